"""What giving up SGLang's overlap costs a decode step: the device's idle gap before it (step-cost model; issue #46).

Under the overlap scheduler the host processes step i's result while the device runs step i+1; a batch that waits
for that result first (``patches/lookup_current_tokens.py``) leaves the device idle for the host's result processing
and launch. The step's own time (``StepRecord.seconds``) starts at its forward and cannot see it; the gap between the
previous decode step's end and this one's start can (``StepRecord.gap_seconds``: device events on a GPU, the host
clock on the CPU). Per load bucket, the cost is the mean gap of steps that waited minus that of steps that kept the
overlap, once each has ``gap_min_samples``; before that, the prior: 0 where the device is the host (the CPU runs the
forward on the host either way), and on a device ``gap_prior_seconds`` plus ``gap_prior_seconds_per_request`` per
request (by reading SGLang's result processing and launch path, not measured: a stated guess the first timed steps
replace). The knobs are ``lookup/config.LookupConfig``'s.
"""

from __future__ import annotations

from typing import Optional

from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.profiler.step_overhead import load_bucket

__all__ = ["OverlapGap"]


class _Mean:
    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.count, self.value = 0, 0.0

    def add(self, x: float, rate: float) -> None:
        self.count += 1
        self.value = x if self.count == 1 else self.value + max(rate, 1.0 / self.count) * (x - self.value)


class OverlapGap:
    def __init__(self, *, on_host: bool, config: LookupConfig = DEFAULT) -> None:
        """``on_host``: the model runs on the host (the CPU): the wait costs no device time."""
        self.on_host = bool(on_host)
        self.config = config
        self._waited: dict[int, _Mean] = {}
        self._kept: dict[int, _Mean] = {}

    def prior(self, num_requests: int) -> float:
        if self.on_host:
            return 0.0
        return self.config.gap_prior_seconds + self.config.gap_prior_seconds_per_request * num_requests

    def seconds(self, num_requests: int) -> float:
        """The device time a batch of ``num_requests`` loses by waiting for the previous result (>= 0)."""
        bucket = load_bucket(num_requests)
        waited, kept = self._waited.get(bucket), self._kept.get(bucket)
        if waited is None or kept is None or min(waited.count, kept.count) < self.config.gap_min_samples:
            return self.prior(num_requests)
        return max(0.0, waited.value - kept.value)

    def observe(self, num_requests: int, gap_seconds: Optional[float], overlap_given_up: bool) -> None:
        """One decode step's gap before it (None: not timed, e.g. another kind of step ran in between)."""
        if gap_seconds is None or gap_seconds < 0.0:
            return
        means = self._waited if overlap_given_up else self._kept
        means.setdefault(load_bucket(num_requests), _Mean()).add(float(gap_seconds), self.config.gap_rate)

    def summary(self) -> dict:
        """Per load bucket: the gap cost in ms and whether it is learned or the prior."""
        buckets = sorted(set(self._waited) | set(self._kept))
        out = {}
        for bucket in buckets:
            waited, kept = self._waited.get(bucket), self._kept.get(bucket)
            learned = (waited is not None and kept is not None
                       and min(waited.count, kept.count) >= self.config.gap_min_samples)
            out[bucket] = {"ms": round(1e3 * self.seconds(bucket), 3), "learned": learned,
                           "samples": [waited.count if waited else 0, kept.count if kept else 0]}
        return out
