"""One decode step's plan: what the step does, decided once before it runs (the twin of ``step_record.py``, which
carries what the step did back out).

Call order of a decode step: ``prepare_verify_budget`` (overlap scheduling: the gate decides with the budget, on the
host, before the step) → ``planner.plan_for`` (the decision taken, or made now on the synchronous path, and how a
skipped step runs) → the proposer, the verify executor, the planner's verify-length hooks and the plain decode step
read the plan → ``planner.observe_step(record)`` (the record carries the plan back).

Nothing else decides per step: the plan is a frozen value. Upstream's call chain between the worker, its proposer, its
verify executor and its planner carries no argument of ours, so they share one :class:`CurrentStep` that the worker
sets for the duration of the step (:meth:`CurrentStep.running`) and that reads :data:`DRAFTED` otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from sglang_dspark.scheduling.draft_gate import DraftChoice, GateDecision


@dataclass(frozen=True)
class LookupPlan:
    """The rows that verify a prompt-lookup chain this step (sglang_dspark/lookup/), on the host, in batch order.

    ``tokens [R, γ]``: the chains (fill past a row's ``lengths``, never verified); ``lengths [R]``: lookup tokens the
    row may verify (0: not a lookup row; on a step without the draft, exactly what it verifies); ``match_lens [R]``:
    tail tokens the lookup matched; ``conditional [R, γ]``: the acceptance estimates the choice read (a drafted step
    ranks them with the draft's confidences); ``explored``: they were the optimistic ones of an exploring step
    (``lookup/calibration.py``), not the mean; ``kinds [R]``: each row's sampling class there (None: all greedy)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    match_lens: torch.Tensor
    conditional: torch.Tensor
    explored: bool = False
    kinds: Optional[torch.Tensor] = None

    @property
    def rows(self) -> torch.Tensor:
        return self.lengths > 0


@dataclass(frozen=True)
class StepPlan:
    """``draft``: run the draft block (False: verify the anchors only, a plain step). A skipped step keeps its logits
    at one row per request (``compact_anchor``, engine/plain_step/anchor_only_verify.py) where nothing reads them strided, and
    runs as SGLang's own decode step (``plain_decode``, engine/plain_step/plain_decode_step.py) where the target is eager too.
    ``decision``: the draft gate's (None: no gate on this server, or not a gated step). ``lookup``: the rows that
    verify a lookup chain instead of the draft's (None: none); a step with lookup rows verifies through upstream's
    ragged path, never anchor-only. ``overlap_given_up``: the scheduler processed the previous result before launching
    this step, for the lookup's current tokens (``patches/lookup_current_tokens.py``; its cost is learned from the
    step's record)."""

    draft: bool = True
    compact_anchor: bool = False
    plain_decode: bool = False
    decision: Optional[GateDecision] = None
    lookup: Optional[LookupPlan] = None
    overlap_given_up: bool = False

    def __post_init__(self) -> None:
        if self.draft and (self.compact_anchor or self.plain_decode):
            raise ValueError("a drafted step has no anchor-only path")
        if self.plain_decode and not self.compact_anchor:
            raise ValueError("a plain decode step is a compact anchor-only step")
        if self.lookup is not None and self.compact_anchor:
            raise ValueError("a step with lookup rows verifies more than the anchors")

    @classmethod
    def decided(cls, decision: Optional[GateDecision], *, compact_ok: bool, plain_ok: bool,
                lookup: Optional[LookupPlan] = None, overlap_given_up: bool = False) -> "StepPlan":
        """The plan of a step the gate decided (``compact_ok`` / ``plain_ok``: the batch qualifies for those paths;
        ``lookup``: its lookup rows, if any; a drafted decision whose every row takes the lookup runs no draft)."""
        if lookup is not None and not bool(lookup.rows.any()):
            lookup = None
        if lookup is not None:
            drafted = decision is None or decision.draft
            return cls(draft=drafted and not bool(lookup.rows.all()), decision=decision, lookup=lookup,
                       overlap_given_up=overlap_given_up)
        if decision is None or decision.draft:
            return cls(decision=decision, overlap_given_up=overlap_given_up)
        return cls(draft=False, compact_anchor=compact_ok, plain_decode=compact_ok and plain_ok, decision=decision,
                   overlap_given_up=overlap_given_up)

    @property
    def kind(self) -> str:
        """``drafted``, ``lookup`` (no draft, lookup rows), ``mixed`` (drafted, with lookup rows) or ``plain``."""
        if self.lookup is None:
            return "drafted" if self.draft else "plain"
        return "mixed" if self.draft else "lookup"

    @property
    def choice(self) -> Optional[DraftChoice]:
        """The prediction this step's outcome is held against (observe_step)."""
        return self.decision.choice if self.decision is not None else None


DRAFTED = StepPlan()  # every step without a gate, prefill steps, and between steps


class CurrentStep:
    """The plan of the decode step being run, shared by the worker's parts (module docstring)."""

    plan: StepPlan = DRAFTED

    @contextmanager
    def running(self, plan: StepPlan) -> Iterator[StepPlan]:
        self.plan = plan
        try:
            yield plan
        finally:
            self.plan = DRAFTED


__all__ = ["DRAFTED", "CurrentStep", "LookupPlan", "StepPlan"]
