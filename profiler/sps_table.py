"""Engine steps per second of a target verify forward, as a function of requests ``R`` and verify tokens ``B``.

DSpark admission maximises ``Θ = τ · SPS(R, B)``; ``B = Σ_r (1 + ℓ_r)`` counts every request's anchor, so
``B ≥ R``. The cost depends on both numbers (16 requests decoding one token each cost more than one request verifying
16 tokens: per-request work), so the table is 2-D: rows of probed request counts, each with step times at a few probed ``B``.

Design (what a reader needs to trust the numbers):

* **Interpolation is linear in step TIME, never in SPS.** Time is what adds up (bias + per-request + per-token
  work); linear SPS would bend the cost curve the wrong way between probes.
* **Between probed request counts** the table interpolates at a fixed mean verify length ``t = B / R``: the rows
  ``r_lo < R < r_hi`` are read at ``r_lo·t`` and ``r_hi·t``, which lie inside both rows' probed ranges whenever
  ``t ≤ γ + 1`` (no row is ever extrapolated to fill a gap between rows), and which is exact for the usual
  ``c + a·R + b·B`` cost shape.
* **Beyond a row's largest probed B** the time grows linearly with ``max(last-segment slope, mean slope of the
  row)``, so SPS keeps falling: tokens past the grid are never free, even when noise flattened the last segment.
  (A row with a single probe borrows the tail slope of the row below.)
  Below a row's smallest probed B the first probe's time is used (an upper bound, by monotonicity).
* **Beyond the largest probed R** each extra request is charged as one more request carrying only its anchor:
  ``time(R, B) = row_last(B - extra) + extra · d``, with ``d`` the per-request slope of anchor-only steps measured
  between the last two rows, and at least one token's cost (an extra request is never cheaper than an extra token).
  Below the smallest probed R, the smallest row is used (``max(B, r_0)`` tokens): an upper bound.
* **Monotone in B (enforced).** Measured noise must not create fake "free" tokens, so each row's times are
  replaced by their running maximum over B. Linear interpolation, the growing tail and the fixed-``t`` blend of two
  rows all preserve this, so ``SPS(R, ·)`` is non-increasing for every R, probed or not.
* **Monotone in R at fixed t = B/R (enforced at the probes).** ``(R', R'·t)`` with ``R' > R`` is strictly more work
  than ``(R, R·t)``: more requests and more tokens, and a superset of the KV to read. Each probe cell is raised to at
  least the next smaller row's time at the same ``t`` (read inside that row's probed range, never from its tail).
  We deliberately do NOT enforce monotonicity at fixed B: trading draft tokens for requests is not a superset of
  work, and backends legitimately run a many-request decode and a one-request verify with different kernels, so a
  table that does not rise with R at fixed B is kept as measured.
* The table keeps the raw (measured) times and derives the enforced ones from them; JSON stores the
  enforced times, so a stored file that is not monotone is corrupt by definition.
* **CUDA-graph token tiers (optional).** Under SGLang's compact ragged verify with CUDA graphs, a step of ``B``
  verify tokens replays the graph of tier ``T = round_up(B)`` (the smallest captured tier ``≥ B``, tiers
  ``bs·(γ+1)`` for the captured batch sizes), padded to ``S = min(T, max_bs)`` request slots. Its cost is a step
  function of ``T``: the padding tokens are computed too. A table built with ``token_tiers`` therefore looks every
  ``B`` up at ``round_up(B)``, exactly SGLang's rounding (:func:`round_up_to_tier`), so linear interpolation between
  tier probes can never invent a saving inside a tier. Steps the graphs do not cover (``R > max_slots`` requests, or
  ``B`` past the largest tier) run eager in SGLang and are looked up unrounded. The tiers live in the table (and its
  JSON) rather than in a cost wrapper: they describe what was measured, so a cached table can never be read with
  another rounding, and every reader (admission, the overhead-adjusted cost,
  /server_info) gets the same rounding without being told.

Immutable once built: the scheduler only reads it.
"""

from __future__ import annotations

import bisect
import datetime
import json
import math
import operator
import time
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import torch

__all__ = ["SCHEMA_VERSION", "SOURCES", "TABLE_KIND", "SpsTable", "SpsTableError", "round_up_to_tier"]

