"""Ragged (compact) verify attention on SGLang's Triton backend, patched by ``patches/triton_ragged_verify.py``,
against the torch reference ``sglang_dspark.kernels.ragged_verify_attention`` (issue #10).

For random tiny paged-KV batches (2-3 requests with different verify lengths, GQA/MQA/MHA, head dim 16/32) it:

1. builds the metadata with the *patched* ``TritonAttnBackend`` (constructed with ``object.__new__`` and only the
   fields its target-verify metadata code reads: its ``__init__`` needs a ModelRunner and a device), in eager mode
   (``init_forward_metadata``) and in CUDA-graph mode (capture every token tier with the runner's synthetic layout,
   then replay live layouts of fewer requests through ``init_forward_metadata_out_graph`` into the same buffers);
2. runs SGLang's own Triton extend kernel (``extend_attention_fwd``, what ``forward_extend`` calls) and the
   deterministic unified kernel (through the patched ``_forward_extend_unified``) with that metadata; in graph mode
   the kernels read the *capture-time* metadata object, whose tensors the replay prep refreshed in place;
3. compares the real requests' rows with the torch reference, checks the metadata against what the layout implies,
   and runs upstream's unpatched eager metadata as a control (it must be wrong).

CPU (the unit test runs this in a subprocess):
``TRITON_INTERPRET=1 python -m sglang_dspark.engine.ragged_verify_parity``.
GPU (real kernels, real CUDA graphs captured and replayed): ``python -m sglang_dspark.engine.ragged_verify_parity
--device cuda``. Prints one JSON report; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from types import SimpleNamespace
from typing import Any, Optional

import torch

TOL = 2e-5  # fp32
FLASHINFER_BF16_TOL = 3e-2  # bf16 q/K/V (reference in fp32 from the same bf16 values)

EAGER_CASES = [
    dict(name="eager-host-gqa2-d16", hq=4, hkv=2, d=16, n=4, prefix=[7, 3, 12], verify=[1, 4, 2], host=True),
    dict(name="eager-device-mqa-d32", hq=4, hkv=1, d=32, n=4, prefix=[5, 9], verify=[3, 1], host=False),
    dict(name="eager-host-mha-d32", hq=2, hkv=2, d=32, n=6, prefix=[20, 1, 4], verify=[6, 2, 5], host=True),
]
# max_bs = 3 and N = 4: tiers {4, 8, 12}, S = min(T, max_bs) = 3 slots for every tier (slots collide across tiers).
GRAPH_CASE = dict(
    name="graph", hq=4, hkv=2, d=16, n=4, max_bs=3,
    replays=[  # (tier T, prefix lens, verify lens): R < S (padding rows), R == S (leftover on the last row, capped)
        (8, [7, 3], [4, 1]),
        (4, [9], [2]),
        (12, [2, 15, 6], [4, 3, 4]),
        (8, [5, 8, 1], [2, 3, 1]),
        (8, [11, 4], [1, 2]),
    ],
)
GRAPH_CASE_MQA_D32 = dict(
    name="graph-mqa-d32", hq=4, hkv=1, d=32, n=3, max_bs=2,
    replays=[(6, [4, 10], [3, 1]), (3, [6], [1]), (6, [13], [3])],
)


class _Translator:
    """Stand-in for ``KVIndexTranslator.pack_read_stream`` on a plain (untranslated) page-size-1 pool."""

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token

    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, kv_start_idx=None, **_):
        for i in range(int(seq_lens.numel())):
            n, start = int(seq_lens[i]), int(indptr[i])
            begin = int(kv_start_idx[i]) if kv_start_idx is not None else 0
            out[start:start + n] = self.req_to_token[int(req_pool_indices[i]), begin:begin + n]
        return True


class _Pool:
    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k, self.v = k_cache, v_cache

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


class World:
    """A paged KV pool: ``pool_rows`` request rows of ``max_context`` slots (slot 0 is never a real token)."""

    def __init__(self, *, hq, hkv, d, device, seed, pool_rows=6, max_context=40):
        g = torch.Generator().manual_seed(seed)
        self.hq, self.hkv, self.d, self.device = hq, hkv, d, device
        self.pool_rows, self.max_context = pool_rows, max_context
        num_slots = pool_rows * max_context + 1
        self.req_to_token = (torch.randperm(num_slots - 1, generator=g) + 1).view(pool_rows, max_context).to(device)
        self.k_cache = torch.randn(num_slots, hkv, d, generator=g).to(device)
        self.v_cache = torch.randn(num_slots, hkv, d, generator=g).to(device)
        self.g = g

    def batch(self, prefix, verify, num_rows):
        """Pool rows (1..), packed q and the verify rows' K/V (cache slots), padded to ``num_rows`` with slot 0."""
        rows = torch.randperm(self.pool_rows - 1, generator=self.g)[: len(prefix)] + 1
        slots = [self.req_to_token[int(r), p:p + v] for r, p, v in zip(rows.tolist(), prefix, verify)]
        out_cache_loc = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        packed = torch.cat(slots).to(torch.int64)
        out_cache_loc[: packed.numel()] = packed
        q = torch.randn(num_rows, self.hq, self.d, generator=self.g).to(self.device)
        return SimpleNamespace(
            req_pool_indices=rows.to(torch.int64).to(self.device),
            prefix=torch.tensor(prefix, dtype=torch.int64, device=self.device),
            verify=list(verify),
            q=q,
            k_ext=self.k_cache[out_cache_loc].contiguous(),
            v_ext=self.v_cache[out_cache_loc].contiguous(),
            out_cache_loc=out_cache_loc,
            num_real=int(packed.numel()),
        )


