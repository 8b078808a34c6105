"""The pure-torch ``sgl_kernel`` stand-in against straightforward loop references (CPU only, fast).

Every helper is checked on random inputs against a reference written here with plain loops, including the
parts of the output buffers that must stay untouched. The attention ops are called through
``torch.ops.sgl_kernel`` with the positional arguments of SGLang 0.5.23's intel_amx backend.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
from pathlib import Path

import pytest
import torch

import sglang_dspark.cpu.sgl_kernel_standin as sk
from sglang_dspark.cpu.sgl_kernel_standin import attention as attention_impl
from sglang_dspark.cpu.sgl_kernel_standin import speculative as sk_spec

OPS = torch.ops.sgl_kernel


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


# --------------------------------------------------------------------------------------------------------------
# Import contract
# --------------------------------------------------------------------------------------------------------------


def test_module_contract():
    for name in sk.IMPLEMENTED:
        fn = getattr(sk, name)
        assert callable(fn) and not getattr(fn, "_sglang_dspark_standin_missing", False), name
    assert callable(sk_spec.reconstruct_indices_from_tree_mask)
    # Names SGLang imports but never calls on the CPU engine path: importable, raise when called.
    from sglang_dspark.cpu.sgl_kernel_standin import merge_state_v2, silu_and_mul
    from sglang_dspark.cpu.sgl_kernel_standin.mamba import causal_conv1d_fn_cpu
    from sglang_dspark.cpu.sgl_kernel_standin.speculative import tree_speculative_sampling_target_only

    for fn in (merge_state_v2, silu_and_mul, causal_conv1d_fn_cpu, tree_speculative_sampling_target_only):
        with pytest.raises(NotImplementedError, match="not provided by the sglang-dspark CPU stand-in"):
            fn(torch.zeros(1))
    # Submodules SGLang imports under `except ImportError` must stay missing (e.g. scalar_type -> mock types).
    with pytest.raises(ImportError):
        importlib.import_module("sglang_dspark.cpu.sgl_kernel_standin.scalar_type")
    with pytest.raises(ImportError):
        exec("from sglang_dspark.cpu.sgl_kernel_standin import kvcacheio", {})
    with pytest.raises(AttributeError):
        sk.__wrapped__  # noqa: B018  (tools probe dunders; they must not get placeholders)
    for op in sk.IMPLEMENTED_OPS:
        assert hasattr(OPS, op), op
    # Its absence keeps SGLang's cpu_has_amx_support() False, i.e. every layer on its torch-native path.
    assert not hasattr(OPS, "convert_weight_packed")


def test_second_copy_of_the_package_is_harmless():
    """A second module copy (e.g. loaded as ``sgl_kernel`` by a hook that does not alias) re-runs the op
    registration; it must skip the ops that already exist instead of raising."""
    pkg_dir = Path(sk.__file__).parent
    name = "_sgl_kernel_standin_second_copy"
    spec = importlib.util.spec_from_file_location(
        name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        assert mod.copy_all_layer_kv_cache_cpu is not sk.copy_all_layer_kv_cache_cpu  # really a second copy
        assert mod.registry.define_op("extend_attention_cpu", "unused", lambda: None) is False
        with pytest.raises(NotImplementedError, match="sgl_kernel.fused_experts"):
            mod.fused_experts()
        from _sgl_kernel_standin_second_copy.speculative import reconstruct_indices_from_tree_mask  # noqa: F401
    finally:
        for n in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
            del sys.modules[n]
    assert all(hasattr(OPS, op) for op in sk.IMPLEMENTED_OPS)


# --------------------------------------------------------------------------------------------------------------
# KV-cache bookkeeping
# --------------------------------------------------------------------------------------------------------------


def test_copy_all_layer_kv_cache(gen):
    bufs = [
        torch.randn(40, 2, 8, generator=gen).to(torch.bfloat16),
        torch.randn(40, 2, 8, generator=gen),
        torch.randint(0, 255, (40, 3), generator=gen, dtype=torch.uint8),
    ]
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    # Overlapping targets and sources: 5 -> 7 and 7 -> 9 must read the OLD row 7.
    src = torch.tensor([5, 7, 0, 39, 12], dtype=torch.int64)
    tgt = torch.tensor([7, 9, 3, 1, 12], dtype=torch.int64)
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        ref = old.clone()
        rows = [old[int(s)].clone() for s in src]
        for t, row in zip(tgt.tolist(), rows):
            ref[t] = row
        assert torch.equal(b, ref)
    # SGLang's warm-up: one self-copy of row 0; empty moves are no-ops.
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt[:0], src[:0])
    with pytest.raises(ValueError):
        sk.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([-1]), torch.tensor([0]))


def _ragged_spans(gen, bs=4, pool_rows=6):
    rpi = torch.randperm(pool_rows, generator=gen)[:bs]
    start = torch.randint(0, 12, (bs,), generator=gen)
    lens = torch.tensor([3, 0, 7, 1])[:bs]
    return rpi, start, start + lens


def test_assign_req_to_token_pool_and_extend_cache_locs(gen):
    pool_rows, pool_len = 6, 32
    rpi, start, end = _ragged_spans(gen)
    total = int((end - start).sum())
    out_cache_loc = torch.randint(100, 1000, (total + 3,), generator=gen)  # longer than needed
    req_to_token = torch.randint(0, 50, (pool_rows, pool_len), generator=gen, dtype=torch.int32)
    ref = req_to_token.clone()
    off = 0
    for i in range(len(rpi)):
        for c in range(int(start[i]), int(end[i])):
            ref[rpi[i], c] = out_cache_loc[off]
            off += 1
    sk.assign_req_to_token_pool_cpu(rpi, req_to_token, start, end, out_cache_loc, pool_len)
    assert torch.equal(req_to_token, ref)

    # The inverse read, into an over-sized output whose tail stays untouched.
    out = torch.full((total + 4,), -7, dtype=torch.int64)
    sk.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, out, pool_len)
    expect = [int(req_to_token[rpi[i], c]) for i in range(len(rpi)) for c in range(int(start[i]), int(end[i]))]
    assert out[:total].tolist() == expect and out[total:].tolist() == [-7] * 4
    with pytest.raises(ValueError):
        sk.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, out, pool_len + 1)


def test_ragged_positions_host_and_tensor_builds_agree(gen):
    """Small batches build the spans as Python lists, large ones with tensor ops: the same positions, negative and
    empty spans included."""
    from sglang_dspark.cpu.sgl_kernel_standin import kv_cache_ops

    for bs in (1, 4, kv_cache_ops._HOST_BUILD_MAX_REQUESTS, kv_cache_ops._HOST_BUILD_MAX_REQUESTS + 5):
        rpi = torch.randperm(200, generator=gen)[:bs]
        start = torch.randint(0, 40, (bs,), generator=gen)
        end = start + torch.randint(-3, 9, (bs,), generator=gen)
        want = kv_cache_ops._ragged_positions_on_host(rpi, start, end)
        limit = kv_cache_ops._HOST_BUILD_MAX_REQUESTS
        try:
            kv_cache_ops._HOST_BUILD_MAX_REQUESTS = -1  # force the tensor build
            got = kv_cache_ops._ragged_positions(rpi, start, end)
        finally:
            kv_cache_ops._HOST_BUILD_MAX_REQUESTS = limit
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2], bs
        assert want[2] == int((end - start).clamp_min(0).sum())


def test_assign_draft_cache_locs_contiguous(gen):
    req_to_token = torch.randint(0, 500, (5, 40), generator=gen, dtype=torch.int32)
    rpi = torch.tensor([3, 0, 4])
    seq_lens = torch.tensor([10, 1, 25])
    topk, steps = 2, 3
    n = topk * steps
    out = torch.full((3 * n + 2,), -1, dtype=torch.int64)
    sk.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq_lens, out, 40, topk, steps)
    for i in range(3):
        for j in range(n):
            assert out[i * n + j] == req_to_token[rpi[i], seq_lens[i] + j]
    assert out[3 * n :].tolist() == [-1, -1]


def test_build_draft_decode_metadata(gen):
    req_to_token = torch.randint(0, 500, (5, 64), generator=gen, dtype=torch.int32)
    rpi = torch.tensor([2, 4, 0])
    seq_lens = torch.tensor([7, 1, 12])
    topk, steps = 3, 4
    table = sk.build_draft_decode_metadata_cpu(req_to_token, rpi, seq_lens, topk, steps, 64)
    assert table.shape[0] == 3 * topk and table.dtype == req_to_token.dtype
    assert table.shape[1] >= int(seq_lens.max()) + steps
    for b in range(3):
        for tk in range(topk):
            row = table[b * topk + tk]
            L = int(seq_lens[b])
            assert row[:L].tolist() == req_to_token[rpi[b], :L].tolist()
            for s in range(steps):
                assert row[L + s] == req_to_token[rpi[b], L + tk * steps + s]


# --------------------------------------------------------------------------------------------------------------
# Speculative bookkeeping
# --------------------------------------------------------------------------------------------------------------


def test_fill_bonus_tokens_and_accept_out_cache_loc(gen):
    bs, stride = 4, 5
    accept_tokens = torch.randint(0, 1000, (bs, stride), generator=gen)
    accept_lens = torch.tensor([1, 5, 3, 2], dtype=torch.int32)
    bonus = torch.empty(bs, dtype=torch.int32)
    sk.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
    assert bonus.tolist() == [int(accept_tokens[i, accept_lens[i] - 1]) for i in range(bs)]

    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.randint(0, 10_000, (9,), generator=gen)
    dst = torch.full((9,), -5, dtype=torch.int64)
    sk.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    expect = [int(out_cache_loc[i]) for i in accept_index.flatten().tolist() if i != -1]
    assert dst[: len(expect)].tolist() == expect and (dst[len(expect) :] == -5).all()


def _random_ancestor_mask(gen, n):
    """A random tree over nodes 0..n-1 (node 0 the root, parent index < child index) as [n, n] ancestor-or-self."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parent[j]
    return mask, parent


