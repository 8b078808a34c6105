"""Online refinement of the step cost: the part of a decode step that is not the target verify forward.

The start-up profile times target verify forwards, SPS(R, B). A DSpark decode step also runs the draft block, the
Markov sampling loop, acceptance and bookkeeping; on small models that is most of the step, and it depends on the
number of requests R much more than on the verify tokens B. Leaving it out makes extra verify tokens look more
expensive than they are, so the scheduler admits too few. We learn it while serving, as an additive term:

    step_seconds(R, B) = verify_seconds(R, B)  [profiled table]  +  overhead(R)  [measured here]

``overhead(R)`` is, per power-of-two bucket of R, the lower quartile of (measured step − profiled verify) over the
bucket's first 1/rate steps, then an exponential moving average of it, each update moving at most
``max_step_fraction`` of the step the bucket is expected to take; logged periodically. The robust start matters: one
stalled step (a page fault, another process on the cores) as a bucket's first sample would otherwise take tens of
thousands of bounded updates to wash out, and the draft gate would read a drafted (or skipped) step as far dearer
than it is all along. A quartile, not the median: a fresh server's first decode steps stall several times in a row
(first-use allocations and weight packing can make them many times slower than a typical step), and a stall only
ever makes a step slower, so the typical step is at the low end of the sample.

With the draft gate, steps come in two kinds, drafted and plain; :class:`DraftedAndPlainOverheads` learns their
rest as one shared level plus the draft block (its docstring says why not one overhead per kind).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Optional, Union

import torch

logger = logging.getLogger(__name__)


def load_bucket(num_requests: int) -> int:
    """The power of two at or above R (R = 3 and 4 share a bucket): what is learned per load is learned per bucket."""
    return 1 << max(0, int(num_requests) - 1).bit_length()


class StepOverhead:
    def __init__(
        self,
        *,
        rate: float = 0.1,
        max_step_fraction: float = 0.25,
        log_interval_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        label: str = "step",
        signed: bool = False,
        grows_with_requests: bool = False,
        start_quantile: float = 0.25,
    ) -> None:
        if not 0.0 <= start_quantile <= 1.0:
            raise ValueError(f"start_quantile must be in [0, 1], got {start_quantile}")
        self.label = label
        # Where in its first samples a bucket starts: the lower quartile for a whole step (a stall only ever makes a
        # step slower, module docstring), the median for a difference of two steps (symmetric noise).
        self.start_quantile = start_quantile
        # A part that grows with R (a drafted step's draft block runs over every request): read for an R above every
        # learned bucket, the nearest bucket's value is scaled up by the ratio of the buckets, so a larger load is not
        # priced at a smaller one's cost (docs/scheduling.md, "Why each rule exists": probes bounded by their net cost).
        self.grows_with_requests = grows_with_requests
        # signed: the learned part may be negative, i.e. a correction of the table's level for the steps actually
        # served (a table profiled while start-up work shared the cores reads too slow; clamping at 0 would keep
        # that error, and the draft gate would compare a drafted step against a plain step that looks too slow).
        self.signed = signed
        self.rate = rate
        self.max_step_fraction = max_step_fraction
        self.log_interval_seconds = log_interval_seconds
        self._clock = clock
        self._seconds: dict[int, float] = {}
        self._samples: dict[int, int] = {}
        self._first: dict[int, list[float]] = {}  # a bucket's first 1/rate samples, while its median is the estimate
        self.updates = 0
        self._last_log = clock()

    def observe(self, num_requests: int, measured_seconds: float, verify_seconds: float) -> bool:
        if num_requests < 1 or not math.isfinite(measured_seconds) or measured_seconds <= 0:
            return False
        return self.observe_sample(num_requests, measured_seconds - max(0.0, verify_seconds), verify_seconds)

    def observe_sample(self, num_requests: int, sample: float, base_seconds: float) -> bool:
        """One sample of the learned part for R requests; ``base_seconds``: the rest of the step it belongs to (an
        update moves the estimate by at most ``max_step_fraction`` of ``base_seconds`` + the estimate)."""
        if num_requests < 1 or not math.isfinite(sample) or not math.isfinite(base_seconds):
            return False
        if not self.signed:
            sample = max(0.0, sample)
        bucket = load_bucket(num_requests)
        first = self._first.get(bucket)
        if bucket not in self._seconds or first is not None and len(first) < math.ceil(1.0 / self.rate):
            # A robust start (lower quartile or median of the first samples): stalled steps among them do not move it.
            first = self._first.setdefault(bucket, [])
            first.append(sample)
            self._seconds[bucket] = sorted(first)[int(self.start_quantile * (len(first) - 1))]
        else:
            self._first.pop(bucket, None)
            current = self._seconds[bucket]
            # Bounded by the step this bucket is expected to take, not by the measured one: one stalled step moves the
            # estimate by at most `max_step_fraction` of a typical step, where a bound on the measured step would let
            # one stall add a share of its own length that bounded updates then take many steps to wash out; a real
            # shift still converges, the bound growing with it.
            expected = max(max(0.0, base_seconds) + current, 1e-6)
            limit = self.max_step_fraction * expected
            self._seconds[bucket] = current + max(-limit, min(limit, self.rate * (sample - current)))
        self._samples[bucket] = self._samples.get(bucket, 0) + 1
        self.updates += 1
        now = self._clock()
        if now - self._last_log >= self.log_interval_seconds:
            self._last_log = now
            logger.info(
                "sglang-dspark: learned %s overhead (ms) per R bucket: %s after %d steps",
                self.label, self.summary(), self.updates,
            )
        return True

    def seconds(self, num_requests: int) -> float:
        """Overhead for R requests: the nearest learned bucket (0 before any measurement), scaled up past the largest
        learned one when it grows with R."""
        if not self._seconds:
            return 0.0
        target = load_bucket(num_requests)
        nearest = min(self._seconds, key=lambda b: (abs(math.log2(b) - math.log2(target)), b))
        seconds = self._seconds[nearest]
        if self.grows_with_requests and target > nearest and seconds > 0:
            return seconds * target / nearest
        return seconds

    def known(self, num_requests: int) -> Optional[float]:
        """The learned overhead of R's own bucket, or None when that bucket has no measurement yet."""
        return self._seconds.get(load_bucket(num_requests))

    def samples(self, num_requests: int) -> int:
        """How many steps of R's bucket were measured."""
        return self._samples.get(load_bucket(num_requests), 0)

    def summary(self) -> dict[int, float]:
        return {bucket: round(seconds * 1e3, 3) for bucket, seconds in sorted(self._seconds.items())}