def _target_verify():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.TARGET_VERIFY


def make_backend(world: World, n: int, max_tokens: int):
    """A TritonAttnBackend with only the fields its target-verify metadata / extend code reads (no ModelRunner)."""
    from sglang.kernels.ops.attention.extend_attention import (
        build_unified_kv_indices,
        extend_attention_fwd,
        extend_attention_fwd_unified,
    )
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    dev = world.device
    b = object.__new__(TritonAttnBackend)
    size = world.pool_rows + 1
    b.device = dev
    b.dllm_attention = None
    b._dense_one_shot_kv_indptr = None
    b.sliding_window_size = None
    b.window_kv_indptr = None
    b.use_sliding_window_kv_pool = False
    b.target_verify_num_tokens_per_req = n
    b.num_draft_tokens = n
    b.max_context_len = world.max_context
    b.kv_indptr = torch.zeros(size, dtype=torch.int32, device=dev)
    b.qo_indptr = torch.zeros(size, dtype=torch.int64, device=dev)
    b.mask_indptr = torch.zeros(size, dtype=torch.int64, device=dev)
    b.kv_index_translator = _Translator(world.req_to_token)
    b.cuda_graph_kv_indices = torch.zeros(max_tokens * world.max_context, dtype=torch.int64, device=dev)
    b._verify_mask = None
    b.page_size = 1
    b.token_to_kv_pool = _Pool(world.k_cache, world.v_cache)
    b.extend_attention_fwd = extend_attention_fwd
    b.extend_attention_fwd_unified = extend_attention_fwd_unified
    b.build_unified_kv_indices = build_unified_kv_indices
    b.use_verify_splitkv = False
    b.use_verify_shared_kv = False
    b.forward_metadata = None
    return b


def _spec(layout, n):
    return SimpleNamespace(ragged_verify_layout=layout, num_tokens_per_req=n, custom_mask=None)


def _layer(world: World):
    return SimpleNamespace(
        layer_id=0, sliding_window_size=None, tp_q_head_num=world.hq, tp_k_head_num=world.hkv,
        qk_head_dim=world.d, v_head_dim=world.d, k_scale=None, v_scale=None,
        scaling=1.0 / math.sqrt(world.d), xai_temperature_len=-1,
    )


