"""Linear products on the CPU through oneDNN with the weight packed once (plain torch; no SGLang imports).

Why: ``F.linear`` in fp32 on a CPU goes to MKL's GEMM, whose cost grows with the number of rows M long before the
weight read stops dominating. A speculative verify is exactly such a product (one row per verified token), so a
verify row costs nearly a decode step and drafting cannot pay. oneDNN's linear with the weight reordered once into
its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the ops torch.compile's CPU
backend emits) reads the weight once per call, so its cost stays nearly flat over small M. ``python -m
sglang_dspark.cpu.packed_linear`` prints both for SmolLM2-135M's shapes (numbers: docs/cpu.md);
``tests/unit/cpu/test_packed_linear.py`` holds the parity.

An output row comes out bit-identical whatever the other rows (checked in the tests), so a verify row equals the
decode row of the same input, which plain MKL did not promise, and padding a product to its row bucket changes none
of its rows. Results differ from ``F.linear`` in the last bits (fp32 summation order), like any other GEMM.

The dense weight stays where it is (other code reads it: tied embeddings, weight checks); the packed copy costs as
much memory again for the weights that have one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

PACKED_DTYPES = (torch.float32, torch.bfloat16)
# oneDNN builds and caches one primitive per input shape: left to every row count a server meets (every prompt
# length), memory grows without bound (docs/cpu.md). So only products of at most MAX_PACKED_ROWS rows (decode,
# verify, draft blocks: where MKL is at its worst) take this path, their row count rounded up to a bucket (zero rows
# appended: a row's result does not depend on the others), and a new product shape builds all of its buckets at its
# first call, so that memory is reached at start-up and stays flat after.
ROW_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MAX_PACKED_ROWS = ROW_BUCKETS[-1]


def packing_available() -> bool:
    """oneDNN is built into this torch and exposes the two ops (x86 and most aarch64 wheels)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@dataclass(frozen=True)
class PackedWeight:
    """A [out, in] weight in oneDNN's blocked layout, with what it was packed from (to notice a replaced tensor)."""

    packed: torch.Tensor
    source_ptr: int
    shape: tuple
    dtype: torch.dtype
    generation: int

    def matches(self, weight: torch.Tensor, generation: int) -> bool:
        return (
            self.generation == generation
            and weight.data_ptr() == self.source_ptr
            and tuple(weight.shape) == self.shape
            and weight.dtype == self.dtype
        )


@functools.lru_cache(maxsize=None)
def packs_dtype(dtype: torch.dtype) -> bool:
    """oneDNN packs weights of ``dtype`` on this CPU. bfloat16 needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT: on an AVX2
    machine the reorder raises at the first weight, which would stop a bf16 server at start-up; those weights stay
    on torch's own linear instead."""
    if dtype == torch.bfloat16:
        probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(probe()) if probe is not None else False
    return dtype in PACKED_DTYPES


def can_pack(weight: torch.Tensor) -> bool:
    return (
        isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and packs_dtype(weight.dtype)
        and not weight.requires_grad
        and weight.numel() > 0
        and weight.layout == torch.strided
    )


def pack_weight(weight: torch.Tensor, generation: int = 0) -> PackedWeight:
    """Reorder ``weight`` ([out, in], CPU, fp32/bf16) for :func:`packed_linear`."""
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    return PackedWeight(packed, weight.data_ptr(), tuple(weight.shape), weight.dtype, generation)


def rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def fits(x: torch.Tensor) -> bool:
    """Whether :func:`packed_linear` takes ``x`` (at most ``MAX_PACKED_ROWS`` rows); larger products stay on MKL."""
    return rows_of(x) <= MAX_PACKED_ROWS


def row_bucket(rows: int) -> int:
    """The smallest of ``ROW_BUCKETS`` that holds ``rows`` (1 <= rows <= MAX_PACKED_ROWS)."""
    return next(bucket for bucket in ROW_BUCKETS if bucket >= rows)


def packed_linear(x: torch.Tensor, weight: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for any leading shape of ``x`` with at most ``MAX_PACKED_ROWS`` rows (:func:`fits`);
    ``x`` must have W's dtype. The rows are padded with zeros to their bucket; the padding rows are dropped."""
    rows, width = rows_of(x), x.shape[-1]
    out_features = weight.shape[0]
    if rows > MAX_PACKED_ROWS:
        raise ValueError(f"packed_linear takes at most {MAX_PACKED_ROWS} rows, got {rows}: use F.linear")
    if rows == 0:
        return x.new_empty((*x.shape[:-1], out_features))
    _build_primitives_once(weight, bias)
    flat = x.reshape(rows, width)
    bucket = row_bucket(rows)
    if bucket != rows:
        padded = flat.new_zeros((bucket, width))
        padded[:rows] = flat
        flat = padded
    out = torch.ops.mkldnn._linear_pointwise(flat, weight.packed, bias, "none", [], "")
    if bucket != rows:
        out = out[:rows]
    return out.reshape(*x.shape[:-1], out_features)


_built: set = set()


def _build_primitives_once(weight: PackedWeight, bias: Optional[torch.Tensor]) -> None:
    """Run every bucket once for a new product shape, so its primitives exist from the first call on (memory
    reached at start-up, then flat)."""
    signature = (weight.shape, weight.dtype, bias is not None)
    if signature in _built:
        return
    _built.add(signature)
    for bucket in ROW_BUCKETS:
        torch.ops.mkldnn._linear_pointwise(torch.zeros((bucket, weight.shape[1]), dtype=weight.dtype),
                                           weight.packed, bias, "none", [], "")


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What :func:`packed_linear` computes, in plain torch."""
    return torch.nn.functional.linear(x, weight, bias)


def _benchmark() -> None:
    """Per-call times of the two products for SmolLM2-135M's shapes (the module docstring's numbers)."""
    import time

    shapes = {"layer (qkv, o, gate_up, down)": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
              "LM head": [(49152, 576)]}

    def timed(fn, repeats):
        for _ in range(3):
            fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats * 1e3

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, group in shapes.items():
        weights = [torch.randn(out, inp) for out, inp in group]
        packed = [pack_weight(w) for w in weights]
        repeats = 100 if len(group) > 1 else 10
        for rows in (1, 2, 4, 8, 16):
            xs = [torch.randn(rows, w.shape[1]) for w in weights]
            dense = timed(lambda: [reference_linear(x, w) for x, w in zip(xs, weights)], repeats)
            fast = timed(lambda: [packed_linear(x, p) for x, p in zip(xs, packed)], repeats)
            print(f"{name:30s} M={rows:2d}: F.linear {dense:7.3f} ms   packed {fast:7.3f} ms")


if __name__ == "__main__":
    _benchmark()
