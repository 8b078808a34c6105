"""``python -m sglang_dspark.loadtest`` / ``sglang-dspark loadtest``: sweep load against SGLang servers the way
SGLang users do (OpenAI chat completions, streaming), and draw the throughput / per-user-speed frontier.

Two ways to point it at servers:

* ``--url URL [URL ...]``: servers already running (any SGLang launch; loopback only unless ``--allow-remote``);
* ``--configs no-spec dspark dspark-verify-all dspark-upstream ngram`` (the default): it launches each configuration itself with
  the stock ``python -m sglang.launch_server`` on 127.0.0.1 and stops it by PID at the end.

Levels are interleaved: level 1 runs on every server, then level 2 on every server (each level starting from the
next server in turn), and so on; within a level, its prompts are sent in rounds (``--rounds``; by default rounds of
at least two waves of the level's concurrency, up to 4) that take turns across the servers, each round starting from
the next server. A machine whose speed drifts over minutes (a shared CPU does: docs/loadtest.md) then shifts every
configuration of a level alike instead of whichever ran during a slow spell, so the ratios compare like with
like; a level's numbers pool its rounds (all its requests over the time the server spent on them). Launched servers all start first and wait idle (``--sleep-on-idle``) between their turns; on a GPU, or with
``--one-at-a-time``, they run one after another instead (servers cannot share one GPU's memory).

Examples::

    python -m sglang_dspark.loadtest                                   # embedded pair, 5 configs, c = 1..64
    python -m sglang_dspark.loadtest --concurrency 1 4 16 64 --temperature 0 0.7 --max-tokens 64
    python -m sglang_dspark.loadtest --concurrency 1 4 16 --prompts-per-level 24 --max-tokens 64
    python -m sglang_dspark.loadtest --url http://127.0.0.1:30000 --request-rate 0.5 1 2
    python -m sglang_dspark.loadtest --configs no-spec dspark --dataset sharegpt.json
    python -m sglang_dspark.loadtest --configs no-spec ngram dspark --dataset grounded   # answers that copy
    python -m sglang_dspark.loadtest --configs no-spec no-spec-control ngram dspark --dataset code-edit \\
        --max-tokens 256 --concurrency 1 4 --max-total-tokens 32768                     # real code, edited
    python -m sglang_dspark.loadtest --configs no-spec no-spec-control dspark --slo ttft=2s,tpot=100ms --find-max-load

Every level gets fresh prompts (never a prompt sent at an earlier level); every configuration gets the same
prompts per level. Writes ``loadtest.json`` and ``frontier.png`` into ``--output-dir`` and prints a Markdown table
with ratios against the first configuration, each with its 95 % interval from the level's rounds (bootstrap over
paired rounds; ▲ / ▼ where it excludes 1.0; ``--repeats`` for more rounds), then, where a DSPARK server runs
prompt lookup beside the draft, a table per proposal source (step kinds, each source's accept length, the lookup's
planning cost). With a dataset whose prompts carry a passage (``grounded``, ``code-edit``) the table also gives the
share of each answer that copies the prompt (``output_overlap``: output tokens inside a 4-gram of the prompt).

Capacity (``slo``): ``--slo ttft=2s,tpot=100ms`` adds per level and configuration the share of requests that met
every bound and the goodput (requests and output tokens per second of those requests), ``goodput.png``, and "users
per server at this SLO" (the highest load whose share stays ≥ ``--slo-target``, 0.9 by default);
``--find-max-load`` searches for that load: each configuration climbs the levels until its first miss, then
``--search-steps`` halving steps between its last pass and first miss, interleaved like the levels.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import math
import os
import platform
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests

from sglang_dspark.loadtest import engine, prompts as prompt_sets, report, slo

DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
MAX_CONCURRENCY = 1024
MAX_LEVELS = 16
MAX_PROMPTS_PER_LEVEL = 4096
CONFIG_NAMES = ("no-spec", "no-spec-control", "dspark", "dspark-baseline-draft", "dspark-verify-all", "dspark-gate-off",
                "dspark-no-lookup", "dspark-no-shared", "dspark-block-chains", "dspark-upstream", "ngram")
DEFAULT_CONFIGS = ("no-spec", "dspark", "dspark-verify-all", "dspark-upstream", "ngram")
# The built-in sets whose prompts carry a passage the answer copies from: their levels get ``output_overlap``.
PASSAGE_DATASETS = prompt_sets.PASSAGE_SETS


class LoadTestError(RuntimeError):
    """A problem the user can fix (server down, wrong URL, model mismatch, bad arguments)."""


# ------------------------------------------------------------------------------------------------ configurations


@dataclass
class ServerConfig:
    name: str
    label: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def launch_configs(names: list[str], draft: str | None, ngram_draft_tokens: int = 8,
                   baseline_draft: str | None = None) -> list[ServerConfig]:
    draft_args = ["--speculative-algorithm", "DSPARK"]
    if draft:
        draft_args += ["--speculative-draft-model-path", str(draft)]
    if "dspark-baseline-draft" in names and not baseline_draft:
        raise LoadTestError("configuration dspark-baseline-draft needs --baseline-draft-model-path DRAFT_DIR")
    table = {
        "no-spec": ServerConfig("no-spec", "no-spec"),
        # A second no-spec server: its ratio to the first is what two identical servers read in this run (the noise
        # floor, docs/loadtest.md), the yardstick for every other ratio of the table.
        "no-spec-control": ServerConfig("no-spec-control", "no-spec (control)"),
        "dspark": ServerConfig("dspark", "DSPARK (sglang-dspark)", draft_args),
        # The same server with another draft (e.g. the one shipped before a retrained one): two drafts served side by
        # side in one interleaved run, on the same prompts, so their ratios share the machine's drift.
        "dspark-baseline-draft": ServerConfig(
            "dspark-baseline-draft", "DSPARK, baseline draft",
            ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(baseline_draft)],
        ),
        # Our worker, static mode (every draft verified): what confidence scheduling gains over verifying all.
        "dspark-verify-all": ServerConfig(
            "dspark-verify-all", "DSPARK verify-all", draft_args, {"SGLANG_DSPARK_ADMISSION": "verify-all"}
        ),
        # Our worker with the draft gate off (draft every step): what the gate gains.
        "dspark-gate-off": ServerConfig(
            "dspark-gate-off", "DSPARK draft gate off", draft_args, {"SGLANG_DSPARK_DRAFT_GATE": "off"}
        ),
        # Our worker without prompt lookup (the draft only): what the lookup gains, or costs where it does not pay.
        "dspark-no-lookup": ServerConfig(
            "dspark-no-lookup", "DSPARK without lookup", draft_args, {"SGLANG_DSPARK_LOOKUP": "off"}
        ),
        # Our worker, each request's own context only (no shared suffix cache): what sharing gains or costs.
        "dspark-no-shared": ServerConfig(
            "dspark-no-shared", "DSPARK without shared cache", draft_args, {"SGLANG_DSPARK_SHARED_LOOKUP": "off"}
        ),
        # Our worker with every lookup chain stopping at the draft's block: what chains past it gain or cost.
        "dspark-block-chains": ServerConfig(
            "dspark-block-chains", "DSPARK, chains within the block", draft_args, {"SGLANG_DSPARK_LONG_CHAINS": "off"}
        ),
        "dspark-upstream": ServerConfig(
            "dspark-upstream", "DSPARK upstream static", draft_args, {"SGLANG_DSPARK_WORKER": "upstream"}
        ),
        # Same verify width as the embedded draft's block (7 drafts + the anchor).
        "ngram": ServerConfig(
            "ngram", "NGRAM",
            ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(ngram_draft_tokens)],
        ),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise LoadTestError(f"unknown configuration(s) {unknown}: choose from {', '.join(CONFIG_NAMES)}")
    return [table[n] for n in names]


# ------------------------------------------------------------------------------------------------ URLs, servers


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost is not resolved: it could point anywhere


def normalize_url(url: str, allow_remote: bool = False) -> str:
    """The server root of ``url`` (``/v1/chat/completions`` or ``/v1`` dropped), refusing non-loopback hosts
    unless ``allow_remote``."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise LoadTestError(f"{url}: only http:// and https:// URLs are supported")
    if not parts.hostname:
        raise LoadTestError(f"{url}: no host in the URL")
    if not allow_remote and not is_loopback(parts.hostname):
        raise LoadTestError(
            f"{url}: {parts.hostname} is not a loopback address; the load test only targets 127.0.0.1/localhost "
            "unless --allow-remote is given (only load-test servers you run yourself)"
        )
    path = parts.path.rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")).rstrip("/")


