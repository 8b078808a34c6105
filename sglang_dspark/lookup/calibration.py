"""How likely each token of a lookup proposal is to be accepted, learned online (issue #39 item 1).

A lookup proposal carries no model confidence, so its acceptance is estimated from what verifies told us: the
conditional acceptance of position j (j-th proposed token, given the ones before it were accepted), per source (the
request's own context, :data:`OWN`, or the shared suffix cache, :data:`SHARED`: another request's text predicts
differently), match-length bucket and sampling class, as a Beta posterior mean ``(accepted + a) / (tried + a + b)``. The sampling class
(:func:`sampling_class`: greedy, or the temperature's band) keeps apart what the verify's rule makes different: a
greedy row accepts a token that is the target's argmax, a sampled row with probability ``p(x)``, lower the hotter it
samples; one estimate for both would over-promise to sampled rows what greedy rows got, and under-promise the
reverse. A verify of ``proposed`` tokens that accepted ``accepted`` of them says: positions 0..accepted-1 accepted,
position ``accepted`` rejected (if proposed), later positions untried. ``survival`` is the cumulative product, the
same quantity the capacity search reads for the draft, so both sources compete under one objective. :meth:`ece`
reports the expected calibration error of the estimates it handed out, against what verify then did. Positions past
the tracked ones (a chain longer than the draft's block) share one rate per bucket: its own counts over a prior of
the prior's weight centred on the last tracked position's mean, so it starts there and follows what long chains do
(a copy that ran that far tends to go on: deep positions are accepted more often than the block's last).

The scheduler plans with the mean, so its choices rest on calibrated estimates, and explores: one step with
proposals in ``explore_every`` plans with :meth:`optimistic`, the mean plus ``optimism`` posterior standard deviations
(:meth:`planning` picks). A bucket is learned only from chains that were verified, and a chain is verified only
where its estimate pays, so a mean that starts below the pay line (the Beta(1, 1) prior's 0.5 can, at a full batch)
would never be tried and never learned; the exploring steps
try it, and where it pays the mean rises above the line. Not every step optimistically: a bonus on each position
compounds along a chain, so such plans expect more than chains get and verify chains that do not pay
(docs/lookup.md). The bonus shrinks as 1/√(tries). The calibration error is scored on the mean.

The buckets, the prior, ``optimism``, ``explore_every`` and the temperature bands are ``config.LookupConfig``'s.
"""

from __future__ import annotations

import math

import torch

from sglang_dspark.lookup.config import DEFAULT, LookupConfig

GREEDY = 0
OWN, SHARED = 0, 1  # proposal sources: the request's own context, the shared suffix cache (lookup/shared_index.py)
SOURCES = 2


def sampling_class(temperature: float, top_k: int, bands: tuple[float, ...] = DEFAULT.temperature_bands) -> int:
    """A request's sampling class: :data:`GREEDY` for top-k 1 (SGLang's form of temperature 0), else 1 + the index of
    the first of the temperature ``bands`` at or above its temperature (the last class above them all)."""
    if int(top_k) == 1:
        return GREEDY
    for index, upper in enumerate(bands):
        if float(temperature) <= upper:
            return 1 + index
    return 1 + len(bands)


