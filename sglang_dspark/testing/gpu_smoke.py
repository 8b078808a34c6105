"""GPU smoke check for maintainers with a GPU (this project's CI has none): ``scripts/gpu_smoke.sh``.

Runs on the official ``lmsysorg/sglang:v0.5.23`` image after ``pip install`` of this package (nothing else: the
default pair is built offline, the servers are SGLang's own launcher on 127.0.0.1). Per attention backend (default
fa3 and flashinfer), three servers one after another: upstream's DSPARK worker (static), ours, and no-spec last,
which then scores every run's greedy output. Prints one table (``--json`` keeps the full report); exits 1 if a
server does not start or a run misses its threshold. The table also says whether our worker's prompt lookup verified
chains (``/server_info``): their tokens are scored with the rest, so a wrong chain accept fails the match.

Dtype: bfloat16, except ``--attention-backend triton``, which runs float32 (FA3 accepts only fp16/bf16/fp8 and
FlashInfer's JIT has no fp32 attention, so a float32 server does not start there).

Match rate: no-spec scores each run's outputs at c = 1 and at c = 16 (prompt + output as input, ``return_logprob``
with ``logprob_start_len`` just before the output and ``top_logprobs_num=1``), so every output token is compared with
the token no-spec's greedy decoding picks after the same prefix. Free-running identity is no test in bf16: one tie
broken the other way changes the rest of the output. Pass, for every run against no-spec in the same dtype:

* match rate >= ``MATCH_THRESHOLDS`` (bfloat16 0.90, float32 0.95), and
* every token that differs is within ``TIE_NATS`` (1.0 nat) of no-spec's top token: a tie broken the other way,
  never a wrong token.

Measured on the CPU for the default pair, greedy decoding with a KV cache scored by a full forward of the same model:
bfloat16 matched 0.968 with every difference at most 0.25 nats (its logits are near 16-32, where bf16 steps by
0.125), float32 1.0. A real model's top logits reach 32-64, where bf16 steps by 0.25: hence the 1.0 nat margin.
A wrong token (wrong attention, a wrong acceptance) is rarely within a nat of no-spec's, so such a run fails by its
gap even where its rate is high. No-spec also scores its own outputs (the "no-spec" row): the noise of scoring itself.

Default pair: a random Qwen3 target + DeepSpec-format DSpark draft of the released schema at reduced size, built
offline in seconds (``testing/deepspec_schema.py``); random weights still exercise every kernel and graph path. Pass
``--target``/``--draft`` for a real pair (e.g. Qwen/Qwen3-8B + deepseek-ai/dspark_qwen3_8b_block7).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

PROMPTS = [f"def function_{i}(x):\n    return" for i in range(16)]
MAX_NEW_TOKENS = 64
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
DEFAULT_BACKENDS = ("fa3", "flashinfer")
# Attention backends that run float32; every other runs bfloat16 (see the module docstring).
FLOAT32_BACKENDS = ("triton",)
MATCH_THRESHOLDS = {"bfloat16": 0.90, "float32": 0.95}
TIE_NATS = 1.0
NO_SPEC = "no-spec"
# (label, speculative, extra environment); no-spec last: it scores the others.
RUNS = (
    ("dspark-upstream-static", True, {"SGLANG_DSPARK_WORKER": "upstream"}),
    ("dspark-ours", True, {}),
    (NO_SPEC, False, {}),
)


def dtype_for_backend(backend: str) -> str:
    return "float32" if backend in FLOAT32_BACKENDS else "bfloat16"


def server_args(backend: str) -> list[str]:
    """The flags every server of one backend gets (the speculative ones come on top)."""
    return ["--dtype", dtype_for_backend(backend), "--attention-backend", backend, "--sleep-on-idle"]


def verify_mode_from_log(text: str) -> Optional[str]:
    """The verify mode our argument resolution logged (engine/arg_resolution.py), or None when it logged none."""
    mode = None
    for line in text.splitlines():
        found = re.search(r"sglang-dspark: (Compact|Static) verify", line)
        if found:
            mode = found.group(1).lower()
            continue
        found = re.search(r"sglang-dspark: SGLANG_RAGGED_VERIFY_MODE=([\w-]+) was set by the user", line)
        if found:
            mode = found.group(1)
        elif "sglang-dspark: admission policy verify-all verifies every draft token" in line:
            mode = "static"
    return mode


def scored_positions(meta_info: dict, output_ids: Sequence[int]) -> Optional[list[tuple[float, float, int]]]:
    """(token logprob, top logprob, top token) for each output token, from no-spec's scoring of prompt + output, or
    None when the answer does not carry them. Aligned on the token ids: the last ``len(output_ids)`` input positions
    are the output's tokens."""
    tokens = meta_info.get("input_token_logprobs") or []
    tops = meta_info.get("input_top_logprobs") or []
    n = len(output_ids)
    if n == 0 or len(tokens) < n or len(tops) != len(tokens):
        return None
    out = []
    for (logprob, token_id, *_), top, expected in zip(tokens[-n:], tops[-n:], output_ids):
        if logprob is None or not top or int(token_id) != int(expected):
            return None
        top_logprob, top_id = top[0][0], top[0][1]
        out.append((float(logprob), float(top_logprob), int(top_id)))
    return out


