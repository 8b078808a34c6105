"""Outputs of the load test: the JSON record, the frontier and goodput PNGs and Markdown tables (ratios with their
intervals; per proposal source; goodput under an SLO and the users per server it allows). The maths (goodput,
attainment, intervals, the max-load decision) is ``slo``'s; this module applies it to a run's record and prints it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sglang_dspark.loadtest import slo as slo_maths


def level_key(level: dict) -> str:
    key = f"rate={level['request_rate']:g}/s" if level.get("request_rate") is not None else f"c={level['concurrency']}"
    if level.get("temperature") is not None:  # a sweep over several temperatures
        key += f" T={level['temperature']:g}"
    return key


def _temperatures(settings: dict) -> str:
    value = settings.get("temperature", "")
    return " / ".join(f"{t:g}" for t in value) if isinstance(value, list) else str(value)


def _level_temperature(level: dict, settings: dict) -> float | None:
    if level.get("temperature") is not None:
        return float(level["temperature"])
    value = settings.get("temperature")
    if isinstance(value, list):
        return float(value[0]) if len(value) == 1 else None
    return None if value is None else float(value)


def _clean(value: Any) -> Any:
    """JSON without NaN/Infinity (strict parsers reject them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def interval_method(seed: int) -> dict:
    """How every ratio's interval is computed (stated in the JSON and under the table)."""
    return {"method": slo_maths.INTERVAL_METHOD, "confidence": slo_maths.INTERVAL_CONFIDENCE,
            "resamples": slo_maths.INTERVAL_RESAMPLES, "seed": seed,
            "statistic": "mean of the configuration's round values over the mean of the baseline's (round i of both "
                         "ran back to back on the same prompts); resolved: the interval excludes 1.0",
            "rounds": "--rounds per level, times --repeats"}


def _seed(result: dict) -> int:
    seed = (result.get("settings") or {}).get("seed")
    return int(seed) if isinstance(seed, int) else 0


def _round_count(level: dict) -> int:
    return len(level.get("round_duration_s") or [])


def level_intervals(level: dict, ref: dict, seed: int = 0) -> dict:
    """The interval of each ratio of ``level`` to the baseline's level ``ref`` (``slo.bootstrap_ratio_interval``):
    output tok/s from each round's tok/s; per-user and end-to-end per-user tok/s, the median over the level's
    requests, from the rounds' requests pooled (``slo.bootstrap_pooled_ratio_interval``; runs that kept
    ``request_timings``). None where the two have fewer than two paired rounds."""
    intervals = {"output_tok_s_ratio": slo_maths.bootstrap_ratio_interval(
        level.get("round_output_tok_s") or [], ref.get("round_output_tok_s") or [], seed=seed)}
    rounds = _round_count(level)
    mine = slo_maths.records_from_columns(level.get("request_timings"))
    theirs = slo_maths.records_from_columns(ref.get("request_timings"))
    for name, speed, statistic in (("per_user_tok_s_ratio", slo_maths.decode_speed, None),
                                   ("per_user_e2e_tok_s_ratio", slo_maths.e2e_speed, None),
                                   ("sustained_tok_s_ratio", slo_maths.tokens_and_latency,
                                    slo_maths.pooled_sustained_rate)):
        interval = None
        if mine and theirs and rounds >= 2 and rounds == _round_count(ref) and (
                name != "sustained_tok_s_ratio" or level.get("sustained_tok_s") is not None):
            interval = slo_maths.bootstrap_pooled_ratio_interval(slo_maths.per_round_values(mine, rounds, speed),
                                                                 slo_maths.per_round_values(theirs, rounds, speed),
                                                                 seed=seed, statistic=statistic)
        intervals[name] = interval
    return {name: list(value) if value else None for name, value in intervals.items()}


def add_ratios(result: dict) -> dict:
    """Per level, each configuration's output tok/s, per-user tok/s, per-user end-to-end tok/s and sustained tok/s
    (:func:`sustained_tok_s`, set here) divided by the first configuration's
    (measured in the same run: the only comparison these noisy machines support), each with its interval
    (``intervals``: bootstrap over the level's paired rounds, :func:`level_intervals`), and at temperature 0 how many
    of its answers are the same text as the first configuration's (``same_output``: every lossless configuration must
    answer exactly as the target alone)."""
    configs = result.get("configs") or []
    if not configs:
        return result
    base = {level_key(level): level for level in configs[0].get("levels", [])}
    result["baseline"] = configs[0].get("label")
    result["interval_method"] = interval_method(_seed(result))
    for config in configs:
        for level in config.get("levels", []):
            level["sustained_tok_s"] = sustained_tok_s(level, (result.get("settings") or {}).get("max_total_tokens"))
    for config in configs:
        for level in config.get("levels", []):
            ref = base.get(level_key(level)) or {}
            for name in ("output_tok_s", "per_user_tok_s", "per_user_e2e_tok_s", "sustained_tok_s"):
                mine, theirs = level.get(name), ref.get(name)
                level[f"{name}_ratio"] = mine / theirs if mine is not None and theirs else None
            level["round_ratios"] = round_ratios(level.get("round_output_tok_s"), ref.get("round_output_tok_s"))
            level["intervals"] = level_intervals(level, ref, _seed(result)) if ref else {}
            mine, theirs = level.get("output_digests"), ref.get("output_digests")
            greedy = _level_temperature(level, result.get("settings") or {}) == 0.0
            if greedy and mine and theirs and len(mine) == len(theirs):
                pairs = [(a, b) for a, b in zip(mine, theirs) if a is not None and b is not None]
                level["same_output"] = [sum(a == b for a, b in pairs), len(pairs)]
    return result


def sustained_tok_s(level: dict, pool_tokens: int | None = None) -> float | None:
    """A concurrency level's sustained output tok/s: its concurrency × ``slo.sustained_rate`` of its requests (what
    its clients would get if they never ran out of prompts: no drain at a round's end). None for a request-rate level,
    one that kept no ``request_timings``, and one whose requests the server could not hold at once (concurrency ×
    mean prompt + output tokens over ``pool_tokens``, the servers' ``--max-total-tokens`` where the run knows it): a
    queue at the server makes a wave's mean latency a transient (the first requests served wait for nobody), not the
    steady state Little's law reads."""
    concurrency, completed = level.get("concurrency"), level.get("completed")
    if not concurrency or level.get("request_rate") is not None:
        return None
    if pool_tokens and completed and concurrency * (
            (level.get("input_tokens") or 0) + (level.get("output_tokens") or 0)) / completed > pool_tokens:
        return None
    rate = slo_maths.sustained_rate(slo_maths.records_from_columns(level.get("request_timings")))
    return None if rate is None else concurrency * rate


def round_ratios(mine: list | None, theirs: list | None) -> list[float] | None:
    """Round ``i``'s output tok/s over the baseline's round ``i`` (the two ran one after the other on the same
    prompts); None unless both have the same two or more rounds."""
    if not mine or not theirs or len(mine) != len(theirs) or len(mine) < 2:
        return None
    return [a / b if b else None for a, b in zip(mine, theirs)]


RESOLVED_MARKS = {1: " ▲", -1: " ▼", 0: ""}


def interval_cell(ratio: float | None, interval: list | None) -> str:
    """``1.15 (1.03–1.32) ▲``: the ratio, its interval in brackets, ▲ / ▼ when the interval lies above / below
    1.0 (a resolved difference); the ratio alone where there is no interval."""
    cell = _fmt(ratio, 2)
    if ratio is None or not interval:
        return cell
    return f"{cell} ({interval[0]:.2f}–{interval[1]:.2f}){RESOLVED_MARKS[slo_maths.resolved(interval)]}"


def ratio_cell(level: dict, name: str = "output_tok_s_ratio") -> str:
    """The level's ratio ``name`` with its interval (:func:`interval_cell`). A level recorded before intervals
    (no ``intervals``) shows the range of its round-by-round output tok/s ratios instead, as it did then."""
    intervals = level.get("intervals")
    if intervals is not None:
        return interval_cell(level.get(name), intervals.get(name))
    cell = _fmt(level.get(name), 2)
    rounds = [r for r in level.get("round_ratios") or [] if r is not None]
    if name == "output_tok_s_ratio" and len(rounds) >= 2:
        cell += f" ({min(rounds):.2f}–{max(rounds):.2f})"
    return cell


def _compact_json(value: Any, indent: int = 0) -> str:
    """JSON indented by 2, except that a list of numbers, strings, booleans or nulls stays on one line (a level's
    per-request columns would otherwise take a line per value)."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {_compact_json(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return json.dumps(value, allow_nan=False)
        return "[\n" + ",\n".join(f"{inner}{_compact_json(v, indent + 2)}" for v in value) + f"\n{pad}]"
    return json.dumps(value, allow_nan=False)


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_compact_json(_clean(result)) + "\n")
    return path


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def plain_step_ms(level: dict) -> float | None:
    """A decode step without a draft: DSPARK's gate-skipped steps (server-timed), or a non-speculative server's
    step, read as its TPOT p50 (one token per step)."""
    admission = level.get("admission")
    if admission is not None:
        return admission.get("skipped_step_ms")
    if level.get("accept_length") is None:
        return (level.get("tpot_ms") or {}).get("p50")
    return None


def markdown_table(result: dict) -> str:
    """One row per configuration and level; ratios against the first configuration of the run, each with its
    interval in brackets and ▲ / ▼ where the interval excludes 1.0 (:func:`interval_cell`; how: the legend that
    :func:`summary_tables` prints under the table).

    Two columns say why output tok/s moved when the per-request speed did not: "in flight" (the requests in flight on
    average over the level, as a share of its concurrency) and "e2e per-user ×" (a request's tokens over its whole
    latency, queueing and prefill included). Requests that finish out of step leave clients idle at the end of each
    round (fewer in flight) where requests that all take the same steps finish together; per-user tok/s counts decode
    time only, so it moves with where the prefills land (all before the decode when requests arrive together).

    "copied from prompt": with a dataset whose prompts carry a passage (grounded, code-edit), the mean share of each
    answer's tokens inside a 4-gram of its prompt (``output_overlap``, engine.output_overlap); "–" elsewhere."""
    baseline = result.get("baseline") or "first row"
    lines = [
        f"| configuration | load | output tok/s | × {baseline} | in flight | per-user tok/s | × {baseline} | "
        f"e2e per-user × {baseline} | TTFT p50 ms | "
        "TPOT p50 ms | ITL p99 ms | accept length | copied from prompt | drafted steps | drafted step ms | "
        f"plain step ms | same text as {baseline} | errors / timeouts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in result.get("configs", []):
        if config.get("error") and not config.get("levels"):
            lines.append(f"| {config['label']} | – | failed: {config['error'].splitlines()[0][:80]} |" + " |" * 15)
            continue
        for level in config.get("levels", []):
            lines.append(
                "| {label} | {load} | {tps} | {tpsr} | {busy} | {pu} | {pur} | {e2er} | {ttft} | {tpot} | {itl} | {acc} | "
                "{copied} | {drafted} | "
                "{dstep} | {pstep} | {same} | {err} / {to} |".format(
                    label=config["label"], load=level_key(level), tps=_fmt(level.get("output_tok_s")),
                    tpsr=ratio_cell(level), pu=_fmt(level.get("per_user_tok_s")),
                    pur=ratio_cell(level, "per_user_tok_s_ratio"), busy=in_flight_cell(level),
                    e2er=ratio_cell(level, "per_user_e2e_tok_s_ratio"),
                    ttft=_fmt((level.get("ttft_ms") or {}).get("p50"), 0),
                    tpot=_fmt((level.get("tpot_ms") or {}).get("p50"), 0),
                    itl=_fmt((level.get("itl_ms") or {}).get("p99"), 0), acc=_fmt(level.get("accept_length"), 2),
                    copied=copied_cell(level),
                    drafted=_fmt((level.get("admission") or {}).get("drafted_step_share"), 2),
                    dstep=_fmt((level.get("admission") or {}).get("drafted_step_ms"), 0),
                    pstep=_fmt(plain_step_ms(level), 0),
                    same="{}/{}".format(*level["same_output"]) if level.get("same_output") else "–",
                    err=level.get("errors", 0) + level.get("not_sent", 0), to=level.get("timeouts", 0),
                )
            )
    return "\n".join(lines)


def copied_cell(level: dict) -> str:
    """The level's mean share of output tokens copied from the prompt (``output_overlap``), "–" without one."""
    share = level.get("output_overlap")
    return "–" if share is None else f"{100.0 * share:.0f} %"


def in_flight_cell(level: dict) -> str:
    """The level's requests in flight on average as a share of its concurrency ("–" for a request-rate level or
    when unknown)."""
    achieved, concurrency = level.get("achieved_concurrency"), level.get("concurrency")
    if achieved is None or not concurrency:
        return "–"
    return f"{100.0 * achieved / concurrency:.0f} %"


SOURCE_STEP_KINDS = ("plain", "drafted", "lookup", "mixed")


def _percent(value) -> str:
    return "–" if value is None else f"{100.0 * value:.0f}"


def source_cells(level: dict) -> dict[str, str]:
    """The per-source cells of a level (``level["sources"]``, engine.lookup_delta); "–" for what is not there:
    lookup off, a non-DSPARK server, a level without decode steps, a source that verified no row."""
    sources = level.get("sources") if isinstance(level.get("sources"), dict) else {}
    share = sources.get("step_share") or {}
    shares = [share.get(kind) for kind in SOURCE_STEP_KINDS]
    return {
        "steps": "–" if all(s is None for s in shares) else " / ".join(_percent(s) for s in shares),
        "lookup_tau": _fmt(sources.get("lookup_accept_length"), 2),
        "draft_tau": _fmt(sources.get("draft_accept_length"), 2),
        "shared": _shared_cell(sources.get("shared")),
        "plan_us": _fmt(sources.get("plan_us_per_step"), 1),
    }


def _shared_cell(shared) -> str:
    """The shared suffix cache's share of the proposals and its rows' τ ("–" when off or without proposals)."""
    if not isinstance(shared, dict) or shared.get("hit_rate") is None:
        return "–"
    return f"{_percent(shared['hit_rate'])} / {_fmt(shared.get('accept_length'), 2)}"


def sources_table(result: dict) -> str:
    """Prompt lookup beside the draft, per configuration and level: the shares of decode steps of each kind, the
    accept length τ of each source (tokens per request-step that verified it, the bonus included), the shared suffix
    cache's share of the proposals and its rows' τ, and the lookup's host planning cost per step. Empty when no server of the run reported a lookup (the run did not use it)."""
    if not any(level.get("sources") for config in result.get("configs", []) for level in config.get("levels", [])):
        return ""
    lines = [
        "per source (prompt lookup beside the draft):",
        "",
        "| configuration | load | steps plain / drafted / lookup / mixed % | lookup τ | draft τ | shared % / τ | "
        "lookup µs/step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in result.get("configs", []):
        for level in config.get("levels", []):
            cells = source_cells(level)
            lines.append(f"| {config['label']} | {level_key(level)} | {cells['steps']} | {cells['lookup_tau']} | "
                         f"{cells['draft_tau']} | {cells['shared']} | {cells['plan_us']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ intervals, SLO


def control_config(result: dict) -> dict | None:
    """The no-spec control: a second copy of the baseline (launched as ``no-spec-control``, or a ``--url`` server
    whose label says "control"), whose ratio to the baseline is the run's noise floor. None if the run has none."""
    for config in (result.get("configs") or [])[1:]:
        if config.get("name") == "no-spec-control" or "control" in str(config.get("label", "")).lower():
            return config
    return None


def _has_intervals(result: dict) -> bool:
    return any(any((level.get("intervals") or {}).values())
               for config in result.get("configs", []) for level in config.get("levels", []))


def _load(level: dict) -> float:
    return level["request_rate"] if level.get("request_rate") is not None else level.get("concurrency") or 0


def ordered_levels(result: dict) -> list[dict]:
    """One level of each level key of the run, in sweep order: by temperature (as first run), then by load (a
    search's refining levels take their place among the others)."""
    first: dict[str, tuple[int, dict]] = {}
    temperatures: list = []
    for config in result.get("configs", []):
        for level in config.get("levels", []):
            if level.get("temperature") not in temperatures:
                temperatures.append(level.get("temperature"))
            first.setdefault(level_key(level), (len(first), level))
    return [level for _, level in sorted(first.values(), key=lambda item: (
        temperatures.index(item[1].get("temperature")), _load(item[1]), item[0]))]


def interval_legend(result: dict) -> str:
    """The line under the main table: what the brackets and marks mean, and the noise floor (the control's
    intervals) level by level."""
    method = result.get("interval_method") or interval_method(_seed(result))
    text = (f"× columns: ratio to {result.get('baseline') or 'the first configuration'} over the level; in brackets "
            f"its {100 * method['confidence']:g} % interval ({method['method']}, {method['resamples']} resamples, "
            f"seed {method['seed']}); ▲ / ▼: the interval lies above / below 1.0 (a resolved difference); no mark: "
            "not resolved.")
    control = control_config(result)
    if control is not None:
        cells = [f"{level_key(level)} {ratio_cell(level)}" for level in control.get("levels", [])]
        text += f" Noise floor ({control['label']}, a second identical server): " + ", ".join(cells) + "."
    return text


def _level_by_key(config: dict) -> dict[str, dict]:
    return {level_key(level): level for level in config.get("levels", [])}


COMPARED = {"output_tok_s": "output tok/s", "sustained_tok_s": "sustained tok/s (no drain, Little's law)"}


def comparison_table(result: dict, name: str = "output_tok_s") -> str:
    """Configurations by level, the table a README shows: the baseline's ``name`` (:data:`COMPARED`: output tok/s,
    or the sustained tok/s of :func:`sustained_tok_s`), every other configuration's ratio to it with the interval and
    the resolved mark, the control row marked as the noise floor; with an SLO (output tok/s only), a last column of
    the users (or requests per second) per server it allows (:func:`max_load_cell`)."""
    levels = ordered_levels(result)
    configs = result.get("configs") or []
    if not levels or not configs:
        return ""
    baseline = result.get("baseline") or configs[0].get("label")
    spec = result.get("slo") if name == "output_tok_s" else None
    rate_mode = (result.get("settings") or {}).get("mode") == "request_rate"
    capacity = ("req/s" if rate_mode else "users") + " per server at the SLO"
    header = [f"{COMPARED[name]}, × {baseline} (95 % CI)", *(level_key(level) for level in levels)]
    header += [capacity] if spec else []
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |"]
    control = control_config(result)
    loads: dict[str, list[dict]] = {}
    for entry in result.get("max_load") or []:
        loads.setdefault(entry["label"], []).append(entry)
    for index, config in enumerate(configs):
        by_key = _level_by_key(config)
        label = config["label"] + (", noise floor" if config is control else "")
        cells = []
        for level in levels:
            mine = by_key.get(level_key(level))
            if mine is None:
                cells.append("–")
            elif index == 0:
                cells.append(f"{_fmt(mine.get(name))} tok/s")
            else:
                cells.append(ratio_cell(mine, f"{name}_ratio"))
        if spec:
            entries = loads.get(config["label"]) or []
            cells.append("; ".join(
                (f"T={e['temperature']:g}: " if e["temperature"] is not None else "") + max_load_cell(e, rate_mode)
                for e in entries) or "–")
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def add_slo(result: dict, spec: slo_maths.SloSpec) -> dict:
    """Goodput under ``spec`` for every level that kept its ``request_timings`` (``level["slo"]``:
    ``slo.level_goodput`` plus each round's goodput tok/s), its ratio to the baseline's with the interval over rounds
    (``goodput_tok_s_ratio``, ``intervals["goodput_tok_s_ratio"]``), and per configuration (and temperature) the
    highest load that met the SLO (``result["max_load"]``, :func:`max_load_summary`). Call after :func:`add_ratios`."""
    result["slo"] = spec.to_json()
    configs = result.get("configs") or []
    for config in configs:
        for level in config.get("levels", []):
            records = slo_maths.records_from_columns(level.get("request_timings"))
            if not records:
                level.pop("slo", None)
                continue
            durations = level.get("round_duration_s") or [level.get("duration_s") or 0.0]
            level["slo"] = {**slo_maths.level_goodput(records, level.get("duration_s") or 0.0, spec),
                            "round_goodput_tok_s": slo_maths.round_goodput_tok_s(records, durations, spec)}
    base = _level_by_key(configs[0]) if configs else {}
    for config in configs:
        for level in config.get("levels", []):
            ref = (base.get(level_key(level)) or {}).get("slo")
            if "slo" not in level or ref is None:
                continue
            theirs = ref["goodput_tok_s"]
            level["goodput_tok_s_ratio"] = level["slo"]["goodput_tok_s"] / theirs if theirs else None
            rounds = level["slo"]["round_goodput_tok_s"]
            interval = slo_maths.bootstrap_ratio_interval(rounds, ref["round_goodput_tok_s"], seed=_seed(result)) \
                if len(rounds) == len(ref["round_goodput_tok_s"]) else None
            level.setdefault("intervals", {})["goodput_tok_s_ratio"] = list(interval) if interval else None
    result["max_load"] = max_load_summary(result)
    return result


def max_load_summary(result: dict) -> list[dict]:
    """Per configuration and temperature: the highest load whose level passed the SLO with every lower tested load
    passing (``max_load``; None: the lowest tested load already missed it), the lowest load that missed it
    (``first_failing_load``; None: every tested load passed, so the answer is at least the highest tested), and the
    loads tested."""
    rate_mode = (result.get("settings") or {}).get("mode") == "request_rate"
    temperatures = {level.get("temperature") for config in result.get("configs", [])
                    for level in config.get("levels", [])}
    summary = []
    for config in result.get("configs", []):
        for temperature in sorted(temperatures, key=lambda t: -1 if t is None else t):
            levels = [lv for lv in config.get("levels", []) if lv.get("temperature") == temperature and "slo" in lv]
            if not levels:
                continue
            passes = {_load(lv): lv["slo"]["passes"] for lv in levels}
            passing, failing = slo_maths.max_passing_load(passes)
            summary.append({"label": config["label"], "temperature": temperature, "max_load": passing,
                            "first_failing_load": failing, "tested_loads": sorted(passes),
                            "unit": "req/s" if rate_mode else "concurrency"})
    return summary


def _load_text(load: float, rate_mode: bool) -> str:
    return f"{load:g} req/s" if rate_mode else f"{load:g}"


def max_load_cell(entry: dict, rate_mode: bool) -> str:
    """``8``, ``≥ 16`` (every tested load passed), ``0`` (concurrency 1 already missed) or ``< 0.5 req/s``."""
    if entry["max_load"] is None:
        lowest = entry["first_failing_load"]
        return "0" if not rate_mode and lowest <= 1 else f"< {_load_text(lowest, rate_mode)}"
    text = _load_text(entry["max_load"], rate_mode)
    return f"≥ {text}" if entry["first_failing_load"] is None else text


def users_per_server_lines(result: dict) -> list[str]:
    """``users per server at this SLO (TTFT ≤ 2 s, TPOT ≤ 100 ms, ≥ 90 % of requests): no-spec 4, DSPARK 8``, one
    line per temperature when the run had several."""
    spec = result.get("slo")
    if not spec or not result.get("max_load"):
        return []
    rate_mode = (result.get("settings") or {}).get("mode") == "request_rate"
    lead = "requests per second per server" if rate_mode else "users per server"
    lines = []
    temperatures = list(dict.fromkeys(entry["temperature"] for entry in result["max_load"]))
    for temperature in temperatures:
        entries = [entry for entry in result["max_load"] if entry["temperature"] == temperature]
        at = "" if temperature is None else f", T = {temperature:g}"
        cells = ", ".join(f"{entry['label']} {max_load_cell(entry, rate_mode)}" for entry in entries)
        lines.append(f"{lead} at this SLO ({spec['text']}{at}): {cells}")
    if any(entry["first_failing_load"] is None for entry in result["max_load"]):
        lines.append("(≥: every tested load met the SLO; test higher loads for the limit)")
    return lines


def slo_table(result: dict) -> str:
    """Per configuration and level under the run's SLO: the share of requests that met every bound (✓ where it
    reaches the target), the share that met each bound, goodput in requests and output tokens per second, and the
    goodput ratio to the first configuration with its interval. Empty without an SLO."""
    spec = result.get("slo")
    if not spec:
        return ""
    bounds = spec["bounds_ms"]
    baseline = result.get("baseline") or "first row"
    header = ["configuration", "load", "SLO met", *(f"{slo_maths.METRIC_NAMES[m]} ≤ {slo_maths.format_ms(v)}"
                                                      for m, v in bounds.items()),
              "goodput req/s", "goodput tok/s", f"goodput × {baseline}"]
    lines = [f"goodput at the SLO ({spec['text']}; a request meets it when it completed within every bound):", "",
             "| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |"]
    for config in result.get("configs", []):
        for level in config.get("levels", []):
            numbers = level.get("slo")
            if not numbers:
                continue
            met = f"{_percent(numbers['attainment'])} %" + (" ✓" if numbers["passes"] else "")
            shares = [f"{_percent(numbers['attainment_by_metric'].get(m))} %" for m in bounds]
            cells = [config["label"], level_key(level), met, *shares, _fmt(numbers["goodput_req_s"], 2),
                     _fmt(numbers["goodput_tok_s"]), ratio_cell(level, "goodput_tok_s_ratio")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_tables(result: dict) -> str:
    """What the load test prints: the main table (with the legend of its intervals where there are any), the
    per-source table where the run used prompt lookup, and with an SLO the goodput table and the users per server;
    then, where there are intervals or an SLO, the comparison table (configurations by level), and where levels ran
    at a concurrency, the same table of sustained tok/s (:func:`sustained_tok_s`)."""
    parts = [markdown_table(result)]
    if _has_intervals(result):
        parts[0] += "\n\n" + interval_legend(result)
    for part in (sources_table(result), slo_table(result), "\n".join(users_per_server_lines(result))):
        if part:
            parts.append(part)
    if _has_intervals(result) or result.get("slo"):
        parts.append(comparison_table(result))
    if any(level.get("sustained_tok_s") for config in result.get("configs", []) for level in config.get("levels", [])):
        parts.append(comparison_table(result, "sustained_tok_s") + "\n\n" + SUSTAINED_LEGEND)
    return "\n\n".join(parts)


SUSTAINED_LEGEND = (
    "Sustained: concurrency × Σ output tokens / Σ request latency (Little's law), what each level's clients would get "
    "if they never ran out of prompts. Output tok/s above also counts each round's drain, clients idle while the "
    "last requests finish; requests that finish out of step (speculation) drain longer than requests in lockstep. "
    "\"–\" where the level's requests did not fit the KV pool at once (a queue at the server: no steady state).")


def write_png(result: dict, path: str | Path) -> Path:
    """Left: the paper's frontier view, aggregate output throughput against per-user speed, one curve per
    configuration (points = load levels, labelled). Right: output tok/s against concurrency (or request rate)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(12, 5), dpi=110)
    FigureCanvasAgg(figure)
    frontier, sweep = figure.subplots(1, 2)
    rate_mode = (result.get("settings") or {}).get("mode") == "request_rate"
    markers = "osD^vP*X"
    for index, config in enumerate(result.get("configs", [])):
        levels = [lv for lv in config.get("levels", []) if lv.get("output_tok_s") is not None]
        if not levels:
            continue
        marker = markers[index % len(markers)]
        temperatures = list(dict.fromkeys(lv.get("temperature") for lv in levels))
        for temperature, style in zip(temperatures, ("-", "--", ":", "-.") * 4):
            group = [lv for lv in levels if lv.get("temperature") == temperature]
            label = config["label"] if temperature is None else f"{config['label']} T={temperature:g}"
            xs = [lv.get("per_user_tok_s") or 0.0 for lv in group]
            ys = [lv["output_tok_s"] for lv in group]
            (line,) = frontier.plot(xs, ys, marker=marker, linestyle=style, label=label,
                                    **({} if style == "-" else {"color": line.get_color()}))
            for x, y, lv in zip(xs, ys, group):
                frontier.annotate(level_key(lv), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                  color=line.get_color())
            loads = [lv["request_rate"] if rate_mode else lv["concurrency"] for lv in group]
            sweep.plot(loads, ys, marker=marker, linestyle=style, label=label, color=line.get_color())
    frontier.set_xlabel("per-user speed: decode tok/s each request sees (1 / TPOT, median)")
    frontier.set_ylabel("aggregate output throughput (tok/s)")
    frontier.set_title("Throughput vs per-user speed (frontier)")
    frontier.grid(True, alpha=0.3)
    frontier.legend(fontsize=8)
    sweep.set_xscale("log", base=2)
    sweep.xaxis.set_major_formatter(ScalarFormatter())
    sweep.xaxis.set_minor_formatter(NullFormatter())
    sweep.set_xlabel("request rate (req/s)" if rate_mode else "concurrency (requests in flight)")
    sweep.set_ylabel("aggregate output throughput (tok/s)")
    sweep.set_title("Throughput vs load")
    sweep.grid(True, alpha=0.3, which="both")
    settings = result.get("settings") or {}
    figure.suptitle(
        f"{settings.get('model_label', '')} — {settings.get('prompts_per_level', '')} fresh prompts per level, "
        f"{settings.get('max_tokens', '')} tokens each, T={_temperatures(settings)}, "
        f"{result.get('machine', {}).get('description', '')} (one run: compare curves, not absolute numbers)",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_goodput_png(result: dict, path: str | Path) -> Path:
    """The SLO's view, one line per configuration (and temperature): left, goodput (output tok/s of the requests
    that met the SLO) against load; right, the share of requests that met it, with the target as a dashed line.
    Levels without ``slo`` numbers are left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(12, 5), dpi=110)
    FigureCanvasAgg(figure)
    goodput, attainment = figure.subplots(1, 2)
    settings = result.get("settings") or {}
    rate_mode = settings.get("mode") == "request_rate"
    spec = result.get("slo") or {}
    markers = "osD^vP*X"
    for index, config in enumerate(result.get("configs", [])):
        levels = sorted((lv for lv in config.get("levels", []) if lv.get("slo")), key=_load)
        if not levels:
            continue
        temperatures = list(dict.fromkeys(lv.get("temperature") for lv in levels))
        for temperature, style in zip(temperatures, ("-", "--", ":", "-.") * 4):
            group = [lv for lv in levels if lv.get("temperature") == temperature]
            label = config["label"] if temperature is None else f"{config['label']} T={temperature:g}"
            loads = [_load(lv) for lv in group]
            (line,) = goodput.plot(loads, [lv["slo"]["goodput_tok_s"] for lv in group], marker=markers[index % 8],
                                   linestyle=style, label=label)
            attainment.plot(loads, [100 * lv["slo"]["attainment"] for lv in group], marker=markers[index % 8],
                            linestyle=style, label=label, color=line.get_color())
    if spec.get("target") is not None:
        attainment.axhline(100 * spec["target"], color="grey", linestyle="--", linewidth=1,
                           label=f"target {slo_maths.format_share(spec['target'])}")
    for axes in (goodput, attainment):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel("request rate (req/s)" if rate_mode else "concurrency (requests in flight)")
        axes.grid(True, alpha=0.3, which="both")
        axes.legend(fontsize=8)
    goodput.set_ylabel("goodput (output tok/s of requests that met the SLO)")
    goodput.set_title("Goodput vs load")
    attainment.set_ylabel("requests that met the SLO (%)")
    attainment.set_ylim(-3, 103)
    attainment.set_title("SLO attainment vs load")
    figure.suptitle(
        f"{settings.get('model_label', '')} — SLO: {spec.get('text', '')}; {settings.get('max_tokens', '')} tokens "
        f"per request, {result.get('machine', {}).get('description', '')}", fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path)
    return path
