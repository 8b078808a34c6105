"""GPU smoke check for maintainers with a GPU (this project's CI has none): ``scripts/gpu_smoke.sh``.

Per attention backend (default: fa3 and flashinfer), with default DSPARK flags:
1. what ``sglang-dspark explain`` predicts for this GPU (verify mode, reason, probe shapes);
2. the server starts (SPS profiling on graph tiers, CUDA graphs captured) and its log names the verify mode;
3. greedy output identical to no-spec on every prompt (fp32 target: no bf16 tie-breaks);
4. tokens/s at c = 1 and 16 of no-spec, upstream's DSPARK worker (static) and ours, side by side.
Prints one JSON report; exits 1 if any server fails to start or any greedy output differs.

Default pair: a random Qwen3 target + DeepSpec-format DSpark draft of the released schema at reduced size, built
offline in seconds (``draft/deepspec_schema.py``); random weights still exercise every kernel and graph path. Pass
``--target``/``--draft`` for a real pair (e.g. Qwen3-8B + deepseek-ai/dspark_qwen3_8b_block7).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [f"def function_{i}(x):\n    return" for i in range(16)]
GREEDY = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}


def _run(server, concurrency: int, prompts=PROMPTS) -> tuple[list[list[int]], float]:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: server.generate(p, dict(GREEDY)), prompts))
    seconds = time.monotonic() - started
    return [r["output_ids"] for r in results], sum(len(r["output_ids"]) for r in results) / seconds


def smoke(target: str, draft: str, backends: list[str], log_dir: Path) -> dict:
    from sglang_dspark.engine.explain import explain
    from sglang_dspark.testing.server import start_server

    spec = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft]
    report: dict = {"target": target, "draft": draft, "backends": {}}
    ok = True
    for backend in backends:
        common = ["--dtype", "float32", "--attention-backend", backend, "--sleep-on-idle"]
        entry: dict = {"explain": explain(["--model-path", target, *spec, *common], "cuda", None)}
        runs = {}
        for label, args, env in (
            ("no-spec", common, {}),
            ("dspark-upstream-static", common + spec, {"SGLANG_DSPARK_WORKER": "upstream"}),
            ("dspark-ours", common + spec, {}),
        ):
            try:
                server = start_server(target, args, env=env, cpu=False, log_dir=log_dir, timeout=900)
            except Exception as exc:  # noqa: BLE001 - the report says what failed
                runs[label] = {"error": str(exc)[-2000:]}
                ok = False
                continue
            try:
                ids, _ = _run(server, 1)
                runs[label] = {
                    "ids": ids,
                    "tok_s_c1": _run(server, 1)[1],
                    "tok_s_c16": _run(server, 16)[1],
                    "verify_mode_log": [l for l in server.log_text().splitlines() if "verify" in l.lower()][-3:],
                }
            finally:
                server.stop()
        reference = runs.get("no-spec", {}).get("ids")
        for label, run in runs.items():
            if "ids" in run:
                run["greedy_identical"] = run["ids"] == reference
                ok &= bool(run["greedy_identical"])
                run.pop("ids")
        if "tok_s_c1" in runs.get("no-spec", {}):
            for label, run in runs.items():
                for c in ("c1", "c16"):
                    if f"tok_s_{c}" in run:
                        run[f"ratio_{c}"] = run[f"tok_s_{c}"] / runs["no-spec"][f"tok_s_{c}"]
        entry["runs"] = runs
        report["backends"][backend] = entry
    report["ok"] = ok
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--backends", nargs="+", default=["fa3", "flashinfer"])
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-gpu-smoke-"))
    target, draft = args.target, args.draft
    if not target:
        from sglang_dspark.draft.deepspec_schema import build_released_schema_pair

        pair = build_released_schema_pair(work / "pair")
        target, draft = str(pair.target_dir), str(pair.draft_dir)
    report = smoke(target, draft, args.backends, Path(args.log_dir or work / "logs"))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
