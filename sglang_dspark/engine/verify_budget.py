"""A step plan written into SGLang's verify budget (SGLang adapter): the one place that turns the chooser's plan
(``scheduling/step_plan.StepPlan``) into the numbers upstream's DSPARK planner and verify read.

SGLang's verify reads three things of ours per decode step: the draft input's ``verify_token_budget`` (tokens above
the anchors: the draft's, or a step without the draft's chain tokens), the batch's ``spec_verify_tier_num_tokens``
(the token tier a ragged CUDA graph is picked by; -1: none, the full width) and, on a step without the draft, the
per-request verify lengths. A drafted step's draft budget is upstream's budget planner's; the lookup chains' tokens
(``LookupChains.total``, summed once per plan) ride on top of it, ranked with the draft's by the verify schedule.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from sglang_dspark.engine.to_device import to_device
from sglang_dspark.scheduling.step_plan import StepPlan

# (requests, tokens above the anchors or None) -> the batch's verify token tier (upstream's
# local_verify_tier_num_tokens, with the server's block and minimum verify length bound in).
TierOf = Callable[[int, Optional[int]], int]


def chain_tokens(plan: StepPlan) -> int:
    return plan.lookup.total if plan.lookup is not None else 0


def step_budget(plan: StepPlan, draft_budget: Optional[int]) -> Optional[int]:
    """The step's verify tokens above the anchors: the chains' tokens, plus the draft's budget on a drafted step
    (None: the draft's budget is not known, every draft token is verified)."""
    if not plan.draft:
        return chain_tokens(plan)
    return None if draft_budget is None else draft_budget + chain_tokens(plan)


def write_plan_budget(batch, plan: StepPlan, draft_budget: Optional[int], tier_of: TierOf) -> None:
    """Once per step, before it runs: the draft input's budget (the draft's on a drafted step: the chains are added
    when the verify asks, :func:`step_budget`; the chains' on a step without the draft) and the batch's tier for the
    whole step. ``draft_budget``: the budget planner's (None: not known before the verify, as under synchronous
    scheduling, where upstream computes it then). The batch's tier is read by DP attention's tier agreement (never
    with the chooser on: it needs one rank deciding alone) and by upstream's observability; the verify's own tier
    comes from the resolved budget."""
    batch.spec_info.verify_token_budget = draft_budget if plan.draft else chain_tokens(plan)
    batch.spec_verify_tier_num_tokens = tier_of(len(batch.seq_lens), step_budget(plan, draft_budget))


def undrafted_verify_lens(plan: StepPlan, num_requests: int, device) -> torch.Tensor:
    """A step without the draft verifies each request's anchor plus its chain, chosen on the host: pinned and copied
    without blocking (no host sync)."""
    if plan.lookup is not None:
        return to_device((1 + plan.lookup.lengths).to(torch.int32), device)
    return torch.ones(num_requests, dtype=torch.int32, device=device)


__all__ = ["chain_tokens", "step_budget", "undrafted_verify_lens", "write_plan_budget"]
