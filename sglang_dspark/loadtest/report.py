"""Outputs of the load test: the JSON record, the frontier PNG and Markdown tables (ratios; per proposal source)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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


def add_ratios(result: dict) -> dict:
    """Per level, each configuration's output tok/s, per-user tok/s and per-user end-to-end tok/s divided by the first configuration's
    (measured in the same run: the only comparison these noisy machines support), and at temperature 0 how many of
    its answers are the same text as the first configuration's (``same_output``: every lossless configuration must
    answer exactly as the target alone)."""
    configs = result.get("configs") or []
    if not configs:
        return result
    base = {level_key(level): level for level in configs[0].get("levels", [])}
    result["baseline"] = configs[0].get("label")
    for config in configs:
        for level in config.get("levels", []):
            ref = base.get(level_key(level)) or {}
            for name in ("output_tok_s", "per_user_tok_s", "per_user_e2e_tok_s"):
                mine, theirs = level.get(name), ref.get(name)
                level[f"{name}_ratio"] = mine / theirs if mine is not None and theirs else None
            level["round_ratios"] = round_ratios(level.get("round_output_tok_s"), ref.get("round_output_tok_s"))
            mine, theirs = level.get("output_digests"), ref.get("output_digests")
            greedy = _level_temperature(level, result.get("settings") or {}) == 0.0
            if greedy and mine and theirs and len(mine) == len(theirs):
                pairs = [(a, b) for a, b in zip(mine, theirs) if a is not None and b is not None]
                level["same_output"] = [sum(a == b for a, b in pairs), len(pairs)]
    return result


def round_ratios(mine: list | None, theirs: list | None) -> list[float] | None:
    """Round ``i``'s output tok/s over the baseline's round ``i`` (the two ran one after the other on the same
    prompts); None unless both have the same two or more rounds."""
    if not mine or not theirs or len(mine) != len(theirs) or len(mine) < 2:
        return None
    return [a / b if b else None for a, b in zip(mine, theirs)]


def ratio_cell(level: dict) -> str:
    """The level's output tok/s ratio, with the range of its round-by-round ratios when it ran in rounds: a
    ratio whose rounds straddle 1 is within what the machine's drift moves."""
    cell = _fmt(level.get("output_tok_s_ratio"), 2)
    rounds = [r for r in level.get("round_ratios") or [] if r is not None]
    if len(rounds) >= 2:
        cell += f" ({min(rounds):.2f}–{max(rounds):.2f})"
    return cell


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(result), indent=2, allow_nan=False) + "\n")
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
    """One row per configuration and level; ratios against the first configuration of the run (output tok/s:
    with the range of the round-by-round ratios in brackets).

    Two columns say why output tok/s moved when the per-request speed did not: "in flight" (the requests in flight on
    average over the level, as a share of its concurrency) and "e2e per-user ×" (a request's tokens over its whole
    latency, queueing and prefill included). Requests that finish out of step leave clients idle at the end of each
    round (fewer in flight) where requests that all take the same steps finish together; per-user tok/s counts decode
    time only, so it moves with where the prefills land (all before the decode when requests arrive together)."""
    baseline = result.get("baseline") or "first row"
    lines = [
        f"| configuration | load | output tok/s | × {baseline} | in flight | per-user tok/s | × {baseline} | "
        f"e2e per-user × {baseline} | TTFT p50 ms | "
        "TPOT p50 ms | ITL p99 ms | accept length | drafted steps | drafted step ms | plain step ms | "
        f"same text as {baseline} | errors / timeouts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in result.get("configs", []):
        if config.get("error") and not config.get("levels"):
            lines.append(f"| {config['label']} | – | failed: {config['error'].splitlines()[0][:80]} |" + " |" * 14)
            continue
        for level in config.get("levels", []):
            lines.append(
                "| {label} | {load} | {tps} | {tpsr} | {busy} | {pu} | {pur} | {e2er} | {ttft} | {tpot} | {itl} | {acc} | "
                "{drafted} | "
                "{dstep} | {pstep} | {same} | {err} / {to} |".format(
                    label=config["label"], load=level_key(level), tps=_fmt(level.get("output_tok_s")),
                    tpsr=ratio_cell(level), pu=_fmt(level.get("per_user_tok_s")),
                    pur=_fmt(level.get("per_user_tok_s_ratio"), 2), busy=in_flight_cell(level),
                    e2er=_fmt(level.get("per_user_e2e_tok_s_ratio"), 2),
                    ttft=_fmt((level.get("ttft_ms") or {}).get("p50"), 0),
                    tpot=_fmt((level.get("tpot_ms") or {}).get("p50"), 0),
                    itl=_fmt((level.get("itl_ms") or {}).get("p99"), 0), acc=_fmt(level.get("accept_length"), 2),
                    drafted=_fmt((level.get("admission") or {}).get("drafted_step_share"), 2),
                    dstep=_fmt((level.get("admission") or {}).get("drafted_step_ms"), 0),
                    pstep=_fmt(plain_step_ms(level), 0),
                    same="{}/{}".format(*level["same_output"]) if level.get("same_output") else "–",
                    err=level.get("errors", 0) + level.get("not_sent", 0), to=level.get("timeouts", 0),
                )
            )
    return "\n".join(lines)


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
        "plan_us": _fmt(sources.get("plan_us_per_step"), 1),
    }


def sources_table(result: dict) -> str:
    """Prompt lookup beside the draft, per configuration and level: the shares of decode steps of each kind, the
    accept length τ of each source (tokens per request-step that verified it, the bonus included) and the lookup's
    host planning cost per step. Empty when no server of the run reported a lookup (the run did not use it)."""
    if not any(level.get("sources") for config in result.get("configs", []) for level in config.get("levels", [])):
        return ""
    lines = [
        "per source (prompt lookup beside the draft):",
        "",
        "| configuration | load | steps plain / drafted / lookup / mixed % | lookup τ | draft τ | lookup µs/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for config in result.get("configs", []):
        for level in config.get("levels", []):
            cells = source_cells(level)
            lines.append(f"| {config['label']} | {level_key(level)} | {cells['steps']} | {cells['lookup_tau']} | "
                         f"{cells['draft_tau']} | {cells['plan_us']} |")
    return "\n".join(lines)


def summary_tables(result: dict) -> str:
    """What the load test prints: the main table, then the per-source table where the run used prompt lookup."""
    sources = sources_table(result)
    return markdown_table(result) + (f"\n\n{sources}" if sources else "")


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
