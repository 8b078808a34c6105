"""DSPARK of this checkout against DSPARK of another build of sglang-dspark, side by side in one interleaved load test,
with two no-spec servers (the second the noise yardstick): what a refactor that must not change behaviour checks.

    git worktree add /tmp/before <commit>
    .venv/bin/pip install --no-deps --no-build-isolation --target /tmp/before-pkg /tmp/before
    .venv/bin/python benchmarks/before_after.py --before /tmp/before-pkg --dataset chat grounded

Starts four stock ``python -m sglang.launch_server`` servers on the embedded pair (``--dtype float32``,
``--max-total-tokens``, ``--sleep-on-idle``, 127.0.0.1): no-spec, no-spec (control), DSPARK as built before
(``PYTHONPATH`` = ``--before``, whose ``sglang_dspark`` then shadows this checkout's in that server alone) and DSPARK
of this checkout; then, per dataset, ``python -m sglang_dspark.loadtest --url ...`` with fresh prompts per level and
ratios against no-spec. That ``--before`` shadows this checkout is checked first (``import sglang_dspark`` and its
``profiler`` resolve there). Everything is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_dspark.loadtest import runner
from sglang_dspark.local_server import start_server


def shadows_checkout(pythonpath: Path) -> bool:
    """Whether ``import sglang_dspark`` (and its ``profiler``, which this checkout maps from another folder) resolve
    under ``pythonpath`` in this venv's interpreter with ``PYTHONPATH=pythonpath`` (the editable install's finder
    comes after ``PYTHONPATH``, so the other build wins there)."""
    out = subprocess.run([sys.executable, "-c", "import sglang_dspark, sglang_dspark.profiler as p; "
                          "print(sglang_dspark.__file__); print(p.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(pythonpath)}, capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return all(pythonpath in Path(line).resolve().parents for line in out.stdout.split())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a folder holding the other build's sglang_dspark package")
    parser.add_argument("--dataset", nargs="+", default=["chat", "grounded"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--temperature", nargs="+", default=["0"])
    parser.add_argument("--max-total-tokens", type=int, default=32768)
    parser.add_argument("--output-dir")
    args = parser.parse_args(argv)
    before = Path(args.before).resolve()
    if not (before / "sglang_dspark" / "__init__.py").is_file():
        parser.error(f"--before {before}: no sglang_dspark package there (pip install --target it first)")
    if not shadows_checkout(before):
        parser.error(f"--before {before}: with it on PYTHONPATH, sglang_dspark still imports from this checkout")
    from sglang_dspark.embedded.defaults import ensure_default_pair

    target, draft = ensure_default_pair()
    output = Path(args.output_dir or tempfile.mkdtemp(prefix="sglang-dspark-before-after-"))
    output.mkdir(parents=True, exist_ok=True)
    dspark = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(draft)]
    configs = [("no-spec", [], {}), ("no-spec (control)", [], {}),
               ("DSPARK before", dspark, {"PYTHONPATH": str(before)}), ("DSPARK after", dspark, {})]
    servers = []
    try:
        for label, extra, env in configs:
            server = start_server(target, ["--dtype", "float32", *extra], env=env,
                                  max_total_tokens=args.max_total_tokens, log_dir=output / "logs", timeout=600)
            servers.append(server)
            print(f"[before-after] {label}: {server.url}", file=sys.stderr)
        for dataset in args.dataset:
            runner.main(["--url", *(s.url for s in servers), "--label", *(label for label, _, _ in configs),
                         "--dataset", dataset, "--concurrency", *map(str, args.concurrency),
                         "--max-tokens", str(args.max_tokens), "--rounds", str(args.rounds),
                         "--temperature", *args.temperature, "--output-dir", str(output / dataset)])
        print(f"[before-after] results in {output}", file=sys.stderr)
    finally:
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
