"""Fuzz a real SGLang server's request inputs; the server's liveness is the oracle.

Sends the shared corpus (``sglang_dspark.testing.fuzz_corpus``) and, with ``--random N``, N random combinations
of extreme sampling parameters to /generate, /v1/completions and /v1/chat/completions of one server on
127.0.0.1, checking after every request that the server still runs and answers /health. A request that kills
the server is recorded (with the last exception line of the server log) and the server is restarted, so one run
finds every crasher.

    .venv/bin/python scripts/fuzz_inputs.py                              # our plugin (input guard on)
    .venv/bin/python scripts/fuzz_inputs.py --without-dspark-plugin      # stock SGLang 0.5.23 behaviour
    .venv/bin/python scripts/fuzz_inputs.py --dspark --random 200 --json out.json

Only one server runs at a time; it is always stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from sglang_dspark.testing import fuzz_corpus as fc
from sglang_dspark.local_server import start_server

EXTREMES = {
    # JSON carries no NaN/inf (SGLang's parser refuses them); 1e308 becomes inf in float32 tensors.
    "max_new_tokens": [-1, 0, 1, 3, 2**31, 2**63, 10**9],
    "temperature": [0.0, 1e-7, 2e-6, 0.7, 1e30, 1e308, -1.0],
    "top_p": [0.0, 1e-308, 1e-30, 0.5, 1.0, 1.0000001],
    "top_k": [-2, -1, 0, 1, 2, 10**5, 2**31 - 1, 2**31, 2**63],
    "min_p": [-0.1, 0.0, 1e-308, 0.5, 1.0],
    "frequency_penalty": [-2.0, 0.0, 2.0, 2.5],
    "presence_penalty": [-2.0, 2.0, 1e308],
    "repetition_penalty": [1e-308, 1e-6, 0.5, 1.0, 2.0, 3.0],
    "min_new_tokens": [0, 1, 3, 10**6, -1],
    "n": [0, 1, 2, 5, -1, 2000],
    "stop": ["", [""], ["\n", "x"], "ab" * 1000],
    "stop_token_ids": [[0], [-1], [10**6], [2**63], [4000]],
    "stop_regex": ["(", ".*", "\\d+", "a{2,1}"],
    "stream_interval": [0, -1, 1, 10**6],
    "ignore_eos": [True, False],
    "skip_special_tokens": [False],
    "no_stop_trim": [True],
    "sampling_seed": [0, -1, 2**63 - 1, 2**64],
    "logit_bias": [{"5": 100.0}, {"5": -1e308}, {"5": 1e308}, {"-1": 1.0}, {"3": 1e30, "7": -1e30}],
    "json_schema": ['{"type": "object"}', "{", '{"type": "nonsense"}'],
    "regex": ["[a-z]+", "(", ".*"],
}


def random_case(rng: random.Random, vocab_size: int) -> fc.FuzzCase:
    params = {k: rng.choice(vals) for k, vals in rng.sample(sorted(EXTREMES.items()), rng.randint(1, 4))}
    if "json_schema" in params and "regex" in params:
        params.pop("regex")
    params.setdefault("max_new_tokens", 3)
    endpoint = rng.choice(fc.ENDPOINTS)
    prompt_kind = rng.choice(["text", "text", "ids", "batch"])
    stream = rng.random() < 0.3
    description = f"random: {prompt_kind} {json.dumps(params, allow_nan=True)[:160]}"
    if endpoint == fc.GENERATE:
        body = {"sampling_params": params, "stream": stream}
        if prompt_kind == "ids":
            body["input_ids"] = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 8))]
        elif prompt_kind == "batch":
            body["text"] = [fc.PROMPT, "x = 1"]
        else:
            body["text"] = fc.PROMPT
        if rng.random() < 0.3:
            body.update(
                return_logprob=True,
                top_logprobs_num=rng.choice([0, 1, 5, vocab_size, vocab_size + 1, -1]),
                logprob_start_len=rng.choice([-1, -1, 0, 1, 2, -3, 10**6]),
            )
        return fc.FuzzCase(endpoint, body, description)
    openai = {k: v for k, v in params.items() if k not in ("max_new_tokens", "min_new_tokens", "logit_bias")}
    openai["max_tokens"] = params["max_new_tokens"] if params["max_new_tokens"] is not None else 3
    if "min_new_tokens" in params:
        openai["min_tokens"] = params["min_new_tokens"]
    if "logit_bias" in params:
        openai["logit_bias"] = params["logit_bias"]
    for key in ("json_schema", "regex"):  # chat takes these through response_format / regex only
        if endpoint == fc.CHAT and key == "json_schema" and key in openai:
            schema = openai.pop(key)
            try:
                openai["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": json.loads(schema)},
                }
            except ValueError:
                pass
    body = {"model": "default", "stream": stream, **openai}
    if endpoint == fc.COMPLETIONS:
        body["prompt"] = [rng.randrange(vocab_size) for _ in range(3)] if prompt_kind == "ids" else fc.PROMPT
    else:
        body["messages"] = [{"role": "user", "content": fc.PROMPT}]
    return fc.FuzzCase(endpoint, body, description)


def last_exception_line(log_text: str) -> str:
    lines = [l for l in log_text.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", l)]
    return lines[-1][:300] if lines else "(no exception line in the server log)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: build the tiny pair in a temporary folder)")
    ap.add_argument("--vocab-size", type=int, help="default: read from the model's config.json")
    ap.add_argument("--dspark", action="store_true", help="serve with DSPARK (the tiny pair's draft)")
    ap.add_argument("--without-dspark-plugin", action="store_true",
                    help="SGLANG_PLUGINS=dspark_cpu_platform: stock SGLang behaviour (no input guard)")
    ap.add_argument("--random", type=int, default=0, help="random cases after the corpus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", default=[],
                    help="only corpus cases whose description contains this text (repeatable: any of them)")
    ap.add_argument("--skip", action="append", default=[], help="skip corpus cases whose description contains this")
    ap.add_argument("--skip-corpus", action="store_true")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--log-dir")
    ap.add_argument("--max-restarts", type=int, default=40)
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds for a server to become healthy")
    args = ap.parse_args(argv)
    # SIGTERM (e.g. `kill PID`) unwinds like Ctrl-C, so the `finally` below stops the server by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-fuzz-"))
    draft_dir = None
    if args.model:
        model_dir = Path(args.model)
    else:
        from sglang_dspark.testing.tiny_pair import build_tiny_pair

        pair = build_tiny_pair(work / "pair")
        model_dir, draft_dir = pair.target_dir, pair.draft_dir
    vocab_size = args.vocab_size or json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    extra = ["--dtype", "float32"]
    if args.dspark:
        if draft_dir is None:
            ap.error("--dspark needs the tiny pair (no --model)")
        extra += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(draft_dir)]
    env = {"SGLANG_PLUGINS": "dspark_cpu_platform"} if args.without_dspark_plugin else None
    log_dir = Path(args.log_dir) if args.log_dir else work / "logs"

    cases = [] if args.skip_corpus else fc.build_corpus(vocab_size)
    if args.only:
        cases = [c for c in cases if any(o in c.description for o in args.only)]
    cases = [c for c in cases if not any(s in c.description for s in args.skip)]
    rng = random.Random(args.seed)
    cases += [random_case(rng, vocab_size) for _ in range(args.random)]

    print(f"{len(cases)} cases; vocab_size {vocab_size}; server log dir {log_dir}", flush=True)
    results, crashers, restarts = [], [], 0
    server = start_server(model_dir, extra, env=env, log_dir=log_dir, timeout=args.start_timeout)
    watch = fc.CrashWatch(server.log_path)
    started = time.monotonic()
    try:
        for case in cases:
            reply = fc.send(server.url, case)
            ok = fc.alive(server, settle=0.2, watch=watch)
            result = fc.Result(case, reply, ok, fc.judge(case, reply, ok))
            results.append(result)
            print(fc.describe(result), flush=True)
            if not ok:
                time.sleep(2)
                line = last_exception_line(server.log_text())
                crashers.append((case, line))
                print(f"      CRASH: {line}", flush=True)
                server.stop()
                restarts += 1
                if restarts > args.max_restarts:
                    print("too many restarts; stopping", flush=True)
                    break
                server = start_server(model_dir, extra, env=env, log_dir=log_dir, timeout=args.start_timeout)
                watch = fc.CrashWatch(server.log_path)
        final_ok = fc.generation_works(server.url)
    finally:
        server.stop()

    bad = [r for r in results if r.problems]
    print(f"\n{len(results)} cases in {time.monotonic() - started:.0f} s; {len(crashers)} killed the server; "
          f"{len(bad)} with problems; generation after the run: {'OK' if final_ok else 'FAILED'}")
    for case, line in crashers:
        print(f"  CRASHER {case.endpoint} {case.description}\n      {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [
                {
                    "endpoint": r.case.endpoint, "description": r.case.description, "field": r.case.field,
                    "status": r.reply.status, "error_in_stream": r.reply.error_in_stream, "message": r.reply.message,
                    "alive_after": r.alive_after, "problems": r.problems,
                    "body": json.dumps(r.case.body, allow_nan=True)[:2000],
                }
                for r in results
            ],
            indent=1,
        ))
    return 0 if not bad and final_ok else 1


if __name__ == "__main__":
    sys.exit(main())
