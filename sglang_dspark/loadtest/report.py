"""Outputs of the load test: the JSON record, the frontier PNG and a Markdown table with ratios."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def level_key(level: dict) -> str:
    if level.get("request_rate") is not None:
        return f"rate={level['request_rate']:g}/s"
    return f"c={level['concurrency']}"


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
    """Per level, each configuration's output tok/s and per-user tok/s divided by the first configuration's
    (measured in the same run: the only comparison these noisy machines support)."""
    configs = result.get("configs") or []
    if not configs:
        return result
    base = {level_key(level): level for level in configs[0].get("levels", [])}
    result["baseline"] = configs[0].get("label")
    for config in configs:
        for level in config.get("levels", []):
            ref = base.get(level_key(level)) or {}
            for name in ("output_tok_s", "per_user_tok_s"):
                mine, theirs = level.get(name), ref.get(name)
                level[f"{name}_ratio"] = mine / theirs if mine is not None and theirs else None
    return result


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(result), indent=2, allow_nan=False) + "\n")
    return path


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_table(result: dict) -> str:
    """One row per configuration and level; ratios against the first configuration of the run."""
    baseline = result.get("baseline") or "first row"
    lines = [
        f"| configuration | load | output tok/s | × {baseline} | per-user tok/s | × {baseline} | TTFT p50 ms | "
        "TPOT p50 ms | ITL p99 ms | accept length | drafted steps | errors / timeouts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in result.get("configs", []):
        if config.get("error") and not config.get("levels"):
            lines.append(f"| {config['label']} | – | failed: {config['error'].splitlines()[0][:80]} |" + " |" * 9)
            continue
        for level in config.get("levels", []):
            lines.append(
                "| {label} | {load} | {tps} | {tpsr} | {pu} | {pur} | {ttft} | {tpot} | {itl} | {acc} | {drafted} | {err} / {to} |".format(
                    label=config["label"], load=level_key(level), tps=_fmt(level.get("output_tok_s")),
                    tpsr=_fmt(level.get("output_tok_s_ratio"), 2), pu=_fmt(level.get("per_user_tok_s")),
                    pur=_fmt(level.get("per_user_tok_s_ratio"), 2),
                    ttft=_fmt((level.get("ttft_ms") or {}).get("p50"), 0),
                    tpot=_fmt((level.get("tpot_ms") or {}).get("p50"), 0),
                    itl=_fmt((level.get("itl_ms") or {}).get("p99"), 0), acc=_fmt(level.get("accept_length"), 2),
                    drafted=_fmt((level.get("admission") or {}).get("drafted_step_share"), 2),
                    err=level.get("errors", 0) + level.get("not_sent", 0), to=level.get("timeouts", 0),
                )
            )
    return "\n".join(lines)


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
        xs = [lv.get("per_user_tok_s") or 0.0 for lv in levels]
        ys = [lv["output_tok_s"] for lv in levels]
        (line,) = frontier.plot(xs, ys, marker=marker, label=config["label"])
        for x, y, lv in zip(xs, ys, levels):
            frontier.annotate(level_key(lv), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                              color=line.get_color())
        loads = [lv["request_rate"] if rate_mode else lv["concurrency"] for lv in levels]
        sweep.plot(loads, ys, marker=marker, label=config["label"], color=line.get_color())
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
        f"{settings.get('max_tokens', '')} tokens each, T={settings.get('temperature', '')}, "
        f"{result.get('machine', {}).get('description', '')} (one run: compare curves, not absolute numbers)",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path)
    return path
