"""One DSPARK server against two DSPARK replicas behind SGLang's router (cache-aware and round-robin), measured
side by side with the load test on 127.0.0.1.

    python benchmarks/router_replicas.py                                   # embedded pair, grounded, c = 4 16
    python benchmarks/router_replicas.py --concurrency 4 16 --max-tokens 96 --output-dir /tmp/router-run

Starts five stock ``python -m sglang.launch_server --speculative-algorithm DSPARK`` servers on the embedded pair
(one alone; two replicas behind a cache-aware router; two behind a round-robin router), each with
``--max-total-tokens`` and ``--sleep-on-idle``, then runs ``python -m sglang_dspark.loadtest --url SINGLE ROUTER_CA
ROUTER_RR`` (interleaved levels, fresh prompts per level, ratios against the single server), and adds what the
load test cannot see through a router: per configuration, the lookup's and the draft's accept lengths summed over
its replicas' ``/server_info`` (lifetime counters read before and after the sweep), and how many requests each
replica served (the router's own per-worker count). Everything is stopped by PID at the end.

On one machine the replicas split the cores (replica i bound to core i, one OpenMP thread each; the single server
uses them all): two replicas cannot run faster than one server here, so what this measures is routing's effect on
the lookup (does cache-aware routing keep a passage's requests on one replica) and the cost of splitting one
machine's cores, not scale-out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from sglang_dspark.loadtest import runner
from sglang_dspark.loadtest.engine import lookup_delta, server_snapshot
from sglang_dspark.local_server import start_server
from sglang_dspark.testing.router import start_router

CONFIGS = (("single", None), ("router cache-aware", "cache_aware"), ("router round-robin", "round_robin"))


def _admission(url: str) -> dict | None:
    return (server_snapshot(url).get("dspark_admission") or {}).get("lookup")


def _sum_deltas(deltas: list[dict]) -> dict:
    total = {}
    for source in ("lookup", "draft"):
        rows = sum(d[source]["rows"] for d in deltas)
        accepted = sum(d[source]["accepted"] for d in deltas)
        verified = sum(d[source]["verified"] for d in deltas)
        total[source] = {"rows": rows, "verified": verified, "accepted": accepted,
                         "accept_length": 1 + accepted / rows if rows else None}
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dataset", default="grounded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    parser.add_argument("--health-interval", type=int, default=60,
                        help="the router's health probe interval, s (default: the router's own, 60; SGLang's /health "
                             "runs a one-token generation, so a short interval keeps every replica busy)")
    parser.add_argument("--output-dir")
    args = parser.parse_args(argv)
    from sglang_dspark.embedded.defaults import ensure_default_pair

    target, draft = ensure_default_pair()
    output = Path(args.output_dir or tempfile.mkdtemp(prefix="sglang-dspark-router-run-"))
    output.mkdir(parents=True, exist_ok=True)
    server_args = ["--dtype", "float32", "--speculative-algorithm", "DSPARK",
                   "--speculative-draft-model-path", str(draft)]
    servers, routers, replicas_of, urls = [], [], {}, []
    try:
        for label, policy in CONFIGS:
            count = 1 if policy is None else 2
            group = []
            for index in range(count):
                # A replica gets its share of the cores (one each here), as compose's OMP_NUM_THREADS does: replicas
                # whose OpenMP threads oversubscribe the cores spin against each other.
                env = {} if policy is None else {"SGLANG_CPU_OMP_THREADS_BIND": str(index % os.cpu_count()),
                                                 "OMP_NUM_THREADS": "1"}
                server = start_server(target, server_args, env=env, max_total_tokens=args.max_total_tokens,
                                      log_dir=output / "logs", timeout=600)
                servers.append(server)
                group.append(server.url)
            replicas_of[label] = group
            if policy is None:
                urls.append(group[0])
            else:
                router = start_router(group, policy, health_check_interval=args.health_interval, log_dir=output / "logs")
                routers.append((label, router))
                urls.append(router.url)
            print(f"[router-run] {label}: {urls[-1]} -> {group}", file=sys.stderr)
        before = {url: _admission(url) for group in replicas_of.values() for url in group}
        runner.main(["--url", *urls, "--label", *(label for label, _ in CONFIGS),
                     "--dataset", args.dataset, "--seed", str(args.seed), "--tokenizer", str(target),
                     "--concurrency", *map(str, args.concurrency), "--max-tokens", str(args.max_tokens),
                     "--temperature", "0", "--output-dir", str(output)])
        summary = {}
        for label, group in replicas_of.items():
            deltas = [lookup_delta(before[url], _admission(url)) for url in group]
            summary[label] = _sum_deltas([d for d in deltas if d])
        for label, router in routers:
            summary[label]["requests_per_worker"] = router.requests_per_worker()
        (output / "replicas.json").write_text(json.dumps(summary, indent=1))
        print("\n| configuration | lookup accept length | draft accept length | requests per replica |")
        print("|---|---|---|---|")
        for label, entry in summary.items():
            share = entry.get("requests_per_worker")
            shares = " / ".join(f"{v:.0f}" for v in share.values()) if share else "—"
            lookup, draft_ = entry["lookup"]["accept_length"], entry["draft"]["accept_length"]
            print(f"| {label} | {lookup and f'{lookup:.2f}'} | {draft_ and f'{draft_:.2f}'} | {shares} |")
        print(f"[router-run] results in {output}", file=sys.stderr)
    finally:
        for _, router in routers:
            router.stop()
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
