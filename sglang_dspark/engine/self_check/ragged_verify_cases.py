"""The batches the ragged-verify self-check runs (``engine/self_check/ragged_verify_parity.py``): pure data, no torch.

Two lists per backend. The CPU lists are small (the harness runs them under ``TRITON_INTERPRET=1`` in the unit
tests); the GPU lists are what the launcher's self-check runs on the device, and hold the serving shapes:

* **fp32 cases** (head dim 16/32, prefixes up to a few hundred tokens): the kernels' arithmetic at IEEE precision
  (``ragged_verify_parity.FP32_DOT_PRECISION``) against a tight absolute tolerance, so that one row attending to one
  wrong key, or a causal boundary off by one, shows. Small head dims keep fp32 tiles inside every GPU's shared
  memory.
* **bf16 cases** (the serving dtype): head dim 64 and 128, GQA 4:1 and 8:1, prefixes up to 4096 tokens (many KV
  blocks of SGLang's Triton extend kernel, whose largest ``BLOCK_N`` on NVIDIA is ``TRITON_LARGEST_BLOCK_N``; several
  KV chunks per request in FlashInfer's split-KV schedule, which graph mode always uses), the runner's tier grid with
  up to 48 slots and 384 tokens, replays with fewer requests than slots (padding slots) and with as many (the
  leftover on the last row). Their tolerance is relative (``ragged_verify_parity.BF16_REL_TOL``).

``coverage`` says what a list covers; ``tests/unit/engine/test_ragged_self_check.py`` checks the GPU lists against
``GPU_COVERAGE_REQUIRED``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Iterable, NamedTuple

FP32 = "float32"
BF16 = "bfloat16"
# Where FlashInfer's replay plan reads the exact host lengths (patches/flashinfer_ragged_verify.host_lengths): the
# layout's host copy, the batch's host mirrors (the serving path), or a pinned copy from the device.
LENGTHS_FROM = ("layout", "batch", "device")
# The largest BLOCK_N of sglang/kernels/ops/attention/extend_attention.py _get_block_sizes_for_extend_attention on
# NVIDIA (a drift test reads it from SGLang's source): a prefix of more than 4 of these spans several KV blocks on
# every GPU.
TRITON_LARGEST_BLOCK_N = 128


@dataclass(frozen=True)
class AttentionShape:
    hq: int  # query heads (per TP rank)
    hkv: int  # KV heads
    d: int  # head dim
    dtype: str  # FP32 or BF16

    @property
    def group(self) -> int:
        return self.hq // self.hkv


@dataclass(frozen=True)
class EagerCase:
    """One eager TARGET_VERIFY batch: request r verifies ``verify[r]`` rows after a committed ``prefix[r]``."""

    name: str
    shape: AttentionShape
    n: int  # the verify window N = gamma + 1 (every request verifies 1..N rows)
    prefix: tuple[int, ...]
    verify: tuple[int, ...]
    host_lengths: bool  # a layout with host lengths (exact grid bound) or device-only (grid bound N)


@dataclass(frozen=True)
class Replay:
    tier: int  # the captured graph's token count T
    prefix: tuple[int, ...]
    verify: tuple[int, ...]
    lengths_from: str = "batch"  # FlashInfer only: one of LENGTHS_FROM


@dataclass(frozen=True)
class GraphCase:
    """Capture one graph per token tier ``T = bs * n`` (bs from ``capture_bs``, as the decode runner does) with
    ``S = min(T, max(capture_bs))`` slots, then replay live batches of ``R <= S`` requests into them."""

    name: str
    shape: AttentionShape
    n: int
    capture_bs: tuple[int, ...]
    replays: tuple[Replay, ...]

    @property
    def max_bs(self) -> int:
        return max(self.capture_bs)

    @property
    def tiers(self) -> list[int]:
        return sorted({bs * self.n for bs in self.capture_bs})

    def slots(self, tier: int) -> int:
        return min(tier, self.max_bs)


class CaseLists(NamedTuple):
    triton_eager: tuple[EagerCase, ...]
    triton_graph: tuple[GraphCase, ...]
    flashinfer_graph: tuple[GraphCase, ...]


def spread(count: int, longest: int, seed: int) -> tuple[int, ...]:
    """``count`` prefix lengths: ``longest`` first, the rest log-uniform in 1..longest (short and long requests in one
    batch; deterministic)."""
    rng = random.Random(seed)
    lengths = [longest]
    while len(lengths) < count:
        lengths.append(max(1, round(math.exp(rng.uniform(0.0, math.log(longest))))))
    return tuple(lengths)


def verify_lens(count: int, n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randint(1, n) for _ in range(count))


# ---------------------------------------------------------------------------------------------------------------------
# CPU (Triton interpreter; the FlashInfer list runs on a stand-in in the unit tests)
# ---------------------------------------------------------------------------------------------------------------------

CPU_TRITON_EAGER = (
    EagerCase("eager-fp32-gqa2-d16", AttentionShape(4, 2, 16, FP32), 4, (7, 3, 12), (1, 4, 2), True),
    EagerCase("eager-fp32-mqa-d32-device", AttentionShape(4, 1, 32, FP32), 4, (5, 9), (3, 1), False),
    EagerCase("eager-fp32-mha-d32", AttentionShape(2, 2, 32, FP32), 6, (20, 1, 4), (6, 2, 5), True),
)
# max_bs = 3 and N = 4: tiers {4, 8, 12}, S = min(T, 3) = 3 slots for every tier (slots shared across tiers).
CPU_TRITON_GRAPH = (
    GraphCase("graph-fp32-gqa2-d16", AttentionShape(4, 2, 16, FP32), 4, (1, 2, 3), (
        Replay(8, (7, 3), (4, 1)),  # R < S: a padding slot takes the leftover
        Replay(4, (9,), (2,)),
        Replay(12, (2, 15, 6), (4, 3, 4)),  # R == S: the leftover on the last row (capped at N)
        Replay(8, (5, 8, 1), (2, 3, 1)),
        Replay(8, (11, 4), (1, 2)),
    )),
    GraphCase("graph-fp32-mqa-d32", AttentionShape(4, 1, 32, FP32), 3, (1, 2), (
        Replay(6, (4, 10), (3, 1)),
        Replay(3, (6,), (1,)),
        Replay(6, (13,), (3,)),
    )),
)
CPU_FLASHINFER_GRAPH = (
    GraphCase("flashinfer-bf16-gqa4-d128", AttentionShape(8, 2, 128, BF16), 4, (1, 2, 3), (
        Replay(8, (7, 3), (4, 1), "batch"),
        Replay(4, (9,), (2,), "layout"),
        Replay(12, (2, 15, 6), (4, 3, 4), "device"),
        Replay(8, (5, 8, 1), (2, 3, 1), "batch"),
        Replay(8, (11, 4), (1, 2), "layout"),
    )),
)

# ---------------------------------------------------------------------------------------------------------------------
# GPU (the launcher's self-check)
# ---------------------------------------------------------------------------------------------------------------------

GPU_TRITON_EAGER = CPU_TRITON_EAGER + (
    EagerCase("eager-fp32-mha-d32-multiblock", AttentionShape(4, 4, 32, FP32), 4, (300, 129, 5), (4, 1, 3), True),
    EagerCase("eager-bf16-gqa4-d128-long", AttentionShape(32, 8, 128, BF16), 8, (4096, 1, 777, 130), (8, 1, 3, 6),
              True),
    EagerCase("eager-bf16-gqa8-d64-device", AttentionShape(16, 2, 64, BF16), 4, (2500, 64, 9), (2, 4, 1), False),
)
GPU_TRITON_GRAPH = CPU_TRITON_GRAPH + (
    # Serving tiers: N = 8, capture bs (1, 2, 6, 16, 48) -> T = 8, 16, 48, 128, 384 with S = 8, 16, 48, 48, 48.
    GraphCase("graph-bf16-gqa8-d128-tiers", AttentionShape(8, 1, 128, BF16), 8, (1, 2, 6, 16, 48), (
        Replay(384, spread(48, 4096, 1), verify_lens(48, 8, 1)),  # R == S = 48
        Replay(128, spread(20, 3000, 2), verify_lens(20, 8, 2)),  # R < S
        Replay(48, spread(6, 4095, 3), (8, 8, 2, 1, 8, 5)),
        Replay(8, (4096,), (8,)),
        Replay(16, (1, 2, 3), (1, 1, 1)),
    )),
    # N = 4, capture bs (1, 2, 3, 4, 8, 12) -> T = 4, 8, 12, 16, 32, 48; tiers >= 12 share S = 12 slots.
    GraphCase("graph-bf16-gqa4-d64", AttentionShape(16, 4, 64, BF16), 4, (1, 2, 3, 4, 8, 12), (
        Replay(48, spread(12, 2048, 4), verify_lens(12, 4, 4)),
        Replay(12, (2047, 5), (4, 2)),
        Replay(32, (1024, 333, 64, 7, 1), (4, 4, 4, 4, 1)),
        Replay(4, (4096,), (3,)),
        Replay(16, spread(12, 640, 5), (1,) * 12),
    )),
)
GPU_FLASHINFER_GRAPH = (
    # N = 8, capture bs (1, 2, 4, 8) -> T = 8, 16, 32, 64, all with S = 8 slots (one wrapper set per tier).
    GraphCase("flashinfer-bf16-gqa4-d128-long", AttentionShape(32, 8, 128, BF16), 8, (1, 2, 4, 8), (
        Replay(64, spread(8, 4096, 6), verify_lens(8, 8, 6), "batch"),  # R == S
        Replay(16, (4096, 2000), (8, 3), "layout"),
        Replay(32, (1, 3000, 17), (1, 8, 8), "device"),
        Replay(8, (4096,), (5,), "batch"),
    )),
    GraphCase("flashinfer-bf16-gqa8-d128", AttentionShape(16, 2, 128, BF16), 4, (1, 2, 3), (
        Replay(8, (700, 3), (4, 1), "batch"),
        Replay(4, (2049,), (2,), "layout"),
        Replay(12, (2, 1500, 6), (4, 3, 4), "device"),
        Replay(12, (4096, 4000, 1), (1, 4, 4), "batch"),
    )),
)

CPU_CASES = CaseLists(CPU_TRITON_EAGER, CPU_TRITON_GRAPH, CPU_FLASHINFER_GRAPH)
GPU_CASES = CaseLists(GPU_TRITON_EAGER, GPU_TRITON_GRAPH, GPU_FLASHINFER_GRAPH)

# What the GPU lists must cover (tests/unit/engine/test_ragged_self_check.py).
GPU_COVERAGE_REQUIRED = dict(
    bf16_head_dims={64, 128},
    bf16_gqa_groups={4, 8},
    longest_prefix=4096,
    min_kv_blocks=4 * 8,  # the longest prefix spans >= 32 blocks of the largest BLOCK_N
    max_slots=48,
    max_tier=384,
)


def case_lists(device: str) -> CaseLists:
    return GPU_CASES if device == "cuda" else CPU_CASES


def _requests(case) -> Iterable[tuple[tuple[int, ...], tuple[int, ...]]]:
    if isinstance(case, EagerCase):
        yield case.prefix, case.verify
    else:
        for replay in case.replays:
            yield replay.prefix, replay.verify


def validate(case) -> None:
    """Raise ValueError unless ``case`` is a batch the runner could build (lengths, tiers, slots)."""
    for prefix, verify in _requests(case):
        if len(prefix) != len(verify) or not verify:
            raise ValueError(f"{case.name}: {len(prefix)} prefixes for {len(verify)} requests")
        if min(prefix) < 1 or min(verify) < 1 or max(verify) > case.n:
            raise ValueError(f"{case.name}: every prefix >= 1 and every verify length in 1..{case.n}")
    if isinstance(case, GraphCase):
        for replay in case.replays:
            if replay.tier not in case.tiers:
                raise ValueError(f"{case.name}: tier {replay.tier} is not captured ({case.tiers})")
            if len(replay.verify) > case.slots(replay.tier) or sum(replay.verify) > replay.tier:
                raise ValueError(f"{case.name}: replay {replay} does not fit tier {replay.tier}")
            if replay.lengths_from not in LENGTHS_FROM:
                raise ValueError(f"{case.name}: lengths_from {replay.lengths_from!r} not in {LENGTHS_FROM}")
    if case.shape.hq % case.shape.hkv or case.shape.dtype not in (FP32, BF16):
        raise ValueError(f"{case.name}: bad shape {case.shape}")


def coverage(cases: Iterable) -> dict:
    """The shapes a list of cases covers (for the coverage test and the report)."""
    cases = list(cases)
    bf16 = [c for c in cases if c.shape.dtype == BF16]
    prefixes = [p for c in cases for prefix, _ in _requests(c) for p in prefix]
    graph = [c for c in cases if isinstance(c, GraphCase)]
    replays = [(c, r) for c in graph for r in c.replays]
    return dict(
        bf16_head_dims={c.shape.d for c in bf16},
        bf16_gqa_groups={c.shape.group for c in bf16},
        fp32_cases=sum(c.shape.dtype == FP32 for c in cases),
        longest_prefix=max(prefixes, default=0),
        min_kv_blocks=max(prefixes, default=0) // TRITON_LARGEST_BLOCK_N,
        partial_last_block=any(p > TRITON_LARGEST_BLOCK_N and p % TRITON_LARGEST_BLOCK_N for p in prefixes),
        max_slots=max((c.max_bs for c in graph), default=0),
        max_tier=max((t for c in graph for t in c.tiers), default=0),
        tiers_sharing_slots=any(len(c.tiers) > len({c.slots(t) for t in c.tiers}) for c in graph),
        replay_with_padding_slots=any(len(r.verify) < c.slots(r.tier) for c, r in replays),
        replay_with_leftover_on_last_row=any(
            len(r.verify) == c.slots(r.tier) and sum(r.verify) < r.tier for c, r in replays),
        lengths_from={r.lengths_from for _, r in replays},
        device_only_eager=any(isinstance(c, EagerCase) and not c.host_lengths for c in cases),
    )


__all__ = [
    "BF16",
    "CPU_CASES",
    "FP32",
    "GPU_CASES",
    "GPU_COVERAGE_REQUIRED",
    "LENGTHS_FROM",
    "TRITON_LARGEST_BLOCK_N",
    "AttentionShape",
    "CaseLists",
    "EagerCase",
    "GraphCase",
    "Replay",
    "case_lists",
    "coverage",
    "spread",
    "validate",
    "verify_lens",
]
