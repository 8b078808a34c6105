"""One step, one chooser: what a decode step verifies, from the draft, the prompt lookup or nothing (pure torch).

:func:`choose_step` turns a step's frozen facts (:class:`StepFacts`: each source's proposals with their acceptance
estimates, the step costs, the draft gate's advice) into its :class:`~sglang_dspark.scheduling.step_plan.StepPlan`.
Nothing else chooses: the gate (``draft_gate.py``) and the lookup (``engine/lookup_source.py``) advise and learn;
the planner (``engine/planner.py``) gathers the facts and hands the plan on. Three sources share one objective,
expected committed tokens × step rate (``admission.py``):

* **nothing** (a plain step): the anchors only, ``Θ_0 = R · SPS(R, R)``;
* **draft** (the DSpark block): whether it runs is the gate's advice, read from the requests without a lookup chain
  (:func:`without_rows`: the draft must pay on the rows the lookup cannot serve); beside chains a drafted step must
  also beat the step that verifies the chains without it (:func:`draft_pays_beside_lookup`), else it becomes a
  step without the draft (reason ``lookup``);
* **lookup** (``sglang_dspark/lookup/``): a chain copied from the request's own context; its conditional acceptance
  per position is the online estimate (``LookupCalibration``), known on the host before the step, so its lengths come
  from the global capacity search and the top-K (:func:`lookup_lengths`) against the cost of a step that runs no
  draft block. A global search, not Algorithm 1's first-non-improvement stop: a verify of R + 1 tokens can cost far
  more than one of R (a one-token-per-request verify is the cheaper kernel path), a cliff no single candidate
  climbs, and the stop exists only for candidates whose survival depends on tokens sampled in the same step, which
  a chain fixed before the step never has. On a drafted step a row verifies its chain where the chain's expected
  tokens are at least the draft's (:func:`prefers_lookup`); a step where no row wants the draft runs no draft forward.

Every choice is made before the step from facts older than its verify, and a lookup proposal is a point mass, so the
verify's acceptance rule (accept ``x`` with probability ``p(x)``, else sample from ``p`` without ``x`` renormalised)
keeps the output exactly the target's. Why each rule exists: ``docs/lookup.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dspark.lookup.config import DEFAULT
from sglang_dspark.scheduling.admission import (
    _reachable_path_throughput,
    admit_topk,
    survival_probabilities,
)
from sglang_dspark.scheduling.cost_model import StepCostModel
from sglang_dspark.scheduling.draft_gate import GateDecision
from sglang_dspark.scheduling.step_plan import DRAFTED, LookupChains, StepPlan

__all__ = ["CHAIN_MIN_GAIN", "StepFacts", "chain_saving_seconds", "choose_chains", "choose_step",
           "draft_pays_beside_lookup", "lookup_conditionals", "lookup_lengths", "prefers_lookup", "without_rows"]

# The margin a chain must clear (lookup/config.py, ``chain_min_gain``: why it exists).
CHAIN_MIN_GAIN = DEFAULT.chain_min_gain


def lookup_conditionals(lengths: torch.Tensor, match_lens: torch.Tensor, gamma: int, conditional_of,
                        kinds: Optional[torch.Tensor] = None, sources: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[R, γ]`` conditional acceptance of each proposed lookup token (0 past a row's proposal and for rows with
    none). ``conditional_of(match_len, n, kind, source)``: the estimate for n tokens of a row of sampling class
    ``kind`` proposed by ``source`` (``LookupCalibration.conditional``); ``kinds [R]``: each row's class (None: every
    row greedy); ``sources [R]``: each row's source (None: every row's own context, source 0)."""
    rows = int(lengths.shape[0])
    conditional = torch.zeros(rows, gamma, dtype=torch.float64)
    for row in range(rows):
        count = int(lengths[row])
        if count > 0:
            kind = 0 if kinds is None else int(kinds[row])
            source = 0 if sources is None else int(sources[row])
            conditional[row, :count] = conditional_of(int(match_lens[row]), count, kind, source).to(torch.float64)
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
                             cost_drafted: StepCostModel, cost_undrafted: StepCostModel,
                             min_gain: float = CHAIN_MIN_GAIN,
                             undrafted_conditional: Optional[torch.Tensor] = None) -> bool:
    """Whether a drafted step beats the step without the draft when some rows have lookup chains: the draft gate
    compared the draft with a plain step, but here the alternative verifies the chains too.

        Θ(lookup only) = max_K (R + Σ top-K lookup survivals) · SPS_undrafted(R, R + K)
        Θ(drafted)     = max_K (R + Σ top-K of the rows' best survivals) · SPS_drafted(R, R + K)

    (a row's best: its lookup survivals where it has a chain, else the draft's ``draft_survival``; Θ(lookup only) takes
    ``K = 0`` unless a chain clears :data:`CHAIN_MIN_GAIN`, as :func:`lookup_lengths` does). Ties go to the step
    without the draft. With nothing known of the draft (None, or rows that are not these) the gate's call stands:
    a drafted step is how the draft's survivals become known. ``undrafted_conditional``: the chains a step without
    the draft may verify, when longer than a drafted step's (``lookup_conditional``, the draft's block wide)."""
    lookup = survival_probabilities(lookup_conditional)
    num_requests = lookup.shape[-2]
    if draft_survival is None or draft_survival.shape != lookup.shape:
        return True
    has_lookup = lookup_conditional[:, :1] > 0
    best = torch.where(has_lookup, lookup, draft_survival.to(lookup.dtype).clamp(0.0, 1.0))
    # The step without the draft verifies the chains :func:`lookup_lengths` keeps: none below the margin.
    undrafted = lookup if undrafted_conditional is None else survival_probabilities(undrafted_conditional)
    _, theta_lookup = _chosen_chains(undrafted, cost_undrafted, min_gain)
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


