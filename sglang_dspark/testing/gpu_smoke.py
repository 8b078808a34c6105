"""GPU smoke check for maintainers with a GPU (this project's CI has none): ``scripts/gpu_smoke.sh``.

Runs on the official ``lmsysorg/sglang:v0.5.23`` image after ``pip install`` of this package (nothing else: the
default pair is built offline, the servers are SGLang's own launcher on 127.0.0.1). Per attention backend (``--backends
fa3,flashinfer`` by default), four servers one after another: upstream's DSPARK worker (static), ours with the prompt
lookup on, ours with it off (``SGLANG_DSPARK_LOOKUP=off``: the draft alone), and no-spec last, which then scores every
run's greedy output. Prints a table per run, a table per backend and, per backend, what the run proved: each check
PASS / FAIL (or INFO: a timing, never a failure; SKIP: could not be judged, the reason says why). ``--json`` keeps the
full report; exits 1 if any check fails.

Checks per backend:

* **servers**: all four started and served (a backend whose minimum head dim the target misses, FlashInfer's 64, is
  not started and fails: the row would test nothing).
* **verify mode**: the mode our worker logged (lookup on and off) is what ``sglang-dspark explain`` predicts for the
  same flags.
* **match**: every run's greedy output against no-spec's (below).
* **lookup**: where ``explain`` says the lookup is on and ours verifies compact, it *proposed* at least once. A
  proposal is made from the request's own context whenever its tail (2-6 tokens) recurs there, whatever the weights;
  with random weights an output rarely repeats itself, so the prompts include **echo prompts** (each code prompt P
  sent as P + the 32 tokens the model continued P with + P, built once by the first server that serves): a model that
  continues P as before finds its tail in the prompt, so a working lookup path has tails to match whatever the
  weights (what the echo prompts gave on the CPU: docs/gpu.md, "Checks to run on a GPU"). So zero proposals over the
  whole run is the lookup path failing on this backend (issue #46, by reading: on fa3's overlap path it never
  proposes), not chance. Verified chains and accepted tokens are reported, not asserted: the scheduler may rightly
  decline every chain of a random pair. Where explain says the lookup is off, no lookup may run; with
  ``SGLANG_DSPARK_LOOKUP=off`` none may run.
* **speed** (INFO): ours against upstream static at c = 16, ours with the lookup against without, on the code and the
  echo prompts. With the default random pair (hidden 512) a GPU step is host and launch time: no speed claim.

Dtype: bfloat16, except ``--attention-backend triton``, which runs float32 (FA3 accepts only fp16/bf16/fp8 and
FlashInfer's JIT has no fp32 attention, so a float32 server does not start there).

Match rate: no-spec scores each run's outputs (code prompts at c = 1 and 16, echo prompts at c = 1 and 16; prompt +
output as input, ``return_logprob`` with ``logprob_start_len`` just before the output and ``top_logprobs_num=1``), so
every output token is compared with the token no-spec's greedy decoding picks after the same prefix. Free-running
identity is no test in bf16: one tie broken the other way changes the rest of the output. Pass, for every run against
no-spec in the same dtype:

* match rate >= ``MATCH_THRESHOLDS`` (bfloat16 0.90, float32 0.95), and
* every token that differs is within ``TIE_NATS`` (1.0 nat) of no-spec's top token: a tie broken the other way,
  never a wrong token. Tokens accepted from lookup chains are scored with the rest, so a wrong chain accept fails.

The thresholds leave room for bf16 tie-breaks and nothing more (what the default pairs scored on the CPU: docs/gpu.md,
"Checks to run on a GPU"): a real model's top logits reach 32-64, where bf16 steps by 0.25, hence the 1.0 nat margin.
A wrong token (wrong attention, a wrong acceptance) is rarely within a nat of no-spec's, so such a run fails by its gap
even where its rate is high. No-spec also scores its own outputs (the "no-spec" row): the noise of scoring.

Default pair: a random Qwen3 target + DeepSpec-format DSpark draft of the released schema at reduced size and the
released head dim 128 (GQA 4:1, Qwen3-8B's attention shape; ``deepspec_schema.SMOKE_SIZES``), built offline in
seconds; random weights still exercise every kernel and graph path. Pass ``--target``/``--draft`` for a real pair on
disk (e.g. Qwen/Qwen3-8B + deepseek-ai/dspark_qwen3_8b_block7, downloaded beforehand).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence, Union

PROMPTS = [f"def function_{i}(x):\n    return" for i in range(16)]
MAX_NEW_TOKENS = 64
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
ECHO_TOKENS = 32  # tokens of the model's own continuation an echo prompt repeats
DEFAULT_BACKENDS = ("fa3", "flashinfer")
# Attention backends that run float32; every other runs bfloat16 (see the module docstring).
FLOAT32_BACKENDS = ("triton",)
# The smallest head dim an attention backend serves: FlashInfer's FA2 prefill marks every kernel with head dim < 64
# invalid (flashinfer/data/include/flashinfer/attention/prefill.cuh, "Invalid configuration" at dispatch).
MIN_HEAD_DIM = {"flashinfer": 64}
MATCH_THRESHOLDS = {"bfloat16": 0.90, "float32": 0.95}
TIE_NATS = 1.0
UPSTREAM = "dspark-upstream-static"
OURS = "dspark-ours"
OURS_LOOKUP_OFF = "dspark-ours-lookup-off"
NO_SPEC = "no-spec"
# (label, speculative, extra environment); no-spec last: it scores the others. Ours states the lookup switch both
# ways, so an SGLANG_DSPARK_LOOKUP in the caller's environment cannot make the two columns the same.
RUNS = (
    (UPSTREAM, True, {"SGLANG_DSPARK_WORKER": "upstream"}),
    (OURS, True, {"SGLANG_DSPARK_LOOKUP": "on"}),
    (OURS_LOOKUP_OFF, True, {"SGLANG_DSPARK_LOOKUP": "off"}),
    (NO_SPEC, False, {}),
)
# What each server runs, in order: (workload, prompt set, concurrency, timed). The first pass warms up (CUDA graphs,
# JIT) and is scored but not timed. Outputs are scored in this order.
PASSES = (
    ("code_warmup", "code", 1, False),
    ("code_c1", "code", 1, True),
    ("code_c16", "code", 16, True),
    ("echo_c1", "echo", 1, True),
    ("echo_c16", "echo", 16, True),
)
SCORED_PASSES = ("code_warmup", "code_c16", "echo_c1", "echo_c16")

Prompt = Union[str, Sequence[int]]


def dtype_for_backend(backend: str) -> str:
    return "float32" if backend in FLOAT32_BACKENDS else "bfloat16"


def server_args(backend: str) -> list[str]:
    """The flags every server of one backend gets (the speculative ones come on top)."""
    return ["--dtype", dtype_for_backend(backend), "--attention-backend", backend, "--sleep-on-idle"]


def parse_backends(values: Sequence[str]) -> list[str]:
    """``--backends`` as given (``fa3,flashinfer``, ``fa3 flashinfer`` or both): names in order, each once. Raises
    ValueError for an empty list or a name SGLang does not know (where its choices can be read)."""
    names: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    if not names:
        raise ValueError("--backends needs at least one attention backend")
    try:
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    except ImportError:  # another SGLang layout: let the server refuse an unknown name
        return names
    unknown = [name for name in names if name not in ATTENTION_BACKEND_CHOICES]
    if unknown:
        raise ValueError(f"unknown attention backend(s) {', '.join(unknown)}; SGLang's: "
                         f"{', '.join(ATTENTION_BACKEND_CHOICES)}")
    return names


def target_head_dim(target: str) -> Optional[int]:
    """The target's attention head dim from its config.json (a local folder or the local Hugging Face cache; never
    downloads), or None where it cannot be read."""
    from sglang_dspark.engine.draft_head import read_local_config

    config, _ = read_local_config(target)
    if not config:
        return None
    config = config.get("text_config") or config
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return int(hidden) // int(heads) if hidden and heads else None


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
        if run.get("stage") == "not run":
            return ["not run"]
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


def _generate(server, prompt: Prompt, params: dict) -> dict:
    if isinstance(prompt, str):
        return server.generate(prompt, dict(params))
    return server.generate(None, dict(params), input_ids=list(prompt))


def _run(server, concurrency: int, prompts: Sequence[Prompt] = PROMPTS) -> tuple[list[list[int]], float]:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: _generate(server, p, GREEDY), prompts))
    seconds = time.monotonic() - started
    return [r["output_ids"] for r in results], sum(len(r["output_ids"]) for r in results) / seconds


def _prompt_ids(server, prompt: Prompt) -> list[int]:
    """The server's own tokenization of ``prompt`` (its input logprobs carry the ids); token ids as they are."""
    if not isinstance(prompt, str):
        return list(prompt)
    meta = server.generate(prompt, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                           logprob_start_len=0)["meta_info"]
    return [int(entry[1]) for entry in meta["input_token_logprobs"]]