def match_summary(outputs: Sequence[Sequence[int]], scores: Sequence[Optional[list]],
                  reference: Optional[Sequence[Sequence[int]]]) -> dict:
    """Match rate (output tokens equal to no-spec's greedy choice after the same prefix), the widest gap of a token
    that differs (nats below no-spec's top token), and how many outputs equal no-spec's free-running output."""
    agree = total = 0
    worst_gap = 0.0
    unscored = 0
    for ids, score in zip(outputs, scores):
        if score is None:
            unscored += 1
            continue
        for token, (logprob, top_logprob, top_id) in zip(ids, score):
            total += 1
            if int(token) == top_id:
                agree += 1
            else:
                worst_gap = max(worst_gap, top_logprob - logprob)
    identical = None if reference is None else sum(list(a) == list(b) for a, b in zip(outputs, reference))
    return {"match_rate": agree / total if total else None, "worst_gap_nats": worst_gap, "scored_tokens": total,
            "unscored_outputs": unscored, "identical_outputs": identical, "outputs": len(outputs)}


def run_failures(run: dict, dtype: str, min_match: Optional[float] = None, tie_nats: float = TIE_NATS) -> list[str]:
    """Why a run fails the check (empty: it passes)."""
    if "error" in run:
        return ["did not start" if run.get("stage") == "start" else "failed while serving"]
    threshold = MATCH_THRESHOLDS[dtype] if min_match is None else min_match
    rate = run.get("match_rate")
    failures = []
    if rate is None or run.get("unscored_outputs"):
        failures.append("not scored by no-spec")
    if rate is not None and rate < threshold:
        failures.append(f"match {rate:.3f} < {threshold:.2f}")
    if run.get("worst_gap_nats", 0.0) > tie_nats:
        failures.append(f"a differing token {run['worst_gap_nats']:.2f} nats below no-spec's (> {tie_nats})")
    return failures


def _run(server, concurrency: int, prompts=PROMPTS) -> tuple[list[list[int]], float]:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: server.generate(p, dict(GREEDY)), prompts))
    seconds = time.monotonic() - started
    return [r["output_ids"] for r in results], sum(len(r["output_ids"]) for r in results) / seconds


def _prompt_ids(server, prompt: str) -> list[int]:
    """The server's own tokenization of ``prompt`` (its input logprobs carry the ids)."""
    meta = server.generate(prompt, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                           logprob_start_len=0)["meta_info"]
    return [int(entry[1]) for entry in meta["input_token_logprobs"]]


def _score(server, prompt_ids: list[int], output_ids: list[int]) -> Optional[list]:
    # Input logprob entry j is token start+j given its prefix, entry 0 is None (scheduler_components/
    # logprob_result_processor.py:26-79 in SGLang): start one before the output so that every output token is scored.
    meta = server.generate(None, {"max_new_tokens": 1, "temperature": 0}, input_ids=list(prompt_ids) + list(output_ids),
                           return_logprob=True, logprob_start_len=len(prompt_ids) - 1,
                           top_logprobs_num=1)["meta_info"]
    return scored_positions(meta, output_ids)