def run_extend(b, md, batch, world: World, o: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What ``TritonAttnBackend.forward_extend`` hands the extend kernel (no sliding window, no scales)."""
    o = torch.zeros_like(batch.q) if o is None else o
    b.extend_attention_fwd(
        batch.q, batch.k_ext, batch.v_ext, o, world.k_cache, world.v_cache,
        md.qo_indptr, md.kv_indptr, md.kv_indices, md.custom_mask, True, md.mask_indptr, md.max_extend_len,
        1.0, 1.0, sm_scale=1.0 / math.sqrt(world.d),
    )
    return o


def run_unified(b, fb, batch, world: World, o: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The deterministic path (``_forward_extend_unified``, hooked) on the current ``b.forward_metadata``."""
    o = torch.zeros_like(batch.q) if o is None else o
    b._forward_extend_unified(batch.q, o, _layer(world), fb, True, 0.0, None)
    return o


def _reference(world: World, batch) -> torch.Tensor:
    from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_attention_torch

    return ragged_verify_attention_torch(
        batch.q.cpu(), world.k_cache.cpu(), world.v_cache.cpu(), world.req_to_token.cpu(),
        batch.req_pool_indices.cpu(), batch.prefix.cpu(), batch.verify, sm_scale=1.0 / math.sqrt(world.d),
    )


def _err(out: torch.Tensor, ref: torch.Tensor, rows: int) -> float:
    return float((out[:rows].float().cpu() - ref[:rows]).abs().max())


def _graph(device: str, fn):
    """On CUDA: capture ``fn`` into a CUDA graph and return its replay; elsewhere ``fn`` itself."""
    if device != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up (Triton compile) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def eager_case(case: dict, device: str, seed: int, report: dict) -> None:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_metadata

    world = World(hq=case["hq"], hkv=case["hkv"], d=case["d"], device=device, seed=seed)
    n, verify = case["n"], case["verify"]
    tier = n * len(verify)
    batch = world.batch(case["prefix"], verify, tier)
    if case["host"]:
        layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify, device=device, grid=[tier])
    else:
        layout = RaggedVerifyLayout.from_verify_lens_device(
            verify_lens=torch.tensor(verify, dtype=torch.int32, device=device), graph_num_tokens=tier)
    fb = SimpleNamespace(
        batch_size=len(verify), forward_mode=_target_verify(), req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.prefix, seq_lens_sum=int(batch.prefix.sum()), seq_lens_cpu=None, kv_loc_plan=None,
        spec_info=_spec(layout, n), out_cache_loc=batch.out_cache_loc, extend_seq_lens=None, extend_start_loc=None,
        encoder_lens=None,
    )
    b = make_backend(world, n, tier)
    ref = _reference(world, batch)

    b.init_forward_metadata(fb)  # patched
    md = b.forward_metadata
    expect = ragged_verify_metadata(case["prefix"], verify)
    slots = torch.cat([world.req_to_token[int(r), :p] for r, p in zip(batch.req_pool_indices, case["prefix"])])
    report["checks"][f"{case['name']}: metadata"] = bool(
        md.qo_indptr.cpu().tolist() == expect.qo_indptr.tolist()
        and md.kv_indptr.cpu().tolist() == expect.prefix_indptr.tolist()
        and md.kv_indices[: slots.numel()].cpu().tolist() == slots.cpu().tolist()
        and md.max_extend_len == (max(verify) if case["host"] else n)
        and md.custom_mask is None
    )
    out = run_extend(b, md, batch, world)
    uni = run_unified(b, fb, batch, world)
    report["cases"].append(dict(name=case["name"], mode="eager", kernel="extend_attention_fwd",
                                verify_lens=verify, max_abs_err=_err(out, ref, batch.num_real)))
    report["cases"].append(dict(name=case["name"], mode="eager", kernel="extend_attention_fwd_unified",
                                verify_lens=verify, max_abs_err=_err(uni, ref, batch.num_real)))
    report["checks"][f"{case['name']}: unified restores the batch"] = (
        fb.extend_seq_lens is None and fb.extend_start_loc is None)

    # Control: upstream's own (unpatched) metadata segments the packed rows at stride N.
    upstream = TritonAttnBackend.init_forward_metadata.__wrapped__
    upstream(b, fb)
    wrong = run_extend(b, b.forward_metadata, batch, world)
    report["control"][case["name"]] = dict(
        upstream_qo_indptr=b.forward_metadata.qo_indptr.cpu().tolist(),
        upstream_max_abs_err=_err(wrong, ref, batch.num_real),
    )