def echo_prompts(server, prompts: Sequence[str] = PROMPTS, tokens: int = ECHO_TOKENS) -> list[list[int]]:
    """Per prompt P, the token ids of P + (the ``tokens`` greedy tokens ``server`` continues P with) + P: a prompt
    that carries its answer for any weights (module docstring)."""
    out = []
    for prompt in prompts:
        ids = _prompt_ids(server, prompt)
        continued = _generate(server, ids, dict(GREEDY, max_new_tokens=tokens))["output_ids"]
        out.append(ids + [int(t) for t in continued] + ids)
    return out


def _score(server, prompt_ids: list[int], output_ids: list[int]) -> Optional[list]:
    # Input logprob entry j is token start+j given its prefix, entry 0 is None (scheduler_components/
    # logprob_result_processor.py:26-79 in SGLang): start one before the output so that every output token is scored.
    meta = server.generate(None, {"max_new_tokens": 1, "temperature": 0}, input_ids=list(prompt_ids) + list(output_ids),
                           return_logprob=True, logprob_start_len=len(prompt_ids) - 1,
                           top_logprobs_num=1)["meta_info"]
    return scored_positions(meta, output_ids)


def lookup_activity(admission: Optional[dict]) -> Optional[dict]:
    """Our worker's prompt lookup from its ``/server_info`` admission summary (``loadtest.engine.server_snapshot``;
    None: not our DSPARK worker, or the lookup off): the request-steps that got a proposal, those that verified a
    chain (rows), the chain tokens verified and accepted, their accept length, the decode steps that verified any
    chain and all decode steps, and the loads where the scheduler keeps SGLang's overlap."""
    lookup = (admission or {}).get("lookup")
    if not isinstance(lookup, dict):
        return None
    steps, chains = lookup.get("steps") or {}, lookup.get("lookup") or {}
    return {"proposals": chains.get("proposals"), "rows": chains.get("rows"), "verified": chains.get("verified"),
            "accepted": chains.get("accepted"), "accept_length": chains.get("accept_length"),
            "chain_steps": steps.get("lookup", 0) + steps.get("mixed", 0), "steps": sum(steps.values()),
            "overlap_kept_at": lookup.get("overlap_kept_at")}


