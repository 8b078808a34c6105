"""Serve several configurations one after another in ONE run and print their throughput side by side (ratios).

These machines are noisy: compare configurations measured in the same run, never numbers from different runs.

    .venv/bin/python benchmarks/serve_side_by_side.py                        # tiny pair: no-spec vs DSPARK
    .venv/bin/python benchmarks/serve_side_by_side.py --suite scheduler      # DSPARK: scheduler on vs off
    .venv/bin/python benchmarks/serve_side_by_side.py --suite cpu-markov     # CPU Markov step: upstream's vs ours
    .venv/bin/python benchmarks/serve_side_by_side.py --suite draft-gate --fresh-prompts   # draft gate off vs auto
    .venv/bin/python benchmarks/serve_side_by_side.py --model-path T --draft-model-path D --concurrency 1 4

Each configuration is a real `python -m sglang.launch_server` on 127.0.0.1 (stopped by PID after its run); the
same prompts are sent at each concurrency level; tokens/s = generated tokens / wall time of the level. Requests go
through the load test's core (`sglang_dspark/loadtest/engine.py`: SGLang's own bench_serving client, streaming
/v1/chat/completions); `python -m sglang_dspark.loadtest` is the full sweep with latencies and the frontier plot.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.loadtest.engine import measure_level
from sglang_dspark.local_server import start_server

PROMPTS = [
    "def main():", "import os\nimport sys\n", "class Parser(object):\n    def __init__(self", "for i in range(10):",
    "if __name__ == '__main__':", "try:\n    import", "def __repr__(self):\n        return", "raise ValueError(",
    "with open(path) as f:", "while True:\n    line =", "self.assertEqual(", "from collections import",
    "async def fetch(", "@property\ndef name(self):", "except KeyError:", "print(f\"{",
]


def suites(args) -> dict[str, list[tuple[str, list[str], dict]]]:
    draft = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(args.draft_model_path)]
    return {
        "spec": [
            ("no-spec", [], {}),
            ("DSPARK (async, default)", draft, {}),
        ],
        "scheduler": [
            ("DSPARK scheduler off (verify-all)", draft, {"SGLANG_DSPARK_ADMISSION": "verify-all"}),
            ("DSPARK scheduler on (async)", draft, {"SGLANG_DSPARK_ADMISSION": "async"}),
        ],
        "upstream": [
            ("upstream DSPARK static", draft, {"SGLANG_DSPARK_WORKER": "upstream"}),
            ("sglang-dspark DSPARK", draft, {}),
        ],
        "draft-gate": [
            ("no-spec", [], {}),
            ("DSPARK, draft gate off", draft, {"SGLANG_DSPARK_DRAFT_GATE": "off"}),
            ("DSPARK (default: draft gate auto)", draft, {}),
        ],
        "cpu-markov": [
            ("no-spec", [], {}),
            ("DSPARK, upstream Markov step", draft, {"SGLANG_DSPARK_CPU_MARKOV_STEP": "upstream"}),
            ("DSPARK, our CPU Markov step", draft, {}),
        ],
    }


def level_prompts(concurrency: int, fresh: bool = False) -> list[str]:
    prompts = (PROMPTS * ((concurrency * 2) // len(PROMPTS) + 1))[: max(concurrency * 2, 4)]
    if fresh:  # new text per level and request (the same for every configuration): no prefix reuse across levels
        prompts = [f"# level {concurrency}, request {i}\n{p}" for i, p in enumerate(prompts)]
    return prompts


def run_level(server, concurrency: int, max_new_tokens: int, temperature: float, fresh: bool = False) -> dict:
    prompts = level_prompts(concurrency, fresh)
    measure_level(server.url, prompts[:1], concurrency=1, max_tokens=8, temperature=temperature)  # warm-up
    # Generous limits: on a shared 2-core machine a level can take many minutes; a cut request would void it.
    level = measure_level(server.url, prompts, concurrency=concurrency, max_tokens=max_new_tokens,
                          temperature=temperature, request_timeout=3600.0, level_timeout=3600.0)
    if level["completed"] != len(prompts):
        raise RuntimeError(f"{len(prompts) - level['completed']} of {len(prompts)} requests failed at c={concurrency}: "
                           f"{level['error_samples']}\n--- server log tail ---\n{server.log_tail()}")
    return {"tokens_per_second": level["output_tok_s"], "accept_length": level["accept_length"]}


def admission_summary(server) -> dict:
    try:
        return server.get("/server_info").json()["internal_states"][0].get("dspark_admission") or {}
    except Exception:  # noqa: BLE001 - non-DSPARK servers have no such key
        return {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["spec", "scheduler", "upstream", "cpu-markov", "draft-gate"], default="spec")
    parser.add_argument("--fresh-prompts", action="store_true",
                        help="prefix every prompt with its level and index (no prefix-cache reuse across levels)")
    parser.add_argument("--model-path")
    parser.add_argument("--draft-model-path")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-total-tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    if not args.model_path:
        from sglang_dspark.embedded.defaults import ensure_default_pair

        args.model_path, args.draft_model_path = ensure_default_pair()
    log_dir = Path(tempfile.mkdtemp(prefix="sglang-dspark-bench-"))
    configs = suites(args)[args.suite]
    rows = []
    for label, extra, env in tqdm(configs, desc="configurations", unit="server"):
        server = start_server(
            args.model_path, ["--dtype", args.dtype, *extra], env=env,
            max_total_tokens=args.max_total_tokens, log_dir=log_dir, timeout=1200,  # busy shared machines
        )
        try:
            row = {"label": label, "startup_s": server.startup_seconds}
            for c in args.concurrency:
                row[c] = run_level(server, c, args.max_new_tokens, args.temperature, args.fresh_prompts)
            row["admission"] = admission_summary(server)
        finally:
            server.stop()
        rows.append(row)

    base = rows[0]
    print(f"\nsuite={args.suite} model={args.model_path} max_new_tokens={args.max_new_tokens} "
          f"temperature={args.temperature} (logs: {log_dir})")
    header = f"{'configuration':36s} {'start s':>8s}" + "".join(
        f" {'c=' + str(c) + ' tok/s':>12s} {'ratio':>6s} {'accept':>7s}" for c in args.concurrency
    ) + f" {'step ms':>8s} {'admitted':>9s}"
    print(header)
    for row in rows:
        line = f"{row['label']:36s} {row['startup_s']:8.1f}"
        for c in args.concurrency:
            tps = row[c]["tokens_per_second"]
            accept = row[c]["accept_length"]
            line += f" {tps:12.1f} {tps / base[c]['tokens_per_second']:6.2f} {accept if accept else float('nan'):7.2f}"
        adm = row["admission"]
        step = adm.get("mean_step_ms")
        admitted = adm.get("mean_admitted_draft_len")
        line += f" {step if step is not None else float('nan'):8.2f} {admitted if admitted is not None else float('nan'):9.2f}"
        print(line)
    for row in rows:
        gate = row["admission"].get("draft_gate")
        if gate:
            print(f"{row['label']}: drafted_step_share={row['admission'].get('drafted_step_share')}, gate "
                  f"pauses={gate.get('pauses')} resumes={gate.get('resumes')} probes={gate.get('probes')} "
                  f"reasons={gate.get('reasons')} draft_ms={gate.get('draft_ms')}")
    steps = [row["admission"].get("mean_step_ms") for row in rows]
    if all(steps):
        print("step time ratio vs first row: " + ", ".join(f"{row['label']}: {s / steps[0]:.2f}" for row, s in zip(rows, steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
