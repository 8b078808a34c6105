"""Which (R, B) points to time at start-up, and how to turn timings into an :class:`SpsTable`.

Grid. Request counts ``R``: 1, 2, 4, ... below ``R_max``, then ``R_max`` (thinned geometrically if that is too many
rows). Per row, verify tokens ``B = R + k`` with ``k`` draft tokens from 0 to ``R·γ``: ``k = 0`` plus points spaced
geometrically in ``1..R·γ``, denser at small ``k``, where admission usually decides (the first few draft tokens of a
batch are the ones that may be "free"). The total stays ≤ ``max_probes`` (default 40): e.g. ``R_max = 48, γ = 7``
gives 7 rows x 5 = 35 probes. With the default 1 warm-up + 3 timed forwards per probe that is 140 forwards, a few
seconds for a tiny model on 2 CPU cores (the upstream profiler instead restarts a server and sweeps over HTTP).

CUDA graphs (``token_tiers`` given). Under compact ragged verify SGLang's decode graph runner has graphs only for
token tiers ``T = bs·(γ+1)``, ``bs`` in its capture list, each with ``S(T) = min(T, max_bs)`` request slots
(``srt/model_executor/runner/decode_cuda_graph_runner.py:699-702, 789-794``), and it asserts that a batch's layout
names exactly the tier it rounds to (``:1608-1614``); an arbitrary ``B`` (say 1, or 12) is not a shape it runs. So
the plan probes only shapes the engine replays: ``B`` is a tier, ``R ≤ max_bs``, and per row the tiers from
``round_up(R)`` (every request verifies at least its anchor) to ``round_up(R·(γ+1))`` (every request verifies its
whole block; that tier may exceed ``R·(γ+1)``: e.g. ``R = 9, γ = 7`` runs 72 tokens in tier 80). The step cost
is then a step function of the tier, and the table rounds its lookups the same way (``SpsTable(token_tiers=...)``).
Request counts above ``max_bs`` run eager in SGLang and are extrapolated. With the default 40 probes and ``γ = 7``
the small rows get every tier they can reach (``R = 1``: tier 8 only; ``R = 4``: 8..32) and the large rows share
the rest, spaced geometrically (denser near the anchor-only tier).

Measurer contract. ``measure(R, B)`` runs ONE target verify forward of ``R`` requests, each already holding
``plan.context_tokens`` tokens of context, verifying ``plan.probe_verify_lens(R, B)`` tokens each (that is
``split_verify_tokens(R, B, γ + 1)``; under graphs ``min(B, R·(γ+1))`` real tokens, which the runner pads to tier
``B``: build the layout with ``grid=plan.token_tiers``, its ``graph_num_tokens`` is then ``B``), and returns its
wall-clock seconds (synchronise the device before reading the clock). :func:`build_table` does the warm-up and
takes the median of the repeats, so the measurer stays a plain "time one forward".
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from tqdm import tqdm

from sglang_dspark.profiler.sps_table import SpsTable, round_up_to_tier

__all__ = [
    "ProbePlan",
    "ProfilingSchedule",
    "build_table",
    "fit_schedule_to_budget",
    "graph_token_tiers",
    "make_probe_plan",
    "round_up_to_tier",
    "split_verify_tokens",
]

logger = logging.getLogger(__name__)

# Fewer than this many B points per row cannot show where the curve bends (flat start, then linear).
_MIN_POINTS_PER_ROW = 3


@dataclass(frozen=True)
class ProbePlan:
    """The probe grid: ``rows[i] = (R, (B, ...))``, plus what the measurer needs to set each probe up.

    ``token_tiers`` / ``max_slots``: the CUDA-graph tiers and largest captured batch size the grid was made for
    (``None``: eager, any shape runs).
    """

    gamma: int
    context_tokens: int
    rows: tuple[tuple[int, tuple[int, ...]], ...]
    token_tiers: Optional[tuple[int, ...]] = None
    max_slots: Optional[int] = None

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

    def probe_verify_lens(self, num_requests: int, verify_tokens: int) -> list[int]:
        """Per-request verify lengths of probe ``(R, B)``. Eager: ``B`` tokens. Graphs: ``min(B, R·(γ+1))`` real
        tokens; laid out with ``grid=token_tiers`` they round up to tier ``B``, which the runner replays."""
        real = verify_tokens if self.token_tiers is None else min(verify_tokens, num_requests * (self.gamma + 1))
        return split_verify_tokens(num_requests, real, self.gamma + 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; also the probe-grid part of the cache key (so the tiers are part of the key too)."""
        data: dict[str, Any] = {
            "gamma": self.gamma,
            "context_tokens": self.context_tokens,
            "rows": [[r, list(bs)] for r, bs in self.rows],
        }
        if self.token_tiers is not None:  # eager plans keep their old dict (and cache key)
            data["token_tiers"] = list(self.token_tiers)
            data["max_slots"] = self.max_slots
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProbePlan":
        tiers = data.get("token_tiers")
        return cls(
            gamma=int(data["gamma"]),
            context_tokens=int(data["context_tokens"]),
            rows=tuple((int(r), tuple(int(b) for b in bs)) for r, bs in data["rows"]),
            token_tiers=None if tiers is None else tuple(int(t) for t in tiers),
            max_slots=None if data.get("max_slots") is None else int(data["max_slots"]),
        )


