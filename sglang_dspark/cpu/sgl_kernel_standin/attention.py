"""Paged attention of SGLang's ``intel_amx`` backend, in torch: ``torch.ops.sgl_kernel.extend_attention_cpu``
and ``torch.ops.sgl_kernel.decode_attention_cpu``.

The positional signatures are those of srt/layers/attention/intel_amx_backend.py in SGLang 0.5.23
(``IntelAMXAttnBackend.forward_extend`` / ``forward_decode``). Both ops return nothing and write their
output tensor in place; decode first stores the new token's K/V at ``loc``.

Semantics (per request b, ``L = seq_lens[b]``):

* KV rows live in the paged buffers at ``req_to_token[req_pool_indices[b], base : base + L]`` with
  ``base = encoder_lens[b]`` when ``encoder_lens`` is given, else 0 (SGLang's torch_native convention for
  encoder-decoder models). Cross-attention layers attend to ``req_to_token[rpi, :encoder_lens[b]]``, unmasked.
* Extend: ``E = extend_seq_lens[b]`` queries start at row ``extend_start_loc[b]``; the first ``P = L - E``
  keys (the prefix) come from the buffers, the last E from ``k_extend``/``v_extend`` (or from the buffers
  when those are None, e.g. Gemma4's KV-shared layers, whose K/V the sharing layer already stored). E may
  differ per request (ragged speculative verify).
* Query i of the extend block sits at position ``P + i``. Masks: causal (``key_pos <= query_pos``) when
  ``is_causal``; none inside the block when not (ENCODER_ONLY layers such as DSpark/DFlash draft layers see
  the whole block bidirectionally); a ``tree_mask`` replaces the in-block mask (prefix fully visible).
  ``tree_mask`` layouts: QLEN_ONLY (CPU default of SGLang's EAGLE and NGRAM) = concatenated per-request
  [E, E] bool blocks, ``mask[i, j]`` = query i may see extend key j; FULL_MASK = per-request [E, L] rows
  including the prefix columns, recognised by its size (sum E*L, with some prefix present).
* ``sliding_window_size`` W > 0 (the backend passes the layer's window + 1): a key is visible only if
  ``query_pos - key_pos < W`` (only the left edge is limited, causal or not, as in SGLang's Triton kernel).
* Scores ``s = (q . k) * sm_scale``, then ``logit_cap * tanh(s / logit_cap)`` when ``logit_cap > 0``.
  ``sinks`` ([num_heads] logits) add one value-less entry per head to the softmax denominator.
* GQA: query head h uses KV head ``h // (num_heads // num_kv_heads)``.
* fp8 KV buffers are dequantised with ``key_scale``/``value_scale``; other buffers are read as they are.
* All arithmetic in fp32; the output is cast to the output tensor's dtype. ``attn_logits`` (the C++
  kernel's split-KV scratch) and ``max_len_extend`` are accepted and not needed.

Implementation: one SDPA call per request (extend), or per group of requests padded to the longest one with
a key mask (decode, and extends of at most ``SHORT_EXTEND_ROWS`` rows per request without a tree mask), in fp32
with an explicit boolean mask; when a logit cap or sinks are present, or a row has no visible key, an explicit
grouped-query softmax is used instead. Query rows are chunked so that no score/mask matrix exceeds ~64 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F

from .registry import define_op, traced

# Elements of the largest score (or padded K) block materialised at once: 2**24 fp32 = 64 MiB.
_BLOCK_ELEMS = 1 << 24
# Extends up to this many rows per request (verify windows, draft blocks, anchor-only steps) run as one padded
# attention call per group of requests, like decode; one call per request costs several times more on a CPU at
# 16 requests. Longer extends (prefill) keep the per-request loop, where padding would waste work.
SHORT_EXTEND_ROWS = 16

EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int? max_len_extend, float sm_scale, float? logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens=None, Tensor? sinks=None, Tensor? tree_mask=None, bool is_causal=True) -> ()"
)
DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float key_scale, "
    "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float? logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens=None, Tensor? sinks=None) -> ()"
)


def _is_fp8(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point and t.element_size() == 1


def _rows(buffer: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The buffer as [slots, kv_heads, head_dim] (SGLang's MHA pool is already 3-D)."""
    # view, not reshape: decode writes through it, so it must alias the pool buffer.
    return buffer if buffer.dim() == 3 else buffer.view(buffer.shape[0], -1, head_dim)