def graph_case(case: dict, device: str, seed: int, report: dict) -> None:
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_capture_verify_lens

    from sglang_dspark.kernels.ragged_verify_attention import pad_verify_lens_host

    world = World(hq=case["hq"], hkv=case["hkv"], d=case["d"], device=device, seed=seed)
    n, max_bs = case["n"], case["max_bs"]
    tiers = sorted({bs * n for bs in range(1, max_bs + 1)})
    b = make_backend(world, n, tiers[-1])
    name = case["name"]
    # Runner-owned static buffers (decode_cuda_graph_runner: req_pool_indices / seq_lens / out_cache_loc); padding
    # slots keep seq_len fill 1 (TritonAttnBackend.get_cuda_graph_seq_len_fill_value) and pool row 0.
    rpi_buf = torch.zeros(max_bs, dtype=torch.int64, device=device)
    seq_buf = torch.ones(max_bs, dtype=torch.int64, device=device)
    loc_buf = torch.zeros(tiers[-1], dtype=torch.int64, device=device)
    q_buf = torch.zeros(tiers[-1], world.hq, world.d, device=device)
    k_buf = torch.zeros(tiers[-1], world.hkv, world.d, device=device)
    v_buf = torch.zeros_like(k_buf)
    o_ext = torch.zeros_like(q_buf)
    o_uni = torch.zeros_like(q_buf)
    captured = {}
    for tier in tiers:
        slots = min(tier, max_bs)
        cap_layout = RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=build_capture_verify_lens(num_tokens=tier, num_slots=slots, num_draft_tokens=n),
            device=device, grid=tiers)
        fb = SimpleNamespace(
            batch_size=slots, forward_mode=_target_verify(), req_pool_indices=rpi_buf[:slots],
            seq_lens=seq_buf[:slots], seq_lens_sum=None, seq_lens_cpu=None, kv_loc_plan=None,
            spec_info=_spec(cap_layout, n), out_cache_loc=loc_buf[:tier], extend_seq_lens=None,
            extend_start_loc=None, encoder_lens=None, positions=torch.zeros(tier, dtype=torch.int64, device=device),
        )
        b.init_forward_metadata_out_graph(fb, in_capture=True)
        md = b.forward_metadata
        view = SimpleNamespace(q=q_buf[:tier], k_ext=k_buf[:tier], v_ext=v_buf[:tier])
        ext = _graph(device, lambda md=md, view=view, tier=tier: run_extend(b, md, view, world, o_ext[:tier]))
        b.forward_metadata = md

        def unified(md=md, fb=fb, view=view, tier=tier):
            b.forward_metadata = md
            run_unified(b, fb, view, world, o_uni[:tier])

        uni = _graph(device, unified)
        captured[tier] = SimpleNamespace(md=md, slots=slots, ext=ext, uni=uni, fb=fb,
                                         ptrs=(md.qo_indptr.data_ptr(), md.kv_indptr.data_ptr(),
                                               md.kv_indices.data_ptr()))
        report["checks"][f"{name} T={tier}: capture max_extend_len == N"] = md.max_extend_len == n
    for i, (tier, prefix, verify) in enumerate(case["replays"]):
        cap = captured[tier]
        slots = cap.slots
        live = world.batch(prefix, verify, tier)
        layout = RaggedVerifyLayout.from_verify_lens_device(
            verify_lens=torch.tensor(verify, dtype=torch.int32, device=device), graph_num_tokens=tier)
        # The runner's load_batch: copy the live batch into the static buffers (fill_from), then the replay prep.
        r = len(verify)
        rpi_buf[:r] = live.req_pool_indices
        rpi_buf[r:] = 0
        seq_buf[:r] = live.prefix
        seq_buf[r:] = 1
        loc_buf[:tier] = live.out_cache_loc
        q_buf[:tier], k_buf[:tier], v_buf[:tier] = live.q, live.k_ext, live.v_ext
        fb_view = SimpleNamespace(
            batch_size=slots, forward_mode=_target_verify(), req_pool_indices=rpi_buf[:slots],
            seq_lens=seq_buf[:slots], seq_lens_sum=None, seq_lens_cpu=None, kv_loc_plan=None,
            spec_info=_spec(layout, n), out_cache_loc=live.out_cache_loc, encoder_lens=None,
        )
        b.init_forward_metadata_out_graph(fb_view)  # replay prep: refreshes the captured buffers in place
        md = cap.md
        padded = pad_verify_lens_host(verify, tier, slots, cap=n)
        qo = [0]
        for v in padded:
            qo.append(qo[-1] + v)
        kv = [0]
        for p in seq_buf[:slots].tolist():
            kv.append(kv[-1] + p)
        lens_buf = getattr(b, "_dspark_ragged_extend_lens_buf")
        report["checks"][f"{name} replay {i} (T={tier}, R={r}): buffers"] = bool(
            md.qo_indptr.cpu().tolist() == qo
            and md.kv_indptr.cpu().tolist() == kv
            and lens_buf[:slots].cpu().tolist() == padded
            and (md.qo_indptr.data_ptr(), md.kv_indptr.data_ptr(), md.kv_indices.data_ptr()) == cap.ptrs
            and md.max_extend_len == n
        )
        ref = _reference(world, live)
        o_ext.zero_()
        o_uni.zero_()
        cap.ext()
        cap.uni()
        if device == "cuda":
            torch.cuda.synchronize()
        for kernel, out in (("extend_attention_fwd", o_ext), ("extend_attention_fwd_unified", o_uni)):
            report["cases"].append(dict(
                name=f"{name} replay {i}", mode="graph" + ("(cuda graph)" if device == "cuda" else "(simulated)"),
                kernel=kernel, tier=tier, slots=slots, verify_lens=verify, padded_verify_lens=padded,
                max_abs_err=_err(out, ref, live.num_real)))