def _ref_reconstruct(mask, seq_len):
    n = mask.shape[0]
    parent = [max([j for j in range(i) if mask[i, j]], default=-1) for i in range(n)]
    depth = [sum(bool(mask[i, j]) for j in range(i)) for i in range(n)]
    first_child = [next((k for k in range(n) if k > t and mask[k, t]), -1) for t in range(n)]
    sibling = [
        next((k for k in range(t + 1, n) if parent[k] == parent[t]), -1) if parent[t] >= 0 else -1 for t in range(n)
    ]
    return [seq_len + d for d in depth], first_child, sibling


def test_reconstruct_indices_from_tree_mask(gen):
    bs, n = 3, 8
    masks = [_random_ancestor_mask(gen, n)[0] for _ in range(bs)]
    tree_mask = torch.stack(masks).flatten()  # flat [bs*n*n], as the NGRAM worker passes it
    seq_lens = torch.tensor([5, 17, 0])
    positions = torch.empty(bs * n, dtype=torch.int64)
    r_index, r_next, r_sib = torch.full((3, bs, n), -1, dtype=torch.int64)
    sk_spec.reconstruct_indices_from_tree_mask(tree_mask, seq_lens, positions, r_index, r_next, r_sib, bs, n)
    for b in range(bs):
        pos, child, sib = _ref_reconstruct(masks[b], int(seq_lens[b]))
        assert positions[b * n : (b + 1) * n].tolist() == pos
        assert r_index[b].tolist() == [b * n + i for i in range(n)]
        assert r_next[b].tolist() == child
        assert r_sib[b].tolist() == sib


