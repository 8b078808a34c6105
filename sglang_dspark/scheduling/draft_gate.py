"""Draft only when it pays: the per-step choice between a DSpark step and a plain decode step (pure torch).

The capacity search (``admission.py``) maximises ``Θ = τ · SPS`` over how many draft tokens to verify, but the draft
block (draft forward, LM head over the γ slots, Markov loop, confidence head) is paid even when it admits none. The
gate adds the alternative "no draft this step", decided on the host before the step's draft exists:

    Θ(no draft) = R / t_skip(R)                          t_skip(R) = verify(R, R) + level(R)
    Θ(draft)    = max_K (R + Σ_{i<K} a_(i)) · SPS_draft(R, R + K)
                                                         1/SPS_draft(R, B) = verify(R, B) + level(R) + block(R)

(``a_(i)``: the lagged survivals in descending order; costs from ``profiler/step_costs.py``.) The step drafts only
when the corrected ``Θ'(draft) = R · E[committed per request | prediction] / t_draft`` beats ``Θ'(no draft)``; ties go
to the plain step. A skipped step verifies the anchors only: the target's own next token, so no choice of steps can
change the output distribution. The choice is batch-level (all requests draft or none).

Rules around the comparison (knobs in :class:`DraftGateConfig`; why each exists, with the run that motivated it:
``docs/scheduling.md``):

* **probes**: while paused a drafted step runs after ``probe_min`` skipped steps, doubling to ``probe_max`` while
  probes keep saying "pause"; near break-even (within ``probe_close_margin``) every ``probe_min``; never more often
  than keeps the probes' net cost (``t_draft − E · t_skip``) within ``probe_share`` (``probe_share_near``) of the
  time. The back-off resets only after ``steady_spell`` drafting steps.
* **learning the block**: until R's bucket has ``min_skip_samples`` drafted/plain pairs, one step in
  ``learn_skip_every`` is plain; while drafting, one in ``refresh_close_every`` near break-even (``close_margin``),
  else one in ``refresh_skip_every``.
* **acceptance**: predictions are read through :class:`~sglang_dspark.scheduling.acceptance.TokensByLoad` (what
  drafted steps committed against what they predicted, per load bucket), never above ``1 + K / R``; past
  ``fresh_steps`` decisions without a drafted step the population prior replaces the stale lagged survivals.
* **holding a pause**: most paused steps repeat the last full decision (:meth:`DraftGate.held_pause`); a full one
  comes every ``hold_pause_steps`` steps, when R changes, when a probe may be due, and on the ``hold_after_draft``
  decisions after a drafted step.

Policies: :class:`DraftGate` (``auto``), :class:`ComebackGate` (a test cost model), :class:`ForcedGate` (``off``:
the null gate, ``pause``, ``alternate``); :func:`make_draft_gate` maps ``SGLANG_DSPARK_DRAFT_GATE`` to one. Each has
``advise`` (once per decode step: the decision, the policy's state advanced), ``held_advice`` (a held pause),
``tally`` (what the step did), ``observe(record)`` and ``summary``; ``decide`` / ``held_pause`` advise and tally
in one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from sglang_dspark.scheduling.acceptance import RealizedSeconds, SurvivalPrior, TokensByLoad, sanitize_survival
from sglang_dspark.scheduling.admission import _reachable_path_throughput
from sglang_dspark.scheduling.cost_model import StepCostModel

__all__ = [
    "GATE_MODES", "ComebackGate", "DraftChoice", "DraftGate", "DraftGateConfig", "FlatCost", "ForcedGate",
    "GateDecision", "make_draft_gate", "should_draft",
]

# auto: the cost decision below; off: draft every step (the behaviour before the gate); pause: never draft;
# alternate: draft every other step; comeback: a test cost model (pause first, then drafting pays).
GATE_MODES = ("auto", "off", "pause", "alternate", "comeback")



@dataclass(frozen=True)
class DraftChoice:
    draft: bool
    capacity: int  # the K that maximises Θ(draft) (draft tokens verified in all, anchors excluded)
    theta_draft: float  # tokens per second, drafted step with that K
    theta_skip: float  # tokens per second, plain (anchor-only) step
    seconds_draft: float = math.nan  # time of the drafted step with that K
    seconds_skip: float = math.nan  # time of the plain step

    @property
    def tokens_draft(self) -> float:
        """Committed tokens predicted for the drafted step with this K (anchors included)."""
        return self.theta_draft * self.seconds_draft


def should_draft(
    lagged_survival: torch.Tensor,
    cost_with_draft: StepCostModel,
    seconds_without_draft: float,
    num_requests: Optional[int] = None,
    *,
    min_survival: float = 0.0,
) -> DraftChoice:
    """Compare Θ(no draft) = R / ``seconds_without_draft`` with the best Θ of a drafted step.

    ``lagged_survival``: ``[R, γ]`` survivals known before this step's draft (two steps back in production; a fresh
    request counts as 1). ``cost_with_draft``: steps per second of a step that drafts and verifies ``B`` tokens
    (verify forward + the draft block + the rest of the step). ``seconds_without_draft``: the time of a step that
    skips the draft and verifies the ``R`` anchors only.
    """
    survival = sanitize_survival(lagged_survival)
    rows = survival.shape[-2]
    num_requests = rows if num_requests is None else int(num_requests)
    if num_requests <= 0:
        return DraftChoice(draft=False, capacity=0, theta_draft=0.0, theta_skip=0.0)
    if not (seconds_without_draft > 0 and math.isfinite(seconds_without_draft)):
        theta_skip = math.inf if seconds_without_draft == 0 else 0.0
    else:
        theta_skip = num_requests / float(seconds_without_draft)
    if survival.shape[-1] == 0:
        return DraftChoice(draft=False, capacity=0, theta_draft=0.0, theta_skip=theta_skip)
    # Θ_K along the greedy order, K = 0..(valid candidates); the first maximum, as capacity_from_survival.
    theta = _reachable_path_throughput(survival, num_requests, cost_with_draft, min_survival)
    capacity = int(torch.argmax(theta))
    theta_draft = float(theta[capacity])
    sps = float(cost_with_draft.steps_per_second(num_requests, num_requests + capacity))
    return DraftChoice(draft=theta_draft > theta_skip, capacity=capacity, theta_draft=theta_draft,
                       theta_skip=theta_skip, seconds_draft=1.0 / sps if sps > 0 else math.inf,
                       seconds_skip=float(seconds_without_draft))


class FlatCost:
    """A step cost that does not depend on what is verified (tests, and the ``comeback`` mode)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    def steps_per_second(self, num_requests: int, verify_tokens: Union[int, torch.Tensor]):
        if isinstance(verify_tokens, torch.Tensor):
            return torch.full(verify_tokens.shape, 1.0 / self.seconds, dtype=torch.float64)
        return 1.0 / self.seconds