def random_ragged_batches(seed: int, count: int):
    """(N, tier T, slots S, live verify lens) like the runner's: T = bs * N, S = min(T, max_bs), R <= S rows of 1..N
    summing to <= T."""
    g = torch.Generator().manual_seed(seed)

    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out = []
    for _ in range(count):
        n, max_bs = randint(1, 8), randint(1, 6)
        tier = n * randint(1, max_bs)
        slots = min(tier, max_bs)
        verify = [randint(1, n) for _ in range(randint(1, slots))]
        while sum(verify) > tier:
            verify[verify.index(max(verify))] -= 1
        out.append((n, tier, slots, verify))
    return out


def layout_kernel_checks(device: str, report: dict) -> None:
    """SGLang's own Triton layout kernels (``_padded_to_bucket_kernel``, ``_qo_indptr_kernel``) against the host
    mirror our patches plan with."""
    from sglang.kernels.ops.speculative.ragged_verify_kernels import (
        build_qo_indptr_triton,
        pad_verify_lens_to_bucket_triton,
    )

    from sglang_dspark.kernels.ragged_verify_attention import pad_verify_lens_host

    bad = []
    batches = random_ragged_batches(seed=7, count=10)
    for n, tier, slots, verify in batches:
        lens = torch.tensor(verify, dtype=torch.int32, device=device)
        got = pad_verify_lens_to_bucket_triton(verify_lens=lens, graph_num_tokens=tier, bs=len(verify), padded_bs=slots)
        want = pad_verify_lens_host(verify, tier, slots)
        qo = build_qo_indptr_triton(verify_lens=got)
        want_qo = [0]
        for v in want:
            want_qo.append(want_qo[-1] + v)
        if got.cpu().tolist() != want or qo.qo_indptr.cpu().tolist() != want_qo or \
                qo.extend_start_loc.cpu().tolist() != want_qo[:-1]:
            bad.append(dict(n=n, tier=tier, slots=slots, verify=verify, got=got.cpu().tolist(), want=want))
    report["checks"][f"PaddedToBucket/BuildQoIndptr triton kernels == host mirror ({len(batches)} batches)"] = not bad
    if bad:
        report["layout_kernel_mismatches"] = bad