def _lookup_of(server) -> Optional[dict]:
    from sglang_dspark.loadtest.engine import server_snapshot

    return lookup_activity(server_snapshot(server.url).get("dspark_admission"))


@contextlib.contextmanager
def _lookup_env_on():
    """explain reads ``SGLANG_DSPARK_LOOKUP`` from this process: predict for ours as it is started (lookup on)."""
    old = os.environ.get("SGLANG_DSPARK_LOOKUP")
    os.environ["SGLANG_DSPARK_LOOKUP"] = "on"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SGLANG_DSPARK_LOOKUP", None)
        else:
            os.environ["SGLANG_DSPARK_LOOKUP"] = old


def smoke(target: str, draft: str, backends: Sequence[str], log_dir: Path, *, start_server: Optional[Callable] = None,
          explain: Optional[Callable] = None, min_match: Optional[float] = None, tie_nats: float = TIE_NATS,
          head_dim: Optional[int] = None, default_pair: bool = False) -> dict:
    """Start, measure and score every run of every backend and judge each backend (``backend_checks``); returns the
    report (``render_table`` prints it). ``head_dim``: the target's (None: read from its config where local)."""
    if start_server is None:
        from sglang_dspark.local_server import start_server
    if explain is None:
        from sglang_dspark.engine.explain import explain
    if head_dim is None:
        head_dim = target_head_dim(target)

    spec = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft]
    report: dict = {"target": target, "draft": draft, "head_dim": head_dim, "default_pair": default_pair,
                    "tie_nats": tie_nats, "log_dir": str(log_dir), "backends": {}, "echo_prompts": None}
    ok = True
    for backend in backends:
        dtype = dtype_for_backend(backend)
        common = server_args(backend)
        entry: dict = {"dtype": dtype, "min_match": MATCH_THRESHOLDS[dtype] if min_match is None else min_match}
        try:
            with _lookup_env_on():
                entry["explain"] = explain(["--model-path", target, *spec, *common], "cuda", None)
        except Exception as exc:  # noqa: BLE001 - a prediction that cannot be made is reported, not fatal
            entry["explain"] = {"error": str(exc)}
        minimum = MIN_HEAD_DIM.get(backend)
        if minimum is not None and head_dim is not None and head_dim < minimum:
            entry["not_run"] = (f"target head dim {head_dim} < {minimum}, the smallest {backend} serves: its servers "
                                f"would not start (pass a pair with head dim >= {minimum})")
            runs = {label: {"error": entry["not_run"], "stage": "not run"} for label, _, _ in RUNS}
        else:
            runs = _serve_backend(report, backend, common, spec, target, start_server, log_dir)
        for label, run in runs.items():
            if "tok_s" in run and "tok_s" in runs.get(NO_SPEC, {}):
                base = runs[NO_SPEC]["tok_s"]
                run["ratio"] = {key: value / base[key] for key, value in run["tok_s"].items() if base.get(key)}
            run["failures"] = run_failures(run, dtype, min_match, tie_nats)
        entry["runs"] = {label: runs[label] for label, _, _ in RUNS if label in runs}
        entry["checks"] = backend_checks(entry, tie_nats=tie_nats, default_pair=default_pair)
        entry["ok"] = not any(check["status"] == "FAIL" for check in entry["checks"])
        ok &= entry["ok"]
        report["backends"][backend] = entry
    report["ok"] = ok
    return report


