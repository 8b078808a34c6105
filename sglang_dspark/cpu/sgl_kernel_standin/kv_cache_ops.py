"""KV-cache bookkeeping helpers: ``req_to_token`` table writes/reads and slot moves.

Argument order and names follow SGLang 0.5.23's CPU call sites:

* ``copy_all_layer_kv_cache_cpu``           kernels/ops/kvcache/cache_move.py (``copy_all_layer_kv_cache_func``)
* ``assign_req_to_token_pool_cpu``          srt/mem_cache/allocation.py (``assign_req_to_token_pool_func``)
* ``assign_extend_cache_locs_cpu``          kernels/ops/speculative/cache_locs.py (two call sites)
* ``assign_draft_cache_locs_contiguous_cpu`` kernels/ops/speculative/cache_locs.py
* ``build_draft_decode_metadata_cpu``       srt/layers/attention/intel_amx_backend.py
  (``IntelAMXMultiStepDraftBackend``)

Everything is vectorised with index tensors (no per-request Python loop) because these run on every
scheduler step.
"""

from __future__ import annotations

import ctypes
from typing import List, Tuple

import torch

from .registry import traced

_UINT64_MASK = (1 << 64) - 1


def _as_int_list(t: torch.Tensor) -> List[int]:
    """Host ints of an int tensor, including torch.uint64 (SGLang keeps data pointers as uint64)."""
    t = t.reshape(-1)
    if t.dtype == torch.uint64:
        # uint64 has few kernels; the same bits viewed as int64 always convert.
        return [v & _UINT64_MASK for v in t.view(torch.int64).tolist()]
    return [int(v) for v in t.tolist()]


def _byte_rows(ptr: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    """A writable uint8 [num_rows, row_bytes] tensor aliasing raw memory at ``ptr`` (no copy).

    ctypes gives a writable buffer over the address; torch.frombuffer wraps it without copying and keeps
    the ctypes object alive for the tensor's lifetime.
    """
    buf = (ctypes.c_uint8 * (num_rows * row_bytes)).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8).view(num_rows, row_bytes)


@traced("copy_all_layer_kv_cache_cpu")
def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer b: ``row_b[tgt_loc[i]] = row_b[src_loc[i]]`` (all sources read before any write).

    The caller (``MHATokenToKVPool._move_kv_cache_impl``) hands over only raw base addresses
    (``data_ptrs``, uint64) and row strides in bytes (``strides``, one per K/V/scale buffer), exactly like
    the Triton kernel it replaces; the buffer tensors are not passed. We therefore alias each buffer's first
    ``max(loc) + 1`` rows through ``torch.frombuffer`` over a ctypes array at that address and do one
    gather + scatter per buffer. The memory touched is exactly what the Triton kernel touches: the caller
    guarantees in-range locations (SGLang checks them with ``maybe_detect_oob``), the buffers are contiguous
    (asserted in ``_init_kv_copy_and_warmup``), and a row's stride is its full width. Negative locations are
    rejected here because they would address memory before the buffer.
    """
    tgt = tgt_loc.reshape(-1).to(torch.int64)
    src = src_loc.reshape(-1).to(torch.int64)
    if tgt.numel() != src.numel():
        raise ValueError(f"tgt_loc has {tgt.numel()} entries but src_loc has {src.numel()}")
    if tgt.numel() == 0:
        return
    lo = min(int(tgt.min()), int(src.min()))
    if lo < 0:
        raise ValueError(f"copy_all_layer_kv_cache_cpu: negative KV location {lo}")
    num_rows = max(int(tgt.max()), int(src.max())) + 1
    ptrs = _as_int_list(data_ptrs)
    row_bytes = _as_int_list(strides)
    if len(row_bytes) != len(ptrs):
        raise ValueError(f"{len(ptrs)} data pointers but {len(row_bytes)} strides")
    for ptr, nbytes in zip(ptrs, row_bytes):
        if ptr == 0 or nbytes <= 0:
            raise ValueError(f"invalid KV buffer pointer/stride ({ptr:#x}, {nbytes})")
        rows = _byte_rows(ptr, nbytes, num_rows)
        # index_select materialises every source row before index_copy_ writes, so overlapping
        # source/target sets are safe (the in-place property the Triton kernel documents).
        rows.index_copy_(0, tgt, rows.index_select(0, src))


def _ragged_positions(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """(rows, cols, total) of the flattened [start[i], end[i]) spans of every request, in order.

    Request i's span lands at flat output offset sum_{j<i}(end[j] - start[j]), as in SGLang's Triton
    kernels; a negative span copies nothing.
    """
    if req_pool_indices.numel() <= _HOST_BUILD_MAX_REQUESTS:
        return _ragged_positions_on_host(req_pool_indices, start_offset, end_offset)
    starts = start_offset.reshape(-1).to(torch.int64)
    ends = end_offset.reshape(-1).to(torch.int64)
    lens = (ends - starts).clamp_min(0)
    total = int(lens.sum()) if lens.numel() else 0
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=starts.device)
        return empty, empty, 0
    rows = req_pool_indices.reshape(-1).to(torch.int64).repeat_interleave(lens)
    first = torch.cumsum(lens, 0) - lens  # flat offset of each request's first element
    within = torch.arange(total, device=starts.device) - first.repeat_interleave(lens)
    cols = starts.repeat_interleave(lens) + within
    return rows, cols, total


# Up to this many requests the spans are built as Python lists: these are CPU tensors, and four tensor ops
# (repeat_interleave with tensor repeats, cumsum, arange) are slower than the list build up to this size; the op runs
# a few times per decode step.
_HOST_BUILD_MAX_REQUESTS = 64


def _ragged_positions_on_host(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    rows: list = []
    cols: list = []
    for row, start, end in zip(req_pool_indices.reshape(-1).tolist(), start_offset.reshape(-1).tolist(),
                               end_offset.reshape(-1).tolist()):
        if end > start:
            rows.extend([row] * (end - start))
            cols.extend(range(start, end))
    device = start_offset.device
    return (torch.tensor(rows, dtype=torch.int64, device=device), torch.tensor(cols, dtype=torch.int64, device=device),
            len(rows))


def _check_pool_len(req_to_token: torch.Tensor, pool_len: int) -> None:
    # The Triton kernels take pool_len as the row stride; every SGLang call site passes
    # req_to_token.shape[1], and we index the 2-D table, so anything else would be a silent mismatch.
    if req_to_token.dim() != 2 or int(pool_len) != req_to_token.shape[1]:
        raise ValueError(f"pool_len={pool_len} does not match req_to_token of shape {tuple(req_to_token.shape)}")


@traced("assign_req_to_token_pool_cpu")
def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[off_i : off_i + end[i] - start[i]]``."""
    _check_pool_len(req_to_token, pool_len)
    rows, cols, total = _ragged_positions(req_pool_indices, start_offset, end_offset)
    if total == 0:
        return
    req_to_token[rows, cols] = out_cache_loc.reshape(-1)[:total].to(req_to_token.dtype)


