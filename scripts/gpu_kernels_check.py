#!/usr/bin/env python3
"""GPU check of our Triton ragged verify attention kernel (issue #10); needs only torch + triton.

Runs on a bare GPU machine (no SGLang, no FlashInfer, nothing installed from this repository: the two kernel files
are loaded by path) and prints one table:

1. parity: ``kernels/ragged_verify_attention_triton.py`` vs the torch oracle ``kernels/ragged_verify_attention.py``
   on random paged batches (random page tables, GQA/MQA/MHA, head dim 64/128, verify lengths 1..γ+1, prefixes up to
   2 048), bf16 (oracle in fp32 from the same bf16 values) and fp32, plus a negative control (the same rows read at
   a uniform γ+1 stride must disagree: the check can fail);
2. CUDA graphs: one graph captured for ``S`` request slots, replayed with a different number of live requests and
   different lengths every time (only device buffers change), each replay against the oracle;
3. time: ragged (each request its own length) vs padded to γ+1 (every request γ+1 rows, what static verify runs),
   graph-replayed, for three length mixes: all γ+1; half 1 / half γ+1; geometric (P(len > k) = 0.5^k, capped).

    python scripts/gpu_kernels_check.py                      # GPU, < 8 minutes, exit 1 if a check fails
    TRITON_INTERPRET=1 python scripts/gpu_kernels_check.py --device cpu   # dry run on the CPU (small shapes)

Pass ``--json PATH`` to keep the report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# Errors are max |out - ref| / (1 + |ref|): a bf16 output carries 2^-9 relative rounding, the bf16 p@V product more.
BF16_TOL = 2e-2
FP32_TOL = 1e-4
CONTROL_MIN_ERR = 1e-1


def load_by_path(name: str, path: Path):
    """Execute ``path`` as module ``name`` (registered in ``sys.modules``: dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_kernels():
    """(torch reference module, Triton module), loaded by path so that no package needs installing."""
    reference = load_by_path("dspark_ragged_verify_reference", REPO / "kernels" / "ragged_verify_attention.py")
    triton_kernel = load_by_path("dspark_ragged_verify_triton", REPO / "kernels" / "ragged_verify_attention_triton.py")
    return reference, triton_kernel


class PagedWorld:
    """A paged KV cache with random page tables (every request's positions on random, distinct slots)."""

    def __init__(self, *, slots_per_request: int, num_requests: int, hq: int, hkv: int, d: int, dtype, device,
                 generator: torch.Generator):
        self.hq, self.hkv, self.d, self.dtype, self.device = hq, hkv, d, dtype, device
        num_slots = slots_per_request * num_requests + 1
        self.k = torch.randn(num_slots, hkv, d, generator=generator).to(dtype).to(device)
        self.v = torch.randn(num_slots, hkv, d, generator=generator).to(dtype).to(device)
        perm = torch.randperm(num_slots - 1, generator=generator) + 1  # slot 0 never used: a wrong read shows
        self.req_to_token = perm.reshape(num_requests, slots_per_request).to(torch.int32).to(device).contiguous()

    def queries(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(rows, self.hq, self.d, generator=generator).to(self.dtype).to(self.device)

    def oracle(self, reference, q, pool_rows, prefix, verify):
        return reference.ragged_verify_attention_torch(
            q.float(), self.k.float(), self.v.float(), self.req_to_token, torch.tensor(pool_rows), prefix, verify)


def _indptr(lens, device, slots=None):
    out = [0]
    for length in lens:
        out.append(out[-1] + int(length))
    out += [out[-1]] * ((slots or len(lens)) - len(lens))  # padding slots own no rows
    return torch.tensor(out, dtype=torch.int32, device=device)


def _err(out, ref, rows):
    if not rows:
        return 0.0
    return float(((out[:rows].float() - ref[:rows]).abs() / (1.0 + ref[:rows].abs())).max())


def random_layout(generator, num_requests, gamma, max_prefix):
    verify = torch.randint(1, gamma + 2, (num_requests,), generator=generator).tolist()
    prefix = torch.randint(1, max_prefix + 1, (num_requests,), generator=generator).tolist()
    pool_rows = torch.randperm(num_requests, generator=generator).tolist()
    return pool_rows, prefix, verify


def parity(reference, kern, device: str, small: bool, report: dict) -> None:
    g = torch.Generator().manual_seed(0)
    shapes = [(8, 2, 16), (4, 1, 32), (2, 2, 16)] if small else [(32, 8, 128), (16, 16, 64), (8, 1, 128)]
    for dtype, tol in ((torch.bfloat16, BF16_TOL), (torch.float32, FP32_TOL)):
        for hq, hkv, d in shapes:
            for gamma in ((3,) if small else (7, 15)):
                n_req = 3 if small else 48
                max_prefix = 40 if small else 2048
                world = PagedWorld(slots_per_request=max_prefix + gamma + 1, num_requests=n_req, hq=hq, hkv=hkv,
                                   d=d, dtype=dtype, device=device, generator=g)
                for cap in (0.0, 30.0):
                    pool_rows, prefix, verify = random_layout(g, n_req, gamma, max_prefix)
                    q = world.queries(sum(verify), g)
                    out = kern.ragged_verify_attention_triton(
                        q, world.k, world.v, world.req_to_token, torch.tensor(pool_rows, device=device),
                        torch.tensor(prefix, dtype=torch.int32, device=device), _indptr(verify, device),
                        max_q_len=gamma + 1, logit_cap=cap)
                    ref = reference.ragged_verify_attention_torch(
                        q.float(), world.k.float(), world.v.float(), world.req_to_token, torch.tensor(pool_rows),
                        prefix, verify, logit_cap=cap)
                    err = _err(out, ref, sum(verify))
                    report["parity"].append(dict(dtype=str(dtype).split(".")[-1], hq=hq, hkv=hkv, d=d, gamma=gamma,
                                                 logit_cap=cap, requests=n_req, max_abs_err=err, tol=tol,
                                                 ok=err <= tol))
    # Negative control: rows read at a uniform γ+1 stride (what an unpatched backend does with a compact batch).
    world = PagedWorld(slots_per_request=64, num_requests=3, hq=4, hkv=2, d=32, dtype=torch.float32, device=device,
                       generator=g)
    prefix, verify, gamma = [9, 30, 5], [1, 4, 2], 3
    q = world.queries(sum(verify), g)
    uniform = torch.arange(0, 4 * (gamma + 1), gamma + 1, dtype=torch.int32, device=device)
    out = torch.zeros(3 * (gamma + 1), 4, 32, device=device)
    kern.ragged_verify_attention_triton(
        torch.cat([q, torch.zeros(3 * (gamma + 1) - q.shape[0], 4, 32, device=device)]), world.k, world.v,
        world.req_to_token, torch.tensor([0, 1, 2], device=device), torch.tensor(prefix, dtype=torch.int32,
                                                                                   device=device),
        uniform, max_q_len=gamma + 1, out=out)
    ref = world.oracle(reference, q, [0, 1, 2], prefix, verify)
    err = _err(out, ref, sum(verify))
    report["control"] = dict(max_abs_err=err, must_exceed=CONTROL_MIN_ERR, ok=err > CONTROL_MIN_ERR)


def _graph(fn, device):
    if device != "cuda":
        return fn  # the CPU dry run replays by calling (same buffers, same semantics, no capture)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class SlotBuffers:
    """Fixed device buffers a captured graph reads: S request slots of at most γ+1 rows each."""

    def __init__(self, world: PagedWorld, num_slots: int, gamma: int):
        dev = world.device
        self.world, self.num_slots, self.gamma = world, num_slots, gamma
        self.q = torch.zeros(num_slots * (gamma + 1), world.hq, world.d, dtype=world.dtype, device=dev)
        self.out = torch.zeros_like(self.q)
        self.qo_indptr = torch.zeros(num_slots + 1, dtype=torch.int32, device=dev)
        self.prefix = torch.ones(num_slots, dtype=torch.int32, device=dev)
        self.pool_rows = torch.zeros(num_slots, dtype=torch.int64, device=dev)

    def launch(self, kern):
        return lambda: kern.ragged_verify_attention_triton(
            self.q, self.world.k, self.world.v, self.world.req_to_token, self.pool_rows, self.prefix,
            self.qo_indptr, max_q_len=self.gamma + 1, out=self.out)

    def load(self, q, pool_rows, prefix, verify):
        n = len(verify)
        self.q[: q.shape[0]].copy_(q)
        self.qo_indptr.copy_(_indptr(verify, self.q.device, self.num_slots))
        self.prefix[:n].copy_(torch.tensor(prefix, dtype=torch.int32))
        self.pool_rows[:n].copy_(torch.tensor(pool_rows))


def graph_replays(reference, kern, device: str, small: bool, report: dict) -> None:
    g = torch.Generator().manual_seed(1)
    num_slots, gamma = (4, 3) if small else (64, 7)
    max_prefix = 40 if small else 1500
    world = PagedWorld(slots_per_request=max_prefix + gamma + 1, num_requests=num_slots, hq=8 if small else 32,
                       hkv=2 if small else 8, d=16 if small else 128, dtype=torch.bfloat16, device=device,
                       generator=g)
    bufs = SlotBuffers(world, num_slots, gamma)
    pool_rows, prefix, verify = random_layout(g, num_slots, gamma, max_prefix)
    bufs.load(world.queries(sum(verify), g), pool_rows, prefix, verify)
    replay = _graph(bufs.launch(kern), device)
    for i in range(4 if small else 20):
        live = int(torch.randint(1, num_slots + 1, (1,), generator=g))
        pool_rows, prefix, verify = random_layout(g, num_slots, gamma, max_prefix)
        pool_rows, prefix, verify = pool_rows[:live], prefix[:live], verify[:live]
        q = world.queries(sum(verify), g)
        bufs.load(q, pool_rows, prefix, verify)
        replay()
        if device == "cuda":
            torch.cuda.synchronize()
        err = _err(bufs.out, world.oracle(reference, q, pool_rows, prefix, verify), sum(verify))
        report["graph"].append(dict(replay=i, live_requests=live, rows=sum(verify), max_abs_err=err, tol=BF16_TOL,
                                    ok=err <= BF16_TOL))


def length_mix(name: str, n: int, gamma: int, generator) -> list[int]:
    if name == "all γ+1":
        return [gamma + 1] * n
    if name == "half 1 / half γ+1":
        return [1 if i % 2 == 0 else gamma + 1 for i in range(n)]
    lens = []  # geometric: the anchor plus each further draft with probability 1/2
    for _ in range(n):
        length = 1
        while length < gamma + 1 and float(torch.rand(1, generator=generator)) < 0.5:
            length += 1
        lens.append(length)
    return lens


def _time_replays(replay, device: str, iters: int) -> float:
    """Median microseconds of one replay."""
    samples = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            replay()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def timing(kern, device: str, small: bool, report: dict) -> None:
    g = torch.Generator().manual_seed(2)
    gamma, prefix_len = (3, 32) if small else (7, 1024)
    requests = (2,) if small else (1, 8, 32, 128)
    hq, hkv, d = (4, 2, 16) if small else (32, 8, 128)
    for n in requests:
        world = PagedWorld(slots_per_request=prefix_len + gamma + 1, num_requests=n, hq=hq, hkv=hkv, d=d,
                           dtype=torch.bfloat16, device=device, generator=g)
        for mix in ("all γ+1", "half 1 / half γ+1", "geometric"):
            verify = length_mix(mix, n, gamma, g)
            times = {}
            for kind, lens in (("ragged", verify), ("padded", [gamma + 1] * n)):
                bufs = SlotBuffers(world, n, gamma)
                bufs.load(world.queries(sum(lens), g), list(range(n)), [prefix_len] * n, lens)
                replay = _graph(bufs.launch(kern), device)
                times[kind] = _time_replays(replay, device, 3 if small else 50)
            report["timing"].append(dict(requests=n, mix=mix, rows_ragged=sum(verify), rows_padded=n * (gamma + 1),
                                         ragged_us=times["ragged"], padded_us=times["padded"],
                                         ratio=times["ragged"] / times["padded"]))


def check_rows(report: dict) -> list[dict]:
    """One row per checked claim (parity per dtype, graph replays, control): ``check``, ``cases``, ``worst_error``
    (the control's error must *exceed* its bound), ``tolerance`` (text), ``ok``."""
    rows = []
    for dtype in ("bfloat16", "float32"):
        cases = [c for c in report["parity"] if c["dtype"] == dtype]
        rows.append(dict(check=f"parity {dtype}", cases=len(cases), worst_error=max(c["max_abs_err"] for c in cases),
                         tolerance=f"{cases[0]['tol']:.0e}", ok=all(c["ok"] for c in cases)))
    graph = report["graph"]
    rows.append(dict(check="CUDA-graph replays, bf16 (lengths change every replay)", cases=len(graph),
                     worst_error=max(c["max_abs_err"] for c in graph), tolerance=f"{BF16_TOL:.0e}",
                     ok=all(c["ok"] for c in graph)))
    control = report["control"]
    rows.append(dict(check="control: uniform γ+1 stride must be wrong", cases=1, worst_error=control["max_abs_err"],
                     tolerance=f"> {CONTROL_MIN_ERR:.0e}", ok=control["ok"]))
    return rows


def print_table(report: dict) -> None:
    print(f"device: {report['device_name']}  torch {report['torch']}  triton {report['triton']}")
    print("\n| check | cases | worst error (abs / (1 + abs(ref))) | tolerance | ok |\n| --- | --- | --- | --- | --- |")
    for row in check_rows(report):
        print(f"| {row['check']} | {row['cases']} | {row['worst_error']:.2e} | {row['tolerance']} | {row['ok']} |")
    print("\n| requests | length mix | rows ragged / padded | ragged µs | padded µs | ragged / padded |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for t in report["timing"]:
        print(f"| {t['requests']} | {t['mix']} | {t['rows_ragged']} / {t['rows_padded']} | {t['ragged_us']:.1f} | "
              f"{t['padded_us']:.1f} | {t['ratio']:.2f} |")
    print(f"\nall checks ok: {report['ok']}  ({report['seconds']:.0f} s)")


def device_problem(device: str) -> str | None:
    """Why this process cannot run the checks on ``device`` (None: it can)."""
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "on the CPU run with TRITON_INTERPRET=1 (set before triton is imported)"
    if device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device: run on a GPU, or dry-run with TRITON_INTERPRET=1 ... --device cpu"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default=None, help="also write the JSON report here")
    args = ap.parse_args(argv)
    problem = device_problem(args.device)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import triton

    t0 = time.time()
    reference, kern = load_kernels()
    small = args.device == "cpu"
    report = {"device": args.device, "torch": torch.__version__, "triton": triton.__version__,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (TRITON_INTERPRET=1)",
              "parity": [], "graph": [], "timing": []}
    parity(reference, kern, args.device, small, report)
    graph_replays(reference, kern, args.device, small, report)
    timing(kern, args.device, small, report)
    report["seconds"] = time.time() - t0
    report["ok"] = bool(all(c["ok"] for c in report["parity"] + report["graph"]) and report["control"]["ok"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print_table(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