def flashinfer_graph_case(report: dict, seed: int = 400, *, device: str = "cuda", flashinfer=None) -> None:
    """GPU (FlashInfer JIT): the host plan of ``patches/flashinfer_ragged_verify.py`` driving a real
    ``BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True)`` per token tier (shared buffers and workspace, like
    SGLang's), captured into CUDA graphs with the runner's synthetic layout and replayed through
    ``ragged_fast_prefill_plan`` -> upstream's ``fast_prefill_plan`` with live ragged layouts of fewer requests.

    ``flashinfer`` may be a stand-in module (the CPU unit test passes one that honours FlashInfer's contract: q/kv
    lengths from the device buffers, output rows at the host-planned offsets); off CUDA nothing is graph-captured."""
    from functools import partial

    if flashinfer is None:
        import flashinfer
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_capture_verify_lens

    from sglang_dspark.patches.flashinfer_ragged_verify import (
        HostPlanSlot,
        build_verify_host_plan,
        ragged_fast_prefill_plan,
    )

    dtype, n, max_bs = torch.bfloat16, 4, 3
    world = World(hq=8, hkv=2, d=128, device=device, seed=seed)
    k_pages = world.k_cache.to(dtype).unsqueeze(1)  # NHD, page size 1
    v_pages = world.v_cache.to(dtype).unsqueeze(1)
    ref_world = SimpleNamespace(**vars(world))
    ref_world.k_cache, ref_world.v_cache = k_pages[:, 0].float(), v_pages[:, 0].float()
    tiers = sorted({bs * n for bs in range(1, max_bs + 1)})
    slots = max_bs
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    qo_buf = torch.zeros(slots + 1, dtype=torch.int32, device=device)
    kv_indptr_buf = torch.zeros(slots + 1, dtype=torch.int32, device=device)
    kv_indices_buf = torch.zeros(slots * world.max_context, dtype=torch.int32, device=device)
    last_buf = torch.ones(slots, dtype=torch.int32, device=device)
    q_buf = torch.zeros(tiers[-1], world.hq, world.d, dtype=dtype, device=device)
    slot = HostPlanSlot()

    def device_args(prefix, rows, padded_lens):
        kv_lens = [p + v for p, v in zip(prefix, padded_lens)]
        kv_indptr = [0]
        for length in kv_lens:
            kv_indptr.append(kv_indptr[-1] + length)
        kv_indices = torch.cat([world.req_to_token[int(r), :length] for r, length in zip(rows, kv_lens)])
        return (torch.tensor(kv_indptr, dtype=torch.int32, device=device), kv_indices.to(torch.int32))

    def plan(w, qo_dev, kv_indptr, kv_indices):  # the call_begin_forward shape (flashinfer_backend.py:2396-2414)
        w.begin_forward(qo_dev, kv_indptr, kv_indices, last_buf, world.hq, world.hkv, world.d, 1,
                        q_data_type=dtype, kv_data_type=dtype, custom_mask=None, non_blocking=True)

    captured = {}
    for tier in tiers:
        lens = build_capture_verify_lens(num_tokens=tier, num_slots=slots, num_draft_tokens=n)
        layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=device, grid=tiers)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, backend="fa2", qo_indptr_buf=qo_buf,
            paged_kv_indptr_buf=kv_indptr_buf, paged_kv_indices_buf=kv_indices_buf,
            paged_kv_last_page_len_buf=last_buf)
        if getattr(w, "_max_total_num_rows", 0) is None:
            w._max_total_num_rows = tier
        plan(w, layout.qo_indptr_device, *device_args([1] * slots, [0] * slots, lens))  # real plan() at capture
        run = lambda w=w, tier=tier: w.forward(q_buf[:tier], (k_pages, v_pages), causal=True)  # noqa: E731
        if device == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            replay = graph.replay
        else:
            out = torch.zeros(tier, world.hq, world.d, dtype=dtype)
            replay = lambda run=run, out=out: out.copy_(run())  # noqa: E731
        w.begin_forward = partial(ragged_fast_prefill_plan, w, slot)
        captured[tier] = (w, replay, out)
    for i, (tier, prefix, verify) in enumerate(GRAPH_CASE["replays"]):
        w, replay, out = captured[tier]
        live = world.batch(prefix, verify, tier)
        layout = RaggedVerifyLayout.from_verify_lens_device(
            verify_lens=torch.tensor(verify, dtype=torch.int32, device=device), graph_num_tokens=tier)
        padded = layout.padded_to_bucket(padded_bs=slots)  # full coverage, as the patch hands upstream
        host = build_verify_host_plan(verify_lens_cpu=verify, prefix_lens_cpu=prefix, graph_num_tokens=tier,
                                      padded_bs=slots, seq_len_fill_value=1)
        rows = live.req_pool_indices.tolist() + [0] * (slots - len(verify))
        kv_indptr, kv_indices = device_args(list(prefix) + [1] * (slots - len(verify)), rows, list(host.verify_lens))
        same = padded.qo_indptr_device.cpu().tolist() == host.qo_indptr_host.tolist() and \
            kv_indptr.cpu().tolist() == host.kv_indptr_host.tolist()
        slot.plan = host
        plan(w, padded.qo_indptr_device, kv_indptr, kv_indices)
        slot.plan = None
        q_buf[:tier] = live.q.to(dtype)
        replay()
        if device == "cuda":
            torch.cuda.synchronize()
        live.q = q_buf[:tier].float()
        ref = _reference(ref_world, live)
        report["flashinfer"].append(dict(name=f"flashinfer replay {i}", tier=tier, verify_lens=verify,
                                         padded_verify_lens=list(host.verify_lens), host_plan_matches_device=same,
                                         max_abs_err=_err(out, ref, live.num_real)))