@dataclass(frozen=True)
class StepFacts:
    """What a decode step is chosen from, all known on the host before it runs.

    ``gate``: the draft gate's advice (None: no gate on this server, or a step it does not decide: every such step
    drafts, as without the gate). ``weigh_draft``: the advice comes from the automatic gate, so a drafted step must
    also beat the chains without it (the forced test gates are obeyed as they are). ``lookup``: the lookup's proposals
    with their estimates (None: none). ``draft_survival [R, γ]``: the survivals the gate read (rows of no confidence
    of their own read the population prior; None: nothing known); ``known_draft_survival``: the lagged survivals
    before that fill (None where no row had any), which a row's chain is weighed against. ``cost_drafted`` /
    ``cost_undrafted``: steps per second of a step with and without the draft block (None: not known yet: chains
    verify every proposed token). ``block``: the draft's block γ (None: proposals are no wider); ``long_chains``: a
    step without the draft may verify chains past it on this batch (a drafted step never does). ``forced_lookup``: every proposed chain token is verified
    (``SGLANG_DSPARK_LOOKUP=forced``, a test mode). ``compact_ok`` / ``plain_ok``: how a step that verifies the anchors
    only may run on this batch (``StepPlan.decided``). ``overlap_given_up``: the batch waited for current tokens."""

    gate: Optional[GateDecision]
    lookup: Optional[LookupChains] = None
    draft_survival: Optional[torch.Tensor] = None
    known_draft_survival: Optional[torch.Tensor] = None
    cost_drafted: Optional[StepCostModel] = None
    cost_undrafted: Optional[StepCostModel] = None
    weigh_draft: bool = True
    forced_lookup: bool = False
    min_gain: float = CHAIN_MIN_GAIN
    block: Optional[int] = None
    long_chains: bool = False
    compact_ok: bool = False
    plain_ok: bool = False
    overlap_given_up: bool = False


def choose_step(facts: StepFacts) -> StepPlan:
    """The step's plan: per request its source (draft, lookup chain or the anchor alone) and verify length, and
    whether the draft forward runs (module docstring). Pure: the same facts give the same plan."""
    decision = facts.gate
    if decision is None:
        return DRAFTED
    # A drafted step verifies at most the draft's block per row; a step without it may go past (long_chains).
    long = facts.lookup
    lookup = long if long is None or facts.block is None else long.clipped(facts.block)
    if not facts.long_chains:
        long = lookup
    if (lookup is not None and decision.draft and facts.weigh_draft and facts.cost_drafted is not None
            and facts.cost_undrafted is not None and not draft_pays_beside_lookup(
                lookup.conditional, facts.draft_survival, facts.cost_drafted, facts.cost_undrafted, facts.min_gain,
                undrafted_conditional=None if long is lookup else long.conditional)):
        # The gate weighed the draft against a plain step; beside lookup chains the alternative verifies them too.
        decision = GateDecision(False, "lookup", decision.choice)
    chains = None if lookup is None else choose_chains(
        lookup if decision.draft else long, drafted=decision.draft, draft_survival=facts.known_draft_survival,
        cost=facts.cost_undrafted, forced=facts.forced_lookup, min_gain=facts.min_gain, block=facts.block)
    return StepPlan.decided(decision, compact_ok=facts.compact_ok, plain_ok=facts.plain_ok, lookup=chains,
                            overlap_given_up=facts.overlap_given_up)


def choose_chains(proposed: LookupChains, *, drafted: bool, draft_survival: Optional[torch.Tensor],
                  cost: Optional[StepCostModel], forced: bool = False, min_gain: float = CHAIN_MIN_GAIN,
                  block: Optional[int] = None) -> Optional[LookupChains]:
    """The rows that verify a lookup chain this step (None: none). Lengths by the global capacity search over the
    estimates with ``cost``, the rate of a step without the draft block (None: not known yet, every proposed token);
    on a drafted step (``drafted``) only rows expecting at least the draft's tokens (``draft_survival``, the [R, γ]
    survivals the gate read; None: every row with a proposal). The chosen chains are ``block`` (γ) wide unless some
    row's length passes it (then as wide as the longest)."""
    conditional = proposed.conditional
    lengths = lookup_lengths(conditional, cost, forced=forced, proposed=proposed.lengths, min_gain=min_gain)
    if drafted and not forced:
        known = draft_survival if draft_survival is not None and draft_survival.shape == conditional.shape else None
        lengths = torch.where(prefers_lookup(conditional, known), lengths, torch.zeros_like(lengths))
    if not bool((lengths > 0).any()):
        return None
    width = conditional.shape[-1]
    conditional = torch.where(torch.arange(width) < lengths[:, None], conditional, torch.zeros_like(conditional))
    chosen = LookupChains(tokens=proposed.tokens, lengths=lengths, match_lens=proposed.match_lens,
                          conditional=conditional, explored=proposed.explored, kinds=proposed.kinds,
                          sources=proposed.sources)
    return chosen if block is None else chosen.clipped(max(block, int(lengths.max())))
