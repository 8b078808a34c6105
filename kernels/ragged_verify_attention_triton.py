"""Paged causal ragged verify attention in Triton, beside its torch reference (``ragged_verify_attention.py``).

Same contract as :func:`sglang_dspark.kernels.ragged_verify_attention.ragged_verify_attention_torch`: request ``r``
owns query rows ``qo_indptr[r] .. qo_indptr[r+1]`` (its anchor and drafts, packed back to back), attends to KV
positions ``0 .. prefix_lens[r] + i`` for its row ``i`` (bottom-right aligned causal; the verify rows' K/V are already
in the paged cache), and KV position ``j`` lives in slot ``req_to_token[req_pool_indices[r], j]``.

Why a kernel of ours when SGLang's Triton backend runs its own extend kernel (fed the layout by
``patches/triton_ragged_verify.py``): this one needs only torch + triton, so ``scripts/gpu_kernels_check.py`` can
measure ragged verify on a bare GPU machine (correctness in bf16, CUDA-graph capture with lengths changing between
replays, time against padding every request to γ+1), and it is the reference shape of a sync-free ragged verify:
every length is read on the device and the launch grid is fixed by host bounds only (``num_slots`` requests ×
query heads, ``max_q_len`` rows a request), so one captured graph serves every length mix of at most
``num_slots`` requests. A slot with no rows (``qo_indptr[r] == qo_indptr[r+1]``, graph padding) returns at once.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["ragged_verify_attention_triton"]


@triton.jit
def _ragged_verify_fwd(
    Q, K, V, O,
    req_to_token, req_pool_indices, prefix_lens, qo_indptr,
    sm_scale, logit_cap,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_pool,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_CAP: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // GROUP
    q_start = tl.load(qo_indptr + r)
    num_q = tl.load(qo_indptr + r + 1) - q_start
    prefix = tl.load(prefix_lens + r)
    pool_row = tl.load(req_pool_indices + r).to(tl.int64)
    kv_len = tl.where(num_q > 0, prefix + num_q, 0)  # a padding slot reads nothing

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < num_q
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        col_ok = offs_n < kv_len
        slots = tl.load(req_to_token + pool_row * stride_pool + offs_n, mask=col_ok, other=0).to(tl.int64)
        k = tl.load(K + slots[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                    mask=col_ok[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * sm_scale
        if HAS_CAP:
            s = logit_cap * (2.0 * tl.sigmoid(2.0 * s / logit_cap) - 1.0)  # cap * tanh(s / cap)
        # Row i sees position 0 (<= prefix + i) in the first block, so m_i is finite from then on: no NaN rows.
        visible = col_ok[None, :] & (offs_n[None, :] <= prefix + offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slots[:, None] * stride_vt + kv_head * stride_vh + offs_dv[None, :],
                    mask=col_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + rows[:, None] * stride_ot + h * stride_oh + offs_dv[None, :], acc.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))


def ragged_verify_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    max_q_len: int,
    sm_scale: Optional[float] = None,
    logit_cap: float = 0.0,
    out: Optional[torch.Tensor] = None,
    block_n: int = 64,
    input_precision: Optional[str] = None,
) -> torch.Tensor:
    """Ragged verify attention (see the module docstring); no host read of any length.

    Args as the torch reference, except that the layout comes as device tensors: ``qo_indptr`` ``(S+1,)`` int32 and
    ``prefix_lens``/``req_pool_indices`` ``(S,)`` for ``S`` request slots (slots past the live requests repeat the
    last offset: no rows). ``max_q_len`` is a host bound on every request's rows (γ+1); a request with more rows is
    not allowed (its extra rows would not be written). ``out`` ``(rows, Hq, Dv)`` in ``q``'s dtype when allocated
    here; rows not owned by any request are left as they are. ``input_precision`` is ``tl.dot``'s (``"ieee"``,
    ``"tf32"``, ...); default ``"ieee"`` for fp32 inputs, the tensor-core dot for bf16/fp16. The interpreter ignores
    it (it multiplies in full fp32).
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError("q, k_cache, v_cache must be (rows/slots, heads, head_dim)")
    _, hq, d = q.shape
    hkv, dv = k_cache.shape[1], v_cache.shape[2]
    if hq % hkv != 0:
        raise ValueError(f"query heads {hq} not a multiple of KV heads {hkv}")
    if k_cache.shape[2] != d:
        raise ValueError(f"q head_dim {d} != K head_dim {k_cache.shape[2]}")
    if max_q_len < 1:
        raise ValueError(f"max_q_len must be >= 1, got {max_q_len}")
    for name, t in (("req_to_token", req_to_token), ("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if out is None:
        out = torch.empty((q.shape[0], hq, dv), dtype=q.dtype, device=q.device)
    num_slots = qo_indptr.numel() - 1
    # Triton 3.9's interpreter (TRITON_INTERPRET=1, the CPU parity run) returns garbage from a bf16 tl.dot: there the
    # products run in fp32 (the GPU keeps the bf16 tensor-core dot).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    _ragged_verify_fwd[(num_slots, hq)](
        q, k_cache, v_cache, out,
        req_to_token, req_pool_indices, prefix_lens, qo_indptr,
        float(scale), float(logit_cap) if logit_cap > 0 else 1.0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0),
        GROUP=hq // hkv, HEAD_DIM=d, HEAD_DIM_V=dv,
        BLOCK_M=max(16, triton.next_power_of_2(int(max_q_len))), BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)),
        HAS_CAP=logit_cap > 0,
        PRECISION=input_precision or ("ieee" if q.dtype == torch.float32 or interpreted else "tf32"),
        DOT_F32=interpreted,
    )
    return out
