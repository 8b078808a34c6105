"""Which (R, B) points to time at start-up, and how to turn timings into an :class:`SpsTable`.

Grid. Request counts ``R``: 1, 2, 4, ... below ``R_max``, then ``R_max`` (thinned geometrically if that is too many
rows). Per row, verify tokens ``B = R + k`` with ``k`` draft tokens from 0 to ``R·γ``: ``k = 0`` plus points spaced
geometrically in ``1..R·γ``, denser at small ``k``, where admission usually decides (the first few draft tokens of a
batch are the ones that may be "free"). The total stays ≤ ``max_probes`` (default 40): e.g. ``R_max = 48, γ = 7``
gives 7 rows x 5 = 35 probes. With the default 1 warm-up + 3 timed forwards per probe that is 140 forwards, a few
seconds for a tiny model on 2 CPU cores (the upstream profiler instead restarts a server and sweeps over HTTP).

Measurer contract. ``measure(R, B)`` runs ONE target verify forward of ``R`` requests, each already holding
``plan.context_tokens`` tokens of context, verifying ``split_verify_tokens(R, B, γ + 1)`` tokens each, and returns
its wall-clock seconds (synchronise the device before reading the clock). :func:`build_table` does the warm-up and
takes the median of the repeats, so the measurer stays a plain "time one forward".
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from tqdm import tqdm

from sglang_dspark.profiler.sps_table import SpsTable

__all__ = ["ProbePlan", "build_table", "make_probe_plan", "split_verify_tokens"]

logger = logging.getLogger(__name__)

# Fewer than this many B points per row cannot show where the curve bends (flat start, then linear).
_MIN_POINTS_PER_ROW = 3


@dataclass(frozen=True)
class ProbePlan:
    """The probe grid: ``rows[i] = (R, (B, ...))``, plus what the measurer needs to set each probe up."""

    gamma: int
    context_tokens: int
    rows: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def max_requests(self) -> int:
        return self.rows[-1][0]

    @property
    def num_probes(self) -> int:
        return sum(len(bs) for _, bs in self.rows)

    def probes(self) -> Iterator[tuple[int, int]]:
        for r, bs in self.rows:
            for b in bs:
                yield r, b

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; also the probe-grid part of the cache key."""
        return {
            "gamma": self.gamma,
            "context_tokens": self.context_tokens,
            "rows": [[r, list(bs)] for r, bs in self.rows],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProbePlan":
        return cls(
            gamma=int(data["gamma"]),
            context_tokens=int(data["context_tokens"]),
            rows=tuple((int(r), tuple(int(b) for b in bs)) for r, bs in data["rows"]),
        )


def _geometric_ints(low: int, high: int, count: int) -> list[int]:
    """``count`` integers from ``low`` to ``high`` (both included) spaced geometrically; duplicates dropped."""
    if count <= 1 or high <= low:
        return sorted({low, high})
    ratio = high / low
    return sorted({low, high} | {round(low * ratio ** (i / (count - 1))) for i in range(count)})


def _request_grid(max_requests: int, max_rows: int) -> list[int]:
    grid = [1]
    while grid[-1] * 2 < max_requests:
        grid.append(grid[-1] * 2)
    if max_requests > 1:
        grid.append(max_requests)
    if len(grid) > max_rows:
        grid = _geometric_ints(1, max_requests, max_rows)
    return grid


def _verify_grid(num_requests: int, gamma: int, points: int) -> tuple[int, ...]:
    max_draft = num_requests * gamma
    if max_draft + 1 <= points:
        drafts = list(range(max_draft + 1))
    else:
        drafts = [0] + _geometric_ints(1, max_draft, points - 1)
    return tuple(num_requests + k for k in drafts)


def make_probe_plan(
    max_requests: int,
    gamma: int,
    max_total_tokens: int,
    *,
    context_tokens: int = 256,
    max_probes: int = 40,
) -> ProbePlan:
    """The probe grid for a server with ``max_requests`` running requests, block size ``γ`` and a KV pool of
    ``max_total_tokens``.

    Every probe must fit the pool: ``R·(context + γ + 1) ≤ max_total_tokens``. The context is shortened first (to
    no less than one token); only if that is not enough is ``R_max`` lowered (with a warning: larger R are then
    extrapolated).
    """
    if max_requests < 1 or gamma < 1 or context_tokens < 1:
        raise ValueError(
            f"need max_requests, gamma and context_tokens >= 1, got {max_requests}, {gamma}, {context_tokens}"
        )
    if max_probes < 2 * _MIN_POINTS_PER_ROW:
        raise ValueError(f"max_probes must be >= {2 * _MIN_POINTS_PER_ROW}, got {max_probes}")
    verify_len = gamma + 1
    if max_total_tokens < 1 + verify_len:
        raise ValueError(f"max_total_tokens={max_total_tokens} cannot hold one request of 1 + {verify_len} tokens")
    fitting_context = max_total_tokens // max_requests - verify_len
    if fitting_context < 1:
        fitting = max_total_tokens // (1 + verify_len)
        logger.warning(
            "SPS probe plan: max_total_tokens=%d holds at most %d requests of %d tokens; probing R <= %d instead of %d",
            max_total_tokens, fitting, 1 + verify_len, fitting, max_requests,
        )
        max_requests, fitting_context = fitting, 1
    context_tokens = min(context_tokens, fitting_context)

    request_grid = _request_grid(max_requests, max_probes // _MIN_POINTS_PER_ROW)
    points = max(_MIN_POINTS_PER_ROW, max_probes // len(request_grid))
    rows = tuple((r, _verify_grid(r, gamma, points)) for r in request_grid)
    return ProbePlan(gamma=gamma, context_tokens=context_tokens, rows=rows)


def split_verify_tokens(num_requests: int, verify_tokens: int, max_verify_len: Optional[int] = None) -> list[int]:
    """Per-request verify lengths (anchor included) summing to ``verify_tokens``, as even as possible.

    Each length is in ``[1, max_verify_len]`` (``max_verify_len = γ + 1``); the longer ones come first.
    """
    if num_requests < 1 or verify_tokens < num_requests:
        raise ValueError(f"need 1 <= num_requests <= verify_tokens, got R={num_requests}, B={verify_tokens}")
    if max_verify_len is not None and verify_tokens > num_requests * max_verify_len:
        raise ValueError(f"B={verify_tokens} exceeds R·(γ+1) = {num_requests}·{max_verify_len}")
    base, longer = divmod(verify_tokens, num_requests)
    return [base + 1] * longer + [base] * (num_requests - longer)


def build_table(
    measure: Callable[[int, int], float],
    plan: ProbePlan,
    progress: bool = True,
    *,
    repeats: int = 3,
    warmup: int = 1,
    metadata: Optional[Mapping[str, Any]] = None,
) -> SpsTable:
    """Time every probe of ``plan`` with ``measure(R, B) -> seconds`` and return the (monotone) table.

    Per probe: ``warmup`` discarded calls (first-use allocation, graph capture), then the median of ``repeats``
    calls, robust to a single stall. A non-positive or non-finite timing is a bug in the measurer: raise.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    step_seconds: dict[int, dict[int, float]] = {}
    with tqdm(total=plan.num_probes, desc="Profiling SPS", unit="probe", disable=not progress) as bar:
        for r, b in plan.probes():
            for _ in range(warmup):
                measure(r, b)
            samples = [float(measure(r, b)) for _ in range(repeats)]
            if not all(math.isfinite(s) and s > 0.0 for s in samples):
                raise ValueError(f"measure({r}, {b}) returned a non-positive or non-finite time: {samples}")
            seconds = statistics.median(samples)
            step_seconds.setdefault(r, {})[b] = seconds
            bar.set_postfix(R=r, B=b, ms=f"{seconds * 1e3:.1f}")
            bar.update(1)
    return SpsTable(
        step_seconds,
        source="profiled",
        metadata={"probe_plan": plan.to_dict(), "repeats": repeats, "warmup": warmup, **(metadata or {})},
    )