TABLE_KIND = "sglang-dspark-sps-table"
SCHEMA_VERSION = 1
SOURCES = ("profiled", "cache", "upstream-json")

# Stored tables are checked for monotonicity with this relative slack (float round trips, nothing more).
_MONOTONE_RTOL = 1e-9
# /server_info stays readable: per-row B probes are listed only for tables up to this many cells.
_SUMMARY_MAX_LISTED_CELLS = 256

VerifyTokens = Union[int, torch.Tensor]


class SpsTableError(ValueError):
    """A table, or its JSON, that is malformed, non-positive, or (when stored) not monotone."""


def _as_count(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None


def round_up_to_tier(verify_tokens: int, tiers: Sequence[int]) -> int:
    """The CUDA-graph token tier SGLang replays for ``verify_tokens``: the smallest tier ``≥ verify_tokens``.

    Same rule, same errors as SGLang's ``round_up_grid`` (``srt/speculative/ragged_verify.py:34-43``), which both the
    planner (``dspark_planner.py:454-459``) and the graph runner (``decode_cuda_graph_runner.py:1975-1979``, checked
    at ``:1608-1614``) use: ``tiers`` sorted ascending, ``ValueError`` if empty or if ``verify_tokens`` exceeds the
    largest tier (SGLang's caller must then run the step without a graph).
    """
    if not tiers:
        raise ValueError("round_up_to_tier requires a non-empty list of tiers")
    if verify_tokens > tiers[-1]:
        raise ValueError(f"verify_tokens {verify_tokens} exceeds the largest graph tier {tiers[-1]}")
    return tiers[bisect.bisect_left(tiers, verify_tokens)]


def _check_tiers(token_tiers: Any, max_slots: Any) -> tuple[tuple[int, ...], int]:
    tiers = tuple(_as_count(t, "token tier") for t in token_tiers)
    if not tiers or tiers[0] < 1 or any(a >= b for a, b in zip(tiers, tiers[1:])):
        raise SpsTableError(f"token_tiers must be non-empty, positive and strictly increasing, got {list(tiers)}")
    slots = _as_count(max_slots, "max_slots")
    if slots < 1:
        raise SpsTableError(f"max_slots must be >= 1, got {slots}")
    return tiers, slots


class _Row:
    """One probed request count: step seconds at increasing B, as measured (raw) and monotone (enforced).

    ``slopes[j]`` is the time per token after probe ``j``; the last one is the tail slope past the largest probe.
    Lookups use ``seconds[j] + (b - B_j) · slopes[j]`` in both the scalar and the tensor path, so they agree.
    """

    __slots__ = ("num_requests", "verify_tokens", "raw_seconds", "seconds", "slopes", "mean_slope", "_tensors")

    def __init__(self, num_requests: int, verify_tokens: list[int], raw_seconds: list[float]):
        self.num_requests = num_requests
        self.verify_tokens = verify_tokens
        self.raw_seconds = raw_seconds
        self.seconds = list(raw_seconds)
        self.slopes: list[float] = []
        self.mean_slope = 0.0
        self._tensors: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    @property
    def max_verify_tokens(self) -> int:
        return self.verify_tokens[-1]

    def set_enforced(self, seconds: list[float], single_probe_slope: float = 0.0) -> bool:
        """Install new enforced times and the slopes derived from them; returns whether either changed.

        A row with a single probe has no slope of its own; it borrows ``single_probe_slope`` for its tail.
        """
        bs, ts = self.verify_tokens, seconds
        slopes = [(ts[j + 1] - ts[j]) / (bs[j + 1] - bs[j]) for j in range(len(bs) - 1)]
        if slopes:
            self.mean_slope = (ts[-1] - ts[0]) / (bs[-1] - bs[0])
            slopes.append(max(slopes[-1], self.mean_slope))  # the tail never gets cheaper than the average
        else:
            self.mean_slope = 0.0
            slopes.append(max(single_probe_slope, 0.0))
        changed = seconds != self.seconds or slopes != self.slopes
        self.seconds, self.slopes, self._tensors = seconds, slopes, None
        return changed

    def seconds_at(self, b: float) -> float:
        bs = self.verify_tokens
        if b <= bs[0]:
            return self.seconds[0]
        j = bisect.bisect_right(bs, b) - 1
        return self.seconds[j] + (b - bs[j]) * self.slopes[j]

    def seconds_at_tensor(self, b: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`seconds_at`, element-wise over a float64 CPU tensor."""
        if self._tensors is None:
            self._tensors = (
                torch.tensor(self.verify_tokens, dtype=torch.float64),
                torch.tensor(self.seconds, dtype=torch.float64),
                torch.tensor(self.slopes, dtype=torch.float64),
            )
        bs, ts, slopes = self._tensors
        # Index of the last probe <= b (bucketize(right=True) - 1). Not bucketize itself: it goes multi-threaded past
        # 200 elements, and on a busy host one small OpenMP region can stall the scheduler.
        j = (b.unsqueeze(-1) >= bs).sum(dim=-1).sub_(1).clamp_(min=0)
        return ts[j] + (b.clamp(min=self.verify_tokens[0]) - bs[j]) * slopes[j]

class SpsTable:
    """Steps per second of a verify forward of ``R`` requests carrying ``B`` tokens in all (``B ≥ R``).

    ``step_seconds[R][B]`` are the measured seconds per step at the probe points. ``steps_per_second`` accepts an
    ``int`` B (returns a float) or a tensor of B of any shape (returns float64 on the tensor's device), so the
    table satisfies ``sglang_dspark.scheduling.cost_model.StepCostModel``.

    ``token_tiers`` / ``max_slots`` (both or neither): the engine's CUDA-graph token tiers and its largest captured
    batch size. With them every lookup with ``R ≤ max_slots`` and ``B ≤ token_tiers[-1]`` reads ``B`` as
    ``round_up_to_tier(B)`` (see the module docstring).
    """

    def __init__(
        self,
        step_seconds: Mapping[int, Mapping[int, float]],
        *,
        source: str = "profiled",
        created_at: Optional[float] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        token_tiers: Optional[Sequence[int]] = None,
        max_slots: Optional[int] = None,
    ):
        if source not in SOURCES:
            raise SpsTableError(f"source must be one of {SOURCES}, got {source!r}")
        if not step_seconds:
            raise SpsTableError("an SPS table needs at least one probe")
        rows = []
        for num_requests in sorted(step_seconds):
            r = _as_count(num_requests, "number of requests")
            cells = step_seconds[num_requests]
            if r < 1 or not cells:
                raise SpsTableError(f"row R={num_requests!r}: R must be >= 1 and the row must have probes")
            bs = sorted(_as_count(b, "verify tokens") for b in cells)
            if bs[0] < r:
                raise SpsTableError(f"row R={r}: verify tokens B={bs[0]} < R (every request verifies its anchor)")
            ts = [float(cells[b]) for b in bs]
            if not all(math.isfinite(t) and t > 0.0 for t in ts):
                raise SpsTableError(f"row R={r}: step seconds must be finite and > 0, got {ts}")
            rows.append(_Row(r, bs, ts))
        self._rows = rows
        self._row_requests = [row.num_requests for row in rows]
        self._row_index = {r: i for i, r in enumerate(self._row_requests)}
        self._anchor_request_seconds = 0.0
        self.source = source
        self.created_at = time.time() if created_at is None else float(created_at)
        self.metadata: dict[str, Any] = dict(metadata or {})
        if (token_tiers is None) != (max_slots is None):
            raise SpsTableError("token_tiers and max_slots go together (graph tiers and their largest batch size)")
        self.token_tiers: Optional[tuple[int, ...]] = None
        self.max_slots: Optional[int] = None
        self._tiers_tensor: Optional[torch.Tensor] = None
        if token_tiers is not None:
            self.token_tiers, self.max_slots = _check_tiers(token_tiers, max_slots)
            self._tiers_tensor = torch.tensor(self.token_tiers, dtype=torch.float64)
        self._enforce(set(range(len(rows))))

    def with_graph_tiers(self, token_tiers: Optional[Sequence[int]], max_slots: Optional[int]) -> "SpsTable":
        """A copy that rounds lookups to these tiers (``None, None``: to none), e.g. for an upstream or eager-profiled
        table served under CUDA graphs: its curve is then read at the tiers, which is the cost shape graphs have."""
        data = self.to_dict()
        data.pop("graph_tiers", None)
        if token_tiers is not None or max_slots is not None:
            data["graph_tiers"] = {"token_tiers": list(token_tiers or ()), "max_slots": max_slots}
        return SpsTable.from_dict(data, source=self.source, strict=False)

    # ------------------------------------------------------------------ monotonicity

    def _enforce(self, dirty_rows: set[int]) -> None:
        """Recompute enforced times for ``dirty_rows`` and every row above whose lower neighbour changed."""
        below_changed = False
        for i in range(min(dirty_rows), len(self._rows)):
            if i not in dirty_rows and not below_changed:
                continue
            row = self._rows[i]
            enforced, running = [], 0.0
            for t in row.raw_seconds:
                running = max(running, t)
                enforced.append(running)
            lower = self._rows[i - 1] if i > 0 else None
            if lower is not None:
                # Same mean verify length t = B/R in the smaller row, read inside its probed range only: its
                # extrapolated tail is a guess and must not raise measured cells.
                enforced = [
                    max(t, lower.seconds_at(min(lower.num_requests * b / row.num_requests, lower.max_verify_tokens)))
                    for t, b in zip(enforced, row.verify_tokens)
                ]
            below_changed = row.set_enforced(enforced, lower.slopes[-1] if lower is not None else 0.0)
        self._anchor_request_seconds = self._marginal_request_seconds()

    def _marginal_request_seconds(self) -> float:
        """Cost of one more request carrying only its anchor, for request counts past the largest row."""
        last = self._rows[-1]
        per_token = max(last.mean_slope, 0.0)
        if len(self._rows) == 1:
            return per_token
        prev = self._rows[-2]
        per_request = (last.seconds_at(last.num_requests) - prev.seconds_at(prev.num_requests)) / (
            last.num_requests - prev.num_requests
        )
        return max(per_request, per_token)

    def _violations(self) -> list[str]:
        """Probe cells whose raw time is below what monotonicity requires (used to reject stored tables)."""
        problems = []
        for row in self._rows:
            for b, raw, enforced in zip(row.verify_tokens, row.raw_seconds, row.seconds):
                if enforced > raw * (1.0 + _MONOTONE_RTOL):
                    problems.append(f"(R={row.num_requests}, B={b}): {raw!r} < required {enforced!r}")
        return problems

    # ------------------------------------------------------------------ lookups

    def _check_requests(self, num_requests: Any) -> int:
        r = _as_count(num_requests, "num_requests")
        if r < 1:
            raise ValueError(f"num_requests must be >= 1, got {r}")
        return r

    def _graph_tokens(self, num_requests: int, verify_tokens: int) -> int:
        """The B a step really computes: its graph tier when SGLang replays a graph for it, else B itself.

        SGLang replays a graph iff ``R ≤ S(T) = min(T, max_bs)`` and ``T ≤`` the largest tier
        (``decode_cuda_graph_runner.py:927-935``; the planner drops the layout otherwise,
        ``dspark_planner.py:761-777``); ``T ≥ B ≥ R`` makes the first condition ``R ≤ max_bs``.
        """
        tiers = self.token_tiers
        if tiers is None or num_requests > self.max_slots or verify_tokens > tiers[-1]:
            return verify_tokens
        return round_up_to_tier(verify_tokens, tiers)

    def _graph_tokens_tensor(self, num_requests: int, b: torch.Tensor) -> torch.Tensor:
        """:meth:`_graph_tokens` element-wise over a float64 CPU tensor (``B`` past the largest tier unchanged)."""
        tiers = self._tiers_tensor
        if tiers is None or num_requests > self.max_slots:
            return b
        # Tier index = number of tiers < b (bisect_left), by comparison and sum: no bucketize (see _Row).
        index = (b.unsqueeze(-1) > tiers).sum(dim=-1).clamp_(max=len(self.token_tiers) - 1)
        return torch.where(b <= tiers[-1], tiers[index], b)

    def step_seconds(self, num_requests: int, verify_tokens: int) -> float:
        """Predicted seconds of one verify step of ``num_requests`` requests and ``verify_tokens`` tokens."""
        r = self._check_requests(num_requests)
        b = _as_count(verify_tokens, "verify_tokens")
        if b < r:
            raise ValueError(f"verify_tokens ({b}) must be >= num_requests ({r}): each request verifies its anchor")
        b = self._graph_tokens(r, b)
        rows, rs = self._rows, self._row_requests
        if r <= rs[0]:
            return rows[0].seconds_at(max(b, rs[0]))
        if r >= rs[-1]:
            extra = r - rs[-1]
            return rows[-1].seconds_at(b - extra) + extra * self._anchor_request_seconds
        hi = bisect.bisect_right(rs, r)
        lo = hi - 1
        if rs[lo] == r:
            return rows[lo].seconds_at(b)
        weight = (r - rs[lo]) / (rs[hi] - rs[lo])
        low = rows[lo].seconds_at(rs[lo] * b / r)
        high = rows[hi].seconds_at(rs[hi] * b / r)
        return low + weight * (high - low)

    def step_seconds_tensor(self, num_requests: int, verify_tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`step_seconds` for every element of ``verify_tokens`` (any shape); float64 on its device."""
        r = self._check_requests(num_requests)
        b = verify_tokens.detach().to(device="cpu", dtype=torch.float64)
        if b.numel() and float(b.min()) < r:
            raise ValueError(f"verify_tokens must be >= num_requests ({r}), got min {float(b.min())}")
        b = self._graph_tokens_tensor(r, b)
        rows, rs = self._rows, self._row_requests
        if r <= rs[0]:
            out = rows[0].seconds_at_tensor(b.clamp(min=rs[0]))
        elif r >= rs[-1]:
            extra = r - rs[-1]
            out = rows[-1].seconds_at_tensor(b - extra) + extra * self._anchor_request_seconds
        elif r in self._row_index:
            out = rows[self._row_index[r]].seconds_at_tensor(b)
        else:
            hi = bisect.bisect_right(rs, r)
            lo = hi - 1
            weight = (r - rs[lo]) / (rs[hi] - rs[lo])
            low = rows[lo].seconds_at_tensor(rs[lo] * b / r)
            high = rows[hi].seconds_at_tensor(rs[hi] * b / r)
            out = low + weight * (high - low)
        return out.to(verify_tokens.device)

    def steps_per_second(self, num_requests: int, verify_tokens: VerifyTokens) -> Union[float, torch.Tensor]:
        """Engine steps per second at ``(R, B)``; ``B`` an int (→ float) or a tensor (→ float64 tensor)."""
        if isinstance(verify_tokens, torch.Tensor):
            return self.steps_per_second_tensor(num_requests, verify_tokens)
        return 1.0 / self.step_seconds(num_requests, verify_tokens)

    def steps_per_second_tensor(self, num_requests: int, verify_tokens: torch.Tensor) -> torch.Tensor:
        """Vectorised SPS for one R over a tensor of candidate B (what admission evaluates every step)."""
        return self.step_seconds_tensor(num_requests, verify_tokens).reciprocal()

    # ------------------------------------------------------------------ probe cells (for reports)

    @property
    def num_requests_probes(self) -> tuple[int, ...]:
        return tuple(self._row_requests)

    def verify_token_probes(self, num_requests: int) -> tuple[int, ...]:
        return tuple(self._row(num_requests).verify_tokens)

    @property
    def num_probes(self) -> int:
        return sum(len(row.verify_tokens) for row in self._rows)

    def probe_seconds(self) -> dict[int, dict[int, float]]:
        """Enforced (monotone) seconds at every probe cell: ``{R: {B: seconds}}``."""
        return {row.num_requests: dict(zip(row.verify_tokens, row.seconds)) for row in self._rows}

    def raw_probe_seconds(self) -> dict[int, dict[int, float]]:
        """Raw (measured, before enforcement) seconds at every probe cell."""
        return {row.num_requests: dict(zip(row.verify_tokens, row.raw_seconds)) for row in self._rows}

    def _row(self, num_requests: int) -> _Row:
        if num_requests not in self._row_index:
            raise KeyError(f"R={num_requests} is not a probed request count {self._row_requests}")
        return self._rows[self._row_index[num_requests]]

    def iter_probes(self) -> Iterator[tuple[int, int, float]]:
        for row in self._rows:
            for b, t in zip(row.verify_tokens, row.seconds):
                yield row.num_requests, b, t

    # ------------------------------------------------------------------ JSON and reports

    def to_dict(self) -> dict[str, Any]:
        data = {
            "kind": TABLE_KIND,
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "rows": [
                {
                    "num_requests": row.num_requests,
                    "verify_tokens": list(row.verify_tokens),
                    "step_seconds": list(row.seconds),
                }
                for row in self._rows
            ],
        }
        if self.token_tiers is not None:  # only when set: a table without tiers keeps its old JSON byte for byte
            data["graph_tiers"] = {"token_tiers": list(self.token_tiers), "max_slots": self.max_slots}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, *, source: Optional[str] = None, strict: bool = True) -> "SpsTable":
        """Rebuild a table written by :meth:`to_dict`.

        ``strict`` (the default) rejects stored times that are not already monotone: we only ever write enforced
        times, so such a file was edited or damaged. ``source`` overrides the stored one (e.g. ``"cache"``).
        """
        if not isinstance(data, Mapping) or data.get("kind") != TABLE_KIND:
            raise SpsTableError(f"not an SPS table (kind must be {TABLE_KIND!r})")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise SpsTableError(
                f"unsupported SPS table schema_version {data.get('schema_version')!r} (want {SCHEMA_VERSION})"
            )
        try:
            step_seconds: dict[int, dict[int, float]] = {}
            for row in data["rows"]:
                r = _as_count(row["num_requests"], "num_requests")
                bs, ts = row["verify_tokens"], row["step_seconds"]
                if r in step_seconds or len(bs) != len(ts) or len(set(bs)) != len(bs):
                    raise SpsTableError(f"row R={r}: duplicate row, duplicate B, or mismatched lengths")
                if any(isinstance(t, bool) or not isinstance(t, (int, float)) for t in ts):
                    raise SpsTableError(f"row R={r}: step_seconds must be numbers")
                step_seconds[r] = {_as_count(b, "verify tokens"): float(t) for b, t in zip(bs, ts)}
            metadata = data.get("metadata") or {}
            if not isinstance(metadata, Mapping):
                raise SpsTableError("metadata must be an object")
            graph_tiers = data.get("graph_tiers") or {}
            if not isinstance(graph_tiers, Mapping):
                raise SpsTableError("graph_tiers must be an object")
            table = cls(
                step_seconds,
                source=source or data.get("source", "profiled"),
                created_at=float(data["created_at"]),
                metadata=metadata,
                token_tiers=graph_tiers.get("token_tiers"),
                max_slots=graph_tiers.get("max_slots"),
            )
        except SpsTableError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SpsTableError(f"malformed SPS table: {exc!r}") from exc
        if strict:
            problems = table._violations()
            if problems:
                raise SpsTableError(f"stored SPS table is not monotone at {len(problems)} cell(s): {problems[:3]}")
        return table

    @classmethod
    def from_json(cls, text: str, *, source: Optional[str] = None, strict: bool = True) -> "SpsTable":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpsTableError(f"SPS table is not valid JSON: {exc}") from exc
        return cls.from_dict(data, source=source, strict=strict)

    def summary(self, *, now: Optional[float] = None) -> dict[str, Any]:
        """A JSON-ready description for /server_info."""
        now = time.time() if now is None else now
        seconds = [t for _, _, t in self.iter_probes()]
        grid: dict[str, Any] = {"num_requests": list(self._row_requests)}
        if self.num_probes <= _SUMMARY_MAX_LISTED_CELLS:
            grid["verify_tokens"] = {str(row.num_requests): list(row.verify_tokens) for row in self._rows}
        return {
            "source": self.source,
            "schema_version": SCHEMA_VERSION,
            "probe_grid": grid,
            "num_probes": self.num_probes,
            "min_steps_per_second": 1.0 / max(seconds),
            "max_steps_per_second": 1.0 / min(seconds),
            "created_at": self.created_at,
            "created_at_iso": datetime.datetime.fromtimestamp(self.created_at, datetime.timezone.utc).isoformat(),
            "age_seconds": max(0.0, now - self.created_at),
            "metadata": self.metadata,
            "graph_tiers": self.to_dict().get("graph_tiers"),
        }

    def __repr__(self) -> str:
        return (
            f"SpsTable(source={self.source!r}, R={self._row_requests[0]}..{self._row_requests[-1]} "
            f"({len(self._rows)} rows), probes={self.num_probes})"
        )
