#!/usr/bin/env python
"""Soak a DSPARK server (longer than tests/e2e/test_e2e_soak.py, same code: sglang_dspark/testing/soak.py).

    .venv/bin/python scripts/soak.py                          # tiny pair, 10 min, 8 clients, --max-total-tokens 2048
    .venv/bin/python scripts/soak.py --duration 1800 --json soak.json
    .venv/bin/python scripts/soak.py --model TARGET --draft DRAFT --max-total-tokens 4096

Starts one server on 127.0.0.1 (stock launcher, --speculative-algorithm DSPARK, --sleep-on-idle, the CPU flags on a
CPU), runs the soak, prints requests / aborts / refusals / errors / scheduler RSS drift / KV after, stops the server
by PID. Exit status 1 when a request was lost or errored, KV stayed in use, the server is unhealthy, the RSS drift is
5 % or more, or the greedy probe changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="target model folder (default: the tiny test pair, built in a temp folder)")
    parser.add_argument("--draft", help="DSpark draft folder (with --model)")
    parser.add_argument("--duration", type=float, default=600.0, help="soak seconds (default 600)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-requests", type=int, default=5000)
    parser.add_argument("--min-requests", type=int, default=0, help="keep issuing past --duration until this many")
    parser.add_argument("--warmup-requests", type=int, default=40)
    parser.add_argument("--abort-share", type=float, default=0.2)
    parser.add_argument("--near-limit-share", type=float, default=0.25)
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu", action="store_true", help="do not add the CPU flags")
    parser.add_argument("--tp-size", type=int, default=1,
                        help="TP ranks (on the CPU over gloo, one core per rank through SGLANG_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--log-dir", help="server log folder (default: a temp folder)")
    args = parser.parse_args(argv)

    from sglang_dspark.local_server import start_server
    from sglang_dspark.testing.soak import SoakConfig, run_soak

    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-soak-"))
    if args.model:
        if not args.draft:
            parser.error("--model needs --draft")
        target, draft = args.model, args.draft
    else:
        from sglang_dspark.testing.tiny_pair import build_tiny_pair

        pair = build_tiny_pair(work / "tiny-pair")
        target, draft = pair.target_dir, pair.draft_dir
    cfg = SoakConfig(duration_s=args.duration, min_requests=args.min_requests,
                     hard_limit_s=max(600.0, 2 * args.duration), concurrency=args.concurrency,
                     max_requests=args.max_requests,
                     warmup_requests=args.warmup_requests, abort_share=args.abort_share,
                     near_limit_share=args.near_limit_share, max_total_tokens=args.max_total_tokens, seed=args.seed)
    server_args = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(draft)]
    env = None
    if args.tp_size > 1:
        server_args += ["--tp-size", str(args.tp_size)]
        if not args.gpu:  # SGLang refuses more CPU ranks than NUMA nodes unless each rank is given its cores
            env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(rank) for rank in range(args.tp_size))}
    if not args.gpu:
        server_args = ["--dtype", "float32", *server_args]
    server = start_server(target, server_args, env=env, max_total_tokens=args.max_total_tokens, cpu=not args.gpu,
                          timeout=900, log_dir=args.log_dir or work / "logs")
    print(f"[soak] server pid {server.process.pid} at {server.url}, log {server.log_path}", flush=True)
    try:
        report = run_soak(server.url, server.process.pid, cfg, log=lambda m: print(f"[soak] {m}", flush=True))
    finally:
        alive = server.alive()
        server.stop()
    for line in report.lines():
        print(f"[soak] {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({**report.to_dict(), "config": vars(args)}, indent=2))
    ok = (alive and report.accounted and report.outcomes["error"] == 0 and report.kv_used_after == 0
          and report.healthy_after and abs(report.rss_drift) < 0.05 and report.greedy_unchanged)
    print(f"[soak] {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