@dataclass(frozen=True)
class GateDecision:
    draft: bool
    # pays | pause | probe | no-info | learn-skip | refresh-skip | off | forced
    reason: str
    choice: Optional[DraftChoice] = None
    # The verify budget the decision's own capacity search found, where that search read exactly what the step's
    # budget reads (the step's lagged survivals and the served cost model): a drafted step then runs the search once.
    budget: Optional[int] = None


@dataclass(frozen=True)
class DraftGateConfig:
    """The automatic gate's knobs (module docstring for what each rule is for). Validated on construction."""

    probe_min: int = 4  # skipped steps per probe right after a pause, and near break-even
    probe_max: int = 64  # the back-off's cap: probes at most this many skipped steps apart
    learn_skip_every: int = 16  # while the block's cost is unlearned: one plain step per this many drafted ones
    refresh_skip_every: int = 256  # while drafting far from break-even: one plain step per this many drafted ones
    refresh_close_every: int = 32  # ... and near it (within close_margin)
    close_margin: float = 0.25  # "near break-even" for the refresh steps: Θ'(draft) < (1 + margin) Θ'(plain)
    min_skip_samples: int = 3  # drafted/plain step pairs of R's bucket before the block's cost is trusted
    steady_spell: int = 16  # drafting steps in a row after which the next pause probes from probe_min again
    probe_share: float = 0.01  # probes' extra time as a share of the time, far from break-even
    probe_share_near: float = 0.02  # ... and near it (within probe_close_margin)
    probe_close_margin: float = 0.15  # "near break-even" for the probes: the back-off does not apply there
    max_probe_interval: int = 4096  # the cost bound's cap on skipped steps per probe
    fresh_steps: int = 1  # decisions after a drafted one whose lagged survival may still be that step's
    hold_pause_steps: int = 8  # a full decision at least every this many paused steps (held_pause)
    hold_after_draft: int = 4  # ... and on this many decisions after any drafted step

    def __post_init__(self) -> None:
        if not 1 <= self.probe_min <= self.probe_max <= self.max_probe_interval:
            raise ValueError(f"DraftGateConfig: need 1 <= probe_min <= probe_max <= max_probe_interval, got "
                             f"{self.probe_min}, {self.probe_max}, {self.max_probe_interval}")
        counts = ("learn_skip_every", "refresh_skip_every", "refresh_close_every", "steady_spell", "hold_pause_steps")
        bad = [name for name in counts if getattr(self, name) < 1]
        bad += [name for name in ("min_skip_samples", "fresh_steps", "hold_after_draft") if getattr(self, name) < 0]
        bad += [name for name in ("close_margin", "probe_close_margin") if not getattr(self, name) >= 0]
        bad += [name for name in ("probe_share", "probe_share_near") if not 0 < getattr(self, name) <= 1]
        if bad:
            raise ValueError(f"DraftGateConfig: out of range: {', '.join(f'{n}={getattr(self, n)}' for n in bad)}")