def _load(buffer: torch.Tensor, idx: torch.Tensor, scale: float, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 rows ``buffer[idx]`` (shape ``idx.shape + buffer.shape[1:]``), dequantised when the buffer holds fp8.

    ``index_select`` rather than advanced indexing: several times faster for row gathers on CPU. With ``out``
    the rows are converted straight into that fp32 tensor (no intermediate copy).
    """
    rows = torch.index_select(buffer, 0, idx.reshape(-1)).view(*idx.shape, *buffer.shape[1:])
    if out is None:
        out = rows.to(torch.float32)
    else:
        out.copy_(rows)
    if _is_fp8(buffer) and scale not in (None, 1.0):
        out.mul_(float(scale))
    return out


def _store(buffer: torch.Tensor, loc: torch.Tensor, new: torch.Tensor, scale: float) -> None:
    new = new.reshape(-1, *buffer.shape[1:])
    if _is_fp8(buffer) and scale not in (None, 1.0):
        new = new.to(torch.float32) / float(scale)
    buffer.index_copy_(0, loc.reshape(-1).to(torch.int64), new.to(buffer.dtype))


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    sm_scale: float,
    logit_cap: float,
    sinks: Optional[torch.Tensor],
) -> torch.Tensor:
    """Grouped-query attention in fp32.

    q [B, M, H, D], k [B, L, Hkv, D], v [B, L, Hkv, Dv] (fp32), mask bool [B, M, L] (True = visible) or None.
    Returns [B, M, H, Dv] fp32; a row with no visible key (and no sink) yields zeros.
    """
    B, M, H, _ = q.shape
    L, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    if L == 0:
        return q.new_zeros((B, M, H, Dv), dtype=torch.float32)
    if H % Hkv != 0:
        raise ValueError(f"{H} query heads are not a multiple of {Hkv} KV heads")
    G = H // Hkv
    all_rows_live = mask is None or bool(mask.any(-1).all())
    if logit_cap <= 0 and sinks is None and all_rows_live:
        # SDPA's CPU kernel (fp32 in, fp32 accumulation) handles GQA without repeating K/V.
        out = F.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3),
            k.permute(0, 2, 1, 3),
            v.permute(0, 2, 1, 3),
            attn_mask=None if mask is None else mask[:, None],
            scale=sm_scale,
            enable_gqa=G > 1,
        )
        return out.permute(0, 2, 1, 3)

    # Explicit softmax: KV head j serves query heads j*G .. j*G+G-1.
    qg = q.reshape(B, M, Hkv, G, -1).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, M, D]
    kt = k.permute(0, 2, 3, 1).unsqueeze(2)  # [B, Hkv, 1, D, L]
    s = torch.matmul(qg, kt) * sm_scale  # [B, Hkv, G, M, L]
    if logit_cap > 0:
        s = torch.tanh(s / logit_cap) * logit_cap
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None], float("-inf"))
    peak = s.amax(-1, keepdim=True)
    sink = None
    if sinks is not None:
        sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1, 1)
        peak = torch.maximum(peak, sink)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))  # fully masked row
    p = torch.exp(s - peak)
    denom = p.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - peak)
    out = torch.matmul(p, v.permute(0, 2, 1, 3).unsqueeze(2))  # [B, Hkv, G, M, Dv]
    out = out / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out.permute(0, 3, 1, 2, 4).reshape(B, M, H, Dv)


def _host_list(t: Optional[torch.Tensor], n: int) -> Optional[List[int]]:
    return None if t is None else [int(x) for x in t.reshape(-1)[:n].tolist()]


@traced("extend_attention_cpu")
def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: Optional[torch.Tensor],
    v_extend: Optional[torch.Tensor],
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: Optional[int],
    sm_scale: float,
    logit_cap: Optional[float],
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
    tree_mask: Optional[torch.Tensor] = None,
    is_causal: bool = True,
) -> None:
    bs = seq_lens.numel()
    if bs == 0:
        return
    num_heads, head_dim = q_extend.shape[-2], q_extend.shape[-1]
    v_head_dim = o_extend.shape[-1]
    kbuf, vbuf = _rows(k_buffer, head_dim), _rows(v_buffer, v_head_dim)
    cap = float(logit_cap or 0.0)
    window = int(sliding_window_size)
    seq = _host_list(seq_lens, bs)
    ext = _host_list(extend_seq_lens, bs)
    start = _host_list(extend_start_loc, bs)
    rpi = _host_list(req_pool_indices, bs)
    enc = _host_list(encoder_lens, bs)
    if is_cross_attn and enc is None:
        raise ValueError("extend_attention_cpu: cross-attention needs encoder_lens")

    tree_flat, tree_full_layout, tree_offsets = None, False, []
    if tree_mask is not None and not is_cross_attn:
        tree_flat = tree_mask.reshape(-1)
        full_total = sum(e * s for e, s in zip(ext, seq))
        tree_full_layout = any(s > e for e, s in zip(ext, seq)) and tree_flat.numel() == full_total
        off = 0
        for e, s in zip(ext, seq):
            tree_offsets.append(off)
            off += e * (s if tree_full_layout else e)
        if tree_flat.numel() < off:
            raise ValueError(f"tree_mask has {tree_flat.numel()} entries, the batch needs {off}")

    if tree_flat is None and not is_cross_attn and bs > 1 and 0 < max(ext) <= SHORT_EXTEND_ROWS:
        _extend_short_batched(
            q_extend, k_extend, v_extend, o_extend, kbuf, vbuf, key_scale, value_scale, req_to_token,
            seq, ext, start, rpi, enc, sm_scale, cap, window, sinks, is_causal,
        )
        return

    for b in range(bs):
        E, L = ext[b], seq[b]
        if E <= 0:
            continue
        P = L - E
        if P < 0:
            raise ValueError(f"request {b}: extend length {E} exceeds seq_len {L}")
        s0 = start[b]
        q = q_extend[s0 : s0 + E].to(torch.float32)
        table = req_to_token[rpi[b]]
        if is_cross_attn:
            idx = table[: enc[b]]
            keys, vals = _load(kbuf, idx, key_scale), _load(vbuf, idx, value_scale)
        else:
            base = enc[b] if enc is not None else 0
            pre = table[base : base + P]
            keys = torch.empty((L, kbuf.shape[1], head_dim), dtype=torch.float32, device=q.device)
            vals = torch.empty((L, vbuf.shape[1], v_head_dim), dtype=torch.float32, device=q.device)
            _load(kbuf, pre, key_scale, out=keys[:P])
            _load(vbuf, pre, value_scale, out=vals[:P])
            if k_extend is not None and v_extend is not None:
                keys[P:] = k_extend[s0 : s0 + E].reshape(E, -1, head_dim)
                vals[P:] = v_extend[s0 : s0 + E].reshape(E, -1, v_head_dim)
            else:
                new = table[base + P : base + L]
                _load(kbuf, new, key_scale, out=keys[P:])
                _load(vbuf, new, value_scale, out=vals[P:])
        num_keys = keys.shape[0]

        rows_per_chunk = max(1, _BLOCK_ELEMS // max(1, num_heads * num_keys))
        key_pos = torch.arange(num_keys, device=q.device)
        for r0 in range(0, E, rows_per_chunk):
            r1 = min(E, r0 + rows_per_chunk)
            mask = None
            if not is_cross_attn:
                q_pos = torch.arange(P + r0, P + r1, device=q.device)[:, None]
                if tree_flat is not None:
                    if tree_full_layout:
                        rows = tree_flat[tree_offsets[b] : tree_offsets[b] + E * L].view(E, L)
                        mask = rows[r0:r1].to(torch.bool)
                    else:
                        block = tree_flat[tree_offsets[b] : tree_offsets[b] + E * E].view(E, E)
                        mask = torch.ones((r1 - r0, num_keys), dtype=torch.bool, device=q.device)
                        mask[:, P:] = block[r0:r1].to(torch.bool)
                elif is_causal:
                    mask = key_pos[None, :] <= q_pos
                if window > 0:
                    in_window = key_pos[None, :] > q_pos - window
                    mask = in_window if mask is None else mask & in_window
            out = _attend(
                q[None, r0:r1], keys[None], vals[None], None if mask is None else mask[None], sm_scale, cap, sinks
            )
            o_extend[s0 + r0 : s0 + r1] = out[0].reshape(r1 - r0, *o_extend.shape[1:]).to(o_extend.dtype)


@dataclass(frozen=True)
class _ShortExtendGroup:
    """One padded attention call of :func:`_extend_short_batched`: everything that depends only on the batch's
    lengths and masks, the same for every layer of a forward (the K/V slots are read per call)."""

    pool_rows: torch.Tensor  # [g] req_to_token rows of the group's requests
    key_cols: torch.Tensor  # [g, key_len] req_to_token columns of key positions (clamped; padding masked)
    key_valid: torch.Tensor  # [g, key_len] key position < seq_len
    query_src: torch.Tensor  # [g, q_len] rows of q_extend (padded rows repeat the request's first row)
    row_valid: torch.Tensor  # [g, q_len] row < extend length
    extend_dest: torch.Tensor  # flat [g * key_len] positions of the extend rows' keys, in row_valid order
    mask: Optional[torch.Tensor]  # [g, q_len, key_len] visible keys, None when all are


def _short_extend_plan(
    seq: List[int], ext: List[int], start: List[int], rpi: List[int], enc: Optional[List[int]],
    width: int, per_key: int, is_causal: bool, window: int, device: torch.device,
) -> List[_ShortExtendGroup]:
    key = (tuple(seq), tuple(ext), tuple(start), tuple(rpi), None if enc is None else tuple(enc),
           width, per_key, is_causal, window, str(device))
    cached = _SHORT_EXTEND_PLAN_CACHE.get(key)
    if cached is not None:
        return cached
    groups = []
    live = [b for b in range(len(seq)) if ext[b] > 0]
    for group in _decode_groups([seq[b] for b in live], per_key):
        rows = [live[i] for i in group]
        lens = torch.tensor([seq[b] for b in rows], dtype=torch.int64, device=device)
        extend = torch.tensor([ext[b] for b in rows], dtype=torch.int64, device=device)
        prefix = lens - extend
        base = torch.tensor([enc[b] if enc is not None else 0 for b in rows], dtype=torch.int64, device=device)
        g, key_len, q_len = len(rows), int(lens.max()), int(extend.max())
        key_pos = torch.arange(key_len, device=device)[None, :]
        key_valid = key_pos < lens[:, None]
        row_pos = torch.arange(q_len, device=device)[None, :]
        row_valid = row_pos < extend[:, None]
        first_row = torch.tensor([start[b] for b in rows], dtype=torch.int64, device=device)
        q_pos = (prefix[:, None] + row_pos)[:, :, None]  # [g, q_len, 1]
        mask = key_valid[:, None, :].expand(g, q_len, key_len)
        if is_causal:
            mask = mask & (key_pos[:, None, :] <= q_pos)
        if window > 0:
            mask = mask & (key_pos[:, None, :] > q_pos - window)
        # Padded query rows see key 0 only: every row stays live, so SDPA's fast path is taken.
        mask = torch.where(row_valid[:, :, None], mask, key_pos[:, None, :] == 0)
        groups.append(_ShortExtendGroup(
            pool_rows=torch.tensor([rpi[b] for b in rows], dtype=torch.int64, device=device),
            key_cols=(base[:, None] + key_pos).clamp_(max=width - 1),
            key_valid=key_valid,
            query_src=first_row[:, None] + torch.where(row_valid, row_pos, 0),
            row_valid=row_valid,
            extend_dest=(torch.arange(g, device=device)[:, None] * key_len + prefix[:, None] + row_pos)[row_valid],
            mask=None if bool(mask.all()) else mask,
        ))
    _SHORT_EXTEND_PLAN_CACHE.clear()  # one forward's plan at a time: its layers all ask for the same one
    _SHORT_EXTEND_PLAN_CACHE[key] = groups
    return groups


_SHORT_EXTEND_PLAN_CACHE: dict = {}


def _extend_short_batched(
    q_extend: torch.Tensor,
    k_extend: Optional[torch.Tensor],
    v_extend: Optional[torch.Tensor],
    o_extend: torch.Tensor,
    kbuf: torch.Tensor,
    vbuf: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    seq: List[int],
    ext: List[int],
    start: List[int],
    rpi: List[int],
    enc: Optional[List[int]],
    sm_scale: float,
    cap: float,
    window: int,
    sinks: Optional[torch.Tensor],
    is_causal: bool,
) -> None:
    """Extend attention for a batch of short extends (speculative verify, draft blocks, anchor-only steps): the
    requests padded into one attention call per group, as decode does, instead of one call per request.

    Same semantics as the per-request loop (causal or not, sliding window, logit cap, sinks; K/V of the extend rows
    from ``k_extend``/``v_extend`` when given, else from the buffers). The padding plan depends only on lengths
    and is built once per forward (every layer asks for the same one); the K/V slots are read on every call."""
    num_heads, head_dim = q_extend.shape[-2], q_extend.shape[-1]
    per_key = max(kbuf.shape[1] * max(head_dim, o_extend.shape[-1]), num_heads * max(ext))
    plan = _short_extend_plan(
        seq, ext, start, rpi, enc, req_to_token.shape[1], per_key, is_causal, window, q_extend.device
    )
    for group in plan:
        g, q_len = group.query_src.shape
        key_len = group.key_cols.shape[1]
        table = req_to_token.index_select(0, group.pool_rows)
        idx = torch.where(group.key_valid, torch.gather(table, 1, group.key_cols).to(torch.int64), 0)
        keys, vals = _load(kbuf, idx, key_scale), _load(vbuf, idx, value_scale)  # [g, key_len, Hkv, D]
        src = group.query_src[group.row_valid]
        if k_extend is not None and v_extend is not None:
            # The extend rows' K/V as given (not re-read from the buffers), at key positions prefix + i.
            keys.view(g * key_len, *keys.shape[2:])[group.extend_dest] = (
                k_extend[src].reshape(-1, *keys.shape[2:]).to(torch.float32)
            )
            vals.view(g * key_len, *vals.shape[2:])[group.extend_dest] = (
                v_extend[src].reshape(-1, *vals.shape[2:]).to(torch.float32)
            )
        q = q_extend[group.query_src.reshape(-1)].to(torch.float32).view(g, q_len, num_heads, head_dim)
        out = _attend(q, keys, vals, group.mask, sm_scale, cap, sinks)
        o_extend.index_copy_(0, src, out[group.row_valid].reshape(-1, *o_extend.shape[1:]).to(o_extend.dtype))


@traced("decode_attention_cpu")
def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: Optional[torch.Tensor],
    value: Optional[torch.Tensor],
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: Optional[float],
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
) -> None:
    num_heads, head_dim = query.shape[-2], query.shape[-1]
    v_head_dim = output.shape[-1]
    kbuf, vbuf = _rows(k_buffer, head_dim), _rows(v_buffer, v_head_dim)
    if key is not None and value is not None:
        # The new token's K/V first: the request's last req_to_token entry points at ``loc``.
        _store(kbuf, loc, key, key_scale)
        _store(vbuf, loc, value, value_scale)
    bs = seq_lens.numel()
    if bs == 0:
        return
    cap = float(logit_cap or 0.0)
    window = int(sliding_window_size)
    dev = query.device
    seq = seq_lens.reshape(-1).to(torch.int64)
    rpi = req_pool_indices.reshape(-1).to(torch.int64)
    if is_cross_attn:
        if encoder_lens is None:
            raise ValueError("decode_attention_cpu: cross-attention needs encoder_lens")
        kv_len = encoder_lens.reshape(-1).to(torch.int64)
        base = torch.zeros_like(kv_len)
    else:
        kv_len = seq
        base = torch.zeros_like(seq) if encoder_lens is None else encoder_lens.reshape(-1).to(torch.int64)
    width = req_to_token.shape[1]
    q_all = query.reshape(bs, num_heads, head_dim).to(torch.float32)
    per_key = kbuf.shape[1] * max(head_dim, v_head_dim)
    for rows in _decode_groups(kv_len.tolist(), per_key):
        sel = torch.tensor(rows, dtype=torch.int64, device=dev)
        lens = kv_len[sel]
        Lmax = max(1, int(lens.max()))
        pos = torch.arange(Lmax, device=dev)[None, :]
        valid = pos < lens[:, None]  # padding columns of shorter requests
        cols = (base[sel, None] + pos).clamp_(max=width - 1)
        idx = torch.where(valid, req_to_token[rpi[sel, None], cols].to(torch.int64), 0)
        keys, vals = _load(kbuf, idx, key_scale), _load(vbuf, idx, value_scale)  # [b, Lmax, Hkv, D]
        mask = valid
        if window > 0 and not is_cross_attn:
            mask = mask & (pos > (lens[:, None] - 1) - window)
        if bool(mask.all()):
            mask = None
        out = _attend(q_all[sel, None], keys, vals, None if mask is None else mask[:, None, :], sm_scale, cap, sinks)
        # index_copy_ into ``output`` itself (a reshape could silently write into a copy).
        output.index_copy_(0, sel, out[:, 0].reshape(len(rows), *output.shape[1:]).to(output.dtype))


def _decode_groups(lens: List[int], per_key: int) -> List[List[int]]:
    """Requests grouped for padded batched decode: longest first, a group closes when padding would exceed
    ~25% of its keys or its padded K block would exceed the size budget. Uniform lengths give one group."""
    groups: List[List[int]] = []
    cur: List[int] = []
    cur_max = cur_sum = 0
    for r in sorted(range(len(lens)), key=lambda i: -lens[i]):
        n = lens[r]
        if cur and (
            (len(cur) + 1) * cur_max * per_key > _BLOCK_ELEMS or cur_sum + n < 0.75 * (len(cur) + 1) * cur_max
        ):
            groups.append(cur)
            cur, cur_sum = [], 0
        if not cur:
            cur_max = max(n, 1)
        cur.append(r)
        cur_sum += n
    if cur:
        groups.append(cur)
    return groups


def register() -> None:
    """Define the two ops in the ``sgl_kernel`` namespace (no-op for ops that already exist).

    No fake (meta) kernels: SGLang's CPU graph runner registers its own for these two names
    (cpu_graph_runner.register_fake_ops), and a second registration would raise there.
    """
    define_op("extend_attention_cpu", EXTEND_SCHEMA, extend_attention_cpu)
    define_op("decode_attention_cpu", DECODE_SCHEMA, decode_attention_cpu)
