"""Speculative-decoding helpers: draft trees, greedy tree verification, accept bookkeeping.

Argument order and names follow SGLang 0.5.23's CPU call sites:

* ``fill_bonus_tokens_cpu``, ``fill_accept_out_cache_loc_cpu``  kernels/ops/speculative/eagle.py
* ``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu`` kernels/ops/speculative/spec_tree.py
  (``verify_tree_greedy_cpu`` is called with KEYWORD arguments spelled ``retrive_*``)
* ``rotate_input_ids_cpu``                                       kernels/ops/speculative/multi_layer_eagle.py
* ``reconstruct_indices_from_tree_mask`` (``sgl_kernel.speculative``) kernels/ops/speculative/reconstruct_tree.py

Semantics were taken from SGLang's CUDA/Triton versions of the same kernels (kernels/jit/include/
sgl_kernel/speculative/{eagle,ngram}.cuh, spec_tree.py, reconstruct_tree.py, eagle.py, multi_layer_eagle.py).
Tree walks are per request and short (tens of nodes), so they run on host lists; everything else is
vectorised.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .registry import traced

# TreeMaskMode of sglang.kernels.ops.speculative.spec_tree
FULL_MASK = 0
QLEN_ONLY = 1
QLEN_ONLY_BITPACKING = 2


@traced("fill_bonus_tokens_cpu")
def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[i * accept_stride + accept_lens[i] - 1]`` (last accepted token)."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    flat = accept_tokens.reshape(-1)
    idx = torch.arange(bs, device=flat.device) * int(accept_stride) + accept_lens.reshape(-1).to(torch.int64) - 1
    bonus_tokens.view(-1)[:bs] = flat[idx].to(bonus_tokens.dtype)


@traced("fill_accept_out_cache_loc_cpu")
def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact ``out_cache_loc[accept_index]`` over the accepted (non-negative) entries, in flat order.

    The GPU kernel takes a ``size`` = ``accept_index.numel()`` (spec_utils.move_accept_tokens_to_target_kvcache);
    the CPU signature has none, so the whole ``accept_index`` is scanned. Entries of ``accept_out_cache_loc``
    past the accepted count are left untouched.
    """
    flat = accept_index.reshape(-1).to(torch.int64)
    picked = flat[flat >= 0]
    n = picked.numel()
    if n == 0:
        return
    accept_out_cache_loc.view(-1)[:n] = out_cache_loc.reshape(-1)[picked].to(accept_out_cache_loc.dtype)


