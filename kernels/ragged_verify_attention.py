"""Paged causal *ragged* verify attention: the torch reference for DSpark's compact (per-request length) verify.

In SGLang 0.5.23's compact verify (``SGLANG_RAGGED_VERIFY_MODE=compact``) request ``r`` verifies ``verify_lens[r]``
tokens (its anchor plus ``verify_lens[r] - 1`` drafts, ``1 <= verify_lens[r] <= γ+1``), and the query rows of all
requests are packed back to back (``qo_indptr = [0, cumsum(verify_lens)]``), not at a uniform stride of γ+1. Every
verify row attends to the request's committed KV prefix (``prefix_lens[r]`` tokens, ``forward_batch.seq_lens`` in a
TARGET_VERIFY batch) and causally to its own verify rows: row ``i`` of request ``r`` sees KV positions
``0 .. prefix_lens[r] + i`` (bottom-right aligned causal mask, ``q_len <= kv_len``). A linear verify chain needs no
custom mask.

Which kernels run this on a GPU, and from which metadata (SGLang 0.5.23, ``sglang/srt/...``):

* Triton (``layers/attention/triton_backend.py``, kernel ``sglang/kernels/ops/attention/extend_attention.py``
  ``extend_attention_fwd``): the prefix is read through ``kv_indptr = [0, cumsum(prefix_lens)]`` / ``kv_indices``
  (paged), the verify rows' K/V come from ``k_extend``/``v_extend`` row-aligned with ``q``; the segmentation is the
  device ``qo_indptr`` and the launch grid's third axis ``cdiv(max_extend_len, BLOCK_M)``. The patch
  ``sglang_dspark.patches.triton_ragged_verify`` feeds the layout's ``qo_indptr`` there.
* FlashInfer / fa3: one paged KV covering prefix + verify rows, ``kv_lens = prefix_lens + verify_lens``
  (``speculative/ragged_verify.py`` ``build_ragged_target_verify_geometry``, ``speculative/dflash_info.py``
  ``generate_attn_arg_prefill``).

Our Triton version beside this reference, ``ragged_verify_attention_triton.py``, is what ``scripts/
gpu_kernels_check.py`` measures on a bare GPU machine. In serving, SGLang's Triton backend keeps its own
``extend_attention_fwd`` fed by our patch (tests/unit/engine/test_ragged_verify_triton.py runs that kernel under
``TRITON_INTERPRET=1`` with the metadata our patch builds).

This module must stay free of sglang imports (pure torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = [
    "RaggedVerifyMetadata",
    "pad_verify_lens_host",
    "ragged_verify_attention_torch",
    "ragged_verify_metadata",
]


@dataclass(frozen=True)
class RaggedVerifyMetadata:
    """What a ragged verify layout implies for the attention kernels (all int32, on ``verify_lens``' device).

    * ``qo_indptr`` ``(R+1,)``: packed query-row offsets ``[0, cumsum(verify_lens)]``;
    * ``extend_start_loc`` ``(R,)``: ``qo_indptr[:-1]``;
    * ``prefix_indptr`` ``(R+1,)``: ``[0, cumsum(prefix_lens)]``, the Triton extend kernel's paged ``kv_indptr``
      (prefix only: the verify rows' K/V are passed beside ``q``);
    * ``kv_lens`` ``(R,)`` = ``prefix_lens + verify_lens`` and ``kv_indptr`` ``(R+1,)``: the paged KV of FlashInfer /
      fa3, which cover the verify rows too (they are written to the cache before attention);
    * ``max_q_len``: ``max(verify_lens)`` (a Python int; the Triton grid bound ``max_extend_len`` must be >= it).
    """

    qo_indptr: torch.Tensor
    extend_start_loc: torch.Tensor
    prefix_indptr: torch.Tensor
    kv_lens: torch.Tensor
    kv_indptr: torch.Tensor
    max_q_len: int


def _indptr(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    out[1:] = torch.cumsum(lens.to(torch.int64), dim=0).to(torch.int32)
    return out


def ragged_verify_metadata(prefix_lens: torch.Tensor | Sequence[int],
                           verify_lens: torch.Tensor | Sequence[int]) -> RaggedVerifyMetadata:
    """The attention metadata a ragged layout implies (see :class:`RaggedVerifyMetadata`). Reads ``verify_lens`` on
    the host for ``max_q_len`` (a reference: not for the hot path)."""
    verify = torch.as_tensor(verify_lens).to(torch.int32).reshape(-1)
    prefix = torch.as_tensor(prefix_lens).to(torch.int32).reshape(-1).to(verify.device)
    if prefix.numel() != verify.numel():
        raise ValueError(f"prefix_lens has {prefix.numel()} requests, verify_lens {verify.numel()}")
    if verify.numel() and int(verify.min()) < 0:
        raise ValueError(f"verify_lens must be >= 0, got {verify.tolist()}")
    qo_indptr = _indptr(verify)
    kv_lens = prefix + verify
    return RaggedVerifyMetadata(
        qo_indptr=qo_indptr,
        extend_start_loc=qo_indptr[:-1].clone(),
        prefix_indptr=_indptr(prefix),
        kv_lens=kv_lens,
        kv_indptr=_indptr(kv_lens),
        max_q_len=int(verify.max()) if verify.numel() else 0,
    )


def pad_verify_lens_host(verify_lens: Sequence[int], graph_num_tokens: int, padded_bs: int,
                         cap: Optional[int] = None) -> list[int]:
    """Host (pure Python) mirror of SGLang 0.5.23's ``PaddedToBucket`` (``sglang/kernels/ops/speculative/
    ragged_verify_kernels.py`` ``pad_verify_lens_to_bucket``) followed by ``RaggedVerifyLayout.padded_to_bucket``'s
    optional clamp (``speculative/ragged_verify.py:167-195``).

    The ``R`` live rows are kept; the ``leftover = graph_num_tokens - sum(verify_lens)`` tokens of the captured tier
    go to the ``padded_bs - R`` padding rows (``leftover // pad`` each, the first ``leftover % pad`` rows one more),
    or, with no padding row, to the last live row. ``cap`` then clamps every row (``torch.clamp(max=cap)``).
    """
    lens = [int(v) for v in verify_lens]
    bs = len(lens)
    if padded_bs < bs:
        raise ValueError(f"padded_bs {padded_bs} < bs {bs}: the captured tier cannot hold this batch's requests")
    leftover = int(graph_num_tokens) - sum(lens)
    num_pad = padded_bs - bs
    if num_pad > 0:
        base, rem = divmod(leftover, num_pad)  # floor division, like torch's int64 `//`
        padded = lens + [base + (1 if i < rem else 0) for i in range(num_pad)]
    else:
        padded = list(lens)
        padded[-1] += leftover
    if cap is not None:
        padded = [min(v, int(cap)) for v in padded]
    return padded


def ragged_verify_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor | Sequence[int],
    verify_lens: torch.Tensor | Sequence[int],
    *,
    sm_scale: Optional[float] = None,
    logit_cap: float = 0.0,
    out: Optional[torch.Tensor] = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Paged causal ragged verify attention in torch, float32 by default (a reference, one request at a time).

    Args:
      q: ``(num_rows, Hq, D)``; request ``r``'s rows are ``q[qo_indptr[r]:qo_indptr[r+1]]``. Rows past
        ``sum(verify_lens)`` (graph padding) are not read.
      k_cache, v_cache: ``(num_slots, Hkv, D)`` / ``(num_slots, Hkv, Dv)``, ``Hq % Hkv == 0`` (GQA: query head ``h``
        reads KV head ``h // (Hq // Hkv)``).
      req_to_token: ``(pool_size, max_context)`` slot ids; request ``r``'s KV position ``j`` lives in slot
        ``req_to_token[req_pool_indices[r], j]``, for ``j < prefix_lens[r] + verify_lens[r]`` (its verify rows are
        already in the cache, as in SGLang's TARGET_VERIFY: they are written before attention).
      prefix_lens: committed prefix per request (a TARGET_VERIFY batch's ``seq_lens``); verify_lens: rows per request.
      sm_scale: softmax scale, default ``1/sqrt(D)``; logit_cap: ``cap * tanh(s / cap)`` when > 0 (SGLang's soft cap).
      out: optional ``(num_rows, Hq, Dv)`` to write into (rows past ``sum(verify_lens)`` are left as they are).
      compute_dtype: the dtype every product runs in (float64: an oracle that fp32 kernels' rounding can be
        measured against).

    Returns ``out`` (``compute_dtype`` when allocated here).
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError("q, k_cache, v_cache must be (rows/slots, heads, head_dim)")
    num_rows, hq, d = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv != 0:
        raise ValueError(f"query heads {hq} not a multiple of KV heads {hkv}")
    group = hq // hkv
    meta = ragged_verify_metadata(prefix_lens, verify_lens)
    qo = meta.qo_indptr.tolist()
    if qo[-1] > num_rows:
        raise ValueError(f"layout packs {qo[-1]} rows but q has {num_rows}")
    prefix = torch.as_tensor(prefix_lens).reshape(-1).tolist()
    kv_lens = meta.kv_lens.tolist()
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    if out is None:
        out = torch.zeros((num_rows, hq, v_cache.shape[2]), dtype=compute_dtype, device=q.device)
    pool_rows = torch.as_tensor(req_pool_indices).reshape(-1).tolist()
    for r, pool_row in enumerate(pool_rows):
        n_q = qo[r + 1] - qo[r]
        if n_q == 0:
            continue
        kv_len = kv_lens[r]
        slots = req_to_token[pool_row, :kv_len].to(torch.long)
        k = k_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)  # (kv_len, Hq, D)
        v = v_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)
        qr = q[qo[r]:qo[r + 1]].to(compute_dtype)  # (n_q, Hq, D)
        scores = torch.einsum("qhd,khd->hqk", qr, k) * scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        # bottom-right aligned causal: row i sees kv positions <= prefix + i
        visible = torch.arange(kv_len, device=q.device)[None, :] <= (
            prefix[r] + torch.arange(n_q, device=q.device)[:, None])
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qo[r]:qo[r + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
    return out
