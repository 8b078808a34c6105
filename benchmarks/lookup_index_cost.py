"""Host time and memory of the prompt lookup's per-request index, per context token, and its longest stall (#46).

For contexts of 1k, 8k, 32k and 128k tokens, two token streams:
  * distinct — every token new (every n-gram a new map entry: the most entries a context can make);
  * zipf     — tokens drawn with Zipf frequencies (s = 1.1) over a 50 000-token vocabulary (text-like repeats);
and two variants:
  * before — the index as it was (commit 1a0da79, copied below): the whole context indexed in one call, at the
    request's first decode step;
  * after  — ``lookup/book.py`` with ``config.IndexLimits()`` (its defaults, printed): the request's prompt arrives,
    then a decode step commits one token per ``LookupBook.propose`` call until the index has caught up; only the
    last ``window`` tokens are indexed, so past the window its cost and memory per context token fall.
Columns: µs per context token (all indexing calls together), bytes per context token (tracemalloc, tuple free lists
emptied before and after, so what the index holds, not the allocator's caches), map entries per context token, the
longest single call (the stall one decode step pays), how many calls the index took to catch up, and, once caught
up, one step's indexing (4 tokens committed). Times: the best of ``--repeats`` runs (the machine is shared; the least
disturbed run is the cost), single-threaded CPython, the garbage collector on (as in the scheduler).

Usage: python benchmarks/lookup_index_cost.py [--contexts 1000,8000,32000,131072] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import time
import tracemalloc
from typing import Iterable

from sglang_dspark.lookup.book import LookupBook
from sglang_dspark.lookup.config import DEFAULT, IndexLimits, LookupConfig


class IndexBefore:
    """``ContextIndex`` as of commit 1a0da79 (its indexing only): every appended token indexed at once."""

    def __init__(self, *, min_ngram: int = DEFAULT.min_ngram, max_ngram: int = DEFAULT.max_ngram) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self._latest_end: dict[tuple[int, ...], int] = {}
        self._indexed_ends = 0

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)
        last_usable_end = len(self.tokens) - 1
        for end in range(max(self._indexed_ends, self.min_ngram), last_usable_end + 1):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._latest_end[tuple(self.tokens[end - n:end])] = end
        self._indexed_ends = max(self._indexed_ends, last_usable_end + 1)


def context(kind: str, length: int, rng: random.Random) -> list[int]:
    if kind == "distinct":
        return list(range(1000, 1000 + length))
    weights = list(itertools.accumulate(1.0 / rank ** 1.1 for rank in range(1, 50_001)))
    return rng.choices(range(50_000), cum_weights=weights, k=length)


def empty_free_lists() -> list:
    """Hold 3000 tuples of every size an n-gram takes, so the run allocates its own (tracemalloc sees them)."""
    return [tuple([size] * size) for size in range(1, 12) for _ in range(3000)]


def run_before(prompt: list[int]) -> dict:
    index = IndexBefore()
    started = time.perf_counter()
    index.extend(prompt)
    seconds = time.perf_counter() - started
    steady = time.perf_counter()
    index.extend(prompt[:4])
    return {"seconds": seconds, "worst": seconds, "calls": 1, "steady": time.perf_counter() - steady,
            "entries": len(index._latest_end), "held": index}


def run_after(prompt: list[int], limits: IndexLimits) -> dict:
    book = LookupBook(LookupConfig(index_limits=limits))
    output: list[int] = []
    calls, seconds, worst = 0, 0.0, 0.0
    while True:
        started = time.perf_counter()
        book.propose([("r", prompt, output)], gamma=4)
        elapsed = time.perf_counter() - started
        calls, seconds, worst = calls + 1, seconds + elapsed, max(worst, elapsed)
        if book.index_for("r", prompt, output, budget=0).caught_up:
            break
        output.append(prompt[calls % len(prompt)])  # one token committed per step while it catches up
    output.extend(prompt[:4])
    steady = time.perf_counter()
    index = book.index_for("r", prompt, output)
    return {"seconds": seconds, "worst": worst, "calls": calls, "steady": time.perf_counter() - steady,
            "entries": index.entries, "held": book}


def measure(variant: str, prompt: list[int], limits: IndexLimits, repeats: int) -> dict:
    run = (lambda: run_before(prompt)) if variant == "before" else (lambda: run_after(prompt, limits))
    timed = [run() for _ in range(repeats)]
    for result in timed:
        result.pop("held")
    best = {key: min(result[key] for result in timed) for key in ("seconds", "worst", "steady")}
    hold = empty_free_lists()
    gc.collect()
    tracemalloc.start()
    held = run()
    gc.collect()  # empties the free lists the run filled: what is left is what the index holds
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held, hold
    return {**best, "calls": timed[0]["calls"], "entries": timed[0]["entries"], "bytes": size}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="1000,8000,32000,131072", help="context lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (the best is reported)")
    args = parser.parse_args(argv)
    limits = IndexLimits()
    rng = random.Random(0)
    lengths = [int(length) for length in args.contexts.split(",")]
    rows = []
    measure("after", context("zipf", 4000, rng), limits, 1)  # warm-up: first-call allocations, caches
    for kind in ("distinct", "zipf"):
        for length in lengths:
            prompt = context(kind, length, rng)
            for variant in ("before", "after"):
                rows.append((kind, length, variant, measure(variant, prompt, limits, args.repeats)))
                print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    print(f"lookup index cost, Python {sys.version.split()[0]}, best of {args.repeats} runs; after = {limits}")
    header = (f"{'stream':>14} {'context':>7} {'variant':>7} | {'µs/token':>8} {'B/token':>8} {'entries/token':>13} | "
              f"{'worst call ms':>13} {'calls':>5} | {'step µs':>8}")
    print(header)
    print("-" * len(header))
    for kind, length, variant, cell in rows:
        print(f"{kind:>14} {length:>7} {variant:>7} | {1e6 * cell['seconds'] / length:>8.2f} "
              f"{cell['bytes'] / length:>8.0f} {cell['entries'] / length:>13.2f} | {1e3 * cell['worst']:>13.2f} "
              f"{cell['calls']:>5} | {1e6 * cell['steady']:>8.1f}")
    print("step µs: a step's indexing once caught up, 4 tokens committed (before: their extend; after: index_for).")


if __name__ == "__main__":
    main()