@traced("assign_extend_cache_locs_cpu")
def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse read: ``out_cache_loc[off_i : off_i + len_i] = req_to_token[rpi[i], start[i]:end[i]]``.

    Only the first sum(len) entries of ``out_cache_loc`` are written (the caller may size it for the
    uniform maximum).
    """
    _check_pool_len(req_to_token, pool_len)
    rows, cols, total = _ragged_positions(req_pool_indices, start_offset, end_offset)
    if total == 0:
        return
    out_cache_loc.view(-1)[:total] = req_to_token[rows, cols].to(out_cache_loc.dtype)


@traced("assign_draft_cache_locs_contiguous_cpu")
def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc[i*n:(i+1)*n] = req_to_token[rpi[i], seq_lens[i] : seq_lens[i] + n]``, n = topk*num_steps."""
    _check_pool_len(req_to_token, pool_len)
    n = int(topk) * int(num_steps)
    bs = seq_lens.numel()
    if bs == 0 or n == 0:
        return
    rows = req_pool_indices.reshape(-1).to(torch.int64)[:, None]
    cols = seq_lens.reshape(-1).to(torch.int64)[:, None] + torch.arange(n, device=seq_lens.device)
    out_cache_loc.view(-1)[: bs * n] = req_to_token[rows, cols].reshape(-1).to(out_cache_loc.dtype)


@traced("build_draft_decode_metadata_cpu")
def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Per-candidate ``req_to_token`` rows for the multi-step draft decode.

    Row ``b*topk + tk`` = request b's committed prefix ``req_to_token[rpi[b], :seq_lens[b]]`` followed by
    candidate tk's ``num_steps`` draft slots ``req_to_token[rpi[b], seq_lens[b] + tk*num_steps + s]`` (the
    layout ``assign_draft_cache_locs_contiguous`` allocates: each candidate's chain is contiguous). Step s of
    the draft decode then reads the first ``seq_lens[b] + s + 1`` entries of the row with
    ``req_pool_indices = arange(bs*topk)`` (see ``IntelAMXMultiStepDraftBackend.init_forward_metadata``).

    The chain layout is the token-granular one (page_size 1, what SGLang's CPU engine runs): with
    page_size > 1 and topk > 1 the GPU path pads each candidate's chain to whole pages, which this signature
    (no page_size) cannot express.

    The table is ``max(seq_lens) + num_steps`` wide (padding 0, a valid slot index) instead of ``pool_len``:
    nothing reads past a row's length and a full-width copy would cost bs*topk*context_len per step.
    """
    _check_pool_len(req_to_token, pool_len)
    topk, num_steps = int(topk), int(num_steps)
    device = req_to_token.device
    bs = seq_lens.numel()
    if bs == 0:
        return torch.zeros((0, max(num_steps, 1)), dtype=req_to_token.dtype, device=device)
    lens = seq_lens.reshape(-1).to(torch.int64)
    width = min(int(lens.max()) + num_steps, int(pool_len))
    col = torch.arange(width, device=device)[None, None, :]  # [1, 1, W]
    prefix = lens[:, None, None]  # [bs, 1, 1]
    tk = torch.arange(topk, device=device)[None, :, None]  # [1, topk, 1]
    in_prefix = col < prefix
    in_chain = (col >= prefix) & (col < prefix + num_steps)
    src_col = torch.where(in_prefix, col, prefix + tk * num_steps + (col - prefix))
    valid = in_prefix | in_chain
    src_col = torch.where(valid, src_col, torch.zeros_like(src_col))
    rows = req_pool_indices.reshape(-1).to(torch.int64)[:, None, None].expand(bs, topk, width)
    table = req_to_token[rows, src_col.expand(bs, topk, width)]
    table = torch.where(valid.expand(bs, topk, width), table, torch.zeros_like(table))
    return table.reshape(bs * topk, width).contiguous()