class DraftedAndPlainOverheads:
    """The non-verify time of both kinds of decode step, as one level they share plus the draft block:

        plain step(R)      = verify(R, R) + level(R)
        drafted step(R, B) = verify(R, B) + level(R) + block(R)

    ``level`` is learned from every step (a drafted step's sample net of the block), ``block`` from adjacent pairs: a
    drafted and a plain step one after the other at the same R (probes, pauses, resumes and the gate's re-measuring
    steps give two each), the difference of their residuals (measured − profiled verify). Why not one overhead per
    kind, learned from that kind's steps: the kind not being run then keeps the value it had when it stopped, and a
    drafting spell tends to begin right after a few slow plain steps, a pause right after a few slow drafted steps, so
    the frozen value is the selected one, and the gate's comparison of the two ran on a stale, biased cost for as long
    as the spell lasted (docs/scheduling.md, "Why each rule exists"). Here a slow
    spell moves both kinds alike, and the gate's comparison reads the block, the one thing it decides on.

    The block starts from the median of its first pairs (a difference of two steps is symmetric noise; a stall in
    either step is an outlier either way), then moves at most ``block_step_fraction`` of the drafted step per pair:
    pairs are few, and one noisy pair must not double the block; a step that took more than ``stall_factor`` times
    its prediction is in no pair at all. Until R's bucket has ``min_pairs`` pairs, a drafted step is predicted from
    the drafted steps alone (``drafted_direct``, as before the pairs)."""

    def __init__(self, *, min_pairs: int = 3, block_rate: float = 0.2, block_step_fraction: float = 0.05,
                 stall_factor: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        if min_pairs < 1 or not stall_factor > 1:
            raise ValueError(
                f"DraftedAndPlainOverheads: bad settings min_pairs={min_pairs}, stall_factor={stall_factor}")
        self.min_pairs = min_pairs
        self.stall_factor = stall_factor
        self.level = StepOverhead(label="step level", signed=True, clock=clock)
        self.block = StepOverhead(label="draft block", signed=True, grows_with_requests=True, start_quantile=0.5,
                                  rate=block_rate, max_step_fraction=block_step_fraction, clock=clock)
        self.drafted_direct = StepOverhead(label="drafted step", signed=True, grows_with_requests=True, clock=clock)
        self.drafted = _DraftedStepOverhead(self)  # what OverheadAdjustedCost reads for a drafted step
        self.plain_steps = 0
        self._previous: Optional[tuple[int, bool, float, float]] = None  # (R, drafted, residual, verify seconds)

    def observe(self, num_requests: int, drafted: bool, measured_seconds: float, verify_seconds: float) -> bool:
        if num_requests < 1 or not math.isfinite(measured_seconds) or measured_seconds <= 0:
            return False
        verify_seconds = max(0.0, verify_seconds)
        residual = measured_seconds - verify_seconds
        # A stalled step (a page fault, another process on the cores) pairs with neither neighbour.
        rest = self.drafted_seconds(num_requests) if drafted else self.level.seconds(num_requests)
        stalled = self.plain_steps > 0 and measured_seconds > self.stall_factor * (verify_seconds + max(0.0, rest))
        previous = self._previous
        self._previous = None if stalled else (num_requests, bool(drafted), residual, verify_seconds)
        if not stalled and previous is not None and previous[0] == num_requests and previous[1] != bool(drafted):
            drafted_residual, plain_residual = (residual, previous[2]) if drafted else (previous[2], residual)
            drafted_verify = verify_seconds if drafted else previous[3]
            # Bounded by the drafted step as predicted, not as measured: either step of the pair may have stalled.
            self.block.observe_sample(num_requests, drafted_residual - plain_residual,
                                      drafted_verify + max(0.0, self.level.seconds(num_requests)))
        if drafted:
            self.drafted_direct.observe(num_requests, measured_seconds, verify_seconds)
            if self.has_block(num_requests):
                block = max(0.0, self.block.seconds(num_requests))
                self.level.observe_sample(num_requests, residual - block, verify_seconds + block)
        else:
            self.plain_steps += 1
            self.level.observe(num_requests, measured_seconds, verify_seconds)
        return True

    def has_block(self, num_requests: int) -> bool:
        """R's bucket has enough pairs for the shared form."""
        return self.block.samples(num_requests) >= self.min_pairs

    def pairs(self, num_requests: int) -> int:
        return self.block.samples(num_requests)

    def plain_seconds(self, num_requests: int) -> Optional[float]:
        """The plain step's non-verify time for R (None before any plain step was measured)."""
        return self.level.seconds(num_requests) if self.plain_steps else None

    def drafted_seconds(self, num_requests: int) -> float:
        if self.has_block(num_requests):
            return self.level.seconds(num_requests) + max(0.0, self.block.seconds(num_requests))
        return self.drafted_direct.seconds(num_requests)

    def summary(self) -> dict:
        return {"level_ms": self.level.summary(), "draft_block_ms": self.block.summary(),
                "pairs": {bucket: self.block.samples(bucket) for bucket in self.block.summary()},
                "drafted_step_ms": self.drafted_direct.summary()}


class _DraftedStepOverhead:
    """A drafted step's non-verify time, in the interface OverheadAdjustedCost reads."""

    def __init__(self, costs: DraftedAndPlainOverheads) -> None:
        self._costs = costs

    def seconds(self, num_requests: int) -> float:
        return self._costs.drafted_seconds(num_requests)


class OverheadAdjustedCost:
    """A ``StepCostModel``: SPS of the whole step = 1 / (profiled verify seconds + learned overhead)."""

    def __init__(self, table, overhead: StepOverhead) -> None:
        self.table = table
        self.overhead = overhead
        # Online correction of a table that is too slow for the steps served (profiler/table_trust.py).
        self.verify_scale = 1.0

    # A signed overhead lowers the table's level; the step never costs less than this share of the table's verify.
    MIN_SHARE_OF_TABLE = 0.1

    def verify_seconds(self, num_requests: int, verify_tokens: int) -> float:
        return self.verify_scale * self.table.step_seconds(num_requests, int(verify_tokens))

    def steps_per_second(self, num_requests: int, verify_tokens: Union[int, torch.Tensor]):
        extra = self.overhead.seconds(num_requests)
        if isinstance(verify_tokens, torch.Tensor):
            verify = self.verify_scale * self.table.step_seconds_tensor(num_requests, verify_tokens)
            return 1.0 / torch.maximum(verify + extra, self.MIN_SHARE_OF_TABLE * verify)
        verify = self.verify_seconds(num_requests, verify_tokens)
        return 1.0 / max(verify + extra, self.MIN_SHARE_OF_TABLE * verify)