@traced("verify_tree_greedy_cpu")
def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy walk of each request's draft tree (outputs written in place).

    Start at the root (node 0). At each level, scan the children of the last accepted node (first child via
    ``retrive_next_token``, then ``retrive_next_sibling``) for the draft token equal to the target's argmax
    at the last accepted node (``target_predict`` is indexed by the flat ``retrive_index`` value). On a match,
    record ``predicts[last] = target``, append the child's retrieve index to ``accept_index[b]`` and descend;
    stop at the first level with no match or after ``accept_index.shape[1] - 1`` accepted drafts. Finally
    ``accept_token_num[b]`` = number of accepted drafts and ``predicts[last]`` = the target token there (the
    bonus). Entries of ``accept_index`` past the accepted ones and ``predicts`` elsewhere are untouched.
    """
    bs, num_draft = candidates.shape[0], candidates.shape[1]
    num_spec = accept_index.shape[1]
    if bs == 0:
        return
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()

    pred_pos: List[int] = []
    pred_val: List[int] = []
    acc_rows: List[int] = []
    acc_cols: List[int] = []
    acc_vals: List[int] = []
    counts: List[int] = []
    for b in range(bs):
        last = r_index[b][0]
        acc_rows.append(b)
        acc_cols.append(0)
        acc_vals.append(last)
        accepted = 0
        node = 0
        for _ in range(1, num_spec):
            child = r_next[b][node]
            want = target[last]
            while child != -1 and cand[b][child] != want:
                child = r_sib[b][child]
            if child == -1:
                break
            pred_pos.append(last)
            pred_val.append(want)
            accepted += 1
            last = r_index[b][child]
            acc_rows.append(b)
            acc_cols.append(accepted)
            acc_vals.append(last)
            node = child
        counts.append(accepted)
        pred_pos.append(last)
        pred_val.append(target[last])

    dev = predicts.device
    flat_pred = predicts.view(-1)
    flat_pred[torch.tensor(pred_pos, dtype=torch.int64, device=dev)] = torch.tensor(
        pred_val, dtype=flat_pred.dtype, device=dev
    )
    accept_index[
        torch.tensor(acc_rows, dtype=torch.int64, device=dev), torch.tensor(acc_cols, dtype=torch.int64, device=dev)
    ] = torch.tensor(acc_vals, dtype=accept_index.dtype, device=dev)
    accept_token_num.view(-1)[:bs] = torch.tensor(counts, dtype=accept_token_num.dtype, device=dev)


def _tree_parents(sel: List[int], par: List[int], topk: int, n: int) -> List[Optional[int]]:
    """Parent node of every tree node 1..n-1 (node i is draft ``sel[i-1]``; node 0 is the root/bonus token).

    ``sel[i-1] // topk`` indexes ``par`` (0 = the root); ``par[k]`` is a draft id that is itself some node
    ``p`` with ``sel[p-1] == par[k]``. None marks a node whose parent was not selected (an invalid tree; the
    CUDA kernel warns and skips it too).
    """
    where = {}
    for pos, tok in enumerate(sel):
        where.setdefault(tok, pos)  # first match, as the kernels search from the front
    parents: List[Optional[int]] = [None] * n
    for i in range(1, n):
        tb = sel[i - 1] // topk
        if tb == 0:
            parents[i] = 0
        else:
            pos = where.get(par[tb])
            parents[i] = None if pos is None else pos + 1
    return parents


@traced("build_tree_kernel_efficient_cpu")
def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE draft tree metadata, written in place (``retrive_next_*`` arrive pre-filled with -1).

    * ``retrive_index[b, i] = b*n + i``.
    * Children lists: scanning nodes i = n-1 .. 1, node i is pushed in front of its parent's child list, so
      ``retrive_next_token[parent]`` is the smallest child and ``retrive_next_sibling`` links upward.
    * ``positions[b*n + i] = verified_seq_len[b] + depth(i)`` (root depth 0).
    * Tree mask row of node i: True at the root column and at every node on i's path to the root (itself
      included), False at the other draft columns. Layouts: QLEN_ONLY = [bs, n, n] bools;
      FULL_MASK = per request [n, seq_len + n] rows whose first seq_len columns the caller pre-filled
      (left untouched); QLEN_ONLY_BITPACKING = one little-endian bit row per node (bit j = column j) in
      ``tree_mask.element_size()`` bytes, OR-ed into the zero-filled buffer.
    """
    n = int(draft_token_num)
    topk = int(topk)
    mode = int(tree_mask_mode)
    bs = verified_seq_len.numel()
    if bs == 0:
        return
    seq = verified_seq_len.reshape(-1).tolist()
    sel_all = selected_index.reshape(bs, -1).tolist() if n > 1 else [[] for _ in range(bs)]
    par_all = parent_list.reshape(bs, -1).tolist()
    nxt = retrive_next_token.tolist()
    sib = retrive_next_sibling.tolist()

    pos_out: List[int] = []
    mask_rows: List[List[int]] = []  # per (b, i): the draft columns set to True
    for b in range(bs):
        parents = _tree_parents(sel_all[b], par_all[b], topk, n)
        for i in range(n - 1, 0, -1):
            p = parents[i]
            if p is None:
                continue
            if nxt[b][p] != -1:
                sib[b][i] = nxt[b][p]
            nxt[b][p] = i
        for i in range(n):
            cols = [0]
            node, d = i, 0
            # Walk to the root; the bound guards against a malformed (cyclic) parent chain.
            while node is not None and node != 0 and d < n:
                cols.append(node)
                d += 1
                node = parents[node]
            pos_out.append(seq[b] + d)
            mask_rows.append(cols)

    dev = positions.device
    positions.view(-1)[: bs * n] = torch.tensor(pos_out, dtype=positions.dtype, device=dev)
    retrive_index.copy_(
        (torch.arange(bs, device=dev)[:, None] * n + torch.arange(n, device=dev)[None, :]).to(retrive_index.dtype)
    )
    retrive_next_token.copy_(torch.tensor(nxt, dtype=retrive_next_token.dtype, device=dev))
    retrive_next_sibling.copy_(torch.tensor(sib, dtype=retrive_next_sibling.dtype, device=dev))

    if mode == QLEN_ONLY_BITPACKING:
        item_bytes = tree_mask.element_size()
        raw = tree_mask.view(-1).view(torch.uint8)
        vals = []
        for cols in mask_rows:
            bits = 0
            for c in cols:
                bits |= 1 << c
            vals.extend((bits >> (8 * k)) & 0xFF for k in range(item_bytes))
        packed = torch.tensor(vals, dtype=torch.uint8, device=dev)
        raw[: packed.numel()] |= packed
        return

    dense = torch.zeros((bs * n, n), dtype=torch.bool, device=dev)
    r = [row for row, cols in enumerate(mask_rows) for _ in cols]
    c = [col for cols in mask_rows for col in cols]
    dense[torch.tensor(r, dtype=torch.int64, device=dev), torch.tensor(c, dtype=torch.int64, device=dev)] = True
    flat = tree_mask.view(-1)
    if mode == QLEN_ONLY:
        flat[: bs * n * n] = dense.reshape(-1).to(flat.dtype)
    elif mode == FULL_MASK:
        offset = 0
        for b in range(bs):
            width = seq[b] + n
            block = flat[offset : offset + n * width].view(n, width)
            block[:, seq[b] :] = dense[b * n : (b + 1) * n].to(flat.dtype)
            offset += n * width
    else:
        raise ValueError(f"build_tree_kernel_efficient_cpu: unknown tree_mask_mode {tree_mask_mode}")