@dataclass(frozen=True)
class ProfilingSchedule:
    """What start-up profiling runs: the grid, and per probe ``warmup`` discarded + ``repeats`` timed forwards."""

    plan: ProbePlan
    repeats: int = 3
    warmup: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "repeats": self.repeats, "warmup": self.warmup}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfilingSchedule":
        return cls(ProbePlan.from_dict(data["plan"]), int(data["repeats"]), int(data["warmup"]))


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


def _row_tiers(num_requests: int, gamma: int, tiers: tuple[int, ...]) -> tuple[int, ...]:
    """Every tier ``R`` requests can replay: ``round_up(R)`` .. ``round_up(R·(γ+1))`` (capped at the largest)."""
    first = bisect.bisect_left(tiers, num_requests)
    last = min(bisect.bisect_left(tiers, num_requests * (gamma + 1)), len(tiers) - 1)
    return tiers[first : last + 1]


def _pick_tiers(candidates: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``count`` of ``candidates`` (all if that many): both ends, then token counts spaced geometrically (denser near
    the anchor-only tier, like the eager grid) rounded up to a candidate; collisions (several targets inside one
    tier) are filled at the middle of the widest remaining index gap."""
    if count >= len(candidates):
        return candidates
    picked = {bisect.bisect_left(candidates, t) for t in _geometric_ints(candidates[0], candidates[-1], count)}
    while len(picked) < count:
        ordered = sorted(picked)
        lo, hi = max(zip(ordered, ordered[1:]), key=lambda gap: (gap[1] - gap[0], -gap[0]))
        picked.add((lo + hi) // 2)
    return tuple(candidates[i] for i in sorted(picked))


def _tier_rows(request_grid: list[int], gamma: int, tiers: tuple[int, ...], max_probes: int):
    """Rows of tier probes within ``max_probes``: rows with few reachable tiers take all of them, the rest of the
    budget is shared evenly by the larger rows (never below ``_MIN_POINTS_PER_ROW`` each)."""
    candidates = {r: _row_tiers(r, gamma, tiers) for r in request_grid}
    counts: dict[int, int] = {}
    remaining, left = max_probes, len(request_grid)
    for r in sorted(request_grid, key=lambda r: (len(candidates[r]), r)):
        counts[r] = min(len(candidates[r]), max(_MIN_POINTS_PER_ROW, remaining // left))
        remaining, left = remaining - counts[r], left - 1
    return tuple((r, _pick_tiers(candidates[r], counts[r])) for r in request_grid)


def _check_tiers(token_tiers: Sequence[int], max_slots: Optional[int], gamma: int) -> tuple[tuple[int, ...], int]:
    tiers = tuple(sorted({int(t) for t in token_tiers}))
    if not tiers or tiers[0] < 1:
        raise ValueError(f"token_tiers must be non-empty and positive, got {list(token_tiers)}")
    if max_slots is None:
        # SGLang's tiers are bs·(γ+1) and its largest one is max_bs·(γ+1) (decode_cuda_graph_runner.py:699-702).
        max_slots = max(1, tiers[-1] // (gamma + 1))
    if int(max_slots) < 1:
        raise ValueError(f"max_slots must be >= 1, got {max_slots}")
    # S(T) = min(T, max_bs) <= the largest tier: no more requests than that ever share a graph.
    return tiers, min(int(max_slots), tiers[-1])


def make_probe_plan(
    max_requests: int,
    gamma: int,
    max_total_tokens: int,
    *,
    context_tokens: int = 256,
    max_probes: int = 40,
    token_tiers: Optional[Sequence[int]] = None,
    max_slots: Optional[int] = None,
) -> ProbePlan:
    """The probe grid for a server with ``max_requests`` running requests, block size ``γ`` and a KV pool of
    ``max_total_tokens``.

    Every probe must fit the pool: ``R·(context + γ + 1) ≤ max_total_tokens``. The context is shortened first (to
    no less than one token); only if that is not enough is ``R_max`` lowered (with a warning: larger R are then
    extrapolated).

    ``token_tiers`` (CUDA graphs on: the graph runner's ``capture_num_tokens``) and ``max_slots`` (its ``max_bs``;
    default ``token_tiers[-1] // (γ+1)``): probe only the shapes the graphs run, see the module docstring. ``None``:
    the eager grid.
    """
    if max_requests < 1 or gamma < 1 or context_tokens < 1:
        raise ValueError(
            f"need max_requests, gamma and context_tokens >= 1, got {max_requests}, {gamma}, {context_tokens}"
        )
    if max_probes < 2 * _MIN_POINTS_PER_ROW:
        raise ValueError(f"max_probes must be >= {2 * _MIN_POINTS_PER_ROW}, got {max_probes}")
    verify_len = gamma + 1
    tiers: Optional[tuple[int, ...]] = None
    if token_tiers is not None:
        tiers, max_slots = _check_tiers(token_tiers, max_slots, gamma)
        if max_requests > max_slots:
            logger.info(
                "SPS probe plan: CUDA graphs hold at most %d requests; R in %d..%d run eager and are extrapolated",
                max_slots, max_slots + 1, max_requests,
            )
            max_requests = max_slots
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
    if tiers is not None:
        rows = _tier_rows(request_grid, gamma, tiers, max_probes)
        return ProbePlan(gamma, context_tokens, rows, token_tiers=tiers, max_slots=max_slots)
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
        token_tiers=plan.token_tiers,
        max_slots=plan.max_slots,
    )


def fit_schedule_to_budget(
    measure: Callable[[int, int], float],
    make_plan: Callable[[int], ProbePlan],
    budget_seconds: float,
    *,
    max_probes: int = 40,
    min_probes: int = 8,
) -> ProfilingSchedule:
    """The schedule (plan, repeats, warm-up) whose estimated profiling time fits ``budget_seconds``.

    ``make_plan(max_probes)`` builds a grid of at most that many probes (``make_probe_plan`` with the server's
    settings, tiers included, so a thinner grid is still runnable under graphs). Start-up must stay short (target:
    under 10 % of server start-up); the three calibration forwards are charged to the budget. The cost of a probe
    is estimated from two measured ones (smallest and largest verify batch, linear in B between them, after one
    discarded call for first-use allocations); then, in order, we drop repeats, drop per-probe warm-ups, and finally
    thin the grid. The table's interpolation covers what a thinner
    grid skips, and online refinement corrects it while serving.

    Under TP pass the collective measure of :func:`sglang_dspark.profiler.tp_consensus.profile_consistently`: the
    three calibration forwards then run on every rank and the estimate uses the slowest rank's times.
    """
    plan = make_plan(max_probes)
    probes = list(plan.probes())
    smallest = min(probes, key=lambda p: p[1])
    largest = max(probes, key=lambda p: p[1])
    first_call = measure(*largest)  # first-call allocations
    t_small, t_large = measure(*smallest), measure(*largest)
    span = max(1, largest[1] - smallest[1])
    # The calibration forwards are start-up time too: the grid gets what they left of the budget.
    budget_seconds = max(0.0, budget_seconds - (first_call + t_small + t_large))

    def one_pass(candidate: ProbePlan) -> float:
        return sum(t_small + (t_large - t_small) * (b - smallest[1]) / span for _, b in candidate.probes())

    for repeats, warmup in ((3, 1), (2, 0), (1, 0)):
        if one_pass(plan) * (repeats + warmup) <= budget_seconds:
            return ProfilingSchedule(plan, repeats, warmup)
    thinner, probes_left = plan, plan.num_probes
    while probes_left > min_probes:
        probes_left = max(min_probes, int(probes_left * 0.7))
        thinner = make_plan(probes_left)
        if one_pass(thinner) <= budget_seconds:
            return ProfilingSchedule(thinner, 1, 0)
    logger.warning(
        "sglang-dspark: SPS profiling needs ~%.1f s even on a minimal grid (budget %.1f s)",
        one_pass(thinner), budget_seconds,
    )
    return ProfilingSchedule(thinner, 1, 0)


def graph_token_tiers(model_runner: Any) -> tuple[Optional[tuple[int, ...]], Optional[int]]:
    """``(token_tiers, max_slots)`` of a live SGLang target ``ModelRunner`` when its verify forwards replay compact
    ragged CUDA graphs, else ``(None, None)`` (eager: any shape runs, no rounding).

    Reads what upstream's planner reads (``dspark_planner.py:747-758``, ``ragged_capture_num_tokens`` and
    ``ragged_capture_max_slots``): ``model_runner.decode_cuda_graph_runner.capture_num_tokens`` and ``.max_bs``, set
    only in ragged mode (``decode_cuda_graph_runner.py:393-405``). A backend without ragged-verify graph support
    (``attn_backend.supports_ragged_verify_graph`` False, e.g. triton) replays nothing (``:927-929``): eager too.
    Duck-typed on purpose: this module does not import SGLang.
    """
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    if runner is None or not getattr(runner, "ragged_verify_mode", False):
        return None, None
    tiers = getattr(runner, "capture_num_tokens", None)
    backend = getattr(runner, "attn_backend", None)
    if not tiers or not getattr(backend, "supports_ragged_verify_graph", False):
        return None, None
    return tuple(int(t) for t in tiers), int(runner.max_bs)