@dataclass
class ServerInfo:
    url: str
    model: str
    model_path: str | None = None
    tokenizer_path: str | None = None
    speculative_algorithm: str | None = None


def probe_server(base_url: str, model: str | None = None, timeout: float = 10.0) -> ServerInfo:
    """Check that an SGLang OpenAI-compatible server answers at ``base_url`` and serves ``model``."""
    try:
        health = requests.get(f"{base_url}/health", timeout=timeout)
    except requests.ConnectionError:
        raise LoadTestError(
            f"no server answers at {base_url} (connection refused): is it running? Start one with "
            "`python -m sglang.launch_server ...`, or let the load test launch its own (no --url)"
        ) from None
    except requests.Timeout:
        raise LoadTestError(f"{base_url} did not answer /health within {timeout:g} s (overloaded or hung?)") from None
    try:
        listing = requests.get(f"{base_url}/v1/models", timeout=timeout)
    except requests.RequestException as exc:
        raise LoadTestError(f"{base_url}/v1/models: {exc}") from None
    if listing.status_code == 404 or health.status_code == 404:
        raise LoadTestError(
            f"{base_url} answers but has no SGLang /health or OpenAI /v1/models (HTTP 404): wrong URL? Give the "
            "server root, e.g. http://127.0.0.1:30000"
        )
    try:
        served = [entry["id"] for entry in listing.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise LoadTestError(
            f"{base_url}/v1/models did not return an OpenAI model list (HTTP {listing.status_code}): "
            "not an OpenAI-compatible server?"
        ) from None
    if health.status_code != 200:
        raise LoadTestError(f"{base_url}/health answered HTTP {health.status_code}: the server is not ready")
    if not served:
        raise LoadTestError(f"{base_url} serves no model")
    if model is not None and model not in served:
        raise LoadTestError(f"model mismatch: --model {model!r} is not served by {base_url} (it serves {served})")
    info = ServerInfo(url=base_url, model=model or served[0])
    try:
        model_info = requests.get(f"{base_url}/model_info", timeout=timeout).json()
        info.model_path = model_info.get("model_path")
        info.tokenizer_path = model_info.get("tokenizer_path")
    except (requests.RequestException, ValueError, AttributeError):
        pass
    info.speculative_algorithm = engine.server_snapshot(base_url, timeout=timeout).get("speculative_algorithm")
    return info


def load_tokenizer(path: str | None):
    """The server's tokenizer from a local path (never a download); None if there is none."""
    if not path or not os.path.exists(path):
        return None
    try:
        from sglang.benchmark.utils import get_tokenizer

        return get_tokenizer(path)
    except Exception:  # noqa: BLE001 - per-chunk ITL is the fallback
        return None


def warm_up(info: ServerInfo, request_timeout: float) -> None:
    """One short request before measuring; its failure (chat template, model name, ...) stops this server's run."""
    outputs, _ = asyncio.run(
        engine.run_requests(
            f"{info.url}/v1/chat/completions", info.model, [prompt_sets.WARMUP_PROMPT], max_tokens=8,
            concurrency=1, request_timeout=request_timeout, level_timeout=request_timeout,
        )
    )
    if not outputs[0].success:
        raise LoadTestError(f"warm-up request to {info.url} failed: {outputs[0].error.strip()[-500:]}")


# ------------------------------------------------------------------------------------------------ the sweep


@dataclass
class SweepTarget:
    """One server of a sweep: its levels go to ``entry["levels"]``, a reason to stop to ``entry["error"]``."""

    info: ServerInfo
    label: str
    entry: dict
    tokenizer: object = None
    alive: object = lambda: True
    server: object = None  # a launched server (its log tail goes into the error)


def _run_round(target: SweepTarget, run: "engine.LevelRun", level: dict, prompts: list[str], round_label: str,
               args, request_func):
    """One round of a level against one server; returns why the server is gone (None: it is not)."""
    from tqdm import tqdm

    desc = f"{target.label} {report.level_key(level)}{round_label}"
    with tqdm(total=len(prompts), desc=desc, unit="req", leave=False, disable=args.quiet, file=sys.stderr) as pbar:
        completed = run.run_round(
            prompts, concurrency=level.get("concurrency"), request_rate=level.get("request_rate") or math.inf,
            max_tokens=prompt_sets.output_lengths(prompts, args.max_tokens, args.random_range_ratio, args.seed),
            temperature=level.get("temperature", args.temperature[0]),
            model=target.info.model, request_timeout=args.request_timeout, level_timeout=args.level_timeout,
            request_func=request_func, pbar=pbar,
        )
    if completed == 0 and not target.alive():
        return f"the server stopped during {report.level_key(level)}"
    if completed == 0 and request_func is None:
        try:
            requests.get(f"{target.info.url}/health", timeout=10).raise_for_status()
        except requests.RequestException as exc:
            return f"the server stopped answering during {report.level_key(level)}: {exc}"
    return None


def _finish_level(target: SweepTarget, run: "engine.LevelRun", level: dict, prompts: list[str], args) -> None:
    metrics = run.result(target.tokenizer)
    if args.dataset in PASSAGE_DATASETS:  # how much of each answer copies its prompt (engine.output_overlap)
        metrics["output_overlap"] = engine.mean_output_overlap(getattr(run, "prompts", []), run.outputs,
                                                               target.tokenizer)
        metrics["output_overlap_unit"] = "token" if target.tokenizer is not None else "word"
    recorded = {**level, "prompts": len(prompts), **metrics}
    if args.slo_spec is not None:  # what the max-load search decides on (report.add_slo recomputes it at the end)
        recorded["slo"] = slo.level_goodput(slo.records_from_columns(metrics.get("request_timings")),
                                            metrics.get("duration_s") or 0.0, args.slo_spec)
    target.entry["levels"].append(recorded)
    if not args.quiet:
        cells = report.source_cells(metrics)
        sources = f" (lookup τ {cells['lookup_tau']}, draft τ {cells['draft_tau']})" if metrics.get("sources") else ""
        met = f", SLO met {100 * recorded['slo']['attainment']:.0f} %" if "slo" in recorded else ""
        if recorded.get("output_overlap") is not None:
            met += f", copied {100 * recorded['output_overlap']:.0f} %"
        print(
            f"  {target.label} {report.level_key(level)}: {metrics.get('output_tok_s') or 0:.1f} tok/s, per-user "
            f"{metrics.get('per_user_tok_s') or 0:.1f} tok/s, accept "
            f"{metrics.get('accept_length') or float('nan'):.2f}{sources}, "
            f"{metrics['completed']}/{metrics['requests']} ok{met}",
            file=sys.stderr,
        )


def level_order(num_targets: int, level_index: int) -> list[int]:
    """The servers' turn at a level (or round): turn ``i`` starts from server ``i mod n`` (no server always goes
    first)."""
    return [(level_index + k) % num_targets for k in range(num_targets)]


def level_rounds(args, level: dict, num_prompts: int) -> int:
    """How many rounds a level is split into. ``--rounds N``; by default (auto) rounds of at least two waves of
    the level's concurrency (a round drains its requests before the next server's turn), at most 4 rounds. With
    ``--repeats N`` the level holds N times the prompts (:func:`prompts_per_level`) and runs N times the rounds: the
    same level repeated N times over, on fresh prompts each time, every repeat adding rounds to the intervals."""
    repeats = max(1, getattr(args, "repeats", 1) or 1)
    per_repeat = max(1, num_prompts // repeats)
    if args.rounds is not None:
        rounds = max(1, min(int(args.rounds), per_repeat))
    else:
        concurrency = level.get("concurrency") or args.max_concurrency or 1
        rounds = max(1, min(4, per_repeat // (2 * concurrency)))
    return min(rounds * repeats, num_prompts)


def split_rounds(prompts: list[str], rounds: int) -> list[list[str]]:
    """Contiguous, near-equal chunks (the level's outputs stay in prompt order when the rounds are pooled)."""
    bounds = [round(k * len(prompts) / rounds) for k in range(rounds + 1)]
    return [prompts[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def run_step(targets: list[SweepTarget], assignments: dict[int, tuple[dict, list[str]]], step_index: int, args,
             request_func=None, snapshot_func=None) -> None:
    """One step of a sweep: every target named in ``assignments`` (target index → its level and prompts) runs its
    level in rounds, the rounds taking turns across the targets (round r of step s starts from target ``s + r``);
    targets not named wait. A sweep gives every target the same level; a max-load search may give each its own.
    A server that goes away keeps what it measured and its entry's ``error`` says why."""
    chunks = {position: split_rounds(prompts, level_rounds(args, level, len(prompts)))
              for position, (level, prompts) in assignments.items()}
    runs: dict[int, engine.LevelRun] = {}
    for round_index in range(max((len(c) for c in chunks.values()), default=0)):
        for position in level_order(len(targets), step_index + round_index):
            target = targets[position]
            if position not in assignments or round_index >= len(chunks[position]) or target.entry.get("error"):
                continue
            level, prompts = assignments[position]
            rounds = chunks[position]
            round_label = f" round {round_index + 1}/{len(rounds)}" if len(rounds) > 1 else ""
            if position not in runs:
                runs[position] = engine.LevelRun(
                    target.info.url, snapshot_func or (lambda url=target.info.url: engine.server_snapshot(url)))
            reason = _run_round(target, runs[position], level, rounds[round_index], round_label, args, request_func)
            if reason or round_index == len(rounds) - 1:
                # Its last round (or it went away: what it measured stays): read its counters now.
                _finish_level(target, runs.pop(position), level, prompts, args)
            if reason:
                tail = f"\n--- server log tail ---\n{target.server.log_tail(30)}" if target.server else ""
                target.entry["error"] = reason + tail
                print(f"[loadtest] {target.label}: {reason}", file=sys.stderr)


def sweep_interleaved(targets: list[SweepTarget], levels: list[dict], level_prompts: list[list[str]], args,
                      request_func=None, snapshot_func=None) -> None:
    """Every level on every server before the next level, each level in rounds that take turns across the servers
    (module docstring); a server that went away keeps the levels it finished and gets no more (its entry's
    ``error`` says why)."""
    for index, (level, prompts) in enumerate(zip(levels, level_prompts)):
        run_step(targets, {position: (level, prompts) for position in range(len(targets))}, index, args,
                 request_func, snapshot_func)


def _load_of(level: dict) -> float:
    return level["request_rate"] if level.get("request_rate") is not None else level["concurrency"]


def _passes_by_load(target: SweepTarget) -> dict[float, bool]:
    return {_load_of(level): level["slo"]["passes"] for level in target.entry["levels"] if "slo" in level}


def search_max_load(targets: list[SweepTarget], levels: list[dict], level_prompts: list[list[str]],
                    spare_prompts: list[str], args, request_func=None, snapshot_func=None) -> None:
    """``--find-max-load``: per server, the highest load whose SLO attainment stays ≥ the target.

    First the levels in ascending order, interleaved as a sweep's are, each server climbing until a level misses
    the target (it runs no higher level); then up to ``--search-steps`` steps that halve each server's bracket
    (``slo.next_probe`` between its highest passing and lowest failing load), every server of a step on the same
    fresh prompts from ``spare_prompts`` (the pool after the levels' slices), its own probe load, rounds interleaved.
    The recorded levels end sorted by load; ``report.add_slo`` reads the answer off them."""
    spec = args.slo_spec
    rate_mode = levels[0].get("request_rate") is not None
    climbing = list(range(len(targets)))
    step = 0
    for level, prompts in zip(levels, level_prompts):
        assignments = {i: (level, prompts) for i in climbing if not targets[i].entry.get("error")}
        if not assignments:
            break
        run_step(targets, assignments, step, args, request_func, snapshot_func)
        step += 1
        climbing = []
        for i in assignments:
            recorded = [lv for lv in targets[i].entry["levels"] if report.level_key(lv) == report.level_key(level)]
            if recorded and recorded[-1].get("slo", {}).get("passes"):
                climbing.append(i)
            elif recorded and not args.quiet:
                print(f"[loadtest] {targets[i].label} misses the SLO at {report.level_key(level)} (met by "
                      f"{100 * recorded[-1]['slo']['attainment']:.0f} % < {100 * spec.target:g} %): no higher level",
                      file=sys.stderr)
    spare = list(spare_prompts)
    for _ in range(args.search_steps):
        probes = {}
        for i, target in enumerate(targets):
            if target.entry.get("error"):
                continue
            probe = slo.next_probe(*slo.max_passing_load(_passes_by_load(target)), integer=not rate_mode)
            if probe is not None:
                probes[i] = ({**levels[0], "request_rate": probe} if rate_mode
                             else {**levels[0], "concurrency": int(probe)})
        if not probes:
            break
        counts = {i: prompts_per_level(args, level) for i, level in probes.items()}
        if max(counts.values()) > len(spare):
            print(f"[loadtest] no fresh prompts left for another search step ({max(counts.values())} needed, "
                  f"{len(spare)} left): the search stops here (a larger --dataset or fewer --prompts-per-level)",
                  file=sys.stderr)
            break
        step_prompts, spare = spare[: max(counts.values())], spare[max(counts.values()):]
        if not args.quiet:
            print("[loadtest] search step: " + ", ".join(
                f"{targets[i].label} {report.level_key(level)}" for i, level in probes.items()), file=sys.stderr)
        run_step(targets, {i: (level, step_prompts[: counts[i]]) for i, level in probes.items()}, step, args,
                 request_func, snapshot_func)
        step += 1
    for target in targets:
        target.entry["levels"].sort(key=_load_of)


def sweep(targets: list[SweepTarget], levels: list[dict], level_prompts: list[list[str]], spare_prompts: list[str],
          args) -> None:
    """The run's schedule: a max-load search (``--find-max-load``) or the interleaved sweep."""
    if args.find_max_load:
        search_max_load(targets, levels, level_prompts, spare_prompts, args)
    else:
        sweep_interleaved(targets, levels, level_prompts, args)


def build_levels(args) -> list[dict]:
    if args.request_rate:
        levels = [{"request_rate": float(r), "concurrency": args.max_concurrency} for r in args.request_rate]
    else:
        levels = [{"concurrency": int(c)} for c in (args.concurrency or DEFAULT_CONCURRENCY)]
    if len(args.temperature) > 1:
        # Each temperature is its own set of levels, with its own fresh prompts (a server never sees a prompt twice).
        levels = [{**level, "temperature": float(t)} for t in args.temperature for level in levels]
    if not levels or len(levels) > MAX_LEVELS:
        raise LoadTestError(f"give 1 to {MAX_LEVELS} load levels")
    if getattr(args, "find_max_load", False):  # the search climbs: ascending, each load once
        levels = sorted({_load_of(level): level for level in levels}.values(), key=_load_of)
    for level in levels:
        c = level.get("concurrency")
        if c is not None and not 1 <= c <= MAX_CONCURRENCY:
            raise LoadTestError(f"concurrency must be within 1..{MAX_CONCURRENCY}, got {c}")
        if level.get("request_rate") is not None and not level["request_rate"] > 0:
            raise LoadTestError("request rates must be > 0")
    return levels


def prompts_per_level(args, level: dict) -> int:
    if args.prompts_per_level:
        count = args.prompts_per_level
    elif level.get("request_rate") is not None:
        count = 32
    else:
        count = max(8, 4 * level["concurrency"])
    count *= max(1, getattr(args, "repeats", 1) or 1)  # --repeats: the level again, on fresh prompts
    if not 1 <= count <= MAX_PROMPTS_PER_LEVEL:
        raise LoadTestError(f"prompts per level must be within 1..{MAX_PROMPTS_PER_LEVEL}, got {count}")
    return count


def prompt_pool(args) -> list[str]:
    if args.dataset is None or args.dataset in prompt_sets.BUILTIN_SETS:
        return prompt_sets.BUILTIN_SETS[args.dataset or "builtin"](args.seed)
    try:
        pool = prompt_sets.load_prompts(args.dataset, args.dataset_format)
    except (OSError, ValueError) as exc:
        raise LoadTestError(str(exc)) from None
    if args.shuffle:
        import random

        random.Random(args.seed).shuffle(pool)
    return pool


def machine_description() -> dict:
    cpus = os.cpu_count()
    description = f"{cpus}-core {platform.machine()} CPU"
    try:
        import torch

        if torch.cuda.is_available():
            description = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    return {"cpus": cpus, "platform": platform.platform(), "description": description}


def run(args, argv: list[str]) -> dict:
    levels = build_levels(args)
    counts = [prompts_per_level(args, level) for level in levels]
    pool = prompt_pool(args)
    try:
        level_prompts = prompt_sets.split_for_levels(pool, counts)
    except ValueError as exc:
        raise LoadTestError(str(exc)) from None
    spare_prompts = pool[sum(counts):]  # a max-load search's refining steps draw fresh prompts from here
    output_dir = Path(args.output_dir or f"loadtest-results/{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    import numpy as np

    np.random.seed(args.seed)  # bench_serving's Poisson arrivals
    result: dict = {
        "tool": "sglang-dspark loadtest",
        "command": "python -m sglang_dspark.loadtest " + shlex.join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "machine": machine_description(),
        "settings": {
            "mode": "request_rate" if args.request_rate else "concurrency",
            "levels": levels,
            "prompts_per_level": counts[0] if len(set(counts)) == 1 else counts,
            "rounds_per_level": [level_rounds(args, level, count) for level, count in zip(levels, counts)],
            "max_tokens": args.max_tokens,
            "random_range_ratio": args.random_range_ratio,
            "temperature": args.temperature,
            "ignore_eos": True,
            "dataset": args.dataset or "builtin",
            "output_overlap": ({"n": engine.OVERLAP_N, "definition": "per request, the share of output tokens (words "
                               "without a tokenizer) inside an n-gram that also appears in the prompt; per level, "
                               "the mean over completed requests"} if args.dataset in PASSAGE_DATASETS else None),
            "seed": args.seed,
            "request_timeout_s": args.request_timeout,
            "level_timeout_s": args.level_timeout,
            "endpoint": "/v1/chat/completions (stream)",
            "fresh_prompts_per_level": True,
            "repeats": args.repeats,
            "slo": args.slo_spec.to_json() if args.slo_spec else None,
            "find_max_load": bool(args.find_max_load),
            "search_steps": args.search_steps if args.find_max_load else None,
        },
        "configs": [],
    }
    steps = len(levels) + (args.search_steps if args.find_max_load else 0)
    bound = steps * args.level_timeout * (len(args.url) if args.url else len(args.configs))
    if not args.quiet:
        print(f"[loadtest] {len(levels)} levels, {sum(counts)} distinct prompts, at most {bound / 60:.0f} min of "
              f"requests (plus server start-ups); results -> {output_dir}", file=sys.stderr)
    try:
        if args.url:
            _run_urls(args, levels, level_prompts, spare_prompts, result)
        else:
            _run_launched(args, levels, level_prompts, spare_prompts, result)
    except KeyboardInterrupt:
        result["interrupted"] = True  # keep what was measured
        report.write_json(analyse(result, args.slo_spec), output_dir / "loadtest.json")
        raise
    analyse(result, args.slo_spec)
    json_path = report.write_json(result, output_dir / "loadtest.json")
    png_paths = write_pngs(result, output_dir)
    table = report.summary_tables(result)
    print(table)
    print(f"\n{result['command']}")
    print(f"[loadtest] wrote {json_path} and {png_paths}", file=sys.stderr)
    return result


def analyse(result: dict, spec: "slo.SloSpec | None") -> dict:
    """Ratios and their intervals, and with an SLO goodput, attainment and the max load (``report``)."""
    report.add_ratios(result)
    if spec is not None:
        report.add_slo(result, spec)
    return result


def write_pngs(result: dict, output_dir: Path) -> str:
    """frontier.png, and goodput.png where the run has an SLO; what was written (or why not), for the log line."""
    try:
        paths = [report.write_png(result, Path(output_dir) / "frontier.png")]
        if result.get("slo"):
            paths.append(report.write_goodput_png(result, Path(output_dir) / "goodput.png"))
    except ImportError:
        return "no PNG (matplotlib is missing: pip install -r requirements/plots.txt)"
    return " and ".join(map(str, paths))


def replot(json_path: str, output_dir: str | None = None, spec: "slo.SloSpec | None" = None) -> int:
    """Redraw the PNGs and reprint the tables from a ``loadtest.json`` (no requests): ratios and intervals recomputed
    from its rounds, goodput under ``spec`` (``--slo``) or the SLO the run had, from its per-request timings."""
    import json

    try:
        result = json.loads(Path(json_path).read_text())
    except (OSError, ValueError) as exc:
        print(f"sglang-dspark loadtest: error: cannot read {json_path}: {exc}", file=sys.stderr)
        return 2
    if spec is None and result.get("slo"):
        spec = slo.SloSpec.from_json(result["slo"])
    analyse(result, spec)
    pngs = write_pngs(result, Path(output_dir or Path(json_path).parent))
    print(report.summary_tables(result))
    print(f"\n{result.get('command', '')}")
    print(f"[loadtest] wrote {pngs}", file=sys.stderr)
    return 0


def _versions() -> dict:
    from importlib import metadata

    versions = {}
    for name in ("sglang", "sglang-dspark"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _run_urls(args, levels, level_prompts, spare_prompts, result) -> None:
    infos = [probe_server(url, args.model) for url in args.url]
    models = {info.model_path or info.model for info in infos}
    if len(models) > 1 and not args.allow_model_mismatch:
        raise LoadTestError(
            f"model mismatch: the servers serve different models {sorted(models)}; comparing them is meaningless "
            "(pass --allow-model-mismatch to do it anyway)"
        )
    labels = args.label or [info.url for info in infos]
    result["settings"]["model_label"] = Path(str(infos[0].model_path or infos[0].model)).name
    result["settings"]["schedule"] = "interleaved"
    targets = []
    for info, label in zip(infos, labels):
        entry = {"label": label, "url": info.url, "launched": False, "model": info.model,
                 "model_path": info.model_path, "speculative_algorithm": info.speculative_algorithm, "levels": []}
        result["configs"].append(entry)
        try:
            warm_up(info, args.request_timeout)
            targets.append(SweepTarget(info, label, entry, load_tokenizer(args.tokenizer or info.tokenizer_path)))
        except LoadTestError as exc:
            entry["error"] = str(exc)
            print(f"[loadtest] {entry['label']}: {exc}", file=sys.stderr)
    sweep(targets, levels, level_prompts, spare_prompts, args)


def _start_config(config, target, server_args, max_total_tokens, device, args, log_dir, tokenizer, result):
    """Launch one configuration and warm it up; None (with the entry's error set) if it did not start."""
    from sglang_dspark.local_server import ServerStartError, start_server

    entry = {"name": config.name, "label": config.label, "launched": True, "server_args": server_args,
             "env": config.env, "levels": []}
    result["configs"].append(entry)
    if not args.quiet:
        print(f"[loadtest] starting {config.label}: python -m sglang.launch_server --model-path {target} "
              f"{shlex.join(server_args)} (logs: {log_dir})", file=sys.stderr)
    try:
        server = start_server(target, server_args, env=config.env, max_total_tokens=max_total_tokens,
                              cpu=device == "cpu", timeout=args.startup_timeout, log_dir=log_dir)
    except ServerStartError as exc:
        entry["error"] = f"server did not start: {exc}"
        print(f"[loadtest] {config.label}: {entry['error']}", file=sys.stderr)
        return None
    try:
        entry["startup_s"] = server.startup_seconds
        entry["url"] = server.url
        info = probe_server(server.url)
        entry["model"] = info.model
        entry["speculative_algorithm"] = info.speculative_algorithm
        warm_up(info, args.request_timeout)
    except BaseException as exc:
        if isinstance(exc, LoadTestError):
            entry["error"] = f"{exc}\n--- server log tail ---\n{server.log_tail(30)}"
            print(f"[loadtest] {config.label}: {exc}", file=sys.stderr)
        server.stop()
        if not isinstance(exc, LoadTestError):
            raise
        return None
    return SweepTarget(info, config.label, entry, tokenizer, server.alive, server)


def _run_launched(args, levels, level_prompts, spare_prompts, result) -> None:
    if args.model_path:
        target, draft = args.model_path, args.draft_model_path
    else:
        from sglang_dspark.embedded.defaults import ensure_default_pair

        target, draft = ensure_default_pair()
    configs = launch_configs(args.configs, draft, args.ngram_draft_tokens, args.baseline_draft_model_path)
    if any(c.name.startswith("dspark") for c in configs) and not draft:
        print("[loadtest] no --draft-model-path: DSPARK uses the draft SGLang resolves for the target",
              file=sys.stderr)
    device = args.device
    if device == "auto":
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:  # noqa: BLE001
            device = "cpu"
    max_c = max((lv.get("concurrency") or 64) for lv in levels)
    max_total_tokens = args.max_total_tokens or min(131072, max(8192, max_c * (args.max_tokens + 512)))
    interleaved = device == "cpu" and not args.one_at_a_time
    result["settings"].update({"model_label": Path(str(target)).name, "model_path": str(target),
                               "draft_model_path": str(draft) if draft else None, "device": device,
                               "baseline_draft_model_path": args.baseline_draft_model_path,
                               "max_total_tokens": max_total_tokens, "dtype": args.dtype,
                               "schedule": "interleaved" if interleaved else "one at a time"})
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sglang-dspark-loadtest-"))
    tokenizer = load_tokenizer(str(target))
    started: list[SweepTarget] = []  # up and idle, waiting for their turns

    def sweep_started():
        try:
            sweep(started, levels, level_prompts, spare_prompts, args)
        finally:
            for sweep_target in started:
                sweep_target.server.stop()
            started.clear()

    try:
        for config in configs:
            server_args = ["--dtype", args.dtype, *config.args, *args.server_arg]
            available_before = memory_available_bytes()
            sweep_target = _start_config(config, target, server_args, max_total_tokens, device, args, log_dir,
                                         tokenizer, result)
            if sweep_target is None:
                continue
            started.append(sweep_target)
            if not interleaved or not room_for_another_server(available_before, memory_available_bytes()):
                if interleaved and not args.quiet:
                    print(f"[loadtest] memory for {len(started)} server(s) at a time: interleaving them, then the "
                          "next ones", file=sys.stderr)
                sweep_started()
        if started:
            sweep_started()
    finally:
        for sweep_target in started:
            sweep_target.server.stop()


def memory_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def room_for_another_server(available_before: int | None, available_after: int | None) -> bool:
    """Whether one more server like the one just started fits (its footprint + 25 %, and 1 GiB to spare)."""
    if available_before is None or available_after is None:
        return True
    footprint = max(available_before - available_after, 0)
    return available_after >= 1.25 * footprint + (1 << 30)


# ------------------------------------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dspark.loadtest", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_argument_group("servers")
    target.add_argument("--url", nargs="+", help="running servers to test (default: launch --configs here)")
    target.add_argument("--label", nargs="+", help="one label per --url (default: the URL)")
    target.add_argument("--allow-remote", action="store_true", help="allow non-loopback --url hosts")
    target.add_argument("--model", help="served model name to request (checked against /v1/models)")
    target.add_argument("--allow-model-mismatch", action="store_true",
                        help="compare --url servers that serve different models")
    target.add_argument("--tokenizer", help="local tokenizer path for per-token ITL (--url mode)")
    target.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=CONFIG_NAMES,
                        help="configurations to launch one after another (default: " + " ".join(DEFAULT_CONFIGS) + ")")
    target.add_argument("--model-path", help="target model (default: the embedded SmolLM2 pair)")
    target.add_argument("--draft-model-path", help="DSpark draft for --model-path")
    target.add_argument("--baseline-draft-model-path",
                        help="a second DSpark draft for the same target, served as configuration "
                             "dspark-baseline-draft (added to --configs when missing): a new draft against the old one")
    target.add_argument("--dtype", default="float32")
    target.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    target.add_argument("--max-total-tokens", type=int, help="KV cache size of launched servers (default: sized "
                        "for the largest level)")
    target.add_argument("--ngram-draft-tokens", type=int, default=8, help="NGRAM verify width (default 8 = the "
                        "embedded draft's block + 1)")
    target.add_argument("--server-arg", action="append", default=[],
                        help="extra launch_server argument for every launched server (repeatable; "
                             "--server-arg=--flag=value)")
    target.add_argument("--startup-timeout", type=float, default=600)
    target.add_argument("--log-dir", help="server logs (default: a temporary folder)")
    target.add_argument("--one-at-a-time", action="store_true",
                        help="launch, measure and stop one configuration after another (the default on a GPU) "
                             "instead of keeping them all up and interleaving the levels")
    load = parser.add_argument_group("load")
    sweep = load.add_mutually_exclusive_group()
    sweep.add_argument("--concurrency", type=int, nargs="+", help="concurrency levels (default 1 2 4 8 16 32 64)")
    sweep.add_argument("--request-rate", type=float, nargs="+", help="Poisson request rates (req/s) instead")
    load.add_argument("--max-concurrency", type=int, help="cap on requests in flight in --request-rate mode")
    load.add_argument("--prompts-per-level", type=int,
                      help="requests per level (default 4 x concurrency, at least 8; 32 per rate level)")
    load.add_argument("--rounds", type=int, help="split each level into this many rounds that take turns across "
                      "the servers (default: rounds of at least two waves of the level's concurrency, at most 4)")
    load.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request (EOS ignored; "
                      "default 128; 256 recommended with --dataset code-edit, whose answers re-emit 40-150 lines)")
    load.add_argument("--random-range-ratio", type=float, default=1.0,
                      help="each request generates a length uniform in [ratio x --max-tokens, --max-tokens], fixed "
                      "per prompt (as sglang.bench_serving's option; default 1: every request the same length)")
    load.add_argument("--temperature", type=float, nargs="+", default=[0.0],
                      help="sampling temperature(s); several: every level runs at each, with fresh prompts")
    load.add_argument("--dataset", default="builtin", help="builtin (the chat set, default; alias chat), grounded "
                      "(a passage and a task that copies from it), grounded-recurring (the same, each passage asked several tasks "
                      "within a level, as users working on one document), code-edit (a function, class or method of "
                      "Python's standard library, read here at run time, with an edit task whose answer re-emits it: "
                      "rename, type hints, docstrings, a loop rewritten, reformat; use --max-tokens 256), a JSONL "
                      "file or a ShareGPT JSON file")
    load.add_argument("--dataset-format", choices=["auto", "jsonl", "sharegpt"], default="auto")
    load.add_argument("--shuffle", action="store_true", help="shuffle a --dataset file (seeded)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--request-timeout", type=float, default=300, help="seconds before a request counts as "
                      "timed out")
    load.add_argument("--level-timeout", type=float, default=600, help="bound on one level's wall time (s)")
    load.add_argument("--repeats", type=int, default=1,
                      help="run each level N times over, on fresh prompts each time (N x the prompts and rounds): "
                      "more rounds for every ratio's interval (default 1)")
    capacity = parser.add_argument_group("capacity (SLO, goodput, max load)")
    capacity.add_argument("--slo", metavar="SPEC",
                          help="per-request service-level objective, e.g. ttft=2s,tpot=100ms (metrics: ttft, tpot or "
                          "itl, e2e; units ms, s; a pNN term sets the target share, e.g. ttft=2s,tpot=100ms,p90): "
                          "goodput, SLO attainment and users per server in the tables, JSON and goodput.png")
    capacity.add_argument("--slo-target", type=float, metavar="SHARE",
                          help=f"share of a level's requests that must meet the SLO for the level to pass (default "
                          f"{slo.DEFAULT_TARGET:g}, or the --slo's pNN)")
    capacity.add_argument("--find-max-load", action="store_true",
                          help="search the loads (--concurrency or --request-rate, ascending) for the highest whose "
                          "SLO attainment stays >= the target, per configuration, interleaved: each configuration "
                          "stops climbing at its first miss, then --search-steps bisection steps between its last "
                          "pass and first miss (needs --slo)")
    capacity.add_argument("--search-steps", type=int, default=2,
                          help="bisection steps after the climb of --find-max-load (default 2; 0: the levels only)")
    out = parser.add_argument_group("output")
    out.add_argument("--output-dir", help="where loadtest.json and frontier.png go (default loadtest-results/DATE)")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    out.add_argument("--replot", metavar="JSON", help="redraw the PNGs and the tables from a loadtest.json (no "
                     "requests); with --slo, goodput under that SLO from the run's per-request timings")
    parser.set_defaults(slo_spec=None)
    return parser


def _stop_on_sigterm():
    """SIGTERM (kill PID) unwinds like Ctrl-C, so a launched server is still stopped by its ``finally``. Returns
    the previous handler (None off the main thread, where handlers cannot be set)."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, interrupt)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, checked: combinations that cannot work are refused here, before any server starts."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.label and (not args.url or len(args.label) != len(args.url)):
        parser.error("--label needs one label per --url")
    if args.url and (args.model_path or args.draft_model_path):
        parser.error("--model-path/--draft-model-path launch servers; with --url the servers are already running")
    if args.draft_model_path and not args.model_path:
        parser.error("--draft-model-path goes with --model-path")
    if args.baseline_draft_model_path:
        if args.url:
            parser.error("--baseline-draft-model-path launches a server; with --url the servers are already running")
        if not (Path(args.baseline_draft_model_path) / "config.json").is_file():
            parser.error(f"--baseline-draft-model-path {args.baseline_draft_model_path}: no config.json there "
                         "(give the folder of a DSpark draft checkpoint)")
        if "dspark-baseline-draft" not in args.configs:
            args.configs = [*args.configs, "dspark-baseline-draft"]
    elif "dspark-baseline-draft" in args.configs and not args.url:
        parser.error("configuration dspark-baseline-draft needs --baseline-draft-model-path DRAFT_DIR")
    if not 0.0 < args.random_range_ratio <= 1.0:
        parser.error("--random-range-ratio must be in (0, 1]")
    if args.max_tokens < 1 or args.request_timeout <= 0 or args.level_timeout <= 0:
        parser.error("--max-tokens, --request-timeout and --level-timeout must be positive")
    if args.repeats < 1 or args.search_steps < 0:
        parser.error("--repeats must be at least 1 and --search-steps at least 0")
    if args.slo:
        try:
            args.slo_spec = slo.parse_slo(args.slo, args.slo_target)
        except ValueError as exc:
            parser.error(f"--slo: {exc}")
    elif args.slo_target is not None or args.find_max_load:
        parser.error("--slo-target and --find-max-load need --slo (e.g. --slo ttft=2s,tpot=100ms)")
    if args.find_max_load and len(args.temperature) > 1:
        parser.error("--find-max-load searches at one temperature: give one --temperature per run")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot, args.output_dir, args.slo_spec)
    previous_handler = _stop_on_sigterm()
    try:
        args.url = [normalize_url(url, args.allow_remote) for url in args.url or []]
        result = run(args, argv)
    except LoadTestError as exc:
        print(f"sglang-dspark loadtest: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sglang-dspark loadtest: interrupted (launched servers stopped)", file=sys.stderr)
        return 130
    finally:
        if previous_handler is not None:
            import signal

            signal.signal(signal.SIGTERM, previous_handler)
    failed = [c["label"] for c in result["configs"] if c.get("error")]
    if failed:
        print(f"sglang-dspark loadtest: {len(failed)} configuration(s) did not complete: {', '.join(failed)} "
              "(reasons in loadtest.json)", file=sys.stderr)
        return 1
    return 0