@traced("rotate_input_ids_cpu")
def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: Optional[torch.Tensor] = None,
) -> None:
    """Per request: shift its extend segment of ``input_ids`` left by one, then write the new token.

    ``input_ids[start : start+len-1] = old[start+1 : start+len]``; then ``topk_index.flat[b]`` goes to
    ``select_index[b]`` when given, else to the segment's last slot ``start+len-1``. Requests with len 0 are
    skipped. In place.
    """
    bs = extend_seq_lens.numel()
    if bs == 0:
        return
    starts = extend_start_loc.reshape(-1).to(torch.int64)
    lens = extend_seq_lens.reshape(-1).to(torch.int64)
    ids = input_ids.view(-1)
    shift = (lens - 1).clamp_min(0)
    total = int(shift.sum())
    if total > 0:
        first = torch.cumsum(shift, 0) - shift
        dst = starts.repeat_interleave(shift) + torch.arange(total, device=ids.device) - first.repeat_interleave(shift)
        ids[dst] = ids[dst + 1]  # the right side is gathered before the write
    live = lens > 0
    if select_index is not None:
        last = select_index.reshape(-1).to(torch.int64)[:bs]
    else:
        last = starts + lens - 1
    new_tok = topk_index.reshape(-1)[:bs].to(ids.dtype)
    ids[last[live]] = new_tok[live]


@traced("reconstruct_indices_from_tree_mask")
def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from a [bs, n, n] ancestor mask (``mask[b, i, j]``: j is i or an ancestor of i).

    With ``anc[i, j] = mask[i, j] and j < i`` (strict ancestors):
    ``positions[b, i] = verified_seq_len[b] + #anc[i, :]``; ``retrive_index[b, i] = b*n + i``;
    ``parent(i) = max{j : anc[i, j]}`` (or none); ``retrive_next_token[b, i] = min{k : anc[k, i]}`` (first
    child, -1 if none); ``retrive_next_sibling[b, i] = min{k > i : parent(k) == parent(i)}`` (-1 if none or
    if i is the root).
    """
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0:
        return
    dev = positions.device
    m = tree_mask.reshape(-1)[: bs * n * n].reshape(bs, n, n).to(torch.bool)
    idx = torch.arange(n, device=dev)
    anc = m & (idx[None, None, :] < idx[None, :, None])  # [b, i, j], j < i
    depth = anc.sum(-1)
    positions.view(-1)[: bs * n] = (depth + verified_seq_len.reshape(-1).to(torch.int64)[:, None]).reshape(-1).to(
        positions.dtype
    )
    flat_ids = torch.arange(bs, device=dev)[:, None] * n + idx[None, :]
    retrive_index.view(bs, n).copy_(flat_ids.to(retrive_index.dtype))

    parent = torch.where(anc, idx[None, None, :], torch.full_like(idx, -1)[None, None, :]).amax(-1)  # [b, i]
    # First child of t: the smallest row k whose strict ancestors include t.
    child = torch.where(anc, idx[None, :, None], torch.full_like(idx, n)[None, :, None]).amin(1)  # [b, t]
    retrive_next_token.view(bs, n).copy_(torch.where(child < n, child, -1).to(retrive_next_token.dtype))
    # Next sibling of t: the smallest k > t with the same parent, for non-root t.
    same = (parent[:, :, None] == parent[:, None, :]) & (idx[None, :, None] > idx[None, None, :])  # [b, k, t]
    sibling = torch.where(same, idx[None, :, None], torch.full_like(idx, n)[None, :, None]).amin(1)  # [b, t]
    sibling = torch.where((parent >= 0) & (sibling < n), sibling, -1)
    retrive_next_sibling.view(bs, n).copy_(sibling.to(retrive_next_sibling.dtype))
