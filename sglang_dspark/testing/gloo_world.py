"""Run one function in several spawned processes (simulated TP ranks over gloo, CPU tests) and collect their outputs.

``rank_main(rank, world_size, init_file, results)`` must put ``(rank, output_dict)`` on ``results`` exactly once; an
output holding ``"crash"`` (a traceback) fails the calling test, so does a rank that does not answer in time.
"""

from __future__ import annotations

import multiprocessing
import queue
from pathlib import Path
from typing import Callable

import pytest


def spawn_ranks(rank_main: Callable, world_size: int, folder: Path, wait_seconds: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init_file = str(Path(folder) / "rendezvous")
    procs = [ctx.Process(target=rank_main, args=(rank, world_size, init_file, results)) for rank in range(world_size)]
    for p in procs:
        p.start()
    outputs = {}
    try:
        for _ in procs:
            rank, out = results.get(timeout=wait_seconds)
            outputs[rank] = out
    except queue.Empty:
        pytest.fail(f"ranks {sorted(set(range(world_size)) - set(outputs))} did not finish in {wait_seconds} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()  # only our own child, by its handle
    for rank, out in outputs.items():
        assert "crash" not in out, f"rank {rank}:\n{out['crash']}"
    return outputs
