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
    survival_probabilities,
)
from sglang_dspark.scheduling.cost_model import StepCostModel

__all__ = ["CHAIN_MIN_GAIN", "chain_saving_seconds", "draft_pays_beside_lookup", "lookup_conditionals", "lookup_lengths", "prefers_lookup",
           "without_rows"]

# A step verifies lookup chains only where they promise at least this much more throughput than the step without
# them. A chain speeds the requests it is accepted for and not the rest, so requests that started together finish
# apart: later steps run fewer requests and prefills land one by one, a cost the per-step objective does not see.
# Chains predicted to gain a few per cent at a full batch realize less than that in the trace and lose the level
# (docs/lookup.md, "The margin"); chains that pay clearly (a long accepted run, a light batch) are kept.
CHAIN_MIN_GAIN = 0.05


def lookup_conditionals(lengths: torch.Tensor, match_lens: torch.Tensor, gamma: int, conditional_of,
                        kinds: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[R, γ]`` conditional acceptance of each proposed lookup token (0 past a row's proposal and for rows with
    none). ``conditional_of(match_len, n, kind)``: the estimate for n tokens of a row of sampling class ``kind``
    (``LookupCalibration.conditional``); ``kinds [R]``: each row's class (None: every row greedy)."""
    rows = int(lengths.shape[0])
    conditional = torch.zeros(rows, gamma, dtype=torch.float64)
    for row in range(rows):
        count = int(lengths[row])
        if count > 0:
            kind = 0 if kinds is None else int(kinds[row])
            conditional[row, :count] = conditional_of(int(match_lens[row]), count, kind).to(torch.float64)
    return conditional


def lookup_lengths(conditional: torch.Tensor, cost: Optional[StepCostModel], *, forced: bool = False,
                   proposed: Optional[torch.Tensor] = None, min_gain: float = CHAIN_MIN_GAIN) -> torch.Tensor:
    """``[R]`` lookup tokens to verify per request on a step without the draft: ``K = argmax_K Θ_K`` over the lookup
    survivals with ``cost`` (a step that runs no draft block), counting ``K = 0`` (no chain) at ``(1 + min_gain)·Θ_0``
    (:data:`CHAIN_MIN_GAIN`), then the top ``K`` candidates by survival (a prefix of every row); ``forced`` (or no cost yet): every proposed
    token (``proposed``: tokens per row; default, the rows' positive conditionals)."""
    if forced or cost is None:
        if proposed is None:
            proposed = (conditional > 0).sum(dim=-1)
        return proposed.to(torch.long)
    if conditional.shape[-2] == 0 or conditional.shape[-1] == 0:
        return torch.zeros(conditional.shape[:-1], dtype=torch.long)
    capacity, _ = _chosen_chains(survival_probabilities(conditional), cost, min_gain)
    return admit_topk(conditional, capacity)


def _chosen_chains(survival: torch.Tensor, cost: StepCostModel, min_gain: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(K, Θ_K)``: the best count of chain tokens along the top-K path of the lookup survivals, ``K = 0`` (no
    chain) unless some ``Θ_K`` beats ``(1 + min_gain)·Θ_0`` (the first maximum: ties go to fewer), and its throughput."""
    theta = _reachable_path_throughput(survival, survival.shape[-2], cost, 0.0)
    bar = theta.clone()
    bar[..., 0] *= 1.0 + float(min_gain)
    capacity = torch.argmax(bar, dim=-1)
    return capacity, theta.gather(-1, capacity.unsqueeze(-1)).squeeze(-1)


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

    (a row's best: its lookup survivals where it has a chain, else the draft's ``draft_survival``; Θ(lookup only) takes
    ``K = 0`` unless a chain clears :data:`CHAIN_MIN_GAIN`, as :func:`lookup_lengths` does). Ties go to the step
    without the draft. With nothing known of the draft (None, or rows that are not these) the gate's call stands:
    a drafted step is how the draft's survivals become known."""
    lookup = survival_probabilities(lookup_conditional)
    num_requests = lookup.shape[-2]
    if draft_survival is None or draft_survival.shape != lookup.shape:
        return True
    has_lookup = lookup_conditional[:, :1] > 0
    best = torch.where(has_lookup, lookup, draft_survival.to(lookup.dtype).clamp(0.0, 1.0))
    # The step without the draft verifies the chains :func:`lookup_lengths` keeps: none below the margin.
    _, theta_lookup = _chosen_chains(lookup, cost_undrafted, CHAIN_MIN_GAIN)
    theta_drafted = _reachable_path_throughput(best, num_requests, cost_drafted, 0.0).max()
    return bool(theta_drafted > theta_lookup)


def chain_saving_seconds(conditional: torch.Tensor, lengths: torch.Tensor, cost: Optional[StepCostModel]) -> Optional[float]:
    """Seconds a step that verifies these chains is predicted to save against producing the same expected tokens with
    steps that verify none: ``E / Θ_0 - t_K``, with ``E = R + Σ`` the chains' survivals (``conditional [R, γ]`` as
    planned, 0 past each row's ``lengths``), ``Θ_0 = R · SPS(R, R)`` and ``t_K = 1 / SPS(R, R + Σ lengths)``. What a
    wait for current tokens has to beat (``scheduling/current_tokens.py``); None without a cost (nothing known)."""
    num_requests = int(conditional.shape[-2])
    if cost is None or num_requests == 0:
        return None
    expected = num_requests + float(survival_probabilities(conditional).sum())
    theta_plain = num_requests * float(cost.steps_per_second(num_requests, num_requests))
    step_seconds = 1.0 / float(cost.steps_per_second(num_requests, num_requests + int(lengths.sum())))
    return expected / theta_plain - step_seconds
