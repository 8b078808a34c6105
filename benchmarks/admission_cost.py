"""Host cost of one admission decision per step: Algorithm 1 ("exact") vs the production variant ("async").

For R = 1, 16, 256 requests and γ = 16 drafts each, times (median of N runs, microseconds, one step per call):
  * exact    — admit_exact(c, cost): sort, cumsum, SPS lookup, first-non-improvement stop;
  * capacity — capacity_global_search(c_lagged, cost): the async policy's host-side global search;
  * top-K    — admit_topk(c, K): the async policy's per-step admission;
  * async    — admit_async(c, c_lagged, cost): capacity + top-K in one call (timed on its own, so it need not
               equal the sum of the two columns exactly).
"admitted" is the total number of draft tokens each policy verifies in that step: on a jagged curve Algorithm 1
stops at the first tile edge, the global search climbs past it.
The SPS table is synthetic and jagged (step time grows in 64-token tiles), covering every B the policies ask for.

Usage: python benchmarks/admission_cost.py [--runs N] [--gamma G] [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from sglang_dspark.scheduling import (
    TabulatedSps1D,
    admit_async,
    admit_exact,
    admit_topk,
    capacity_global_search,
)


def tiled_sps(max_verify_tokens: int) -> TabulatedSps1D:
    """Steps/s for B = 1..max: a fixed cost plus a per-64-token-tile cost (a jagged, realistic-looking curve)."""
    verify_tokens = torch.arange(1, max_verify_tokens + 1, dtype=torch.float64)
    step_seconds = 0.010 + 0.0004 * torch.ceil(verify_tokens / 64) + 0.000002 * verify_tokens
    return TabulatedSps1D(1.0 / step_seconds)


def median_microseconds(fn, runs: int, progress: tqdm) -> float:
    for _ in range(max(3, runs // 20)):  # warm-up: allocator and dispatcher caches
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
        progress.update()
    return statistics.median(samples) / 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="timed runs per cell (median reported)")
    parser.add_argument("--gamma", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave the default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    request_counts = (1, 16, 256)
    gamma = args.gamma
    cost = tiled_sps(max(request_counts) * (gamma + 1))
    generator = torch.Generator().manual_seed(0)
    kinds = ("exact", "capacity", "top-K", "async")
    rows = []
    with tqdm(total=len(request_counts) * len(kinds) * args.runs, desc="admission cost", unit="call") as progress:
        for num_requests in request_counts:
            # Confidences like a trained head's: high early, falling with depth, varying across requests.
            base = torch.rand(num_requests, 1, generator=generator) * 0.3 + 0.7
            decay = torch.rand(num_requests, gamma, generator=generator) * 0.15
            c_now = (base - decay.cumsum(dim=1) * 0.3).clamp(0.05, 1.0)
            c_lagged = (c_now + 0.05 * torch.randn(c_now.shape, generator=generator)).clamp(0.0, 1.0)
            capacity = capacity_global_search(c_lagged, cost)
            timings = {
                "exact": median_microseconds(lambda: admit_exact(c_now, cost), args.runs, progress),
                "capacity": median_microseconds(lambda: capacity_global_search(c_lagged, cost), args.runs, progress),
                "top-K": median_microseconds(lambda: admit_topk(c_now, capacity), args.runs, progress),
                "async": median_microseconds(lambda: admit_async(c_now, c_lagged, cost), args.runs, progress),
            }
            admitted = {
                "exact": int(admit_exact(c_now, cost).sum()),
                "async": int(admit_async(c_now, c_lagged, cost).sum()),
            }
            rows.append((num_requests, timings, admitted))

    print(f"\nadmission cost per step, median of {args.runs} runs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU thread(s), γ = {gamma}")
    header = f"{'R':>5} {'R·γ':>6} | {'exact µs':>9} | {'async µs':>9} | {'capacity µs':>11} {'top-K µs':>9} | " \
             f"{'admitted exact':>14} {'admitted async':>14}"
    print(header)
    print("-" * len(header))
    for num_requests, timings, admitted in rows:
        print(f"{num_requests:>5} {num_requests * gamma:>6} | {timings['exact']:>9.1f} | {timings['async']:>9.1f} | "
              f"{timings['capacity']:>11.1f} {timings['top-K']:>9.1f} | "
              f"{admitted['exact']:>14} {admitted['async']:>14}")


if __name__ == "__main__":
    main()
