"""One decode step's plan: what the step does, decided once before it runs (the twin of ``engine/step_record.py``,
which carries what the step did back out, the plan included). Values only (pure torch); the choice that makes a plan
is ``step_choice.choose_step``.

Call order of a decode step: the planner (``engine/planner.py``) gathers the step's facts and calls ``choose_step``
once (in ``prepare_verify_budget`` under overlap scheduling, else in ``plan_for``) → ``engine/verify_budget.py`` writes
the plan into SGLang's verify budget → the proposer, the verify executor and the plain decode step read the plan
(``engine/current_step.py``) → the step record carries it back to each source's ``observe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from sglang_dspark.scheduling.draft_gate import DraftChoice, GateDecision


@dataclass(frozen=True)
class LookupChains:
    """Prompt-lookup chains for a batch, on the host, in batch order: one step's proposals (what the lookup source
    offers) and, once chosen, the rows that verify one (what the plan carries).

    ``tokens [R, γ]``: the chains (fill past a row's ``lengths``, never verified); ``lengths [R]``: chain tokens of
    the row (0: none; in a plan, exactly what a step without the draft verifies); ``match_lens [R]``: tail tokens the
    lookup matched; ``conditional [R, γ]``: acceptance estimates (``lookup/calibration.py``; in a plan, 0 past each
    row's length; a drafted step ranks them with the draft's confidences); ``explored``: the optimistic estimates of
    an exploring step, not the mean; ``kinds [R]``: each row's sampling class (None: all greedy); ``sources [R]``:
    where each row's chain came from (``lookup/calibration.py``'s OWN or SHARED; None: all own). ``total``: Σ
    lengths, the chain tokens a step verifies, summed once."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    match_lens: torch.Tensor
    conditional: torch.Tensor
    explored: bool = False
    kinds: Optional[torch.Tensor] = None
    sources: Optional[torch.Tensor] = None
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", int(self.lengths.sum()))

    @property
    def rows(self) -> torch.Tensor:
        return self.lengths > 0

    @property
    def width(self) -> int:
        """Chain positions each row holds (γ, or more where chains past the draft's block were proposed)."""
        return int(self.tokens.shape[-1])

    def clipped(self, width: int) -> "LookupChains":
        """These chains cut to their first ``width`` tokens (themselves when no wider)."""
        if self.width <= width:
            return self
        lengths = torch.clamp(self.lengths, max=width)
        return LookupChains(tokens=self.tokens[:, :width], lengths=lengths,
                            match_lens=torch.where(lengths > 0, self.match_lens, 0),
                            conditional=self.conditional[:, :width], explored=self.explored, kinds=self.kinds,
                            sources=self.sources)


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
    lookup: Optional[LookupChains] = None
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
                lookup: Optional[LookupChains] = None, overlap_given_up: bool = False) -> "StepPlan":
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

    def with_anchor_paths(self, *, compact_ok: bool, plain_ok: bool) -> "StepPlan":
        """This plan, with how a step that verifies the anchors only runs on this batch (``compact_ok`` /
        ``plain_ok``, known when the step launches; :meth:`decided`)."""
        return StepPlan.decided(self.decision, compact_ok=compact_ok, plain_ok=plain_ok, lookup=self.lookup,
                                overlap_given_up=self.overlap_given_up) if self.decision is not None else self

    def verifies_past(self, block: int) -> bool:
        """Whether this step verifies a chain longer than ``block`` (γ) tokens: a step without the draft whose chains
        are wider than the draft's block (engine/long_chain_step.py runs it)."""
        return not self.draft and self.lookup is not None and self.lookup.width > block

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


__all__ = ["DRAFTED", "LookupChains", "StepPlan"]