class _Counts:
    """What every gate policy reports: decisions by outcome and reason, and the last decision."""

    mode = "auto"
    decisions = drafted = skipped = 0
    last: Optional[GateDecision] = None
    reasons: dict[str, int]  # set by each policy's constructor

    def decide(self, **facts) -> GateDecision:
        """The gate's decision for this step, counted as what the step did (:meth:`advise`, then :meth:`tally`)."""
        decision = self.advise(**facts)
        self.tally(decision)
        return decision

    def held_pause(self, num_requests: int) -> Optional[GateDecision]:
        """:meth:`held_advice`, counted as what the step did (None: a full decision is due)."""
        decision = self.held_advice(num_requests)
        if decision is not None:
            self.tally(decision)
        return decision

    def tally(self, decision: GateDecision) -> None:
        """Count what the step did. The step chooser (``step_choice.py``) tallies its final decision, which may
        differ from the gate's advice (a draft the lookup chains beat); the policy's own state keeps its advice."""
        self.decisions += 1
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        if decision.draft:
            self.drafted += 1
        else:
            self.skipped += 1
        self.last = decision

    def summary(self) -> dict:
        return {"mode": self.mode, "decisions": self.decisions, "drafted": self.drafted, "skipped": self.skipped,
                "reasons": dict(self.reasons)}


class ForcedGate(_Counts):
    """A gate that reads nothing: ``off`` drafts every step (the null gate), ``pause`` never, ``alternate`` every
    other step (test modes, to check that any choice of steps stays exact)."""

    def __init__(self, mode: str) -> None:
        if mode not in ("off", "pause", "alternate"):
            raise ValueError(f"no forced draft gate mode {mode!r}")
        self.mode = mode
        self.reasons = {}

    def advise(self, **_) -> GateDecision:
        if self.mode == "off":
            return GateDecision(True, "off")
        return GateDecision(self.mode == "alternate" and self.decisions % 2 == 0, "forced")

    def held_advice(self, num_requests: int) -> None:
        return None

    def observe(self, record) -> None:
        return None

    def trace_fields(self, choice, num_requests: int) -> dict:
        return {}


