"""Refine a profiled SPS table from the step times measured while serving.

Start-up probes run with one context length and an idle machine; serving has other KV lengths, co-located prefills
and thermal drift. Each measured verify step nudges the probe cells the prediction for that ``(R, B)`` was read from:

* In log space, so a correction is a ratio: the predicted time is multiplied by ``(measured / predicted) ** rate``,
  shared among the cells by their interpolation weights (a cell that contributed 30 % moves 30 % as much).
* Bounded per update: no cell moves by more than ``max_step_fraction`` (default 2 %) per measurement, so a single
  stalled step (GC pause, page fault) cannot swing admission.
* Bounded in total: a cell stays within ``[profiled / max_drift_factor, profiled · max_drift_factor]``.
* Monotone afterwards: the table re-enforces monotonicity after every update. Each update starts from the cell's
  enforced value, not its hidden raw value, so a cell held up by its neighbours does not silently wind down and
  jump later.

Pure: ``observe(num_requests, verify_tokens, measured_seconds)`` takes numbers, no clocks or devices of its own
(the clock is injectable for the periodic log). Logs a summary at most every ``log_interval_seconds``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from sglang_dspark.profiler.sps_table import SpsTable

__all__ = ["SpsOnlineRefiner"]

logger = logging.getLogger(__name__)


class SpsOnlineRefiner:
    """Exponentially weighted, bounded, monotone refinement of ``table`` (modified in place)."""

    def __init__(
        self,
        table: SpsTable,
        *,
        rate: float = 0.1,
        max_step_fraction: float = 0.02,
        max_drift_factor: float = 2.0,
        log_interval_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        if not 0.0 < max_step_fraction < 1.0:
            raise ValueError(f"max_step_fraction must be in (0, 1), got {max_step_fraction}")
        if not max_drift_factor >= 1.0:
            raise ValueError(f"max_drift_factor must be >= 1, got {max_drift_factor}")
        self.table = table
        self.rate = rate
        self._max_log_step = math.log1p(max_step_fraction)
        self._max_log_drift = math.log(max_drift_factor)
        self.log_interval_seconds = log_interval_seconds
        self._clock = clock
        # The drift cap is measured from the table as it was handed to us (profiled or cached).
        self._profiled = {(r, b): t for r, cells in table.probe_seconds().items() for b, t in cells.items()}
        self.updates = 0
        self.rejected = 0
        self._abs_log_error_sum = 0.0
        self._updates_at_last_log = 0
        self._abs_log_error_at_last_log = 0.0
        self._last_log = clock()

    def observe(self, num_requests: int, verify_tokens: int, measured_seconds: float) -> bool:
        """Fold in one measured verify step. Returns False (and counts it) for an unusable measurement."""
        measured = float(measured_seconds)
        if not (math.isfinite(measured) and measured > 0.0) or num_requests < 1 or verify_tokens < num_requests:
            self.rejected += 1
            return False
        predicted = self.table.step_seconds(num_requests, verify_tokens)
        log_error = math.log(measured / predicted)
        updates = {}
        for (r, b), weight in self.table.interpolation_cells(num_requests, verify_tokens):
            step = max(-self._max_log_step, min(self._max_log_step, self.rate * weight * log_error))
            profiled = math.log(self._profiled[(r, b)])
            moved = math.log(self.table.cell_seconds(r, b)) + step
            updates[(r, b)] = math.exp(min(profiled + self._max_log_drift, max(profiled - self._max_log_drift, moved)))
        self.table.set_probe_seconds(updates, count_as_refinement=True)
        self.updates += 1
        self._abs_log_error_sum += abs(log_error)
        self._maybe_log()
        return True

    def max_drift(self) -> float:
        """Largest current |time / profiled - 1| over the probe cells."""
        current = self.table.probe_seconds()
        return max(abs(current[r][b] / t - 1.0) for (r, b), t in self._profiled.items())

    def stats(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "rejected": self.rejected,
            "mean_abs_error_pct": 100.0 * math.expm1(self._abs_log_error_sum / self.updates) if self.updates else 0.0,
            "max_drift_pct": 100.0 * self.max_drift(),
        }

    def _maybe_log(self) -> None:
        now = self._clock()
        if now - self._last_log < self.log_interval_seconds:
            return
        recent = self.updates - self._updates_at_last_log
        recent_error = (self._abs_log_error_sum - self._abs_log_error_at_last_log) / recent if recent else 0.0
        logger.info(
            "SPS online refinement: %d updates (%d since last report, mean |error| %.1f%%), %d rejected, "
            "max drift from profiled %.1f%%",
            self.updates, recent, 100.0 * math.expm1(recent_error), self.rejected, 100.0 * self.max_drift(),
        )
        self._last_log = now
        self._updates_at_last_log = self.updates
        self._abs_log_error_at_last_log = self._abs_log_error_sum

    def log_now(self) -> None:
        """Emit the summary immediately (e.g. at shutdown)."""
        self._last_log = -math.inf
        self._maybe_log()
