"""Linear products on the CPU through oneDNN with the weight packed once (plain torch; no SGLang imports).

Why: ``F.linear`` in fp32 on a CPU goes to MKL's GEMM, whose cost grows with the number of rows M long before the
weight read stops dominating: on a 2-core EPYC a layer's linears cost about three times as much at M = 2 as at M = 1
and five times at M = 8, the LM head twice as much. A speculative verify is exactly such a product (one row per
verified token), so on the CPU verifying one draft token cost almost a second decode step and drafting could not pay.
oneDNN's linear with the weight reordered once into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` /
``_linear_pointwise``, the ops torch.compile's CPU backend emits) reads the weight once per call: nearly flat up to
M = 8, and faster than MKL at M = 1 too. ``python -m sglang_dspark.cpu.packed_linear`` prints both for SmolLM2-135M's
shapes (the README's "On a CPU" quotes a run); ``tests/unit/test_packed_linear.py`` holds the parity.

An output row comes out bit-identical whatever the other rows (checked for M up to 16 in the tests), so a verify row
equals the decode row of the same input, which plain MKL did not promise. Results differ from ``F.linear`` in the last bits (fp32
summation order), like any other GEMM.

The dense weight stays where it is (other code reads it: tied embeddings, weight checks); the packed copy costs as
much memory again for the weights that have one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

PACKED_DTYPES = (torch.float32, torch.bfloat16)


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


def can_pack(weight: torch.Tensor) -> bool:
    return (
        isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.dtype in PACKED_DTYPES
        and not weight.requires_grad
        and weight.numel() > 0
        and weight.layout == torch.strided
    )


def pack_weight(weight: torch.Tensor, generation: int = 0) -> PackedWeight:
    """Reorder ``weight`` ([out, in], CPU, fp32/bf16) for :func:`packed_linear`."""
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    return PackedWeight(packed, weight.data_ptr(), tuple(weight.shape), weight.dtype, generation)


def packed_linear(x: torch.Tensor, weight: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for any leading shape of ``x``; ``x`` must have W's dtype."""
    return torch.ops.mkldnn._linear_pointwise(x, weight.packed, bias, "none", [], "")


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
