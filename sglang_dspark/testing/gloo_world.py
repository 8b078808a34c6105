"""Run one function in several spawned processes (simulated TP ranks over gloo, CPU tests) and collect their outputs.

``rank_main(rank, world_size, init_file, results)`` must put ``(rank, output_dict)`` on ``results`` exactly once
(:func:`rank_report` does it); an output holding ``"crash"`` (a traceback) fails the calling test, so does a rank
that does not answer in time.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest


@contextmanager
def rank_report(rank: int, results) -> Iterator[dict]:
    """A rank's body fills the yielded dict; whatever happens, ``(rank, dict)`` goes on ``results`` (a crash as its
    traceback under ``"crash"``) and the rank leaves its process group."""
    import torch.distributed as dist

    out: dict = {}
    try:
        yield out
    except BaseException:  # noqa: BLE001 - reported to the parent
        out["crash"] = traceback.format_exc()
    finally:
        results.put((rank, out))
        if dist.is_initialized():
            dist.destroy_process_group()


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
