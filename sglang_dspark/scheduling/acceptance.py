"""What the draft's proposals realize, learned while serving (pure torch): the inputs of the draft gate and the
capacity search that describe acceptance rather than cost.

* :class:`SurvivalPrior`: the population's recent survival curve, for requests with no lagged confidence of their own;
* :class:`RealizedTokens`: committed tokens per request of drafted steps against their prediction, a forgetting line;
  :class:`TokensByLoad` keeps it pooled and per power-of-two bucket of R (what a step commits depends on the load);
* :class:`RealizedSeconds`: measured ÷ predicted seconds of one kind of step (a diagnostic, not a decision input).

Why each is shaped so: ``docs/scheduling.md``, "Why each rule exists".
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sglang_dspark.profiler.step_overhead import load_bucket

__all__ = ["RealizedSeconds", "RealizedTokens", "SurvivalPrior", "TokensByLoad", "sanitize_survival"]


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
    the prior is the prediction itself (``y = x``) for the pooled fit, the pooled fit for a load bucket's: the first
    few drafted steps never decide alone."""

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


class TokensByLoad:
    """:class:`RealizedTokens` pooled over every drafted step and per load bucket (a bucket's fit starts from the
    pooled one): ``expected(predicted, R)`` is E[committed tokens per request | prediction] at load R."""

    def __init__(self) -> None:
        self.pooled = RealizedTokens()
        self.by_load: dict[int, RealizedTokens] = {}

    def expected(self, predicted: float, num_requests: int) -> float:
        expected = self.pooled.expected(predicted)
        fit = self.by_load.get(load_bucket(num_requests))
        return fit.expected(predicted, prior=expected) if fit is not None else expected

    def observe(self, predicted: float, realized: float, num_requests: int) -> None:
        self.pooled.observe(predicted, realized)
        bucket = load_bucket(num_requests)
        if bucket not in self.by_load:
            pooled = self.pooled
            self.by_load[bucket] = RealizedTokens(half_life=pooled.half_life, shrink=pooled.shrink,
                                                  prior_steps=pooled.prior_steps)
        self.by_load[bucket].observe(predicted, realized)
