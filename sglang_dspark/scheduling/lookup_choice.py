"""Which source each request verifies, and how many lookup tokens (pure torch; issue #39).

Two proposal sources share one objective, expected committed tokens × step rate (``admission.py``):

* **lookup** (``sglang_dspark/lookup/``): a deterministic chain copied from the request's own context; its
  conditional acceptance per position is the online estimate (``LookupCalibration``), known on the host before the
  step, so its lengths come from the global capacity search and the top-K (:func:`lookup_lengths`) against the cost
  of a step that runs no draft block (verify + the step level). A global search, not Algorithm 1's
  first-non-improvement stop: a verify of R + 1 tokens can cost far more than one of R (a one-token-per-request
  verify is the cheaper kernel path; +16 % at R = 16 in a CPU table), a cliff no single candidate climbs, and the stop
  exists only for candidates whose survival depends on tokens sampled in the same step, which a chain fixed before
  the step never has.
* **draft**: the DSpark block; whether it runs at all is the draft gate's decision (``draft_gate.py``).

The draft gate decides whether the draft runs from the requests without a lookup proposal only (:func:`without_rows`:
the draft must pay on the rows the lookup cannot serve). Per request: a row with a lookup proposal verifies the lookup
chain when its expected tokens are at least the draft's (:func:`prefers_lookup`: Σ survival of each, the draft's from
the survivals the gate read); a step where no request wants the draft runs no draft forward. Every choice is made before the step from facts older than its verify, and a
lookup proposal is a point mass, so the verify's acceptance rule (accept ``x`` with probability ``p(x)``, else
sample from ``p`` without ``x`` renormalised) keeps the output exactly the target's.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang_dspark.scheduling.admission import (
    _reachable_path_throughput,
    admit_topk,
    capacity_from_survival,
    survival_probabilities,
)
from sglang_dspark.scheduling.cost_model import StepCostModel

__all__ = ["draft_pays_beside_lookup", "lookup_conditionals", "lookup_lengths", "prefers_lookup", "without_rows"]


def lookup_conditionals(lengths: torch.Tensor, match_lens: torch.Tensor, gamma: int, conditional_of) -> torch.Tensor:
    """``[R, γ]`` conditional acceptance of each proposed lookup token (0 past a row's proposal and for rows with
    none). ``conditional_of(match_len, n)``: the estimate for n tokens (``LookupCalibration.conditional``)."""
    rows = int(lengths.shape[0])
    conditional = torch.zeros(rows, gamma, dtype=torch.float64)
    for row in range(rows):
        count = int(lengths[row])
        if count > 0:
            conditional[row, :count] = conditional_of(int(match_lens[row]), count).to(torch.float64)
    return conditional


def lookup_lengths(conditional: torch.Tensor, cost: Optional[StepCostModel], *, forced: bool = False,
                   proposed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[R]`` lookup tokens to verify per request on a step without the draft: ``K = argmax_K Θ_K`` over the lookup
    survivals with ``cost`` (a step that runs no draft block), then the top ``K`` candidates by survival (a prefix of
    every row); ``forced`` (or no cost yet): every proposed token (``proposed``: tokens per row; default, the rows'
    positive conditionals)."""
    if forced or cost is None:
        if proposed is None:
            proposed = (conditional > 0).sum(dim=-1)
        return proposed.to(torch.long)
    capacity = capacity_from_survival(survival_probabilities(conditional), cost, conditional.shape[-2])
    return admit_topk(conditional, capacity)


def prefers_lookup(lookup_conditional: torch.Tensor, draft_survival: Optional[torch.Tensor]) -> torch.Tensor:
    """``[R]`` bool: the row has a lookup proposal whose expected tokens (Σ of its survivals) are at least the draft's
    (Σ of ``draft_survival``'s row; None: no draft this step, every row with a proposal)."""
    has_lookup = lookup_conditional[:, :1].squeeze(-1) > 0
    if draft_survival is None:
        return has_lookup
    lookup_expected = torch.cumprod(lookup_conditional, dim=-1).sum(dim=-1)
    draft_expected = draft_survival.to(torch.float64).clamp(0.0, 1.0).sum(dim=-1)
    return has_lookup & (lookup_expected >= draft_expected)


def without_rows(survival: Optional[torch.Tensor], rows: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``survival`` with the given rows at 0 (they count no draft token); unchanged when either is None or the shapes
    disagree (a batch whose rows are not the survivals')."""
    if survival is None or rows is None or survival.shape[0] != rows.shape[0] or not bool(rows.any()):
        return survival
    return survival.masked_fill(rows.to(torch.bool)[:, None], 0.0)


def draft_pays_beside_lookup(lookup_conditional: torch.Tensor, draft_survival: Optional[torch.Tensor],
                             cost_drafted: StepCostModel, cost_undrafted: StepCostModel) -> bool:
    """Whether a drafted step beats the step without the draft when some rows have lookup chains: the draft gate
    compared the draft with a plain step, but here the alternative verifies the chains too.

        Θ(lookup only) = max_K (R + Σ top-K lookup survivals) · SPS_undrafted(R, R + K)
        Θ(drafted)     = max_K (R + Σ top-K of the rows' best survivals) · SPS_drafted(R, R + K)

    (a row's best: its lookup survivals where it has a chain, else the draft's ``draft_survival``). Ties go to the step
    without the draft. With nothing known of the draft (None, or rows that are not these) the gate's call stands:
    a drafted step is how the draft's survivals become known."""
    lookup = survival_probabilities(lookup_conditional)
    num_requests = lookup.shape[-2]
    if draft_survival is None or draft_survival.shape != lookup.shape:
        return True
    has_lookup = lookup_conditional[:, :1] > 0
    best = torch.where(has_lookup, lookup, draft_survival.to(lookup.dtype).clamp(0.0, 1.0))
    theta_lookup = _reachable_path_throughput(lookup, num_requests, cost_undrafted, 0.0).max()
    theta_drafted = _reachable_path_throughput(best, num_requests, cost_drafted, 0.0).max()
    return bool(theta_drafted > theta_lookup)
