"""Draft only when it pays: the per-step choice between a DSpark step and a plain decode step (pure torch).

A DSpark decode step runs the draft block (one draft forward over ``[x0, MASK × (γ−1)]``, the LM head over the γ
slots, the serial Markov loop and the confidence head) and then verifies the admitted prefix. The admission search
(``admission.py``) maximises ``Θ = τ · SPS`` over how many draft tokens to verify, but the draft itself is paid even
when it admits none. This module adds the missing alternative, "no draft this step":

    Θ(no draft) = R / t_skip(R)                          t_skip(R) = verify(R, R) + level(R)
    Θ(draft)    = max_K (R + Σ_{i<K} a_(i)) · SPS_draft(R, R + K)
                                                         1/SPS_draft(R, B) = verify(R, B) + level(R) + block(R)

(``a_(i)``: the lagged survivals in descending order, as in the capacity search; ``verify``: the profiled SPS table;
``level``: the rest of a step, learned from every step; ``block``: the draft block for R requests, learned from a
drafted and a plain step in a row; profiler/step_overhead.py.) The step drafts only when
``Θ(draft) > Θ(no draft)``; ties go to the plain step. A skipped step is an anchor-only verify: the target's own
next token, sampled or greedy by the standard rules, so the choice cannot bias the output whatever it looks at (it
is made before any draft token of the step exists); it is a batch-level choice (all requests draft or none).

While paused nothing new is learned about acceptance (no confidences are produced), so :class:`DraftGate` runs a
probe (a drafted step) after every ``N`` skipped steps, ``N`` doubling from ``probe_min`` to ``probe_max`` while the
probes keep saying "pause": a pause costs at most one draft block per ``probe_max + 1`` steps in the long run. The
probe's confidences reach the capacity decision through the usual lag and bring drafting back when it pays again.
Each probe also costs what a drafted step costs more than a plain one, and under load that difference grows faster
than the plain step (the draft block runs over every request, for a verify of a few tokens), so the
interval is also at least what keeps probes within ``probe_share`` of the time: ``(t_draft − E · t_skip) /
(probe_share · t_skip)`` skipped steps per probe (``E``: the committed tokens per request expected of it), from the
same learned costs and fit the decision uses.
Near break-even the back-off does not apply: while the corrected throughputs are within ``probe_close_margin`` of
each other, probes come every ``probe_min`` steps (the cost bound still holds, at ``probe_share_near``: a probe
there is worth more, since it may well flip the choice, while far from it, where under load on a CPU a probe costs
3-11 plain steps, it rarely does, and ``probe_share`` is half as much). There the choice is the least certain
(a one-user draft that paid 8 % drafted on every step was read at 0.8-0.9× from the few probes the back-off let
through, and stayed paused), and a probe costs little: its cost is counted net, ``t_draft − E · t_skip``, what it takes more than plain steps would to commit what
it is expected to commit.
The back-off survives a short comeback: a probe that happens to land on an easy stretch resumes drafting for a step
or two and pauses again, and restarting the probes at ``probe_min`` then would make such a draft flap between the two
(a probe every few steps instead of every ``probe_max``). The interval goes back to ``probe_min`` only when drafting
held for ``steady_spell`` steps before the next pause.
The draft block's cost is learned from a drafted and a plain step in a row (profiler/step_overhead.py,
``DraftedAndPlainOverheads``: one level every step teaches, the block on top from such pairs), so until R's bucket
has ``min_skip_samples`` pairs the gate also skips one step in ``learn_skip_every`` (a plain decode step: it costs
only the drafts it does not verify). While drafting, pairs come only from plain steps the gate puts in: when the two
corrected throughputs are within ``close_margin`` of each other, where the block's estimate decides, one every
``refresh_close_every`` drafted steps; far from break-even one in ``refresh_skip_every`` suffices. (Before the shared
level, these steps were the only way to re-measure a plain step while drafting, and a drafting spell begun on a few
slow plain steps held on their cost: a four-user load drafted at ~1.35 tokens per request for tens of steps at 65-88
ms against 40-50 ms plain steps.)

The two throughputs are predictions, and not equally good ones. The drafted one reads the K highest lagged
survivals, and the largest of many noisy estimates is biased upward (the candidates that look best are, on average,
the ones overestimated most); a low reading is as biased the other way, and pauses a draft that pays. Near a tie
those biases decide. So the gate holds its token predictions against what steps realized: :class:`RealizedTokens`
fits the committed tokens per request of drafted steps against their prediction (a line, so it corrects high and low
readings alike); the gate compares

    Θ'(draft) = R · E[committed per request | prediction] / t_draft      Θ'(no draft) = R / t_skip

The seconds need no such correction, and must not get one: ``t_draft`` and ``t_skip`` already follow the measured
steps (the shared level is a moving average of measured − profiled over every step, drafted or plain). A ratio of
measured ÷ predicted seconds on top of them (:class:`RealizedSeconds`, which the gate used to multiply in) counts a
change twice: a few slow plain steps raised the overhead and, measured against the predictions made before it rose,
the ratio too, and the product then predicted a one-user plain step at 103 ms against 45-50 measured for the whole
drafting spell that followed. The ratios are still kept, per kind of step, as a diagnostic (``realized_vs_predicted``
in ``/server_info``). Taking them out was only safe together with the two token-side changes below: the inflated
plain cost had been masking both (two one-user runs without it paused a draft that paid 15-20 %).

A pause starts on a low reading, and while paused no step produces confidences, so the lagged survival stays the
reading that caused the pause (selected low) until the next probe, however long the back-off. Past ``fresh_steps``
decisions without a drafted step, the gate reads the population prior instead (``prior_survival``, the
:class:`SurvivalPrior` of the recent drafted steps): a draft that pays on average resumes two steps after a pause on
one low reading, and a draft that does not stays paused on its average, not its worst reading.

The fit is kept per power-of-two bucket of R, starting from the pooled fit (:class:`RealizedTokens`): what a
request commits per drafted step depends on the load, since the capacity search verifies fewer drafts per request
as R grows, and one user's drafted steps (K = 2-3 drafts for one request) read at four users (the same K spread over
four requests) made a draft that realized 1.15 tokens per request look like 1.35, and drafted 17 % of the steps at
1.5× a plain step's cost. ``E`` never exceeds ``1 + K / R``: a step commits at most its verified drafts and anchors.
It only moves the choice between two exact steps, never a token.

A pause is held, not re-derived, on most of its steps (:meth:`DraftGate.held_pause`): while nothing drafts, what
the decision reads does not move (no new confidences; the population prior changes only on drafted steps; the learned
costs drift slowly), so re-running the capacity search, the fit and the cost model every step only repeats the last
answer, and on a CPU that is about 1 % of a four-user plain step. A held decision repeats the last full one for the
same R; a full one comes every ``hold_pause_steps`` steps, when R changes, when a probe may be due, and on the
``hold_after_draft`` decisions after any drafted step (its confidences and its effect on the prior arrive then).

A request the draft has not drafted for yet has no lagged confidence; upstream's planner reads it as survival 1 (verify
everything), which is right for the admission of a drafted step but would make every arriving request restart
drafting (and reset the probe back-off) however weak the draft has proved. :class:`SurvivalPrior` gives the gate the
population's recent survivals for those rows instead; it is computed from confidences of steps that already ran, so it
is known before the step's draft exists, like every other input of the gate. A step with no lagged confidence at all
(every request new, or the first steps after an idle spell) reads the prior for every row; only a server that has
never drafted has no prior, and drafts ("no-info").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from sglang_dspark.profiler.step_overhead import load_bucket
from sglang_dspark.scheduling.admission import _reachable_path_throughput
from sglang_dspark.scheduling.cost_model import StepCostModel

__all__ = [
    "GATE_MODES", "DraftChoice", "DraftGate", "GateDecision", "FlatCost", "RealizedSeconds", "RealizedTokens",
    "SurvivalPrior", "sanitize_survival", "should_draft",
]

# auto: the cost decision below; off: draft every step (the behaviour before the gate); pause: never draft;
# alternate: draft every other step; comeback: a test cost model (pause first, then drafting pays).
GATE_MODES = ("auto", "off", "pause", "alternate", "comeback")


def sanitize_survival(survival: torch.Tensor) -> torch.Tensor:
    """Survivals as the capacity search needs them: float64, NaN read as 0, clamped to [0, 1], non-increasing in j.

    Lagged survivals come from relay buffers; a slot never written holds garbage, which must not decide a pause."""
    a = torch.nan_to_num(survival.detach().to("cpu", torch.float64), nan=0.0, posinf=1.0, neginf=0.0).clamp_(0.0, 1.0)
    if a.shape[-1] == 0:
        return a
    return torch.cummin(a, dim=-1).values


class SurvivalPrior:
    """The draft's recent survival curve over the whole population, for rows with no lagged confidence of their own.

    ``observe`` takes the ``[R, γ]`` survivals (cumulative products of the calibrated confidences) of a drafted step;
    the prior is an exponential moving average of their row mean with weight ``weight`` per step. ``fill`` replaces
    the rows marked unknown by it; before the first observation it leaves them as they are (upstream's 1: the first
    steps of a server draft, which is how confidences appear at all)."""

    def __init__(self, weight: float = 0.1) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"SurvivalPrior weight must be in (0, 1], got {weight}")
        self.weight = float(weight)
        self.mean: Optional[torch.Tensor] = None  # [γ] float64
        self.observations = 0

    def observe(self, survival: torch.Tensor) -> None:
        rows = sanitize_survival(survival)
        if rows.dim() != 2 or rows.shape[0] == 0:
            return
        batch_mean = rows.mean(dim=0)
        if self.mean is None or self.mean.shape != batch_mean.shape:
            self.mean = batch_mean
        else:
            self.mean = self.mean + self.weight * (batch_mean - self.mean)
        self.observations += 1

    def rows(self, num_requests: int) -> Optional[torch.Tensor]:
        """``[R, γ]``: the prior for every row, for a step with no lagged confidence at all (a batch of arrivals, the
        first steps after an idle spell); None before the first observation (then the gate drafts: "no-info")."""
        if self.mean is None or num_requests <= 0:
            return None
        return self.mean.unsqueeze(0).expand(int(num_requests), -1).clone()

    def fill(self, survival: torch.Tensor, known_rows: Optional[torch.Tensor]) -> torch.Tensor:
        """``survival`` with the rows where ``known_rows`` is False set to the prior (``known_rows`` None: all known)."""
        if self.mean is None or known_rows is None or survival.shape[-1] != self.mean.shape[0]:
            return survival
        unknown = ~known_rows.to(device="cpu", dtype=torch.bool).view(-1)
        if not bool(unknown.any()):
            return survival
        filled = survival.detach().to("cpu", torch.float64).clone()
        filled[unknown] = self.mean
        return filled


class _Forgetting:
    """Exponentially weighted sums over recent steps: each new step weighs 1, one ``half_life`` steps ago 1/2."""

    def __init__(self, half_life: float, size: int) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0, got {half_life}")
        self.half_life = half_life
        self.keep = 0.5 ** (1.0 / half_life)
        self.sums = [0.0] * size
        self.steps = 0

    def add(self, *values: float) -> None:
        self.sums = [self.keep * total + value for total, value in zip(self.sums, values)]
        self.steps += 1


class RealizedSeconds(_Forgetting):
    """Measured ÷ predicted seconds of one kind of step, over that kind's recent steps (module docstring).

    ``Σ seconds / Σ predicted seconds``, weighted by ``2^(−age / half_life)`` (age in steps of this kind), clamped to
    ``bounds``; 1 until ``min_steps`` steps were seen. A step's seconds count at most ``max_stall`` times their
    prediction (a stalled step: a page fault, another process on the cores). A diagnostic of the cost model (how far
    each kind of step misses its prediction), not an input of the decision."""

    def __init__(self, *, half_life: float = 16.0, min_steps: int = 4, max_stall: float = 4.0,
                 bounds: tuple[float, float] = (0.25, 4.0)) -> None:
        if min_steps < 1 or not max_stall >= 1 or not 0 < bounds[0] <= 1 <= bounds[1]:
            raise ValueError(f"RealizedSeconds: bad settings min_steps={min_steps}, max_stall={max_stall}, "
                             f"bounds={bounds}")
        super().__init__(half_life, 2)  # predicted seconds, measured seconds
        self.min_steps = min_steps
        self.max_stall = max_stall
        self.bounds = bounds

    def observe(self, predicted_seconds: float, seconds: float) -> bool:
        if not all(math.isfinite(v) and v > 0 for v in (predicted_seconds, seconds)):
            return False
        self.add(predicted_seconds, min(seconds, self.max_stall * predicted_seconds))
        return True

    @property
    def factor(self) -> float:
        if self.steps < self.min_steps:
            return 1.0
        predicted, measured = self.sums
        return min(max(measured / predicted, self.bounds[0]), self.bounds[1])


class RealizedTokens(_Forgetting):
    """What drafted steps commit per request given what was predicted for them: ``E[y | x]``, fitted on recent
    drafted steps (``x``: predicted committed tokens per request, ``1 + Σ a`` of the gate's K; ``y``: committed).

    A weighted least-squares line through the recent steps, ``E[y | x] = ȳ + β (x − x̄)`` (weights
    ``2^(−age / half_life)``). The gate drafts where the prediction is high, and a line fitted on the steps it
    selected is still the conditional mean at each ``x`` (selecting on the regressor does not bias the regression);
    the ratio of sums it replaces is not: drafted steps are those whose predictions read high, so it read every
    prediction low, and a pause, decided on a low reading, is never corrected by it. ``β`` is shrunk toward 1
    (predictions as they are) by ``shrink``, in the units of ``Σ w (x − x̄)²``: with little spread in ``x`` (while
    paused, every prediction is the population prior) the fit corrects the level only; ``β`` stays within [0, 1]
    (a higher prediction never predicts fewer tokens, nor more than it says).

    The fit starts from a prior: ``prior_steps`` pseudo-steps, forgotten like real steps, blended in as
    ``(W · fit(x) + W₀ · prior(x)) / (W + W₀)`` (``W``, ``W₀``: the weights of the real and of the pseudo-steps);
    the prior is the prediction itself (``y = x``) for the pooled fit, the pooled fit for a load bucket's. A hard
    "fit only after N steps" let a fit of the first few drafted steps decide alone: four steps that committed 1.0
    token each made every later prediction of 1.31 read 1.0, and paused a one-user draft whose drafted steps went on
    to commit 1.44."""

    def __init__(self, *, half_life: float = 32.0, shrink: float = 0.5, prior_steps: float = 4.0) -> None:
        if not shrink > 0 or not prior_steps >= 0:
            raise ValueError(f"RealizedTokens: bad settings shrink={shrink}, prior_steps={prior_steps}")
        super().__init__(half_life, 5)  # w, Σwx, Σwy, Σwx², Σwxy
        self.shrink = shrink
        self.prior_steps = prior_steps

    def observe(self, predicted: float, realized: float) -> bool:
        if not all(math.isfinite(v) and v > 0 for v in (predicted, realized)):
            return False
        self.add(1.0, predicted, realized, predicted * predicted, predicted * realized)
        return True

    def line(self) -> tuple[float, float, float]:
        """(x̄, ȳ, β) of the current fit."""
        w, sx, sy, sxx, sxy = self.sums
        x_mean, y_mean = sx / w, sy / w
        spread = max(sxx - w * x_mean * x_mean, 0.0)
        covariance = sxy - w * x_mean * y_mean
        slope = (covariance + self.shrink) / (spread + self.shrink)
        return x_mean, y_mean, min(max(slope, 0.0), 1.0)

    def expected(self, predicted: float, prior: Optional[float] = None) -> float:
        """E[y | x = ``predicted``]; ``prior``: what to read before any step (default: ``predicted``)."""
        prior = predicted if prior is None else prior
        if self.steps == 0:
            return max(1.0, prior)
        x_mean, y_mean, slope = self.line()
        fitted = y_mean + slope * (predicted - x_mean)
        weight, prior_weight = self.sums[0], self.prior_steps * self.keep ** self.steps
        blended = (weight * fitted + prior_weight * prior) / (weight + prior_weight)
        return max(1.0, blended)  # a step commits at least its anchor


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


class DraftGate:
    """The per-step draft/skip decision with its exploration (see the module docstring). One per planner.

    ``decide`` is called once per decode step, before the draft, with what the host knows then."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        probe_min: int = 4,
        probe_max: int = 64,
        learn_skip_every: int = 16,
        refresh_skip_every: int = 256,
        min_skip_samples: int = 3,
        comeback_steps: int = 48,
        steady_spell: int = 16,
        probe_share: float = 0.01,
        max_probe_interval: int = 4096,
        refresh_close_every: int = 32,
        close_margin: float = 0.25,
        fresh_steps: int = 1,
        probe_close_margin: float = 0.15,
        probe_share_near: float = 0.02,
        hold_pause_steps: int = 8,
        hold_after_draft: int = 4,
    ) -> None:
        if mode not in GATE_MODES:
            raise ValueError(f"unknown draft gate mode {mode!r}; choose one of {', '.join(GATE_MODES)}")
        if not (1 <= probe_min <= probe_max):
            raise ValueError(f"need 1 <= probe_min <= probe_max, got {probe_min}, {probe_max}")
        self.mode = mode
        self.probe_min = probe_min
        self.probe_max = probe_max
        self.learn_skip_every = learn_skip_every
        self.refresh_skip_every = refresh_skip_every
        self.min_skip_samples = min_skip_samples
        self.comeback_steps = comeback_steps
        self.steady_spell = steady_spell
        self.probe_share = probe_share
        self.max_probe_interval = max_probe_interval
        self.refresh_close_every = refresh_close_every
        self.close_margin = close_margin
        # Decisions after the last drafted one whose lagged survival may still come from a drafted step (the overlap
        # path reads confidences two steps back); past them, the reading is the stale one of a paused spell.
        self.fresh_steps = fresh_steps
        self.probe_close_margin = probe_close_margin
        self.probe_share_near = probe_share_near
        self._probe_near = False  # the last paused decision was within probe_close_margin of break-even
        self._drafting_spell = 0  # "pays" steps since the last resume
        self.paused = False
        self.probe_interval = probe_min
        self.hold_pause_steps = hold_pause_steps
        self.hold_after_draft = hold_after_draft
        self.held = 0  # decisions that repeated the last full pause (held_pause)
        self._held_rows: Optional[int] = None  # R of the last full pause decision (None: nothing to hold)
        self._held_steps = 0  # held decisions since it
        self._probe_due = 0  # skipped steps after which the next probe may be due, as of that decision
        self._skipped_since_probe = 0
        self._drafted_since_skip = 0
        self._decisions_since_draft = 0  # decisions since the last drafted one (0: the previous one drafted)
        self.decisions = 0
        self.drafted = 0
        self.skipped = 0
        self.pauses = 0
        self.resumes = 0
        self.reasons: dict[str, int] = {}
        self.last: Optional[GateDecision] = None
        # What steps realized against their predictions (module docstring): every drafted step, and per R bucket.
        self.realized_tokens = RealizedTokens()
        self.realized_tokens_by_load: dict[int, RealizedTokens] = {}
        self.draft_seconds = RealizedSeconds()  # diagnostics only (module docstring)
        self.skip_seconds = RealizedSeconds()

    # ------------------------------------------------------------------ decision

    def decide(
        self,
        *,
        lagged_survival: Optional[torch.Tensor],
        cost_with_draft: Optional[StepCostModel],
        seconds_without_draft: Optional[float],
        skip_samples: int = 0,
        num_requests: Optional[int] = None,
        prior_survival: Optional[torch.Tensor] = None,
    ) -> GateDecision:
        """``prior_survival``: the population's survivals for R rows (:class:`SurvivalPrior`), read instead of
        ``lagged_survival`` once that reading is stale (module docstring)."""
        step = self.decisions
        if prior_survival is not None and self._decisions_since_draft > self.fresh_steps:
            lagged_survival = prior_survival
        if self.mode == "off":
            decision = GateDecision(True, "off")
        elif self.mode == "pause":
            decision = GateDecision(False, "forced")
        elif self.mode == "alternate":
            decision = GateDecision(step % 2 == 0, "forced")
        else:
            if self.mode == "comeback":
                seconds = 1.0 if seconds_without_draft is None else max(float(seconds_without_draft), 1e-9)
                if step < self.comeback_steps:
                    seconds_without_draft = 0.0  # Θ(no draft) = ∞: drafting never pays (probes still run)
                else:
                    seconds_without_draft, cost_with_draft = seconds, FlatCost(seconds)  # the draft is free
                skip_samples = self.min_skip_samples
            decision = self._decide_auto(lagged_survival, cost_with_draft, seconds_without_draft, skip_samples,
                                         num_requests)
        self._count(decision)
        return decision

    def _decide_auto(self, survival, cost, seconds_without, skip_samples, num_requests) -> GateDecision:
        if survival is None or cost is None:
            # Nothing known about acceptance yet (first decode steps): draft, that is how confidences appear.
            return GateDecision(True, "no-info")
        learning = seconds_without is None or skip_samples < self.min_skip_samples
        if seconds_without is None:
            if self._drafted_since_skip >= self.learn_skip_every:
                return GateDecision(False, "learn-skip")
            return GateDecision(True, "no-info")
        choice = should_draft(survival, cost, seconds_without, num_requests)
        draft_rate, skip_rate = choice.theta_draft, choice.theta_skip
        if self.mode != "comeback":  # the comeback mode's costs are made up: nothing to correct
            draft_rate = self.corrected_draft_throughput(choice, num_requests)
            skip_rate = self.corrected_skip_throughput(choice, num_requests)
            choice = replace(choice, draft=draft_rate > skip_rate)
        if choice.draft:
            if learning and self._drafted_since_skip >= self.learn_skip_every:
                return GateDecision(False, "learn-skip", choice)
            if not learning and self._drafted_since_skip >= self.refresh_interval(draft_rate, skip_rate):
                return GateDecision(False, "refresh-skip", choice)
            return GateDecision(True, "pays", choice)
        # Near break-even the back-off does not apply (module docstring): there a probe costs little and the choice
        # is the least certain; the cost bound still holds, on a probe's net cost.
        self._probe_near = self.mode != "comeback" and skip_rate > 0 and (
            draft_rate * (1.0 + self.probe_close_margin) >= skip_rate)
        expected = self.expected_tokens(choice, num_requests) if self.mode != "comeback" else None
        back_off = self.probe_min if self._probe_near else self.probe_interval
        probe_due = max(back_off, self.cost_bounded_interval(choice, expected))
        if self.paused and self._skipped_since_probe >= probe_due:
            return GateDecision(True, "probe", choice)
        self._held_rows, self._held_steps, self._probe_due = num_requests, 0, probe_due
        return GateDecision(False, "pause", choice)

    def held_pause(self, num_requests: int) -> Optional[GateDecision]:
        """The last full pause decision repeated without reading anything (module docstring); None when a full
        decision is due: another R, ``hold_pause_steps`` held in a row, a drafted step within ``hold_after_draft``
        decisions, or a probe that may be due."""
        last = self.last
        if (self.mode != "auto" or not self.paused or last is None or last.reason != "pause" or last.choice is None
                or num_requests != self._held_rows or self._held_steps + 1 >= self.hold_pause_steps
                or self._decisions_since_draft < self.hold_after_draft
                or self._skipped_since_probe >= self._probe_due):
            return None
        decision = GateDecision(False, "pause", last.choice)
        self._held_steps += 1
        self.held += 1
        self._count(decision)
        return decision

    def refresh_interval(self, draft_rate: float, skip_rate: float) -> int:
        """Drafted steps between two plain steps that re-measure the skipped-step cost (module docstring)."""
        if skip_rate > 0 and draft_rate < (1.0 + self.close_margin) * skip_rate:
            return min(self.refresh_close_every, self.refresh_skip_every)
        return self.refresh_skip_every

    def corrected_draft_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        """Θ'(draft): the prediction's committed tokens read through the fit, over its predicted seconds."""
        if not (choice.seconds_draft > 0 and math.isfinite(choice.seconds_draft)) or num_requests <= 0:
            return choice.theta_draft
        per_request = self.expected_tokens(choice, num_requests)
        return num_requests * per_request / choice.seconds_draft

    def expected_tokens(self, choice: DraftChoice, num_requests: int) -> float:
        """E[committed tokens per request | the choice's prediction]: the fit of R's bucket, starting from the pooled
        one, at most the anchor plus the verified drafts per request."""
        predicted = choice.tokens_draft / num_requests
        expected = self.realized_tokens.expected(predicted)
        fit = self.realized_tokens_by_load.get(load_bucket(num_requests))
        if fit is not None:
            expected = fit.expected(predicted, prior=expected)
        return min(expected, 1.0 + choice.capacity / num_requests)

    def corrected_skip_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        """Θ'(no draft): R over the predicted plain step (no correction: module docstring)."""
        return choice.theta_skip

    def observe_outcome(self, choice: Optional[DraftChoice], drafted: bool, tokens: int, seconds: float,
                        num_requests: int) -> None:
        """What a step the gate decided with ``choice`` realized: its committed tokens and measured seconds."""
        if choice is None or seconds is None or num_requests <= 0:
            return
        if drafted:
            predicted, realized = choice.tokens_draft / num_requests, tokens / num_requests
            self.realized_tokens.observe(predicted, realized)
            bucket = load_bucket(num_requests)
            if bucket not in self.realized_tokens_by_load:
                self.realized_tokens_by_load[bucket] = RealizedTokens(
                    half_life=self.realized_tokens.half_life, shrink=self.realized_tokens.shrink,
                    prior_steps=self.realized_tokens.prior_steps)
            self.realized_tokens_by_load[bucket].observe(predicted, realized)
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
        share = self.probe_share_near if self._probe_near else self.probe_share
        steps = extra / (share * choice.seconds_skip)
        return int(min(math.ceil(steps), self.max_probe_interval))

    def _count(self, decision: GateDecision) -> None:
        self.decisions += 1
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        if decision.draft:
            self.drafted += 1
            self._drafted_since_skip += 1
            self._decisions_since_draft = 0
        else:
            self.skipped += 1
            self._drafted_since_skip = 0
            self._decisions_since_draft += 1
        if decision.reason == "pause":
            if not self.paused:
                self.paused = True
                self.pauses += 1
                if self._drafting_spell >= self.steady_spell:  # drafting paid for a while: probe early again
                    self.probe_interval = self.probe_min
                self._skipped_since_probe = 0
            self._skipped_since_probe += 1
        elif decision.reason == "probe":
            self._skipped_since_probe = 0
            if not self._probe_near:
                self.probe_interval = min(2 * self.probe_interval, self.probe_max)
        elif decision.reason == "pays":
            if self.paused:
                self.paused = False
                self.resumes += 1
                self._drafting_spell = 0
            self._drafting_spell += 1
        self.last = decision

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