class LookupCalibration:
    def __init__(self, *, max_tokens: int = 16, config: LookupConfig = DEFAULT) -> None:
        """``max_tokens``: positions tracked (the step's γ; later ones read the last one's rate). ``config``: the
        buckets, prior, exploration and sampling classes (``match_buckets`` .. ``temperature_bands``)."""
        if max_tokens < 1:
            raise ValueError(f"LookupCalibration: need max_tokens >= 1, got {max_tokens}")
        self.config = config
        self.max_tokens = max_tokens
        self.accepted = torch.zeros(config.sampling_classes, SOURCES * len(config.match_buckets), max_tokens,
                                    dtype=torch.float64)
        self.tried = torch.zeros_like(self.accepted)
        # Positions past ``max_tokens`` (chains longer than the draft's block), pooled: one count per bucket.
        self.tail_accepted = torch.zeros(self.accepted.shape[:-1], dtype=torch.float64)
        self.tail_tried = torch.zeros_like(self.tail_accepted)
        self._bin_predicted = torch.zeros(config.ece_bins, dtype=torch.float64)
        self._bin_outcome = torch.zeros_like(self._bin_predicted)
        self._bin_count = torch.zeros_like(self._bin_predicted)

    def sampling_class(self, temperature: float, top_k: int) -> int:
        """A request's sampling class under this calibration's temperature bands (:func:`sampling_class`)."""
        return sampling_class(temperature, top_k, self.config.temperature_bands)

    def _bucket(self, match_len: int, source: int = OWN) -> int:
        """The source's largest bucket at or below ``match_len`` (the smallest for shorter matches)."""
        index = 0
        for i, lower in enumerate(self.config.match_buckets):
            if match_len >= lower:
                index = i
        return source * len(self.config.match_buckets) + index

    def conditional(self, match_len: int, num_tokens: int, kind: int = GREEDY, source: int = OWN) -> torch.Tensor:
        """``[num_tokens]`` P(position j accepted | positions before it accepted) for a row of sampling class
        ``kind`` proposed by ``source``: the posterior mean."""
        return self._estimate(match_len, num_tokens, 0.0, kind, source)

    def optimistic(self, match_len: int, num_tokens: int, kind: int = GREEDY, source: int = OWN) -> torch.Tensor:
        """``[num_tokens]`` the posterior mean plus ``optimism`` posterior standard deviations, at most 1."""
        return self._estimate(match_len, num_tokens, self.config.optimism, kind, source)

    def explores(self, step: int) -> bool:
        """Whether the ``step``-th planned step with proposals (from 0) explores (module docstring)."""
        return step % self.config.explore_every == 0

    def planning(self, match_len: int, num_tokens: int, kind: int = GREEDY, source: int = OWN, *,
                 explore: bool) -> torch.Tensor:
        """``[num_tokens]`` the estimate a step plans with: :meth:`optimistic` on an exploring step, else the mean."""
        return self._estimate(match_len, num_tokens, self.config.optimism if explore else 0.0, kind, source)

    def _estimate(self, match_len: int, num_tokens: int, optimism: float, kind: int, source: int) -> torch.Tensor:
        alpha, total = self._posterior(match_len, int(num_tokens), kind, source)
        estimate = alpha / total
        if optimism > 0:
            spread = torch.sqrt(estimate * (1.0 - estimate) / (total + 1.0))  # the Beta posterior's deviation
            estimate = torch.clamp(estimate + optimism * spread, max=1.0)
        return estimate

    def _posterior(self, match_len: int, num_tokens: int, kind: int, source: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha, alpha + beta)`` of each position's Beta posterior: its counts over the prior
        (``acceptance_prior``); positions past the tracked ones share the tail's counts, over a prior of the same
        weight at the last tracked position's mean."""
        k = min(num_tokens, self.max_tokens)
        row = self._bucket(match_len, source)
        a, b = self.config.acceptance_prior
        alpha = self.accepted[kind, row, :k] + a
        total = self.tried[kind, row, :k] + a + b
        if k < num_tokens:
            tail_alpha = self.tail_accepted[kind, row] + (a + b) * alpha[k - 1] / total[k - 1]
            tail_total = self.tail_tried[kind, row] + a + b
            alpha = torch.cat([alpha, tail_alpha.reshape(1).expand(num_tokens - k)])
            total = torch.cat([total, tail_total.reshape(1).expand(num_tokens - k)])
        return alpha, total

    def survival(self, match_len: int, num_tokens: int, kind: int = GREEDY, source: int = OWN) -> torch.Tensor:
        """``[num_tokens]`` P(positions 0..j all accepted)."""
        return torch.cumprod(self.conditional(match_len, num_tokens, kind, source), dim=0)

    def observe(self, match_len: int, proposed: int, accepted: int, kind: int = GREEDY, source: int = OWN) -> None:
        """A verify of ``proposed`` lookup tokens (0 <= accepted <= proposed); also scores the estimate it replaces."""
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted {accepted} out of 0..{proposed}")
        if proposed == 0:
            return
        tried = min(accepted + 1, proposed)
        predicted = self.conditional(match_len, tried, kind, source)
        outcome = torch.zeros(tried, dtype=torch.float64)
        outcome[:accepted] = 1.0
        bins = torch.clamp((predicted * len(self._bin_count)).long(), max=len(self._bin_count) - 1)
        self._bin_predicted.index_add_(0, bins, predicted)
        self._bin_outcome.index_add_(0, bins, outcome)
        self._bin_count.index_add_(0, bins, torch.ones_like(predicted))
        row, k = self._bucket(match_len, source), min(tried, self.max_tokens)
        self.tried[kind, row, :k] += 1.0
        self.accepted[kind, row, :min(accepted, k)] += 1.0
        self.tail_tried[kind, row] += max(0, tried - self.max_tokens)
        self.tail_accepted[kind, row] += max(0, accepted - self.max_tokens)

    def ece(self) -> float:
        """Expected calibration error of every estimate scored so far (NaN before any)."""
        total = float(self._bin_count.sum())
        if total == 0:
            return math.nan
        gaps = (self._bin_predicted - self._bin_outcome).abs()
        return float(gaps.sum() / total)


__all__ = ["GREEDY", "OWN", "SHARED", "SOURCES", "LookupCalibration", "sampling_class"]