def _simulate_eagle_draft(gen, bs, topk, depth, n):
    """(parent_list, selected_index) laid out as SGLang's EAGLE draft builds them (organize_draft_results).

    Step 0 gives ids 0..topk-1 (parent: root); step s >= 1 gives ids topk + (s-1)*topk^2 + c, the child
    c % topk of the (c // topk)-th node expanded at step s-1. Scores are products along the path, so every
    selected node's parent is selected too, as in EAGLE.
    """
    parent_lists, selected = [], []
    for _ in range(bs):
        score = {}
        expanded = list(range(topk))  # step-0 nodes, all expanded
        for v in expanded:
            score[v] = float(torch.rand(1, generator=gen)) * 0.9 + 0.05
        plist = [-1] + expanded[:]
        for s in range(1, depth):
            base = topk + (s - 1) * topk * topk
            new_ids = []
            for c in range(topk * topk):
                par = expanded[c // topk]
                score[base + c] = score[par] * (float(torch.rand(1, generator=gen)) * 0.9 + 0.05)
                new_ids.append(base + c)
            expanded = sorted(new_ids, key=lambda v: -score[v])[:topk]
            if s < depth - 1:
                plist += expanded
        sel = sorted(sorted(score, key=lambda v: -score[v])[: n - 1])
        parent_lists.append(plist)
        selected.append(sel)
    return torch.tensor(parent_lists, dtype=torch.int64), torch.tensor(selected, dtype=torch.int64)


def _ref_build_tree(parent_list, selected, seq_lens, topk, n):
    """Per-thread transcription of the CUDA kernel's rules: parents by search, links by front insertion."""
    bs = len(seq_lens)
    positions, r_index = [], []
    r_next = [[-1] * n for _ in range(bs)]
    r_sib = [[-1] * n for _ in range(bs)]
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        sel, par = selected[b], parent_list[b]

        def parent_node(i):
            tb = sel[i - 1] // topk
            return 0 if tb == 0 else sel.index(par[tb]) + 1

        for i in range(n - 1, 0, -1):
            p = parent_node(i)
            if r_next[b][p] != -1:
                r_sib[b][i] = r_next[b][p]
            r_next[b][p] = i
        r_index.append([b * n + i for i in range(n)])
        for i in range(n):
            mask[b, i, 0] = True
            node, d = i, 0
            while node != 0:
                mask[b, i, node] = True
                node = parent_node(node)
                d += 1
            positions.append(seq_lens[b] + d)
    return positions, r_index, r_next, r_sib, mask


@pytest.mark.parametrize("topk,depth,n", [(2, 3, 6), (3, 4, 9), (1, 4, 5)])
def test_build_tree_kernel_efficient(gen, topk, depth, n):
    bs = 3
    parent_list, selected = _simulate_eagle_draft(gen, bs, topk, depth, n)
    seq_lens = torch.tensor([9, 3, 30])
    ref = _ref_build_tree(parent_list.tolist(), selected.tolist(), seq_lens.tolist(), topk, n)

    # QLEN_ONLY: SGLang's CPU default (eagle_utils.default_tree_mask_mode).
    tree_mask = torch.full((bs * n * n,), True)
    positions = torch.empty(bs * n, dtype=torch.int64)
    r_index, r_next, r_sib = torch.full((3, bs, n), -1, dtype=torch.int64)
    sk.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, tree_mask, positions, r_index, r_next, r_sib, topk, depth, n, 1
    )
    assert positions.tolist() == ref[0]
    assert r_index.tolist() == ref[1] and r_next.tolist() == ref[2] and r_sib.tolist() == ref[3]
    assert torch.equal(tree_mask.view(bs, n, n), ref[4])

    # The NGRAM reconstruction must read the same tree back out of that mask.
    pos2 = torch.empty_like(positions)
    i2, n2, s2 = torch.full((3, bs, n), -1, dtype=torch.int64)
    sk_spec.reconstruct_indices_from_tree_mask(tree_mask, seq_lens, pos2, i2, n2, s2, bs, n)
    assert torch.equal(pos2, positions) and torch.equal(n2, r_next) and torch.equal(s2, r_sib)

    # FULL_MASK: per request [n, seq_len + n] rows; the prefix columns (caller-filled) stay untouched.
    total = int(seq_lens.sum()) * n + bs * n * n
    full = torch.full((total,), True)
    r_index, r_next, r_sib = torch.full((3, bs, n), -1, dtype=torch.int64)
    sk.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, full, positions, r_index, r_next, r_sib, topk, depth, n, 0
    )
    off = 0
    for b in range(bs):
        w = int(seq_lens[b]) + n
        block = full[off : off + n * w].view(n, w)
        assert block[:, : int(seq_lens[b])].all()
        assert torch.equal(block[:, int(seq_lens[b]) :], ref[4][b])
        off += n * w

    # QLEN_ONLY_BITPACKING: one little-endian bit row per node.
    dtype = torch.uint8 if n <= 8 else torch.uint16
    packed = torch.zeros(bs * n, dtype=dtype)
    sk.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, packed, positions, r_index, r_next, r_sib, topk, depth, n, 2
    )
    as_int = packed.to(torch.int64).view(bs, n)
    for b in range(bs):
        for i in range(n):
            assert int(as_int[b, i]) == sum(1 << j for j in range(n) if ref[4][b, i, j])