class DraftGate(_Counts):
    """The automatic per-step draft/skip decision with its exploration (module docstring). One per planner.

    ``decide`` is called once per decode step, before the draft, with what the host knows then."""

    # The probe back-off, the pause hold and the spells (instance values shadow these defaults on first write).
    paused = False
    pauses = resumes = held = 0
    _probe_near = False  # the last paused decision was within probe_close_margin of break-even
    _drafting_spell = 0  # "pays" steps since the last resume
    _held_rows: Optional[int] = None  # R of the last full pause decision (None: nothing to hold)
    _held_steps = 0  # held decisions since it
    _probe_due = 0  # skipped steps after which the next probe may be due, as of that decision
    _skipped_since_probe = _drafted_since_skip = 0
    _decisions_since_draft = 0  # decisions since the last drafted one (0: the previous one drafted)

    def __init__(self, config: Optional[DraftGateConfig] = None) -> None:
        self.config = config if config is not None else DraftGateConfig()
        self.probe_interval = self.config.probe_min
        self.reasons: dict[str, int] = {}
        self.realized = TokensByLoad()  # what drafted steps committed against their predictions (module docstring)
        self.draft_seconds = RealizedSeconds()  # diagnostics only (module docstring)
        self.skip_seconds = RealizedSeconds()

    @property
    def realized_tokens(self):
        """The pooled fit (every drafted step)."""
        return self.realized.pooled

    # ------------------------------------------------------------------ decision

    def advise(
        self,
        *,
        lagged_survival: Optional[torch.Tensor],
        cost_with_draft: Optional[StepCostModel],
        seconds_without_draft: Optional[float],
        skip_samples: int = 0,
        num_requests: Optional[int] = None,
        prior_survival: Optional[torch.Tensor] = None,
    ) -> GateDecision:
        """The gate's advice for this step, its own state advanced as if the step runs it (:meth:`tally` counts what
        the step did). ``prior_survival``: the population's survivals for R rows (:class:`SurvivalPrior`), read
        instead of ``lagged_survival`` once that reading is stale (module docstring)."""
        read_prior = prior_survival is not None and self._decisions_since_draft > self.config.fresh_steps
        if read_prior:
            lagged_survival = prior_survival
        seconds_without_draft, cost_with_draft, skip_samples = self._costs(seconds_without_draft, cost_with_draft,
                                                                           skip_samples)
        decision = self._decide_auto(lagged_survival, cost_with_draft, seconds_without_draft, skip_samples,
                                     num_requests)
        if decision.draft and decision.choice is not None and not read_prior and self._reads_served_costs():
            decision = replace(decision, budget=decision.choice.capacity)
        self._advance(decision)
        return decision

    def _costs(self, seconds_without, cost, skip_samples):
        """The costs the decision reads: the served ones (:class:`ComebackGate` makes them up)."""
        return seconds_without, cost, skip_samples

    def _reads_served_costs(self) -> bool:
        return True

    def _decide_auto(self, survival, cost, seconds_without, skip_samples, num_requests) -> GateDecision:
        if survival is None or cost is None:
            # Nothing known about acceptance yet (first decode steps): draft, that is how confidences appear.
            return GateDecision(True, "no-info")
        learning = seconds_without is None or skip_samples < self.config.min_skip_samples
        if seconds_without is None:
            if self._drafted_since_skip >= self.config.learn_skip_every:
                return GateDecision(False, "learn-skip")
            return GateDecision(True, "no-info")
        choice = should_draft(survival, cost, seconds_without, num_requests)
        draft_rate, skip_rate = choice.theta_draft, choice.theta_skip
        if self._reads_served_costs():  # made-up costs (ComebackGate): nothing to correct
            draft_rate = self.corrected_draft_throughput(choice, num_requests)
            skip_rate = self.corrected_skip_throughput(choice, num_requests)
            choice = replace(choice, draft=draft_rate > skip_rate)
        if choice.draft:
            if learning and self._drafted_since_skip >= self.config.learn_skip_every:
                return GateDecision(False, "learn-skip", choice)
            if not learning and self._drafted_since_skip >= self.refresh_interval(draft_rate, skip_rate):
                return GateDecision(False, "refresh-skip", choice)
            return GateDecision(True, "pays", choice)
        # Near break-even the back-off does not apply (module docstring): there a probe costs little and the choice
        # is the least certain; the cost bound still holds, on a probe's net cost.
        self._probe_near = self._reads_served_costs() and skip_rate > 0 and (
            draft_rate * (1.0 + self.config.probe_close_margin) >= skip_rate)
        expected = self.expected_tokens(choice, num_requests) if self._reads_served_costs() else None
        back_off = self.config.probe_min if self._probe_near else self.probe_interval
        probe_due = max(back_off, self.cost_bounded_interval(choice, expected))
        if self.paused and self._skipped_since_probe >= probe_due:
            return GateDecision(True, "probe", choice)
        self._held_rows, self._held_steps, self._probe_due = num_requests, 0, probe_due
        return GateDecision(False, "pause", choice)

    def held_advice(self, num_requests: int) -> Optional[GateDecision]:
        """The last full pause decision repeated without reading anything (module docstring); None when a full
        decision is due: another R, ``hold_pause_steps`` held in a row, a drafted step within ``hold_after_draft``
        decisions, or a probe that may be due."""
        last = self.last
        if (not self._reads_served_costs() or not self.paused or last is None or last.reason != "pause" or last.choice is None
                or num_requests != self._held_rows or self._held_steps + 1 >= self.config.hold_pause_steps
                or self._decisions_since_draft < self.config.hold_after_draft
                or self._skipped_since_probe >= self._probe_due):
            return None
        decision = GateDecision(False, "pause", last.choice)
        self._held_steps += 1
        self.held += 1
        self._advance(decision)
        return decision

    def refresh_interval(self, draft_rate: float, skip_rate: float) -> int:
        """Drafted steps between two plain steps that re-measure the skipped-step cost (module docstring)."""
        if skip_rate > 0 and draft_rate < (1.0 + self.config.close_margin) * skip_rate:
            return min(self.config.refresh_close_every, self.config.refresh_skip_every)
        return self.config.refresh_skip_every

    def corrected_draft_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        """Θ'(draft): the prediction's committed tokens read through the fit, over its predicted seconds."""
        if not (choice.seconds_draft > 0 and math.isfinite(choice.seconds_draft)) or num_requests <= 0:
            return choice.theta_draft
        per_request = self.expected_tokens(choice, num_requests)
        return num_requests * per_request / choice.seconds_draft

    def expected_tokens(self, choice: DraftChoice, num_requests: int) -> float:
        """E[committed tokens per request | the choice's prediction]: the fit of R's bucket, starting from the pooled
        one, at most the anchor plus the verified drafts per request."""
        expected = self.realized.expected(choice.tokens_draft / num_requests, num_requests)
        return min(expected, 1.0 + choice.capacity / num_requests)

    def corrected_skip_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        """Θ'(no draft): R over the predicted plain step (no correction: module docstring)."""
        return choice.theta_skip

    def observe(self, record) -> None:
        """A decode step's outcome (``engine/step_record.StepRecord``), held against the choice it was decided with."""
        if record.gate_choice is not None and record.seconds is not None:
            self.observe_outcome(record.gate_choice, record.drafted, sum(record.commit_lens), record.seconds,
                                 len(record.commit_lens))

    def observe_outcome(self, choice: Optional[DraftChoice], drafted: bool, tokens: int, seconds: float,
                        num_requests: int) -> None:
        """What a step the gate decided with ``choice`` realized: its committed tokens and measured seconds."""
        if choice is None or seconds is None or num_requests <= 0:
            return
        if drafted:
            self.realized.observe(choice.tokens_draft / num_requests, tokens / num_requests, num_requests)
            self.draft_seconds.observe(choice.seconds_draft, float(seconds))
        else:
            self.skip_seconds.observe(choice.seconds_skip, float(seconds))

    def trace_fields(self, choice: Optional[DraftChoice], num_requests: int) -> dict:
        """What the gate read for a step decided with ``choice`` (engine/gate_trace.py); empty without a choice."""
        if choice is None or num_requests <= 0:
            return {}
        return {
            "predicted_tokens": round(choice.tokens_draft / num_requests, 4),
            "expected_tokens": round(self.expected_tokens(choice, num_requests), 4),
            "capacity": choice.capacity,
            "predicted_draft_seconds": round(choice.seconds_draft, 6),
            "predicted_plain_seconds": round(choice.seconds_skip, 6),
        }

    def cost_bounded_interval(self, choice: Optional[DraftChoice], expected_tokens: Optional[float] = None) -> int:
        """Skipped steps per probe that keep the probes' extra cost within ``probe_share`` of the time
        (``probe_share_near`` near break-even).

        A probe's cost is what it takes more than plain steps would to commit what it is expected to commit,
        ``t_draft − E · t_skip`` (``expected_tokens`` per request; None: 1, the drafted step's whole extra time)."""
        if choice is None or not (choice.seconds_skip > 0) or not math.isfinite(choice.seconds_skip):
            return 0
        tokens = 1.0 if expected_tokens is None or not math.isfinite(expected_tokens) else max(1.0, expected_tokens)
        extra = choice.seconds_draft - tokens * choice.seconds_skip
        if not extra > 0:
            return 0
        share = self.config.probe_share_near if self._probe_near else self.config.probe_share
        steps = extra / (share * choice.seconds_skip)
        return int(min(math.ceil(steps), self.config.max_probe_interval))

    def _advance(self, decision: GateDecision) -> None:
        """The policy's state after advising ``decision``: spells, probe back-off, pause hold."""
        if decision.draft:
            self._drafted_since_skip += 1
            self._decisions_since_draft = 0
        else:
            self._drafted_since_skip = 0
            self._decisions_since_draft += 1
        if decision.reason == "pause":
            if not self.paused:
                self.paused = True
                self.pauses += 1
                if self._drafting_spell >= self.config.steady_spell:  # drafting paid for a while: probe early again
                    self.probe_interval = self.config.probe_min
                self._skipped_since_probe = 0
            self._skipped_since_probe += 1
        elif decision.reason == "probe":
            self._skipped_since_probe = 0
            if not self._probe_near:
                self.probe_interval = min(2 * self.probe_interval, self.config.probe_max)
        elif decision.reason == "pays":
            if self.paused:
                self.paused = False
                self.resumes += 1
                self._drafting_spell = 0
            self._drafting_spell += 1

    # ------------------------------------------------------------------ reading

    def _realized_summary(self) -> dict:
        summary = {"drafted_seconds": round(self.draft_seconds.factor, 3),
                   "plain_seconds": round(self.skip_seconds.factor, 3), "drafted_steps": self.realized_tokens.steps}
        if self.realized_tokens.steps > 0:
            x_mean, y_mean, slope = self.realized_tokens.line()
            summary.update(predicted_tokens_per_request=round(x_mean, 3), committed_tokens_per_request=round(y_mean, 3),
                           slope=round(slope, 3))
        return summary

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "decisions": self.decisions,
            "drafted": self.drafted,
            "skipped": self.skipped,
            "paused": self.paused,
            "pauses": self.pauses,
            "resumes": self.resumes,
            "probes": self.reasons.get("probe", 0),
            "probe_interval": self.probe_interval,
            "held": self.held,
            "reasons": dict(self.reasons),
            "realized_vs_predicted": self._realized_summary(),
        }


