"""Draft only when it pays: the per-step choice between a DSpark step and a plain decode step (pure torch).

A DSpark decode step runs the draft block (one draft forward over ``[x0, MASK × (γ−1)]``, the LM head over the γ
slots, the serial Markov loop and the confidence head) and then verifies the admitted prefix. The admission search
(``admission.py``) maximises ``Θ = τ · SPS`` over how many draft tokens to verify, but the draft itself is paid even
when it admits none. This module adds the missing alternative, "no draft this step":

    Θ(no draft) = R / t_skip(R)                          t_skip(R) = verify(R, R) + overhead of a skipped step
    Θ(draft)    = max_K (R + Σ_{i<K} a_(i)) · SPS_draft(R, R + K)
                                                         1/SPS_draft(R, B) = verify(R, B) + overhead of a drafted step

(``a_(i)``: the lagged survivals in descending order, as in the capacity search; the difference of the two overheads
is the cost of the draft block for R requests.) The step drafts only when ``Θ(draft) > Θ(no draft)``; ties go to the
plain step. A skipped step is an anchor-only verify: the target's own next token, sampled or greedy by the standard
rules, so the choice cannot bias the output whatever it looks at (it is made before any draft token of the step
exists); it is a batch-level choice (all requests draft or none).

While paused nothing new is learned about acceptance (no confidences are produced), so :class:`DraftGate` runs a
probe (a drafted step) after every ``N`` skipped steps, ``N`` doubling from ``probe_min`` to ``probe_max`` while the
probes keep saying "pause": a pause costs at most one draft block per ``probe_max + 1`` steps in the long run. The
probe's confidences reach the capacity decision through the usual lag and bring drafting back when it pays again.
Each probe also costs what a drafted step costs more than a plain one, and under load that difference grows faster
than the plain step (the draft block runs over every request, for a verify of a few tokens), so the
interval is also at least what keeps probes within ``probe_share`` of the time: ``(t_draft − t_skip) /
(probe_share · t_skip)`` skipped steps per probe, from the same learned costs the decision uses.
The back-off survives a short comeback: a probe that happens to land on an easy stretch resumes drafting for a step
or two and pauses again, and restarting the probes at ``probe_min`` then would make such a draft flap between the two
(a probe every few steps instead of every ``probe_max``). The interval goes back to ``probe_min`` only when drafting
held for ``steady_spell`` steps before the next pause.
The skipped-step cost is learned from skipped steps, so until a few have been measured the gate also skips one step
in ``learn_skip_every`` (a plain decode step: it costs only the drafts it does not verify).
The same holds the other way round while drafting: the skipped-step cost is then the one measured before the drafting
spell began, and it is not a random one, since a spell tends to begin just after a few slow plain steps (a machine-wide
slow spell, another process on the cores) made a plain step look dearer than it is. Left alone until
``refresh_skip_every`` drafted steps, that stale cost kept a four-user load drafting at ~1.35 tokens per request for
tens of steps at 65-88 ms against 40-50 ms plain steps. So when the two corrected throughputs are within
``close_margin`` of each other, where a stale reading can flip the choice, the gate re-measures a plain step every
``refresh_close_every`` drafted steps; far from break-even one in ``refresh_skip_every`` suffices.

The two throughputs are predictions, and not equally good ones. The drafted one reads the K highest lagged
survivals, and the largest of many noisy estimates is biased upward (the candidates that look best are, on average,
the ones overestimated most); a low reading is as biased the other way, and pauses a draft that pays; its cost is
learned from far fewer steps than the plain step's. Near a tie those biases decide. So the gate holds its
predictions against what steps realized: :class:`RealizedTokens` fits the committed tokens per request of drafted
steps against their prediction (a line, so it corrects high and low readings alike), and :class:`RealizedSeconds`
the measured against the predicted seconds of each kind of step; the gate compares

    Θ'(draft) = R · E[committed per request | prediction] / (κ_draft · t_draft)      Θ'(no draft) = R / (κ_skip · t_skip)

The fit, and each seconds ratio, is kept per power-of-two bucket of R (the pooled one stands in until a bucket has its
own few steps): what a request commits per drafted step depends on the load, since the capacity search verifies fewer
drafts per request as R grows, and one user's drafted steps (K = 2-3 drafts for one request) read at four users (the
same K spread over four requests) made a draft that realized 1.15 tokens per request look like 1.35, and drafted 17 %
of the steps at 1.5× a plain step's cost. How far a step's seconds miss their prediction depends on the load too: a
bucket's learned overhead starts from its first few steps, while the pooled ratio is mostly the one-user steps'.
``E`` never exceeds ``1 + K / R``: a step commits at most its verified drafts and anchors. It only moves the choice
between two exact steps, never a token.

Known weakness of the seconds ratios: they multiply predictions whose learned overheads (profiler/step_overhead.py)
already follow the same measured steps, so a slowdown counts twice, and for the kind of step not being run the
product stays as it was (a one-user plain step read as 103 ms against 45-50 measured through a drafting spell).
Taken out alone, they let two one-user runs pause a draft that paid 15-20 %: the inflated plain cost had masked the
stale survival reading a pause starts on and a token fit levelled on its first few drafted steps. Both sides want
fixing together (issue #11's notes: a shared level learned from every step, the draft block from adjacent pairs).

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
    prediction: a stalled step (a page fault, another process on the cores) says nothing about drafting, and would
    otherwise hold the draft paused until forgotten, which while paused only the probes' few steps do."""

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
    (a higher prediction never predicts fewer tokens, nor more than it says). Before ``min_steps`` drafted steps,
    the prediction stands."""

    def __init__(self, *, half_life: float = 32.0, min_steps: int = 4, shrink: float = 0.5) -> None:
        if min_steps < 1 or not shrink > 0:
            raise ValueError(f"RealizedTokens: bad settings min_steps={min_steps}, shrink={shrink}")
        super().__init__(half_life, 5)  # w, Σwx, Σwy, Σwx², Σwxy
        self.min_steps = min_steps
        self.shrink = shrink

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

    def expected(self, predicted: float) -> float:
        if self.steps < self.min_steps:
            return predicted
        x_mean, y_mean, slope = self.line()
        return max(1.0, y_mean + slope * (predicted - x_mean))  # a step commits at least its anchor


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
        probe_share: float = 0.02,
        max_probe_interval: int = 4096,
        refresh_close_every: int = 32,
        close_margin: float = 0.25,
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
        self._drafting_spell = 0  # "pays" steps since the last resume
        self.paused = False
        self.probe_interval = probe_min
        self._skipped_since_probe = 0
        self._drafted_since_skip = 0
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
        self.draft_seconds = RealizedSeconds()
        self.skip_seconds = RealizedSeconds()
        self.draft_seconds_by_load: dict[int, RealizedSeconds] = {}
        self.skip_seconds_by_load: dict[int, RealizedSeconds] = {}

    # ------------------------------------------------------------------ decision

    def decide(
        self,
        *,
        lagged_survival: Optional[torch.Tensor],
        cost_with_draft: Optional[StepCostModel],
        seconds_without_draft: Optional[float],
        skip_samples: int = 0,
        num_requests: Optional[int] = None,
    ) -> GateDecision:
        step = self.decisions
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
        if not self.paused:
            return GateDecision(False, "pause", choice)
        if self._skipped_since_probe >= max(self.probe_interval, self.cost_bounded_interval(choice)):
            return GateDecision(True, "probe", choice)
        return GateDecision(False, "pause", choice)

    def refresh_interval(self, draft_rate: float, skip_rate: float) -> int:
        """Drafted steps between two plain steps that re-measure the skipped-step cost (module docstring)."""
        if skip_rate > 0 and draft_rate < (1.0 + self.close_margin) * skip_rate:
            return min(self.refresh_close_every, self.refresh_skip_every)
        return self.refresh_skip_every

    @staticmethod
    def _load_factor(pooled: RealizedSeconds, by_load: dict[int, RealizedSeconds], num_requests: int) -> float:
        """The seconds ratio of R's bucket once it has its own few steps, else the pooled one."""
        own = by_load.get(load_bucket(num_requests))
        return own.factor if own is not None and own.steps >= own.min_steps else pooled.factor

    def corrected_draft_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        """Θ'(draft): the prediction's committed tokens read through the fit, its seconds through the ratio."""
        if not (choice.seconds_draft > 0 and math.isfinite(choice.seconds_draft)) or num_requests <= 0:
            return choice.theta_draft
        per_request = self.expected_tokens(choice, num_requests)
        factor = self._load_factor(self.draft_seconds, self.draft_seconds_by_load, num_requests)
        return num_requests * per_request / (factor * choice.seconds_draft)

    def expected_tokens(self, choice: DraftChoice, num_requests: int) -> float:
        """E[committed tokens per request | the choice's prediction]: the fit of R's bucket, else the pooled one,
        at most the anchor plus the verified drafts per request."""
        fit = self.realized_tokens_by_load.get(load_bucket(num_requests))
        if fit is None or fit.steps < fit.min_steps:
            fit = self.realized_tokens
        expected = fit.expected(choice.tokens_draft / num_requests)
        return min(expected, 1.0 + choice.capacity / num_requests)

    def corrected_skip_throughput(self, choice: DraftChoice, num_requests: int) -> float:
        if not (choice.seconds_skip > 0 and math.isfinite(choice.seconds_skip)) or num_requests <= 0:
            return choice.theta_skip
        factor = self._load_factor(self.skip_seconds, self.skip_seconds_by_load, num_requests)
        return num_requests / (factor * choice.seconds_skip)

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
                    half_life=self.realized_tokens.half_life, min_steps=self.realized_tokens.min_steps,
                    shrink=self.realized_tokens.shrink)
            self.realized_tokens_by_load[bucket].observe(predicted, realized)
            self._observe_seconds(self.draft_seconds, self.draft_seconds_by_load, num_requests,
                                  choice.seconds_draft, float(seconds))
        else:
            self._observe_seconds(self.skip_seconds, self.skip_seconds_by_load, num_requests,
                                  choice.seconds_skip, float(seconds))

    @staticmethod
    def _observe_seconds(pooled: RealizedSeconds, by_load: dict[int, RealizedSeconds], num_requests: int,
                         predicted: float, seconds: float) -> None:
        pooled.observe(predicted, seconds)
        bucket = load_bucket(num_requests)
        if bucket not in by_load:
            by_load[bucket] = RealizedSeconds(half_life=pooled.half_life, min_steps=pooled.min_steps,
                                              max_stall=pooled.max_stall, bounds=pooled.bounds)
        by_load[bucket].observe(predicted, seconds)

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
            "draft_seconds_factor": round(self._load_factor(self.draft_seconds, self.draft_seconds_by_load,
                                                            num_requests), 4),
            "plain_seconds_factor": round(self._load_factor(self.skip_seconds, self.skip_seconds_by_load,
                                                            num_requests), 4),
        }

    def cost_bounded_interval(self, choice: Optional[DraftChoice]) -> int:
        """Skipped steps per probe that keep the probes' extra cost within ``probe_share`` of the time."""
        if choice is None or not (choice.seconds_skip > 0) or not math.isfinite(choice.seconds_skip):
            return 0
        extra = choice.seconds_draft - choice.seconds_skip
        if not extra > 0:
            return 0
        steps = extra / (self.probe_share * choice.seconds_skip)
        return int(min(math.ceil(steps), self.max_probe_interval))

    def _count(self, decision: GateDecision) -> None:
        self.decisions += 1
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        if decision.draft:
            self.drafted += 1
            self._drafted_since_skip += 1
        else:
            self.skipped += 1
            self._drafted_since_skip = 0
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
            "reasons": dict(self.reasons),
            "realized_vs_predicted": self._realized_summary(),
        }