def _serve_backend(report: dict, backend: str, common: list, spec: list, target: str, start_server: Callable,
                   log_dir: Path) -> dict:
    """Start each run of one backend in turn, run ``PASSES`` and let no-spec (last) score every run."""
    runs: dict = {}
    outputs: dict = {}
    for label, speculative, env in RUNS:
        try:
            server = start_server(target, common + spec if speculative else common, env=env, cpu=False,
                                  log_dir=log_dir, timeout=900)
        except Exception as exc:  # noqa: BLE001 - the report says what failed
            runs[label] = {"error": str(exc)[-2000:], "stage": "start"}
            continue
        run: dict = {"startup_seconds": round(getattr(server, "startup_seconds", 0.0), 1), "tok_s": {}}
        try:
            run["verify_mode"] = verify_mode_from_log(server.log_text())
            if report["echo_prompts"] is None:  # built once, by the first server that serves, for every run
                report["echo_prompts"] = echo_prompts(server)
                report["echo_built_by"] = f"{backend} {label}"
            prompt_sets = {"code": PROMPTS, "echo": report["echo_prompts"]}
            produced = {}
            for name, prompts, concurrency, timed in PASSES:
                produced[name], tok_s = _run(server, concurrency, prompt_sets[prompts])
                if timed:
                    run["tok_s"][name] = tok_s
            outputs[label] = [ids for name in SCORED_PASSES for ids in produced[name]]
            if speculative:  # whether the lookup path ran (its tokens are scored with the rest)
                run["lookup"] = _lookup_of(server)
            if label == NO_SPEC:  # the reference: score every run's output, its own included
                prompt_ids = {"code": [_prompt_ids(server, p) for p in PROMPTS], "echo": report["echo_prompts"]}
                scored_prompts = [ids for name in SCORED_PASSES
                                  for ids in prompt_ids[next(p for n, p, _, _ in PASSES if n == name)]]
                for scored_label, ids in outputs.items():
                    scores = [_score(server, p, o) for p, o in zip(scored_prompts, ids)]
                    summary = match_summary(ids, scores, outputs[NO_SPEC])
                    (run if scored_label == NO_SPEC else runs[scored_label]).update(summary)
        except Exception as exc:  # noqa: BLE001
            run["error"] = str(exc)[-2000:]
            run["stage"] = "serve"
        finally:
            server.stop()
        runs[label] = run
    return runs


