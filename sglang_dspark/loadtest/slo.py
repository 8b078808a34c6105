"""The capacity maths of the load test, pure (no server, no I/O): service-level objectives (SLOs), goodput and SLO
attainment of a level's requests, the confidence interval of a ratio from its rounds, and the max-load search's
decisions (which load passed, which to try next).

* **SLO** (:func:`parse_slo`): per-request bounds, ``ttft=2s,tpot=100ms`` (``ttft``: time to first token; ``tpot``
  (alias ``itl``): time per output token after the first, (latency − TTFT) / (tokens − 1), which is also the request's
  mean inter-token latency; ``e2e`` (aliases ``e2el``, ``latency``): the whole request). A request *meets the SLO*
  when it completed and every bound holds. A ``pNN`` term (``ttft=2s,tpot=100ms,p90``) sets the attainment target:
  "p90 TTFT ≤ 2 s and p90 TPOT ≤ 100 ms" read jointly, at least NN % of the level's requests meet every bound.
* **Goodput** (:func:`level_goodput`): the requests that met the SLO per second of the level, and their output
  tokens per second (vLLM's ``--goodput`` and DistServe's definition); **attainment**: their share of all the level's
  requests (failed, timed-out and unsent requests count as missing it); a level **passes** when attainment ≥ target.
* **Interval** (:func:`bootstrap_ratio_interval`): a configuration's ratio to the baseline from the paired rounds of a
  level (round i of both ran back to back on the same prompts): rounds resampled in pairs with replacement, seeded;
  the statistic is the mean of the configuration's round values over the mean of the baseline's; the percentile
  interval. Per-user speeds, printed as the median over all the level's requests, get the interval of that same
  statistic (:func:`bootstrap_pooled_ratio_interval`: the drawn rounds' requests pooled). A difference is
  **resolved** (:func:`resolved`) only when the interval excludes 1.0.
* **Max-load search** (:func:`max_passing_load`, :func:`next_probe`): the highest load whose level passes with every
  lower tested load passing too, the lowest that failed, and the load to try between them.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_TARGET = 0.9
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency"}
METRIC_ALIASES = {"itl": "tpot", "e2el": "e2e", "latency": "e2e", "e2e_latency": "e2e"}
INTERVAL_CONFIDENCE = 0.95
INTERVAL_RESAMPLES = 2000
INTERVAL_METHOD = "percentile bootstrap over the level's paired rounds"

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|min)?\s*$")
_UNIT_MS = {None: 1.0, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "min": 60_000.0}


# ------------------------------------------------------------------------------------------------ the SLO


@dataclass(frozen=True)
class SloSpec:
    """Per-request bounds in milliseconds (metric → bound, in the order given) and the share of a level's requests
    that must meet all of them for the level to pass."""

    bounds_ms: dict[str, float]
    target: float = DEFAULT_TARGET

    def describe(self) -> str:
        """E.g. ``TTFT ≤ 2 s, TPOT ≤ 100 ms, ≥ 90 % of requests``."""
        bounds = ", ".join(f"{METRIC_NAMES[m]} ≤ {format_ms(v)}" for m, v in self.bounds_ms.items())
        return f"{bounds}, ≥ {format_share(self.target)} of requests"

    def to_json(self) -> dict:
        return {"bounds_ms": dict(self.bounds_ms), "target": self.target, "text": self.describe(),
                "definition": "a request meets the SLO when it completed and every bound holds; goodput counts those "
                              "requests (and their output tokens) per second of the level; a level passes when their "
                              "share of all its requests is at least the target"}

    @classmethod
    def from_json(cls, data: Mapping) -> SloSpec:
        return cls(dict(data["bounds_ms"]), float(data.get("target", DEFAULT_TARGET)))


def format_ms(value_ms: float) -> str:
    """``2000`` → ``2 s``, ``100`` → ``100 ms``, ``1500`` → ``1.5 s``."""
    return f"{value_ms / 1000:g} s" if value_ms >= 1000 else f"{value_ms:g} ms"


def format_share(share: float) -> str:
    return f"{100 * share:g} %"


def parse_duration_ms(text: str) -> float:
    """``2s``, ``100ms``, ``1.5 s``, ``1m``; a bare number is milliseconds (as vLLM's ``--goodput``). Positive."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 2s, 100ms, 1.5s)")
    value = float(match.group(1)) * _UNIT_MS[match.group(2)]
    if not value > 0:
        raise ValueError(f"{text!r}: a bound must be positive")
    return value


def parse_slo(text: str, target: float | None = None) -> SloSpec:
    """``ttft=2s,tpot=100ms[,e2e=20s][,p90]`` → :class:`SloSpec`. ``target`` (``--slo-target``) and a ``pNN`` term
    say the same thing; both given, they must agree. Neither: :data:`DEFAULT_TARGET`. Raises ``ValueError`` with what
    is wrong."""
    bounds: dict[str, float] = {}
    percentile_target = None
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        if re.fullmatch(r"[pP][0-9]+(\.[0-9]+)?", term):
            percentile_target = float(term[1:]) / 100
            continue
        name, sep, value = term.partition("=")
        if not sep:
            raise ValueError(f"SLO term {term!r}: write metric=bound (e.g. ttft=2s) or a percentile (e.g. p90)")
        metric = METRIC_ALIASES.get(name.strip().lower(), name.strip().lower())
        if metric not in METRIC_NAMES:
            raise ValueError(f"SLO metric {name.strip()!r}: choose from ttft, tpot (itl), e2e")
        if metric in bounds:
            raise ValueError(f"SLO metric {metric} given twice")
        bounds[metric] = parse_duration_ms(value)
    if not bounds:
        raise ValueError(f"SLO {text!r} has no bound (e.g. ttft=2s,tpot=100ms)")
    if percentile_target is not None and target is not None and not math.isclose(percentile_target, target):
        raise ValueError(f"the SLO's p{100 * percentile_target:g} and --slo-target {target:g} disagree: give one")
    chosen = target if target is not None else percentile_target if percentile_target is not None else DEFAULT_TARGET
    if not 0 < chosen <= 1:
        raise ValueError(f"the attainment target must be in (0, 1], got {chosen:g}")
    return SloSpec(bounds, chosen)


# ------------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class RequestRecord:
    """One request of a level, as the SLO sees it. Timings in milliseconds; ``tpot_ms`` is None for a request of
    one token (no decode to bound); ``round`` is the level's round (0-based) it was sent in."""

    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    output_tokens: int = 0
    round: int = 0

    @classmethod
    def from_timings(cls, ok: bool, ttft_s: float, latency_s: float, output_tokens: int, round_index: int = 0):
        """From a streamed request's TTFT and latency (seconds): TPOT = (latency − TTFT) / (tokens − 1)."""
        if not ok:
            return cls(False, round=round_index)
        tpot = (latency_s - ttft_s) / (output_tokens - 1) * 1000 if output_tokens > 1 else None
        return cls(True, ttft_s * 1000, tpot, latency_s * 1000, int(output_tokens), round_index)

    def value(self, metric: str) -> float | None:
        return {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2e": self.e2e_ms}[metric]


COLUMNS = ("ok", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens", "round")


def records_to_columns(records: Sequence[RequestRecord]) -> dict[str, list]:
    """Column lists (compact in JSON), timings rounded to 0.1 ms."""

    def rounded(value):
        return None if value is None else round(value, 1)

    return {
        "ok": [r.ok for r in records],
        "ttft_ms": [rounded(r.ttft_ms) for r in records],
        "tpot_ms": [rounded(r.tpot_ms) for r in records],
        "e2e_ms": [rounded(r.e2e_ms) for r in records],
        "output_tokens": [r.output_tokens for r in records],
        "round": [r.round for r in records],
    }


def records_from_columns(columns: Mapping[str, Sequence] | None) -> list[RequestRecord]:
    """The records of :func:`records_to_columns`' columns (a missing ``round`` column: every request in round 0; a
    missing timing: None); none without an ``ok`` column."""
    if not columns or not columns.get("ok"):
        return []
    count = len(columns["ok"])
    defaults = {"round": 0, "output_tokens": 0}
    lists = [columns.get(name) or [defaults.get(name)] * count for name in COLUMNS]
    return [RequestRecord(*row) for row in zip(*lists)]


def meets(record: RequestRecord, spec: SloSpec) -> dict[str, bool]:
    """Per bound of ``spec``: whether the request met it (a failed request meets none; a one-token request has no
    TPOT to miss)."""
    if not record.ok:
        return dict.fromkeys(spec.bounds_ms, False)
    result = {}
    for metric, bound in spec.bounds_ms.items():
        value = record.value(metric)
        result[metric] = (value is None and metric == "tpot") or (value is not None and value <= bound)
    return result


def meets_all(record: RequestRecord, spec: SloSpec) -> bool:
    return all(meets(record, spec).values())


def level_goodput(records: Sequence[RequestRecord], duration_s: float, spec: SloSpec) -> dict:
    """A level's SLO numbers: requests, good_requests (met every bound), attainment (their share), attainment per
    bound, goodput_req_s and goodput_tok_s (per second of ``duration_s``, the level's time), passes (attainment ≥
    target). An empty level attains nothing and does not pass."""
    checks = [meets(r, spec) for r in records]
    good = [r for r, check in zip(records, checks) if all(check.values())]
    count = len(records)
    attainment = len(good) / count if count else 0.0
    return {
        "requests": count,
        "good_requests": len(good),
        "attainment": attainment,
        "attainment_by_metric": {m: (sum(c[m] for c in checks) / count if count else 0.0) for m in spec.bounds_ms},
        "goodput_req_s": len(good) / duration_s if duration_s > 0 else 0.0,
        "goodput_tok_s": sum(r.output_tokens for r in good) / duration_s if duration_s > 0 else 0.0,
        "passes": count > 0 and attainment >= spec.target - 1e-12,
    }


def round_goodput_tok_s(records: Sequence[RequestRecord], round_durations_s: Sequence[float],
                        spec: SloSpec) -> list[float]:
    """Each round's goodput (output tokens of its requests that met the SLO per second of the round)."""
    return [level_goodput([r for r in records if r.round == i], d, spec)["goodput_tok_s"]
            for i, d in enumerate(round_durations_s)]


def decode_speed(record: RequestRecord) -> float | None:
    """The decode tokens per second a user sees: 1 / TPOT."""
    return 1000.0 / record.tpot_ms if record.tpot_ms else None


def e2e_speed(record: RequestRecord) -> float | None:
    """Tokens over the whole request's latency (TTFT included)."""
    return record.output_tokens / (record.e2e_ms / 1000) if record.e2e_ms else None


def sustained_rate(records: Sequence[RequestRecord]) -> float | None:
    """Output tokens per second of latency over the completed requests, Σ tokens / Σ end-to-end seconds. By Little's
    law a closed loop of c clients that always have a request outstanding gets c × this: what a level would give if
    its clients never ran out of prompts. A level's own output tok/s also counts its drain (clients idle at a round's
    end while the last requests finish), which a steady load never has and which grows with how far apart requests
    finish, not with how fast the server serves them. None without a completed request."""
    import numpy as np

    rows = [value for r in records if r.ok for value in [tokens_and_latency(r)] if value is not None]
    return pooled_sustained_rate(np.asarray(rows)) if rows else None


def tokens_and_latency(record: RequestRecord) -> tuple[float, float] | None:
    """``(tokens, end-to-end seconds)`` of a completed request: :func:`sustained_rate`'s per-request values."""
    return (float(record.output_tokens), record.e2e_ms / 1000) if record.ok and record.e2e_ms else None


def pooled_sustained_rate(values) -> float:
    """:func:`sustained_rate` of pooled ``[n, 2]`` (tokens, seconds) rows (a bootstrap statistic)."""
    return float(values[:, 0].sum() / values[:, 1].sum())


# ------------------------------------------------------------------------------------------------ intervals


def bootstrap_ratio_interval(mine: Sequence[float | None], base: Sequence[float | None], *,
                             confidence: float = INTERVAL_CONFIDENCE, resamples: int = INTERVAL_RESAMPLES,
                             seed: int = 0) -> tuple[float, float] | None:
    """The ``confidence`` interval of ``mean(mine) / mean(base)`` over paired rounds (``mine[i]`` and ``base[i]``
    ran back to back): ``resamples`` draws of the round indices with replacement (``numpy`` generator seeded with
    ``seed``), the ratio of means of each draw, the draws' central percentiles. None unless there are two or more
    pairs with both values (a pair with a None is dropped, as is a draw whose baseline mean is 0)."""
    import numpy as np

    pairs = [(a, b) for a, b in zip(mine, base) if a is not None and b is not None]
    if len(mine) != len(base) or len(pairs) < 2:
        return None
    mine_array = np.array([a for a, _ in pairs], dtype=float)
    base_array = np.array([b for _, b in pairs], dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    numerators, denominators = mine_array[draws].mean(axis=1), base_array[draws].mean(axis=1)
    keep = denominators > 0
    if not keep.any():
        return None
    ratios = numerators[keep] / denominators[keep]
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def bootstrap_pooled_ratio_interval(mine: Sequence[Sequence], base: Sequence[Sequence], *,
                                    confidence: float = INTERVAL_CONFIDENCE, resamples: int = INTERVAL_RESAMPLES,
                                    seed: int = 0, statistic=None) -> tuple[float, float] | None:
    """The ``confidence`` interval of ``statistic(mine) / statistic(base)`` (default the median) where each side
    pools its requests' values over the level's rounds (``mine[i]``: round i's values; round i of both ran back to
    back): the statistic the table prints, so its interval is of that same number. Each of ``resamples`` draws takes
    the round indices with replacement (seeded), pools the drawn rounds of each side (a round drawn twice counts
    twice) and takes the ratio; the draws' central percentiles. None unless two or more rounds have values on both
    sides. ``statistic``: of a pooled array (rows of tuples pool as an ``[n, k]`` array)."""
    import numpy as np

    statistic = statistic or np.median

    if len(mine) != len(base):
        return None
    pairs = [(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for a, b in zip(mine, base) if len(a) and len(b)]
    if len(pairs) < 2:
        return None
    draws = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    ratios = []
    for draw in draws:
        denominator = float(statistic(np.concatenate([pairs[i][1] for i in draw])))
        if denominator > 0:
            ratios.append(float(statistic(np.concatenate([pairs[i][0] for i in draw]))) / denominator)
    if not ratios:
        return None
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def per_round_values(records: Sequence[RequestRecord], rounds: int, speed) -> list[list[float]]:
    """Each round's ``speed(record)`` over its completed requests (None values skipped)."""
    return [[s for r in records if r.round == index and r.ok for s in [speed(r)] if s is not None]
            for index in range(rounds)]


def resolved(interval: Sequence[float] | None) -> int:
    """+1 when the interval lies above 1.0 (resolved: faster), −1 below (resolved: slower), 0 when it holds 1.0 or
    there is none (not resolved)."""
    if not interval:
        return 0
    low, high = interval
    return 1 if low > 1.0 else -1 if high < 1.0 else 0


# ------------------------------------------------------------------------------------------------ max-load search


def max_passing_load(passes_by_load: Mapping[float, bool]) -> tuple[float | None, float | None]:
    """``(highest passing, lowest failing)`` over the tested loads: the highest load that passed with every lower
    tested load passing too (None: the lowest failed), and the lowest load that failed (None: none did)."""
    passing = None
    for load in sorted(passes_by_load):
        if not passes_by_load[load]:
            return passing, load
        passing = load
    return passing, None


def next_probe(passing: float | None, failing: float | None, *, integer: bool,
               rate_resolution: float = 1.25) -> float | None:
    """The load to test between ``passing`` (None: nothing passed) and ``failing`` (None: nothing failed), halving the
    bracket on a log scale (loads span powers of two): concurrency, an integer strictly between the two (from 1 when
    nothing passed); a request rate, the geometric mean while ``failing / passing`` exceeds ``rate_resolution`` (half
    of ``failing`` when nothing passed). None when there is nothing left to test: nothing failed (every tested load
    passed: the answer is "at least the highest tested"), or the bracket is as narrow as the loads go."""
    if failing is None:
        return None
    if integer:
        low = int(passing) if passing is not None else 0
        high = int(failing)
        if high - low <= 1:
            return None
        probe = round(math.sqrt(max(low, 1) * high)) if low else round(math.sqrt(high))
        return float(min(max(probe, low + 1), high - 1))
    if passing is None:
        return failing / 2
    if failing / passing <= rate_resolution:
        return None
    return math.sqrt(passing * failing)
