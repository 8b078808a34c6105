"""``python -m sglang_dspark.profiler``: the step-cost model from the command line.

    profile [--out T.json] [--png P.png] -- <launch_server args>   serve once on 127.0.0.1 (the worker profiles SPS at
                                                                 start-up, as every DSPARK server does), save the table
    show T.json                                                  print it: seconds per verify step, rows = requests R
    plot T.json --out P.png                                      PNG: steps/s vs verify tokens, one curve per R
    compare A.json B.json                                        per-cell ratio B/A (e.g. two machines, two versions)

A table file is ours (``SpsTable.to_json``), a cache entry (``$SGLANG_DSPARK_CACHE/sps/*.json``) or upstream's JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from sglang_dspark.profiler.sps_table import SpsTable
from sglang_dspark.profiler.upstream_sps import load_sps_table_file


def load_any_table(path: "str | Path") -> SpsTable:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and "table" in data and "key" in data:  # a cache entry: key + table
        return SpsTable.from_dict(data["table"], strict=False)
    return load_sps_table_file(path)


def format_table(table: SpsTable) -> str:
    lines = [repr(table)]
    for requests, cells in table.probe_seconds().items():
        row = "  ".join(f"B={b}: {s * 1e3:.2f} ms ({1 / s:.0f}/s)" for b, s in cells.items())
        lines.append(f"R={requests:<4} {row}")
    return "\n".join(lines)


def compare_tables(base: SpsTable, other: SpsTable) -> list[tuple[int, int, float]]:
    """(R, B, other/base seconds) at every probe cell of ``base``, looked up in ``other`` (interpolated)."""
    return [
        (r, b, other.step_seconds(r, b) / seconds)
        for r, cells in base.probe_seconds().items()
        for b, seconds in cells.items()
    ]


def plot_table(table: SpsTable, out: "str | Path", title: Optional[str] = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("plotting needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for requests, cells in table.probe_seconds().items():
        tokens = list(cells)
        ax.plot(tokens, [1 / cells[b] for b in tokens], marker="o", label=f"R = {requests}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verify tokens B (all requests, anchors included)")
    ax.set_ylabel("target verify steps per second")
    ax.set_title(title or "SPS(R, B)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)


def profile_served_model(launch_args: Sequence[str], timeout: float = 900) -> SpsTable:
    """Start one DSPARK server with a private cache folder, let its worker profile SPS at start-up, read the table."""
    from sglang_dspark.local_server import start_server

    args = list(launch_args)
    if "--model-path" not in args:
        raise SystemExit("profile: pass the launch_server arguments after --, including --model-path")
    model = args.pop(args.index("--model-path") + 1)
    args.remove("--model-path")
    if "--speculative-algorithm" not in args:
        args += ["--speculative-algorithm", "DSPARK"]
    with tempfile.TemporaryDirectory(prefix="sglang-dspark-profile-") as cache:
        server = start_server(model, args, env={"SGLANG_DSPARK_CACHE": cache}, timeout=timeout)
        server.stop()
        entries = sorted((Path(cache) / "sps").glob("sps-*.json"))
        if not entries:
            raise SystemExit(
                "profile: the server stored no SPS table (is the draft's confidence head enabled and the admission "
                "policy not verify-all?). Server log: " + server.log_text()[-2000:]
            )
        return load_any_table(entries[-1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_dspark.profiler", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="serve once, save the start-up SPS table")
    p.add_argument("--out", default="sps_table.json")
    p.add_argument("--png")
    p.add_argument("launch_args", nargs=argparse.REMAINDER, help="-- then launch_server arguments")
    p = sub.add_parser("show", help="print a table")
    p.add_argument("table")
    p = sub.add_parser("plot", help="PNG of steps/s vs verify tokens per request count")
    p.add_argument("table")
    p.add_argument("--out", required=True)
    p = sub.add_parser("compare", help="per-cell ratio of two tables")
    p.add_argument("base")
    p.add_argument("other")
    args = parser.parse_args(argv)

    if args.command == "profile":
        launch_args = [a for a in args.launch_args if a != "--"]
        table = profile_served_model(launch_args)
        Path(args.out).write_text(table.to_json(), encoding="utf-8")
        print(format_table(table))
        print(f"saved {args.out}")
        if args.png:
            print(f"plotted {plot_table(table, args.png)}")
    elif args.command == "show":
        print(format_table(load_any_table(args.table)))
    elif args.command == "plot":
        print(plot_table(load_any_table(args.table), args.out, title=Path(args.table).name))
    else:
        ratios = compare_tables(load_any_table(args.base), load_any_table(args.other))
        for r, b, ratio in ratios:
            print(f"R={r:<4} B={b:<5} other/base = {ratio:.3f}")
        worst = max(ratios, key=lambda x: abs(x[2] - 1.0))
        print(f"largest difference: R={worst[0]} B={worst[1]} ratio {worst[2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