def lookup_activity(admission: Optional[dict]) -> Optional[dict]:
    """Our worker's prompt lookup from its ``/server_info`` admission summary (``loadtest.engine.server_snapshot``;
    None: not our DSPARK worker, or the lookup off): the request-steps that verified a chain, their accept length, and
    the decode steps that verified any."""
    lookup = (admission or {}).get("lookup")
    if not isinstance(lookup, dict):
        return None
    steps, chains = lookup.get("steps") or {}, lookup.get("lookup") or {}
    return {"rows": chains.get("rows"), "accept_length": chains.get("accept_length"),
            "chain_steps": steps.get("lookup", 0) + steps.get("mixed", 0), "steps": sum(steps.values())}


def _lookup_of(server) -> Optional[dict]:
    from sglang_dspark.loadtest.engine import server_snapshot

    return lookup_activity(server_snapshot(server.url).get("dspark_admission"))


def smoke(target: str, draft: str, backends: Sequence[str], log_dir: Path, *, start_server: Optional[Callable] = None,
          explain: Optional[Callable] = None, min_match: Optional[float] = None, tie_nats: float = TIE_NATS) -> dict:
    """Start, measure and score every run of every backend; returns the report (``render_table`` prints it)."""
    if start_server is None:
        from sglang_dspark.local_server import start_server
    if explain is None:
        from sglang_dspark.engine.explain import explain

    spec = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft]
    report: dict = {"target": target, "draft": draft, "tie_nats": tie_nats, "log_dir": str(log_dir), "backends": {}}
    ok = True
    for backend in backends:
        dtype = dtype_for_backend(backend)
        common = server_args(backend)
        entry: dict = {"dtype": dtype, "min_match": MATCH_THRESHOLDS[dtype] if min_match is None else min_match}
        try:
            entry["explain"] = explain(["--model-path", target, *spec, *common], "cuda", None)
        except Exception as exc:  # noqa: BLE001 - a prediction that cannot be made is reported, not fatal
            entry["explain"] = {"error": str(exc)}
        runs: dict = {}
        outputs: dict = {}
        for label, speculative, env in RUNS:
            try:
                server = start_server(target, common + spec if speculative else common, env=env, cpu=False,
                                      log_dir=log_dir, timeout=900)
            except Exception as exc:  # noqa: BLE001 - the report says what failed
                runs[label] = {"error": str(exc)[-2000:], "stage": "start"}
                continue
            run: dict = {"startup_seconds": round(getattr(server, "startup_seconds", 0.0), 1)}
            try:
                first_c1, _ = _run(server, 1)  # also the warm-up
                run["tok_s_c1"] = _run(server, 1)[1]
                # c = 16 verifies rows of different lengths in one step: its outputs are scored too
                outputs_c16, run["tok_s_c16"] = _run(server, 16)
                outputs[label] = first_c1 + outputs_c16
                run["verify_mode"] = verify_mode_from_log(server.log_text())
                if speculative:  # whether the lookup path ran (its tokens are scored with the rest)
                    run["lookup"] = _lookup_of(server)
                if label == NO_SPEC:  # the reference: score every run's output, its own included
                    prompt_ids = [_prompt_ids(server, p) for p in PROMPTS] * 2
                    for scored_label, ids in outputs.items():
                        scores = [_score(server, p, o) for p, o in zip(prompt_ids, ids)]
                        summary = match_summary(ids, scores, outputs[NO_SPEC])
                        (run if scored_label == NO_SPEC else runs[scored_label]).update(summary)
            except Exception as exc:  # noqa: BLE001
                run["error"] = str(exc)[-2000:]
                run["stage"] = "serve"
            finally:
                server.stop()
            runs[label] = run
        for label, run in runs.items():
            if "tok_s_c1" in run and "tok_s_c1" in runs.get(NO_SPEC, {}):
                for c in ("c1", "c16"):
                    run[f"ratio_{c}"] = run[f"tok_s_{c}"] / runs[NO_SPEC][f"tok_s_{c}"]
            run["failures"] = run_failures(run, dtype, min_match, tie_nats)
            ok &= not run["failures"]
        entry["runs"] = {label: runs[label] for label, _, _ in RUNS if label in runs}
        report["backends"][backend] = entry
    report["ok"] = ok
    return report