# ------------------------------------------------------------------------------------------------ verdicts


class Check(NamedTuple):
    status: str  # PASS, FAIL, INFO (a number, never a failure) or SKIP (could not be judged)
    name: str
    claim: str

    def as_dict(self) -> dict:
        return self._asdict()


def _served(run: Optional[dict]) -> bool:
    return bool(run) and "error" not in run


def _lookup_expected(explained: dict) -> Optional[bool]:
    """Whether explain says our worker runs the lookup with these flags (None: explain gave no prediction)."""
    note = explained.get("prompt_lookup")
    if "error" in explained or not isinstance(note, str) or not note:
        return None
    return not note.lower().startswith("off")


def backend_checks(entry: dict, *, tie_nats: float = TIE_NATS, default_pair: bool = False) -> list[dict]:
    """What one backend's runs proved (module docstring), as ``Check`` dicts in order: servers, verify mode, match,
    lookup, lookup off, speed. A backend passes when no check is FAIL."""
    runs = entry.get("runs") or {}
    if entry.get("not_run"):
        return [Check("FAIL", "servers", f"not run: {entry['not_run']}").as_dict()]
    checks = [_servers_check(runs), _verify_mode_check(runs, entry.get("explain") or {}),
              _match_check(runs, entry, tie_nats), _lookup_check(runs, entry.get("explain") or {}),
              _lookup_off_check(runs), *_speed_checks(runs, default_pair)]
    return [check.as_dict() for check in checks]


def _servers_check(runs: dict) -> Check:
    labels = [label for label, _, _ in RUNS]
    missing = [label for label in labels if label not in runs]
    not_started = [label for label in labels if (runs.get(label) or {}).get("stage") == "start"]
    failed = [label for label in labels if (runs.get(label) or {}).get("stage") == "serve"]
    if not (missing or not_started or failed):
        return Check("PASS", "servers", f"all {len(labels)} servers started and served")
    parts = [f"did not start: {', '.join(not_started)}" if not_started else "",
             f"failed while serving: {', '.join(failed)}" if failed else "",
             f"missing: {', '.join(missing)}" if missing else ""]
    return Check("FAIL", "servers", "; ".join(p for p in parts if p) + " (see the server logs)")


def _verify_mode_check(runs: dict, explained: dict) -> Check:
    ours = [label for label in (OURS, OURS_LOOKUP_OFF) if _served(runs.get(label))]
    if not ours:
        return Check("SKIP", "verify mode", "our worker did not serve")
    modes = {label: runs[label].get("verify_mode") for label in ours}
    silent = [label for label, mode in modes.items() if mode is None]
    if silent:
        return Check("FAIL", "verify mode", f"{', '.join(silent)} logged no verify mode: is the plugin loaded?")
    if "error" in explained or not explained.get("verify_mode"):
        return Check("SKIP", "verify mode", f"ours verified {', '.join(sorted(set(modes.values())))}; explain could "
                                            f"not predict: {explained.get('error', 'no verify_mode')}")
    predicted = explained["verify_mode"]
    wrong = {label: mode for label, mode in modes.items() if mode != predicted}
    if wrong:
        return Check("FAIL", "verify mode", "; ".join(f"{label} verified {mode}" for label, mode in wrong.items())
                     + f", explain predicted {predicted}")
    return Check("PASS", "verify mode", f"ours ({' and '.join(ours)}) verified {predicted}, as explain predicted")