class ComebackGate(DraftGate):
    """Test mode ``comeback``: the automatic gate on made-up costs. For the first ``comeback_steps`` decisions a
    plain step is infinitely fast (drafting never pays; probes still run), then the draft is free: a paused server
    must resume."""

    mode = "comeback"

    def __init__(self, config: Optional[DraftGateConfig] = None, *, comeback_steps: int = 48) -> None:
        super().__init__(config)
        self.comeback_steps = comeback_steps

    def _costs(self, seconds_without, cost, skip_samples):
        if self.decisions < self.comeback_steps:
            return 0.0, cost, self.config.min_skip_samples
        seconds = 1.0 if seconds_without is None else max(float(seconds_without), 1e-9)
        return seconds, FlatCost(seconds), self.config.min_skip_samples

    def _reads_served_costs(self) -> bool:
        return False


def make_draft_gate(mode: str, config: Optional[DraftGateConfig] = None) -> Union[DraftGate, ForcedGate]:
    """The gate of ``SGLANG_DSPARK_DRAFT_GATE=mode`` (``off``: the null gate, drafting every step)."""
    if mode == "auto":
        return DraftGate(config)
    if mode == "comeback":
        return ComebackGate(config)
    if mode in ("off", "pause", "alternate"):
        return ForcedGate(mode)
    raise ValueError(f"unknown draft gate mode {mode!r}; choose one of {', '.join(GATE_MODES)}")