def flashinfer_patch_registration():
    """Register the FlashInfer patch next to the Triton one; after ``apply_hooks`` the returned callable
    says whether it is live: the property on the class, the wrapped methods, idempotence."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang_dspark.patches import flashinfer_ragged_verify

    before = FlashInferAttnBackend.supports_ragged_verify_graph
    flashinfer_ragged_verify.apply()
    flashinfer_ragged_verify.apply()  # idempotent

    def checks() -> dict[str, bool]:
        def stand_in(**attrs):
            b = object.__new__(FlashInferAttnBackend)
            fields = dict(prefill_backend="fa2", dispatch_reason=None, use_sliding_window_kv_pool=False,
                          skip_prefill=False)
            fields.update(attrs)
            for key, value in fields.items():
                setattr(b, key, value)
            return b

        graph = FlashInferAttnBackend.init_forward_metadata_out_graph
        generate = DFlashVerifyInput.generate_attn_arg_prefill
        return {
            "flashinfer: flag off before its patch": before is False,
            "flashinfer: flag is a property after its patch (fa2, one wrapper)": (
                stand_in().supports_ragged_verify_graph is True
                and stand_in(prefill_backend="fa3").supports_ragged_verify_graph is False
                and stand_in(use_sliding_window_kv_pool=True).supports_ragged_verify_graph is False),
            "flashinfer: metadata hook applied once": (
                getattr(graph, "__wrapped__", None) is not None
                and getattr(graph.__wrapped__, "__wrapped__", None) is None),
            "flashinfer: dflash_info fix applied once": (
                getattr(generate, "__wrapped__", None) is not None
                and getattr(generate.__wrapped__, "__wrapped__", None) is None),
        }

    return checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None, help="also write the JSON report here")
    ap.add_argument("--no-flashinfer", action="store_true", help="on CUDA, skip the FlashInfer CUDA-graph case")
    args = ap.parse_args(argv)
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("on the CPU run with TRITON_INTERPRET=1 (set before triton is imported)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_dspark.patches import triton_ragged_verify

    report: dict[str, Any] = {"device": args.device, "tolerance": TOL, "cases": [], "checks": {}, "control": {}}
    report["checks"]["flag off before the patch"] = TritonAttnBackend.supports_ragged_verify_graph is False
    triton_ragged_verify.apply()
    flashinfer_install = flashinfer_patch_registration()
    HookRegistry.apply_hooks()
    report["checks"]["flag on after the patch"] = TritonAttnBackend.supports_ragged_verify_graph is True
    report["checks"].update(flashinfer_install())
    layout_kernel_checks(args.device, report)
    for seed, case in enumerate(EAGER_CASES):
        eager_case(case, args.device, 100 + seed, report)
    graph_case(GRAPH_CASE, args.device, 200, report)
    graph_case(GRAPH_CASE_MQA_D32, args.device, 300, report)
    report["max_abs_err"] = max(c["max_abs_err"] for c in report["cases"])
    report["ok"] = bool(
        all(report["checks"].values())
        and report["max_abs_err"] <= TOL
        and all(c["upstream_max_abs_err"] > 1e-2 for c in report["control"].values())
    )
    if args.device == "cuda" and not args.no_flashinfer:
        report["flashinfer"] = []
        flashinfer_graph_case(report)
        report["ok"] = report["ok"] and all(
            c["host_plan_matches_device"] and c["max_abs_err"] <= FLASHINFER_BF16_TOL for c in report["flashinfer"])
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
