"""Read SGLang 0.5.23's SPS table files (``--speculative-dspark-sps-table-path``) into an :class:`SpsTable`.

Upstream writes two JSON shapes (``srt/speculative/dspark_components/dspark_sps.py``); like upstream's own loader we
tell them apart by the ``bias_seconds`` field:

* ``SpsCostTable`` ``{"sample_batch_tokens": [B↑], "sample_steps_per_sec": [sps], "max_batch_tokens": int}``:
  SPS as a function of B alone, looked up by floor step (the last probe at or below B, the first one below it).
* ``SpsAdditiveCostTable`` ``{"bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds"}``:
  ``step_time(R, B) = bias + α(R) + θ(B)``, α and θ linearly interpolated and clamped at their ends (upstream
  writes ``θ(num_reqs + budget)`` with ``budget`` the admitted draft tokens, i.e. θ of our ``B``).

Both become a table with one row per request count ``R = 1..max_requests`` whose probe cells sit at ``B = R`` and
at every upstream probe above ``R``. At every upstream probe point (and, for the additive form, everywhere up to its
last ``m`` probe) our times equal upstream's exactly, and no interpolation across R happens inside
``1..max_requests``. The differences are deliberate: between the cost table's probes we interpolate time linearly
(upstream's floor step charges a larger B the price of a smaller one, and a cell at ``B = R`` on that step would
give the row a cliff), past the last probe time keeps growing (upstream's clamp makes those tokens free), and noisy
non-monotone upstream samples are made monotone like any measured table.

No SGLang import: the formats are plain JSON, and struct objects are read by attribute.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
from typing import Any, Mapping, Optional, Sequence

from sglang_dspark.profiler.sps_table import TABLE_KIND, SpsTable, SpsTableError

__all__ = ["DEFAULT_MAX_UPSTREAM_ROWS", "load_sps_table_file", "table_from_upstream"]

logger = logging.getLogger(__name__)

# Without the server's max_running_requests we build at most this many rows (past them, R is extrapolated).
DEFAULT_MAX_UPSTREAM_ROWS = 1024

_COST_TABLE_FIELDS = ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens")
_ADDITIVE_TABLE_FIELDS = ("bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds")


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise SpsTableError(f"upstream SPS table is not valid JSON: {exc}") from exc
    if isinstance(obj, Mapping):
        return obj
    # An upstream msgspec struct: read its fields by name.
    fields = _ADDITIVE_TABLE_FIELDS if hasattr(obj, "bias_seconds") else _COST_TABLE_FIELDS
    try:
        return {name: getattr(obj, name) for name in fields}
    except AttributeError as exc:
        raise SpsTableError(f"not an upstream SPS table: {type(obj).__name__}") from exc


def _strictly_increasing_ints(values: Sequence[Any], what: str) -> list[int]:
    if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise SpsTableError(f"{what} must be a non-empty list of integers, got {values!r}")
    if any(a >= b for a, b in zip(values, values[1:])):
        raise SpsTableError(f"{what} must be strictly increasing, got {values!r}")
    return list(values)


def _floats(values: Sequence[Any], n: int, what: str) -> list[float]:
    if len(values) != n or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise SpsTableError(f"{what} must be {n} numbers, got {values!r}")
    return [float(v) for v in values]


def _interp_clamped(probes: list[int], values: list[float], x: float) -> float:
    """Upstream's additive-table interpolation: linear between probes, constant outside."""
    if x <= probes[0]:
        return values[0]
    if x >= probes[-1]:
        return values[-1]
    hi = bisect.bisect_right(probes, x)
    frac = (x - probes[hi - 1]) / (probes[hi] - probes[hi - 1])
    return values[hi - 1] + frac * (values[hi] - values[hi - 1])


def _interp_with_growing_tail(probes: list[int], values: list[float], x: float) -> float:
    """Linear between probes, constant below the first, and past the last growing with ``max(last-segment slope,
    mean slope, 0)``: where upstream's clamp would make extra tokens free."""
    if x <= probes[-1] or len(probes) == 1:
        return _interp_clamped(probes, values, x)
    last = (values[-1] - values[-2]) / (probes[-1] - probes[-2])
    mean = (values[-1] - values[0]) / (probes[-1] - probes[0])
    return values[-1] + (x - probes[-1]) * max(last, mean, 0.0)