def _ref_verify_greedy(candidates, target_predict, parent, num_spec):
    """Walk the tree by explicit child lists (parent pointers), not by the retrive_* links."""
    bs, n = candidates.shape
    flat_target = target_predict.flatten().tolist()
    results = []
    for b in range(bs):
        children = {p: [k for k in range(n) if parent[b][k] == p] for p in range(n)}
        node, last, accepted, preds = 0, b * n, [b * n], {}
        while len(accepted) < num_spec:
            want = flat_target[last]
            match = next((c for c in children[node] if int(candidates[b, c]) == want), None)
            if match is None:
                break
            preds[last] = want
            node, last = match, b * n + match
            accepted.append(last)
        preds[last] = flat_target[last]
        results.append((accepted, preds))
    return results


@pytest.mark.parametrize("num_spec", [4, 8])
def test_verify_tree_greedy(gen, num_spec):
    bs, n, vocab = 4, 8, 5
    trees = [_random_ancestor_mask(gen, n) for _ in range(bs)]
    tree_mask = torch.stack([m for m, _ in trees]).flatten()
    positions = torch.empty(bs * n, dtype=torch.int64)
    r_index, r_next, r_sib = torch.full((3, bs, n), -1, dtype=torch.int64)
    sk_spec.reconstruct_indices_from_tree_mask(tree_mask, torch.zeros(bs, dtype=torch.int64), positions,
                                               r_index, r_next, r_sib, bs, n)
    # A tiny vocabulary makes matches (and sibling scans) frequent.
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    target_predict = torch.randint(0, vocab, (bs, n), generator=gen)
    predicts = torch.full((bs * n,), -3, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_token_num = torch.full((bs,), -9, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=candidates,
        retrive_index=r_index,
        retrive_next_token=r_next,
        retrive_next_sibling=r_sib,
        target_predict=target_predict,
    )
    ref_pred = [-3] * (bs * n)
    for b, (accepted, preds) in enumerate(_ref_verify_greedy(candidates, target_predict, [p for _, p in trees],
                                                              num_spec)):
        assert accept_token_num[b] == len(accepted) - 1
        assert accept_index[b].tolist() == accepted + [-1] * (num_spec - len(accepted))
        for pos, tok in preds.items():
            ref_pred[pos] = tok
    assert predicts.tolist() == ref_pred
    assert int(accept_token_num.max()) >= 1  # the fixture seed exercises real acceptances


@pytest.mark.parametrize("use_select_index", [False, True])
def test_rotate_input_ids(gen, use_select_index):
    lens = [3, 0, 1, 5]
    starts = [0, 3, 3, 4]
    input_ids = torch.randint(0, 1000, (9,), generator=gen)
    new = torch.tensor([[901], [902], [903], [904]])
    select = torch.tensor([1, 3, 3, 6]) if use_select_index else None
    ref = input_ids.clone().tolist()
    for b in range(4):
        s, n = starts[b], lens[b]
        seg = ref[s : s + n]
        ref[s : s + n] = seg[1:] + seg[-1:] if n else []
        if n:
            ref[int(select[b]) if use_select_index else s + n - 1] = int(new[b, 0])
    sk.rotate_input_ids_cpu(input_ids, torch.tensor(starts), torch.tensor(lens), new, select)
    assert input_ids.tolist() == ref


# --------------------------------------------------------------------------------------------------------------
# Attention ops (torch.ops.sgl_kernel.*, called like intel_amx_backend.py does)
# --------------------------------------------------------------------------------------------------------------

H, HKV, D, DV = 4, 2, 16, 8  # GQA (2 query heads per KV head), v_head_dim != qk head_dim


def _ref_attention(q, keys, vals, visible, scale, cap=0.0, sinks=None):
    """q [H, D]; keys [L, HKV, D]; vals [L, HKV, DV]; visible: list of key indices. float64, head by head."""
    out = torch.zeros(q.shape[0], vals.shape[-1], dtype=torch.float64)
    group = q.shape[0] // keys.shape[1]
    for h in range(q.shape[0]):
        kv = h // group
        s = [float(q[h].double() @ keys[j, kv].double()) * scale for j in visible]
        if cap > 0:
            s = [cap * math.tanh(x / cap) for x in s]
        extra = [float(sinks[h])] if sinks is not None else []
        m = max(s + extra) if s + extra else 0.0
        w = [math.exp(x - m) for x in s]
        denom = sum(w) + sum(math.exp(x - m) for x in extra)
        for wi, j in zip(w, visible):
            out[h] += wi / denom * vals[j, kv].double()
    return out


class _Batch:
    """Paged KV state for a batch: random slots per request, prefix K/V already in the buffers."""

    def __init__(self, gen, seq_lens, ext_lens, dtype=torch.float32, slots=200):
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        self.ext = torch.tensor(ext_lens, dtype=torch.int32)
        self.start = (torch.cumsum(self.ext, 0) - self.ext).to(torch.int32)
        bs = len(seq_lens)
        self.rpi = torch.randperm(bs + 2, generator=gen)[:bs]
        self.req_to_token = torch.zeros(bs + 2, 64, dtype=torch.int32)
        perm = torch.randperm(slots - 1, generator=gen) + 1  # slot 0 is SGLang's padding slot
        off = 0
        for b, L in enumerate(seq_lens):
            self.req_to_token[self.rpi[b], :L] = perm[off : off + L].to(torch.int32)
            off += L
        self.k_buffer = torch.randn(slots, HKV, D, generator=gen).to(dtype)
        self.v_buffer = torch.randn(slots, HKV, DV, generator=gen).to(dtype)
        total = int(self.ext.sum())
        self.q = torch.randn(total, H, D, generator=gen).to(dtype)
        self.k = torch.randn(total, HKV, D, generator=gen).to(dtype)
        self.v = torch.randn(total, HKV, DV, generator=gen).to(dtype)
        # As SGLang does before the kernel: the extend tokens' K/V are stored at their slots.
        for b in range(bs):
            L, E, s0 = int(self.seq_lens[b]), int(self.ext[b]), int(self.start[b])
            slots_b = self.req_to_token[self.rpi[b], L - E : L].long()
            self.k_buffer[slots_b] = self.k[s0 : s0 + E]
            self.v_buffer[slots_b] = self.v[s0 : s0 + E]

    def select(self, b):
        """Request b as a batch of its own (same buffers and pool row)."""
        alone = object.__new__(_Batch)
        E, s0 = int(self.ext[b]), int(self.start[b])
        alone.seq_lens, alone.ext = self.seq_lens[b : b + 1], self.ext[b : b + 1]
        alone.start = torch.zeros(1, dtype=torch.int32)
        alone.rpi, alone.req_to_token = self.rpi[b : b + 1], self.req_to_token
        alone.k_buffer, alone.v_buffer = self.k_buffer, self.v_buffer
        alone.q, alone.k, alone.v = (t[s0 : s0 + E] for t in (self.q, self.k, self.v))
        return alone

    def keys(self, b):
        idx = self.req_to_token[self.rpi[b], : int(self.seq_lens[b])].long()
        return self.k_buffer[idx], self.v_buffer[idx]


def _run_extend(batch, *, scale, cap=0.0, window=0, sinks=None, tree_mask=None, is_causal=True, pass_kv=True):
    o = torch.full((batch.q.shape[0], H, DV), float("nan"), dtype=batch.q.dtype)
    OPS.extend_attention_cpu(
        batch.q,
        batch.k if pass_kv else None,
        batch.v if pass_kv else None,
        o,
        batch.k_buffer,
        batch.v_buffer,
        1.0,
        1.0,
        batch.req_to_token,
        batch.rpi,
        batch.seq_lens,
        batch.ext,
        batch.start,
        int(batch.ext.max()),
        scale,
        cap,
        False,
        window,
        None,
        sinks,
        tree_mask,
        is_causal,
    )
    return o


def _check_extend(batch, out, *, scale, visible_fn, cap=0.0, sinks=None, atol=1e-5):
    for b in range(len(batch.seq_lens)):
        keys, vals = batch.keys(b)
        L, E, s0 = int(batch.seq_lens[b]), int(batch.ext[b]), int(batch.start[b])
        P = L - E
        for i in range(E):
            visible = [j for j in range(L) if visible_fn(b, P, i, j)]
            ref = _ref_attention(batch.q[s0 + i], keys, vals, visible, scale, cap, sinks)
            torch.testing.assert_close(out[s0 + i].double(), ref, atol=atol, rtol=atol)


# Ragged extend, one request without prefix; every extend is short, so the batch takes the padded batched path.
EXT_CASE = dict(seq_lens=[5, 3, 20, 2], ext_lens=[1, 3, 8, 2])
# One extend longer than SHORT_EXTEND_ROWS: the per-request loop (prefill).
LONG_EXT_CASE = dict(seq_lens=[30, 5, 40], ext_lens=[20, 3, 17])


@pytest.mark.parametrize("case", [EXT_CASE, LONG_EXT_CASE], ids=["short-batched", "long-per-request"])
@pytest.mark.parametrize("pass_kv", [True, False])
def test_extend_attention_causal_ragged(gen, pass_kv, case):
    assert (max(case["ext_lens"]) <= attention_impl.SHORT_EXTEND_ROWS) == (case is EXT_CASE)
    batch = _Batch(gen, **case)
    out = _run_extend(batch, scale=0.25, pass_kv=pass_kv)
    _check_extend(batch, out, scale=0.25, visible_fn=lambda b, P, i, j: j <= P + i)


def test_short_extend_plan_reused_across_layers_reads_current_slots(gen):
    """The padding plan is cached by lengths only: a later forward with the same lengths but other KV slots (a new
    request in the same pool row) must read the new slots, not the ones of the forward that built the plan."""
    batch = _Batch(gen, **EXT_CASE)
    _run_extend(batch, scale=0.25)
    moved = _Batch(gen, **EXT_CASE)  # same lengths, fresh random slots, keys and queries
    table = torch.zeros_like(moved.req_to_token)
    table[batch.rpi] = moved.req_to_token[moved.rpi]  # the same pool rows as the first forward
    moved.req_to_token, moved.rpi = table, batch.rpi.clone()
    assert not torch.equal(moved.req_to_token[moved.rpi], batch.req_to_token[batch.rpi])
    out = _run_extend(moved, scale=0.25)
    _check_extend(moved, out, scale=0.25, visible_fn=lambda b, P, i, j: j <= P + i)


@pytest.mark.parametrize("options", [
    dict(), dict(is_causal=False), dict(window=3), dict(cap=2.0, sinks=True), dict(pass_kv=False, window=5),
], ids=["causal", "non-causal", "window", "cap-sinks", "buffer-kv-window"])
def test_short_extend_batched_equals_one_request_at_a_time(gen, options):
    """The padded batched path (lengths far apart, so several padding groups; a request extending by 0 rows) gives
    what the per-request loop gives for each request alone."""
    options = dict(options)
    sinks = torch.randn(H, generator=gen) if options.pop("sinks", False) else None
    seq_lens, ext_lens = [9, 4, 40, 1, 23, 16, 7], [4, 1, 16, 1, 0, 9, 7]
    batch = _Batch(gen, seq_lens=seq_lens, ext_lens=ext_lens)
    together = _run_extend(batch, scale=0.3, sinks=sinks, **options)
    for b in range(len(seq_lens)):
        E, s0 = ext_lens[b], int(batch.start[b])
        if E == 0:
            continue
        alone = _Batch.select(batch, b)
        torch.testing.assert_close(together[s0 : s0 + E], _run_extend(alone, scale=0.3, sinks=sinks, **options),
                                   atol=1e-6, rtol=1e-6)


def test_extend_attention_non_causal_encoder_only(gen):
    """DSpark/DFlash draft layers (ENCODER_ONLY): the whole block, prefix included, is visible to every query."""
    batch = _Batch(gen, **EXT_CASE)
    out = _run_extend(batch, scale=0.3, is_causal=False)
    _check_extend(batch, out, scale=0.3, visible_fn=lambda b, P, i, j: True)
    causal = _run_extend(batch, scale=0.3)
    assert not torch.allclose(out, causal)  # the masks really differ


def test_extend_attention_tree_mask(gen):
    ext = [4, 4, 4]
    batch = _Batch(gen, seq_lens=[9, 4, 6], ext_lens=ext)
    masks = [_random_ancestor_mask(gen, 4)[0] for _ in ext]
    tree_mask = torch.stack(masks).flatten()  # QLEN_ONLY layout, as EAGLE/NGRAM build it on CPU
    out = _run_extend(batch, scale=0.2, tree_mask=tree_mask)
    _check_extend(batch, out, scale=0.2, visible_fn=lambda b, P, i, j: j < P or bool(masks[b][i, j - P]))

    # Ragged verify widths with a tree mask: per-request [E, E] blocks back to back.
    batch2 = _Batch(gen, seq_lens=[5, 9], ext_lens=[2, 5])
    masks2 = [_random_ancestor_mask(gen, e)[0] for e in (2, 5)]
    out2 = _run_extend(batch2, scale=0.2, tree_mask=torch.cat([m.flatten() for m in masks2]))
    _check_extend(batch2, out2, scale=0.2, visible_fn=lambda b, P, i, j: j < P or bool(masks2[b][i, j - P]))

    # FULL_MASK layout ([E, L] rows with prefix columns), recognised by its size.
    full = []
    for b, m in enumerate(masks):
        L, E = int(batch.seq_lens[b]), 4
        rows = torch.ones(E, L, dtype=torch.bool)
        rows[:, L - E :] = m
        full.append(rows.flatten())
    out3 = _run_extend(batch, scale=0.2, tree_mask=torch.cat(full))
    torch.testing.assert_close(out3, out)


def test_extend_attention_logit_cap_window_sinks(gen):
    batch = _Batch(gen, **EXT_CASE)
    batch.q *= 4  # large scores so that the cap matters
    scale, cap, window = 0.5, 3.0, 4
    out = _run_extend(batch, scale=scale, cap=cap)
    _check_extend(batch, out, scale=scale, cap=cap, visible_fn=lambda b, P, i, j: j <= P + i)
    uncapped = _run_extend(batch, scale=scale)
    assert (out - uncapped).abs().max() > 1e-2

    out = _run_extend(batch, scale=scale, window=window)
    _check_extend(batch, out, scale=scale, visible_fn=lambda b, P, i, j: P + i - window < j <= P + i)

    sinks = torch.randn(H, generator=gen)
    out = _run_extend(batch, scale=scale, sinks=sinks)
    _check_extend(batch, out, scale=scale, sinks=sinks, visible_fn=lambda b, P, i, j: j <= P + i)


def test_extend_attention_bf16(gen):
    batch = _Batch(gen, dtype=torch.bfloat16, **EXT_CASE)
    out = _run_extend(batch, scale=0.25)
    assert out.dtype == torch.bfloat16
    _check_extend(batch, out, scale=0.25, visible_fn=lambda b, P, i, j: j <= P + i, atol=2e-2)


def _run_decode(gen, seq_lens, *, scale, cap=0.0, window=0, sinks=None, dtype=torch.float32, q_mult=1.0):
    bs = len(seq_lens)
    batch = _Batch(gen, seq_lens=seq_lens, ext_lens=[1] * bs, dtype=dtype)
    batch.q *= q_mult
    # The new token's K/V is NOT in the buffers yet: the kernel writes it at ``loc`` first.
    loc = torch.stack([batch.req_to_token[batch.rpi[b], seq_lens[b] - 1].long() for b in range(bs)])
    key, value = batch.k.clone(), batch.v.clone()
    batch.k_buffer[loc] = 0
    batch.v_buffer[loc] = 0
    out = torch.full((bs, H, DV), float("nan"), dtype=dtype)
    attn_logits = torch.zeros(bs, H, 8, DV + 1)
    OPS.decode_attention_cpu(
        batch.q, batch.k_buffer, batch.v_buffer, 1.0, 1.0, out, key, value, loc, attn_logits,
        batch.req_to_token, batch.rpi, batch.seq_lens, scale, cap, False, window, None, sinks,
    )
    assert torch.equal(batch.k_buffer[loc], key) and torch.equal(batch.v_buffer[loc], value)
    return batch, out


@pytest.mark.parametrize(
    "cap,window,use_sinks", [(0.0, 0, False), (3.0, 0, False), (0.0, 3, False), (0.0, 0, True), (2.0, 5, True)]
)
def test_decode_attention(gen, cap, window, use_sinks):
    seq_lens = [6, 1, 13, 4]
    scale = 0.5
    sinks = torch.randn(H, generator=gen) if use_sinks else None
    # Larger queries when capping, so that the cap changes the result.
    batch, out = _run_decode(gen, seq_lens, scale=scale, cap=cap, window=window, sinks=sinks, q_mult=4 if cap else 1)
    for b, L in enumerate(seq_lens):
        keys, vals = batch.keys(b)
        visible = [j for j in range(L) if window <= 0 or (L - 1) - j < window]
        ref = _ref_attention(batch.q[b], keys, vals, visible, scale, cap, sinks)
        torch.testing.assert_close(out[b].double(), ref, atol=1e-5, rtol=1e-5)


def test_decode_attention_bf16_matches_extend(gen):
    """A decode step equals an extend of one token at the same position (same kernel semantics)."""
    seq_lens = [7, 2, 11]
    batch, out = _run_decode(gen, seq_lens, scale=0.3, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    ext = _run_extend(batch, scale=0.3)
    torch.testing.assert_close(out.float(), ext.float(), atol=1e-2, rtol=1e-2)


# --------------------------------------------------------------------------------------------------------------
# Seeded sampling hash
# --------------------------------------------------------------------------------------------------------------


def _murmur3_32(data: bytes, seed: int = 0) -> int:
    """Textbook MurmurHash3 x86_32."""
    m = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    h = seed
    nblocks = len(data) // 4
    for i in range(nblocks):
        (k,) = struct.unpack_from("<I", data, 4 * i)
        k = rotl((k * 0xCC9E2D51) & m, 15) * 0x1B873593 & m
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & m
    tail = data[4 * nblocks :]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl((k * 0xCC9E2D51) & m, 15) * 0x1B873593 & m
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


def test_murmur_hash32_cpu():
    assert _murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723  # published vector
    seeds = [0, 1, 2**32 + 5, 2**63 + 12345, 2**64 - 1]
    positions = torch.tensor([0, 7, 123456, 2**31 - 1, 99])
    cols = torch.tensor([0, 1, 31999, 151935])
    seed_t = torch.tensor([s if s < 2**63 else s - 2**64 for s in seeds], dtype=torch.int64).view(torch.uint64)
    out = OPS.murmur_hash32_cpu.default(seed_t, positions, cols)
    assert out.dtype == torch.uint32 and out.shape == (5, 4)
    got = out.to(torch.int64).tolist()
    for i, s in enumerate(seeds):
        for j, c in enumerate(cols.tolist()):
            data = struct.pack("<IIII", s & 0xFFFFFFFF, s >> 32, int(positions[i]), c)
            assert got[i][j] == _murmur3_32(data), (i, j)