COLUMNS = ("backend", "dtype", "run", "start s", "verify mode", "explain", "match", "worst gap", "identical",
           "lookup rows / τ", "tok/s c1", "x c1", "tok/s c16", "x c16", "result")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for backend, entry in report["backends"].items():
        predicted = entry.get("explain", {}).get("verify_mode") or "?"
        for label, run in entry["runs"].items():
            identical = run.get("identical_outputs")
            failures = run.get("failures") or []
            rows.append((
                backend, entry["dtype"], label, _fmt(run.get("startup_seconds"), ".0f"),
                run.get("verify_mode") or "-", predicted if label == "dspark-ours" else "-",
                _fmt(run.get("match_rate"), ".3f"), _fmt(run.get("worst_gap_nats"), ".2f"),
                "-" if identical is None else f"{identical}/{run.get('outputs')}",
                _lookup_cell(run.get("lookup")),
                _fmt(run.get("tok_s_c1"), ".1f"), _fmt(run.get("ratio_c1"), ".2f"),
                _fmt(run.get("tok_s_c16"), ".1f"), _fmt(run.get("ratio_c16"), ".2f"),
                "ok" if not failures else "FAIL: " + "; ".join(failures),
            ))
    return rows


def _lookup_cell(lookup: Optional[dict]) -> str:
    if not lookup:
        return "-"
    return f"{lookup.get('rows') or 0} / {_fmt(lookup.get('accept_length'), '.2f')}"


def render_table(report: dict) -> str:
    """One table, one row per (backend, run), and the legend that states the thresholds."""
    rows = [COLUMNS, *table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    thresholds = ", ".join(f"{d} >= {t:.2f}" for d, t in sorted(
        {(e["dtype"], e["min_match"]) for e in report["backends"].values()}))
    lines.append(
        f"match: output tokens equal to no-spec's greedy token after the same prefix (no-spec scores each output); "
        f"pass: match {thresholds or '-'} and every differing token within {report['tie_nats']} nats of no-spec's "
        f"(worst gap). identical: outputs equal to no-spec's free-running output (information only). lookup: "
        f"request-steps that verified a prompt-lookup chain and their accept length (information only).")
    lines.append(f"{'PASS' if report['ok'] else 'FAIL'}: target {report['target']}, draft {report['draft']}, "
                 f"server logs in {report.get('log_dir', '-')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--backends", nargs="+", default=list(DEFAULT_BACKENDS),
                    help=f"attention backends (triton runs float32, the others bfloat16; default "
                         f"{' '.join(DEFAULT_BACKENDS)})")
    ap.add_argument("--min-match", type=float, default=None,
                    help=f"match-rate threshold for every backend (default {MATCH_THRESHOLDS})")
    ap.add_argument("--tie-nats", type=float, default=TIE_NATS,
                    help=f"widest gap a differing token may have below no-spec's top token (default {TIE_NATS})")
    ap.add_argument("--json", default=None, help="also write the full report (JSON) to this file")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args(argv)
    if args.draft and not args.target:
        ap.error("--draft needs --target")
    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-gpu-smoke-"))
    target, draft = args.target, args.draft
    if not target:
        from sglang_dspark.testing.deepspec_schema import build_released_schema_pair

        pair = build_released_schema_pair(work / "pair")
        target, draft = str(pair.target_dir), str(pair.draft_dir)
    elif not draft:
        ap.error("--target needs --draft")
    report = smoke(target, draft, args.backends, Path(args.log_dir or work / "logs"), min_match=args.min_match,
                   tie_nats=args.tie_nats)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(render_table(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