def _match_check(runs: dict, entry: dict, tie_nats: float) -> Check:
    threshold = entry.get("min_match", MATCH_THRESHOLDS.get(entry.get("dtype"), 0.9))
    failing, rates = [], []
    for label, run in runs.items():
        if (run or {}).get("stage") in ("start", "not run"):
            continue  # the servers check says so
        failures = [f for f in run.get("failures") or [] if f not in ("did not start", "not run")]
        if failures:
            failing.append(f"{label}: {'; '.join(failures)}")
        elif run.get("match_rate") is not None:
            rates.append(f"{label} {run['match_rate']:.3f} (worst gap {run.get('worst_gap_nats', 0.0):.2f})")
    claim = f"greedy match >= {threshold:.2f} and every differing token within {tie_nats} nats of no-spec's"
    if failing:
        return Check("FAIL", "match", f"{claim}: not for " + " | ".join(failing))
    if not rates:
        return Check("SKIP", "match", "nothing was scored (no-spec did not serve)")
    return Check("PASS", "match", f"{claim}: " + ", ".join(rates))


def _lookup_numbers(lookup: dict) -> str:
    accept = lookup.get("accept_length")
    return (f"{lookup.get('proposals') or 0} request-steps got a proposal, {lookup.get('rows') or 0} verified a chain "
            f"(accepted {lookup.get('accepted') or 0} of {lookup.get('verified') or 0} chain tokens"
            f"{'' if accept is None else f', τ {accept:.2f}'}), {lookup.get('chain_steps', 0)} of "
            f"{lookup.get('steps', 0)} decode steps carried a chain; overlap kept at loads "
            f"{lookup.get('overlap_kept_at') or []}")


def _lookup_check(runs: dict, explained: dict) -> Check:
    ours = runs.get(OURS)
    if not _served(ours):
        return Check("SKIP", "lookup", f"{OURS} did not serve")
    expected = _lookup_expected(explained)
    lookup = ours.get("lookup")
    if expected is None:
        return Check("SKIP", "lookup", "explain gave no lookup prediction"
                     + (f"; {_lookup_numbers(lookup)}" if lookup else "; no lookup ran"))
    if not expected:
        if lookup is None:
            return Check("PASS", "lookup", f"no lookup ran, as explain says: {explained.get('prompt_lookup')}")
        return Check("FAIL", "lookup", f"a lookup ran although explain says {explained.get('prompt_lookup')!r}: "
                                       f"{_lookup_numbers(lookup)}")
    if ours.get("verify_mode") != "compact":
        return Check("SKIP", "lookup", f"{OURS} verified {ours.get('verify_mode')}, not compact (see verify mode)")
    if lookup is None:
        return Check("FAIL", "lookup", "explain says the lookup is on, but /server_info has no lookup summary")
    if not lookup.get("proposals"):
        return Check("FAIL", "lookup", f"lookup proposed nothing on a compact backend over {lookup.get('steps', 0)} "
                                       f"decode steps, echo prompts included (their tails recur in their prompts): "
                                       f"the lookup path does not run here")
    note = "" if lookup.get("rows") else " (no chain verified: the scheduler may decline a random pair's chains)"
    return Check("PASS", "lookup", f"lookup proposed: {_lookup_numbers(lookup)}{note}")


def _lookup_off_check(runs: dict) -> Check:
    off = runs.get(OURS_LOOKUP_OFF)
    if not _served(off):
        return Check("SKIP", "lookup off", f"{OURS_LOOKUP_OFF} did not serve")
    if off.get("lookup") is not None:
        return Check("FAIL", "lookup off", f"SGLANG_DSPARK_LOOKUP=off still ran the lookup: "
                                           f"{_lookup_numbers(off['lookup'])}")
    return Check("PASS", "lookup off", "SGLANG_DSPARK_LOOKUP=off ran no lookup (its column is the draft alone)")


def _ratio(run: Optional[dict], key: str) -> Optional[float]:
    return ((run or {}).get("ratio") or {}).get(key)