def _rows_from_formula(step_time, b_probes: list[int], max_requests: int) -> dict[int, dict[int, float]]:
    """Row R: B = R, every upstream probe above R, and B = 2R where none is (so each row has a slope)."""
    rows = {}
    for r in range(1, max_requests + 1):
        bs = [r] + [b for b in b_probes if b > r]
        if len(bs) == 1:
            bs.append(2 * r)
        rows[r] = {b: step_time(r, b) for b in bs}
    return rows


def table_from_upstream(obj: Any, *, max_requests: Optional[int] = None) -> SpsTable:
    """Convert upstream's ``SpsCostTable`` or ``SpsAdditiveCostTable`` (JSON text, dict, or struct).

    ``max_requests``: rows are built for ``R = 1..max_requests``; pass the server's max running requests. By default
    the cost table uses ``max_batch_tokens`` and the additive table its largest ``bs_probes``, at most
    :data:`DEFAULT_MAX_UPSTREAM_ROWS`.
    """
    data = _as_mapping(obj)
    if "bias_seconds" in data:
        missing = [f for f in _ADDITIVE_TABLE_FIELDS if f not in data]
        if missing:
            raise SpsTableError(f"upstream SpsAdditiveCostTable lacks {missing}")
        bias = data["bias_seconds"]
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not bias > 0:
            raise SpsTableError(f"bias_seconds must be > 0, got {bias!r}")
        bs_probes = _strictly_increasing_ints(data["bs_probes"], "bs_probes")
        alpha = _floats(data["alpha_seconds"], len(bs_probes), "alpha_seconds")
        m_probes = _strictly_increasing_ints(data["m_probes"], "m_probes")
        theta = _floats(data["theta_seconds"], len(m_probes), "theta_seconds")

        def step_time(r: int, b: int) -> float:
            return float(bias) + _interp_clamped(bs_probes, alpha, r) + _interp_with_growing_tail(m_probes, theta, b)

        default_rows = max(1, bs_probes[-1])
        b_probes, kind = m_probes, "SpsAdditiveCostTable"
        extra_metadata = {}
    else:
        missing = [f for f in _COST_TABLE_FIELDS if f not in data]
        if missing:
            raise SpsTableError(f"upstream SpsCostTable lacks {missing}")
        b_probes = _strictly_increasing_ints(data["sample_batch_tokens"], "sample_batch_tokens")
        sps = _floats(data["sample_steps_per_sec"], len(b_probes), "sample_steps_per_sec")
        if not all(v > 0 for v in sps):
            raise SpsTableError(f"sample_steps_per_sec must be > 0, got {sps}")
        max_batch_tokens = data["max_batch_tokens"]
        valid_max = isinstance(max_batch_tokens, int) and not isinstance(max_batch_tokens, bool)
        if not valid_max or max_batch_tokens < b_probes[-1]:
            raise SpsTableError(f"max_batch_tokens must be an int >= the largest probe, got {max_batch_tokens!r}")

        sample_seconds = [1.0 / v for v in sps]

        def step_time(r: int, b: int) -> float:  # R-independent, as upstream profiles it
            return _interp_with_growing_tail(b_probes, sample_seconds, b)

        default_rows = max_batch_tokens
        kind = "SpsCostTable"
        extra_metadata = {"max_batch_tokens": max_batch_tokens}

    if max_requests is None:
        max_requests = min(default_rows, DEFAULT_MAX_UPSTREAM_ROWS)
    if max_requests < 1:
        raise SpsTableError(f"max_requests must be >= 1, got {max_requests}")
    rows = _rows_from_formula(step_time, b_probes, max_requests)
    return SpsTable(
        rows,
        source="upstream-json",
        metadata={"upstream_format": kind, "max_requests": max_requests, **extra_metadata},
    )


def load_sps_table_file(path: "str | os.PathLike[str]", *, max_requests: Optional[int] = None) -> SpsTable:
    """Load a ``--speculative-dspark-sps-table-path`` file: our own format or either upstream format."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpsTableError(f"{path}: not valid JSON: {exc}") from exc
    if isinstance(data, Mapping) and data.get("kind") == TABLE_KIND:
        # A hand-supplied file of ours: accept noisy times and make them monotone rather than refuse.
        return SpsTable.from_dict(data, strict=False)
    table = table_from_upstream(data, max_requests=max_requests)
    table.metadata["path"] = os.fspath(path)
    logger.info("Loaded upstream SPS table %s as %r", path, table)
    return table
