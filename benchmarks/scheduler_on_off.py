"""Issue-3 benchmark, one run: admit cost per step (1, 16, 256 requests × γ = 16), then the CPU server with the
tiny pair, scheduler off (verify-all) vs on (async), side by side: tokens/s and mean step time ratios.

    .venv/bin/python benchmarks/scheduler_on_off.py [--concurrency 1 8 32]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import admission_cost  # noqa: E402
import serve_side_by_side  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    admission_cost.main(["--runs", str(args.runs), "--gamma", "16"])
    return serve_side_by_side.main(["--suite", "scheduler", "--concurrency", *map(str, args.concurrency)])


if __name__ == "__main__":
    sys.exit(main())