def _speed_checks(runs: dict, default_pair: bool) -> list[Check]:
    caveat = " (random pair: a GPU step is host and launch time, no speed claim)" if default_pair else ""
    ours, upstream, off = runs.get(OURS), runs.get(UPSTREAM), runs.get(OURS_LOOKUP_OFF)
    checks = []
    a, b = _ratio(ours, "code_c16"), _ratio(upstream, "code_c16")
    if a is None or b is None:
        checks.append(Check("INFO", "ours vs upstream", "not measured (a server did not serve)"))
    else:
        verdict = "ours >= upstream static" if a >= b else "ours < upstream static"
        checks.append(Check("INFO", "ours vs upstream",
                            f"{verdict} at c=16 on the code prompts: {a:.2f}x against {b:.2f}x no-spec{caveat}"))
    pairs = []
    for key in ("code_c1", "code_c16", "echo_c1", "echo_c16"):
        on, without = ((ours or {}).get("tok_s") or {}).get(key), ((off or {}).get("tok_s") or {}).get(key)
        if on and without:
            pairs.append(f"{key.replace('_', ' ')} {on / without:.2f}x")
    checks.append(Check("INFO", "lookup on vs off",
                        ("tok/s of ours with the lookup over ours without: " + ", ".join(pairs) + caveat) if pairs
                        else "not measured (a server did not serve)"))
    return checks


# ------------------------------------------------------------------------------------------------ tables

COLUMNS = ("backend", "dtype", "run", "start s", "verify mode", "explain", "match", "worst gap", "identical",
           "lookup prop / rows / τ", "tok/s c1", "x c1", "tok/s c16", "x c16", "x echo c1", "x echo c16", "result")
SUMMARY_COLUMNS = ("backend", "dtype", "verify ours / explain", "upstream static x", "ours lookup on x",
                   "ours lookup off x", "lookup prop / rows / steps", "result")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(report: dict) -> list[tuple[str, ...]]:
    """One row per (backend, run)."""
    rows = []
    for backend, entry in report["backends"].items():
        predicted = entry.get("explain", {}).get("verify_mode") or "?"
        for label, run in entry["runs"].items():
            identical = run.get("identical_outputs")
            failures = run.get("failures") or []
            tok_s, ratio = run.get("tok_s") or {}, run.get("ratio") or {}
            rows.append((
                backend, entry["dtype"], label, _fmt(run.get("startup_seconds"), ".0f"),
                run.get("verify_mode") or "-", predicted if label in (OURS, OURS_LOOKUP_OFF) else "-",
                _fmt(run.get("match_rate"), ".3f"), _fmt(run.get("worst_gap_nats"), ".2f"),
                "-" if identical is None else f"{identical}/{run.get('outputs')}",
                _lookup_cell(run.get("lookup")),
                _fmt(tok_s.get("code_c1"), ".1f"), _fmt(ratio.get("code_c1"), ".2f"),
                _fmt(tok_s.get("code_c16"), ".1f"), _fmt(ratio.get("code_c16"), ".2f"),
                _fmt(ratio.get("echo_c1"), ".2f"), _fmt(ratio.get("echo_c16"), ".2f"),
                "ok" if not failures else "FAIL: " + "; ".join(failures),
            ))
    return rows


def _lookup_cell(lookup: Optional[dict]) -> str:
    if not lookup:
        return "-"
    return f"{lookup.get('proposals') or 0} / {lookup.get('rows') or 0} / {_fmt(lookup.get('accept_length'), '.2f')}"


def _ratio_cell(run: Optional[dict]) -> str:
    if not run or not run.get("ratio"):
        return "-"
    r = run["ratio"]
    return (f"{_fmt(r.get('code_c1'), '.2f')}/{_fmt(r.get('code_c16'), '.2f')}, "
            f"echo {_fmt(r.get('echo_c1'), '.2f')}/{_fmt(r.get('echo_c16'), '.2f')}")


def summary_rows(report: dict) -> list[tuple[str, ...]]:
    """One row per backend: lookup on and off side by side."""
    rows = []
    for backend, entry in report["backends"].items():
        runs = entry.get("runs") or {}
        ours = runs.get(OURS) or {}
        on, off = (str((runs.get(label) or {}).get("verify_mode") or "-") for label in (OURS, OURS_LOOKUP_OFF))
        lookup = ours.get("lookup")
        failed = [check["name"] for check in entry.get("checks") or [] if check["status"] == "FAIL"]
        rows.append((
            backend, entry["dtype"], f"{on}, off {off} / {entry.get('explain', {}).get('verify_mode') or '?'}",
            _ratio_cell(runs.get(UPSTREAM)), _ratio_cell(ours), _ratio_cell(runs.get(OURS_LOOKUP_OFF)),
            "-" if not lookup else f"{lookup.get('proposals') or 0} / {lookup.get('rows') or 0} / "
                                   f"{lookup.get('steps', 0)}",
            "ok" if not failed else "FAIL: " + ", ".join(failed),
        ))
    return rows


