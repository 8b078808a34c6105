"""TP-consistent start-up SPS profiling: one plan, the same forwards on every rank, one byte-identical table.

Why. Under tensor parallelism every verify forward contains collectives (NCCL all-reduces) that all TP ranks must
enter the same number of times, in the same order. Profiling each rank on its own breaks that twice:

* the plan adapts to local timings (``fit_schedule_to_budget`` picks repeats, warm-ups and grid thinning from
  measured forwards), so a slower or noisier rank can pick a different number of forwards: the ranks then wait in
  different collectives and start-up hangs;
* each rank ends with its own table, hence its own admission budgets and graph tiers, while SGLang broadcasts only
  the verify lengths (``srt/speculative/dspark_components/dspark_planner.py:542``,
  ``srt/speculative/spec_tp_sync.py:135-138``) and relies on the table being the same on every rank (``:333-334``):
  ranks replay different tier graphs, which is an NCCL size mismatch or a hang. A cache file present on one node
  only (multi-node TP) has the same effect.

Protocol (every rank of ``group`` calls :func:`profile_consistently` with the same arguments):

1. **Only rank 0 reads the cache.** A hit is broadcast as the final table; the other ranks never look at their
   disk, so they cannot disagree on whether a cache exists.
2. On a miss **rank 0 drives, the others follow.** Rank 0 runs ``plan_fn`` (which may time calibration forwards,
   e.g. ``fit_schedule_to_budget``) and ``build_table`` with a *collective* measure: each call broadcasts the probe
   ``(R, B)``; every rank, rank 0 included, runs that one forward with its local ``measure``; the timings are
   all-reduced with MAX. A TP step is as slow as its slowest rank, so the max is the time the step costs, and every
   decision rank 0 makes (repeats, warm-ups, thinning, medians) is made from those reduced timings. The followers
   run exactly what they are told, in order, so all ranks run the same number of forwards by construction.
3. **Rank 0 broadcasts the table as JSON**; every rank (rank 0 too) rebuilds it from that text, so the tables are
   byte-identical (same ``to_json()``). Only rank 0 writes the cache.
4. **Failures are collective, never hangs.** A measure that raises (or returns a non-positive / non-finite time)
   on any rank is reported through the same all-reduce, and every rank raises :class:`ProfilingAborted` at that
   probe. An error on rank 0 outside a forward (planning, ``build_table``'s checks, the cache) is broadcast as an
   abort before rank 0 re-raises it.

Costs. One small broadcast and one 16-byte all-reduce on the CPU (gloo) group per forward: well under a
millisecond each, against verify forwards of milliseconds. The per-forward broadcast also starts the ranks'
forwards together, so no rank's timing includes waiting for a late peer inside an NCCL collective.

``group`` must be a CPU-capable (gloo) process group: on an SGLang server, ``get_parallel().tp_group.cpu_group``
(``srt/distributed/parallel_state.py:403-409`` creates it with backend gloo). ``group=None`` or a group of one rank
is today's single-process path, with no communication at all.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.distributed as dist

from sglang_dspark.profiler.probe_plan import ProbePlan, ProfilingSchedule, build_table
from sglang_dspark.profiler.sps_table import SpsTable

__all__ = ["ProfilingAborted", "profile_consistently"]

logger = logging.getLogger(__name__)

Measure = Callable[[int, int], float]
PlanFn = Callable[[Measure], Union[ProfilingSchedule, ProbePlan]]

# Commands rank 0 broadcasts; followers loop on them.
_MEASURE, _TABLE, _ABORT = "measure", "table", "abort"


class ProfilingAborted(RuntimeError):
    """Raised on every rank when a collective profiling run fails on any rank (no rank is left waiting)."""


def _schedule_of(planned: Union[ProfilingSchedule, ProbePlan]) -> ProfilingSchedule:
    return planned if isinstance(planned, ProfilingSchedule) else ProfilingSchedule(planned)


def _store_quietly(store: Optional[Callable[[SpsTable], Any]], table: SpsTable) -> None:
    if store is None:
        return
    try:
        store(table)
    except OSError as exc:  # a read-only home must not stop the server
        logger.warning("sglang-dspark: could not cache the SPS table (%s); it will be profiled again next start.", exc)


def profile_consistently(
    measure: Measure,
    plan_fn: PlanFn,
    group: Optional[Any] = None,
    *,
    load_cached: Optional[Callable[[], Optional[SpsTable]]] = None,
    store: Optional[Callable[[SpsTable], Any]] = None,
    progress: bool = True,
    metadata: Optional[Mapping[str, Any]] = None,
) -> SpsTable:
    """The SPS table, identical on every rank of ``group``.

    ``measure(R, B) -> seconds``: one local verify forward (the probe_plan measurer contract). ``plan_fn(measure)``
    (run on rank 0 only) returns the :class:`ProfilingSchedule` (or a bare ``ProbePlan``: 3 repeats, 1 warm-up); the
    ``measure`` it is given is collective under TP, so it may time calibration forwards. ``load_cached()`` (rank 0
    only) returns a cached table or ``None``; ``store(table)`` (rank 0 only, after profiling) writes it, an
    ``OSError`` there is a warning. ``metadata`` goes into the table, as in ``build_table``.
    """
    if group is None or dist.get_world_size(group) == 1:
        # Single process: exactly the pre-TP path (no JSON round trip, no collective).
        cached = load_cached() if load_cached is not None else None
        if cached is not None:
            return cached
        schedule = _schedule_of(plan_fn(measure))
        table = build_table(
            measure, schedule.plan, progress, repeats=schedule.repeats, warmup=schedule.warmup, metadata=metadata
        )
        _store_quietly(store, table)
        return table
    session = _Session(measure, group)
    if session.rank != 0:
        return session.follow()
    return session.drive(plan_fn, load_cached=load_cached, store=store, progress=progress, metadata=metadata)


class _Session:
    """One collective profiling run over ``group``: rank 0 drives, the other ranks follow its commands."""

    def __init__(self, measure: Measure, group: Any):
        self._measure = measure
        self._group = group
        self.rank = dist.get_rank(group)
        # torch's collectives take GLOBAL ranks as src; the TP cpu_group is a subgroup whose rank 0 need not be 0.
        self._src = dist.get_global_rank(group, 0)
        self._forwards = 0
        self._broken = False

    # ------------------------------------------------------------------ communication

    def _broadcast(self, command: Optional[tuple] = None) -> tuple:
        box = [command]
        dist.broadcast_object_list(box, src=self._src, group=self._group)
        return box[0]

    def _run_and_reduce(self, num_requests: int, verify_tokens: int) -> float:
        """Every rank: one local forward, then MAX of the seconds and of the failure flag over the group."""
        local_error: Optional[BaseException] = None
        try:
            seconds = float(self._measure(num_requests, verify_tokens))
            failed = not (math.isfinite(seconds) and seconds > 0.0)
        except Exception as exc:  # reported to every rank below; re-raised (chained) on this one
            local_error, seconds, failed = exc, 0.0, True
        self._forwards += 1
        # [seconds, 1 + rank of a failing rank (0 when none)]: one all-reduce for the timing and the verdict.
        reduced = torch.tensor(
            [0.0 if failed else seconds, float(self.rank + 1) if failed else 0.0], dtype=torch.float64
        )
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=self._group)
        if reduced[1] > 0:
            self._broken = True
            if local_error is not None:
                detail = f"raised {local_error!r} on this rank"
            elif failed:
                detail = f"returned {seconds!r} on this rank (want finite seconds > 0)"
            else:
                detail = f"failed on rank {int(reduced[1]) - 1} of the group"
            raise ProfilingAborted(
                f"SPS profiling forward {self._forwards}, measure({num_requests}, {verify_tokens}), {detail}"
            ) from local_error
        return float(reduced[0])

    # ------------------------------------------------------------------ rank 0

    def _collective_measure(self, num_requests: int, verify_tokens: int) -> float:
        if self._broken:  # a plan_fn that swallowed ProfilingAborted must not talk to ranks that already left
            raise ProfilingAborted("SPS profiling already failed on a rank; no further forwards")
        self._broadcast((_MEASURE, int(num_requests), int(verify_tokens)))
        return self._run_and_reduce(int(num_requests), int(verify_tokens))

    def drive(self, plan_fn: PlanFn, *, load_cached, store, progress: bool, metadata) -> SpsTable:
        profiled = False
        try:
            table = load_cached() if load_cached is not None else None
            if table is None:
                schedule = _schedule_of(plan_fn(self._collective_measure))
                table = build_table(
                    self._collective_measure,
                    schedule.plan,
                    progress,
                    repeats=schedule.repeats,
                    warmup=schedule.warmup,
                    metadata=metadata,
                )
                profiled = True
            text = table.to_json()
        except ProfilingAborted:
            raise  # every rank saw it in the same all-reduce and is raising it too
        except BaseException as exc:
            if not self._broken:
                self._broken = True
                try:
                    self._broadcast((_ABORT, f"{type(exc).__name__}: {exc}"))
                except Exception:  # the group itself is gone: nothing left to tell
                    logger.exception("sglang-dspark: could not tell the TP ranks that SPS profiling failed")
            raise
        self._broadcast((_TABLE, text))
        result = SpsTable.from_json(text, strict=False)
        if profiled:
            _store_quietly(store, result)
        logger.info("sglang-dspark: SPS table agreed by %d TP ranks after %d forwards each",
                    dist.get_world_size(self._group), self._forwards)
        return result

    # ------------------------------------------------------------------ ranks > 0

    def follow(self) -> SpsTable:
        while True:
            command = self._broadcast()
            kind = command[0]
            if kind == _MEASURE:
                self._run_and_reduce(command[1], command[2])
            elif kind == _TABLE:
                return SpsTable.from_json(command[1], strict=False)
            elif kind == _ABORT:
                raise ProfilingAborted(f"SPS profiling failed on TP rank 0: {command[1]}")
            else:
                raise ProfilingAborted(f"unknown SPS profiling command {command!r} from TP rank 0")
