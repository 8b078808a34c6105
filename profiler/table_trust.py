"""When an SPS table can be trusted: not cached if profiled on a busy machine; corrected online if steps disagree.

Two failure modes of a start-up profile, and what we do about them:

* **Profiled while the machine was busy** (other processes on the cores, another job on the device): the probes are
  slow and noisy, and caching them would mis-schedule every later start. Before a freshly profiled table is stored
  we check (a) on the CPU, how much CPU time OTHER processes used during the profiling window (machine busy time
  from ``/proc/stat`` minus this process's CPU time, as a share of the machine; ``os.getloadavg`` where there is no
  ``/proc/stat``), and (b) everywhere, that the smallest probe re-measured after profiling agrees with its profiled
  time. If either fails, the table serves this run but is not cached (one log line), so a later start profiles
  again.
* **A table that disagrees with the steps actually served** (a cache from a busier or different moment): a decode
  step always contains its verify forward, so a step measured FASTER than the table's verify alone says the table
  is too slow. :class:`TableAgreement` watches ``measured step / table verify`` and, when its running median stays
  below ``1 − tolerance``, scales the table's verify times by that ratio online (one log line; the additive overhead
  learned on top stays as it is). A table too FAST needs no scale: the learned additive overhead absorbs it.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections import deque
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# Load beyond our own process that makes a CPU profile untrustworthy, as a share of the usable cores.
BUSY_LOAD_SHARE = 0.5
# Re-measured smallest probe vs its profiled time: tolerated relative difference.
REMEASURE_TOLERANCE = 0.3


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def host_busy_reason(
    *, own_threads: int, load: Optional[float] = None, cores: Optional[int] = None
) -> Optional[str]:
    """Why the host is too busy for a CPU profile to be cached (None: it is quiet enough).

    ``own_threads``: the threads this process ran the probes with (they count in the load average themselves)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    cores = usable_cores() if cores is None else cores
    others = load - min(own_threads, cores)
    if others > BUSY_LOAD_SHARE * cores:
        return f"host load {load:.1f} on {cores} cores ({others:.1f} beyond this process)"
    return None


def _machine_busy_seconds() -> Optional[float]:
    """CPU seconds all processes of the machine spent busy since boot (``/proc/stat``), None where unavailable."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + ticks[4]
        return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class ContentionWindow:
    """Measures, over a window, the share of the machine's CPU capacity used by processes other than this one."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._own = time.process_time()  # every thread of this process
        self._busy = _machine_busy_seconds()

    def others_share(self) -> Optional[float]:
        busy = _machine_busy_seconds()
        wall = time.monotonic() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return None
        others = max(0.0, (busy - self._busy) - (time.process_time() - self._own))
        return others / (wall * (os.cpu_count() or 1))

    def busy_reason(self, *, own_threads: int) -> Optional[str]:
        share = self.others_share()
        if share is None:
            return host_busy_reason(own_threads=own_threads)
        if share > BUSY_LOAD_SHARE:
            return f"other processes used {share:.0%} of the machine's CPU time while the table was profiled"
        return None


def remeasure_disagreement(profiled_seconds: float, remeasured: list[float]) -> Optional[str]:
    """Why a re-measured probe disagrees with the profile (None: it agrees within ``REMEASURE_TOLERANCE``)."""
    if not remeasured:
        return None
    again = statistics.median(remeasured)
    if profiled_seconds <= 0 or not math.isfinite(again):
        return None
    ratio = again / profiled_seconds
    if abs(ratio - 1.0) > REMEASURE_TOLERANCE:
        return f"the smallest probe re-measured at {ratio:.2f}x its profiled time"
    return None


def cache_refusal(table, measure: Optional[Callable[[int, int], float]], *, device: str, own_threads: int,
                  window: Optional[ContentionWindow] = None) -> Optional[str]:
    """Why this freshly profiled table must not be cached (None: cache it). ``measure`` may be None (under TP);
    ``window`` (opened when profiling started) measures CPU contention over the profile, else the load average."""
    if str(device).startswith("cpu"):
        if window is not None:
            reason = window.busy_reason(own_threads=own_threads)
        else:
            reason = host_busy_reason(own_threads=own_threads)
        if reason is not None:
            return reason
    if measure is not None:
        raw = table.raw_probe_seconds()
        r = min(raw)
        b = min(raw[r])
        return remeasure_disagreement(raw[r][b], [float(measure(r, b)) for _ in range(2)])
    return None


class TableAgreement:
    """Online check of a table against measured decode steps; yields the verify scale to apply (1.0: none)."""

    def __init__(self, *, tolerance: float = 0.2, window: int = 32, min_steps: int = 32, source: str = "") -> None:
        self.tolerance = tolerance
        self.min_steps = min_steps
        self.source = source
        self.scale = 1.0
        self._ratios: deque[float] = deque(maxlen=window)
        self.steps = 0
        self.corrections = 0

    def observe(self, measured_seconds: float, table_verify_seconds: float) -> bool:
        """One decode step; True when the scale changed (the caller's cost model reads ``scale``)."""
        if not (measured_seconds > 0 and table_verify_seconds > 0) or not math.isfinite(measured_seconds):
            return False
        self._ratios.append(measured_seconds / (table_verify_seconds * self.scale))
        self.steps += 1
        if self.steps < self.min_steps or len(self._ratios) < self._ratios.maxlen:
            return False
        ratio = statistics.median(self._ratios)
        if ratio >= 1.0 - self.tolerance:
            return False
        # Whole steps are faster than the table's verify alone: the table is too slow by at least this factor.
        previous = self.scale
        self.scale = previous * ratio
        self.corrections += 1
        self._ratios.clear()
        logger.warning(
            "sglang-dspark: the SPS table%s disagrees with the decode steps served (a whole step takes %.2fx the "
            "table's verify forward alone): scaling its verify times by %.3f online (was %.3f)",
            f" ({self.source})" if self.source else "", ratio, self.scale, previous,
        )
        return True

    def summary(self) -> dict:
        return {"verify_scale": self.scale, "corrections": self.corrections, "steps_checked": self.steps}