def _render(columns: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    rows = [tuple(columns), *body]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return lines


def check_lines(report: dict) -> list[str]:
    """Per backend, what its runs proved: one line per check."""
    lines = []
    for backend, entry in report["backends"].items():
        lines.append(f"{backend} ({entry['dtype']}): {'PASS' if entry.get('ok', True) else 'FAIL'}")
        for check in entry.get("checks") or []:
            lines.append(f"  {check['status']:<4}  {check['name']}: {check['claim']}")
    return lines


def render_table(report: dict) -> str:
    """The per-run table and its legend, the per-backend table, each backend's checks and the verdict."""
    lines = _render(COLUMNS, table_rows(report))
    thresholds = ", ".join(f"{d} >= {t:.2f}" for d, t in sorted(
        {(e["dtype"], e["min_match"]) for e in report["backends"].values()}))
    lines.append(
        f"match: output tokens equal to no-spec's greedy token after the same prefix (no-spec scores each output: "
        f"code prompts at c=1 and 16, echo prompts at c=1 and 16); pass: match {thresholds or '-'} and every "
        f"differing token within {report['tie_nats']} nats of no-spec's (worst gap). identical: outputs equal to "
        f"no-spec's free-running output (information only). lookup: request-steps with a proposal / that verified a "
        f"chain / the chains' accept length. x: tok/s over no-spec's; echo: each code prompt P as P + the model's "
        f"{ECHO_TOKENS}-token continuation + P.")
    lines.append("")
    lines.extend(_render(SUMMARY_COLUMNS, summary_rows(report)))
    lines.append("x cells: code c=1/c=16, echo c=1/c=16, tok/s over no-spec's. lookup: ours with the lookup on.")
    lines.append("")
    lines.extend(check_lines(report))
    head_dim = report.get("head_dim")
    pair = "; the default pair, random weights" if report.get("default_pair") else ""
    lines.append(f"{'PASS' if report['ok'] else 'FAIL'}: target {report['target']}, draft {report['draft']} "
                 f"(head dim {head_dim if head_dim is not None else '?'}{pair}), server logs in "
                 f"{report.get('log_dir', '-')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target model (a local folder or a hub id already downloaded); default: the "
                                     "random head-dim-128 released-schema pair, built offline")
    ap.add_argument("--draft", help="its DeepSpec-format DSpark draft (with --target)")
    ap.add_argument("--backends", nargs="+", default=[",".join(DEFAULT_BACKENDS)],
                    help=f"attention backends, one row each, comma- or space-separated (triton runs float32, the "
                         f"others bfloat16; default {','.join(DEFAULT_BACKENDS)})")
    ap.add_argument("--min-match", type=float, default=None,
                    help=f"match-rate threshold for every backend (default {MATCH_THRESHOLDS})")
    ap.add_argument("--tie-nats", type=float, default=TIE_NATS,
                    help=f"widest gap a differing token may have below no-spec's top token (default {TIE_NATS})")
    ap.add_argument("--json", default=None, help="also write the full report (JSON) to this file")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args(argv)
    if args.draft and not args.target:
        ap.error("--draft needs --target")
    if args.target and not args.draft:
        ap.error("--target needs --draft")
    try:
        backends = parse_backends(args.backends)
    except ValueError as exc:
        ap.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-gpu-smoke-"))
    target, draft = args.target, args.draft
    default_pair = not target
    if default_pair:
        from sglang_dspark.testing.deepspec_schema import SMOKE_SIZES, build_released_schema_pair

        pair = build_released_schema_pair(work / "pair", sizes=SMOKE_SIZES)
        target, draft = str(pair.target_dir), str(pair.draft_dir)
    report = smoke(target, draft, backends, Path(args.log_dir or work / "logs"), min_match=args.min_match,
                   tie_nats=args.tie_nats, default_pair=default_pair)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(render_table(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
