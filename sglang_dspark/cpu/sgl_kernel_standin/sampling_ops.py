"""``torch.ops.sgl_kernel.murmur_hash32_cpu``: the per-(row, column) hash behind SGLang's seeded sampling.

Call site: kernels/ops/sampling/murmur_hash.py ``murmur_hash32`` (CPU branch), used by
``srt/layers/sampler.py::multinomial_with_seed`` (requests with a ``sampling_seed``) and by the speculative
seeded samplers (spec_utils.py, eagle_utils.py). It must agree bit for bit with SGLang's Triton kernel in the
same file, so that a seed gives the same tokens on every platform: MurmurHash3 (x86, 32-bit) over four
32-bit blocks (seed low word, seed high word, position, column index), seed 0, length 16.

Torch has no uint32 arithmetic kernels, so the hash runs in int64 with every intermediate below 2**49:
32-bit products are formed from 16-bit halves of the constant.
"""

from __future__ import annotations

import torch

from .registry import define_op, traced

SCHEMA = "murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor"

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(k, 0xCC9E2D51)
    k = _rotl32(k, 15)
    k = _mul32(k, 0x1B873593)
    h = h ^ k
    h = _rotl32(h, 13)
    return (h * 5 + 0xE6546B64) & _M32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


@traced("murmur_hash32_cpu")
def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """[n, m] uint32 hashes of (seed[i], positions[i], col_indices[j])."""
    s = seed.reshape(-1)
    # The caller passes seed as uint64; its bits viewed as int64 split into the same two 32-bit words.
    s = s.view(torch.int64) if s.dtype == torch.uint64 else s.to(torch.int64)
    seed_lo = (s & _M32)[:, None]
    seed_hi = ((s >> 32) & _M32)[:, None]
    pos = (positions.reshape(-1).to(torch.int64) & _M32)[:, None]
    col = (col_indices.reshape(-1).to(torch.int64) & _M32)[None, :]
    h = _mix(torch.zeros_like(seed_lo), seed_lo)
    h = _mix(h, seed_hi)
    h = _mix(h, pos)  # [n, 1]
    h = _mix(h.expand(-1, col.shape[1]), col.expand(h.shape[0], -1))  # [n, m]
    h = _fmix(h ^ 16)
    return h.to(torch.uint32)


def _murmur_hash32_fake(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    # Shape function for torch.compile: multinomial_with_seed, the caller, is @torch.compile'd.
    return seed.new_empty((seed.shape[0], col_indices.shape[0]), dtype=torch.uint32)


def register() -> None:
    define_op("murmur_hash32_cpu", SCHEMA, murmur_hash32_cpu, fake=_murmur_hash32_fake)
