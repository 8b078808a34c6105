"""The ragged-verify parity harness: our patches on SGLang's real attention backends against a torch reference.

Run by the launcher's self-check in a child process (``engine/self_check/ragged_self_check.py``) and by the unit tests:

* CPU: ``TRITON_INTERPRET=1 python -m sglang_dspark.engine.self_check.ragged_verify_parity`` (the small case lists);
* GPU: ``python -m sglang_dspark.engine.self_check.ragged_verify_parity --device cuda [--backend triton|flashinfer|all]``
  (the serving shapes: ``engine/self_check/ragged_verify_cases.py``).

It prints one JSON report (``--out`` also writes it) and exits 1 unless every part it ran passed.

**Triton** (``patches/triton_ragged_verify.py``): a ``TritonAttnBackend`` built with ``object.__new__`` (its
``__init__`` needs a ModelRunner) holding only what its target-verify code reads builds the metadata through the
patched methods, eager (``init_forward_metadata``) and for CUDA graphs (capture every token tier with the runner's
synthetic layout, then replay live layouts of fewer requests through ``init_forward_metadata_out_graph`` into the same
buffers); the backend's own ``forward_extend`` then runs SGLang's Triton extend kernel and, with
``enable_deterministic``, the unified kernel (through the patched ``_forward_extend_unified``). Upstream's unpatched
eager metadata is the control: it must fail the same tolerance.

**FlashInfer** (``patches/flashinfer_ragged_verify.py``; GPU, or a stand-in module in the unit tests): a
``FlashInferAttnBackend`` built the same way with a real ``FlashInferIndicesUpdaterPrefill``, so that the patched
``init_forward_metadata_out_graph`` runs the patch's own glue (tier wrappers from upstream's
``_create_prefill_wrappers``, ``host_lengths`` from each of its three sources, the host plan, upstream's
``call_begin_forward`` and ``DFlashVerifyInput.generate_attn_arg_prefill``, ``ragged_fast_prefill_plan`` into
upstream's ``fast_prefill_plan``); the backend's ``forward_extend`` runs FlashInfer's wrapper, captured per tier in a
real CUDA graph and replayed.

**Precision and tolerances.** Two kinds of cases (``ragged_verify_cases.py``):

* fp32, small shapes, at IEEE precision: Triton compiles an fp32 ``tl.dot`` without ``input_precision`` (SGLang's
  extend kernels) as TF32 on NVIDIA (``triton/backends/nvidia/compiler.py`` ``default_dot_input_precision``), whose
  10-bit mantissa gives errors of 1e-4..1e-3 here, not an indexing fault. The harness sets
  ``TRITON_F32_DEFAULT=FP32_DOT_PRECISION`` in its own environment before anything compiles (Triton reads it for
  every dot without ``input_precision``, and it is part of Triton's compile-cache key), and reports what Triton read.
  The interpreter (CPU) computes fp32 dots in full fp32 whatever the setting. Tolerance: ``FP32_IEEE_ABS_TOL``
  absolute, far above fp32 rounding (unit roundoff 2^-24; outputs are averages of N(0, 1) values over at most a few
  hundred keys) and far below one wrong key (about 1/kv_len of an O(1) value).
* bf16, the serving shapes, the kernels' real dtype. The reference is fed the very bf16 values the kernel reads
  (upcast exactly to fp32), so the only differences are the kernel's own roundings. Per output element
  ``o = sum_j w_j v_j`` (``w`` the softmax weights), with ``u = BF16_UNIT_ROUNDOFF`` = 2^-8 and
  ``rho = sum_j w_j |v_j|`` (the reference attention applied to ``|V|``, which the harness computes per element),
  to first order in ``u``:

  - SGLang's Triton ``_fwd_kernel`` (by reading) computes the logits in fp32 from bf16 products (exact), rounds the
    unnormalised weights to bf16 for the P.V product while its normaliser sums the fp32 weights (at most
    ``u * rho``), and rounds the output to bf16 (at most ``u |o| <= u * rho``): ``2u * rho``.
  - FlashInfer's fa2 prefill (by reading ``prefill.cuh`` ``compute_sfm_v`` and the split-KV partial output
    ``DTypeO* tmp_v``, FlashInfer's main branch) also normalises by the sum of the
    *rounded* weights (at most ``u * sum_j w_j |v_j - o| <= 2u * rho``), and in CUDA graphs it always splits the KV,
    writing each chunk's partial output in bf16 before the fp32 merge (at most ``u * rho``), then the output
    (``u * rho``): ``4u * rho``.

  ``BF16_REL_TOL`` is the larger bound, 4u = 2^-6; what the bounds leave out is fp32 rounding (about 1e-6 of rho).
  Random data stay well inside (the rounding errors partly cancel: an emulation of both kernels,
  ``tests/unit/engine/test_ragged_self_check.py``). Queries are drawn with ``QUERY_STD`` so that attention is peaked, as in
  trained models: a row reading a wrong key segment moves the output by hundreds of times the tolerance, a KV chunk
  of a 4096-token prefix dropped or merged twice by several times (simulated).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import traceback
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

from sglang_dspark.engine.self_check.ragged_verify_cases import (
    FP32,
    EagerCase,
    GraphCase,
    case_lists,
    coverage,
)

FP32_DOT_PRECISION = "ieee"  # TRITON_F32_DEFAULT in the harness process
FP32_IEEE_ABS_TOL = 2e-5  # fp32 cases: max |kernel - reference|
BF16_UNIT_ROUNDOFF = 2.0 ** -8  # u of bfloat16 (8 significant bits, round to nearest)
# Worst-case error of each kernel's bf16 roundings, relative to rho, to first order in u (module docstring).
BF16_ROUNDING_BOUNDS = {"triton": 2 * BF16_UNIT_ROUNDOFF, "flashinfer": 4 * BF16_UNIT_ROUNDOFF}
BF16_REL_TOL = max(BF16_ROUNDING_BOUNDS.values())  # bf16 cases: max |kernel - reference| / rho, elementwise (2^-6)
QUERY_STD = 2.0  # queries ~ N(0, QUERY_STD^2), keys and values ~ N(0, 1): peaked attention (module docstring)
BACKENDS = ("triton", "flashinfer")
F32_DEFAULT_ENV = "TRITON_F32_DEFAULT"


def tolerance(dtype: str) -> float:
    return FP32_IEEE_ABS_TOL if dtype == FP32 else BF16_REL_TOL


def attention_error(out: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor, rows: int, dtype: str) -> dict:
    """The case's error under its dtype's criterion: fp32 max absolute error; bf16 max of ``|out - ref| / rho``
    (``ref_abs`` = rho, the reference attention of ``|V|``). ``ok`` when within ``tolerance(dtype)``; NaN counts as
    infinite."""
    diff = torch.nan_to_num((out[:rows].float().cpu() - ref[:rows]).abs(), nan=math.inf)
    max_abs = float(diff.max()) if rows else 0.0
    if dtype == FP32:
        error = max_abs
    else:
        error = float((diff / ref_abs[:rows].clamp_min(1e-30)).max()) if rows else 0.0
    tol = tolerance(dtype)
    return dict(max_abs_err=max_abs, error=error, tolerance=tol, ok=bool(error <= tol))


# ---------------------------------------------------------------------------------------------------------------------
# The paged KV world shared by both backends
# ---------------------------------------------------------------------------------------------------------------------


class _Translator:
    """Stand-in for ``KVIndexTranslator.pack_read_stream`` on a plain (untranslated) page-size-1 pool."""

    reads_are_translated = False

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token

    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, kv_start_idx=None, **_):
        lens, starts, rows = seq_lens.tolist(), indptr.tolist(), req_pool_indices.tolist()
        for i, (n, start, row) in enumerate(zip(lens, starts, rows)):
            begin = int(kv_start_idx[i]) if kv_start_idx is not None else 0
            out[start:start + n] = self.req_to_token[int(row), begin:begin + n]
        return True


class _Pool:
    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k, self.v = k_cache, v_cache

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v

    def get_kv_buffer(self, layer_id):
        return self.k, self.v


class World:
    """A paged KV pool of ``pool_rows`` request rows of ``max_context`` slots (slot 0 is never a real token), in the
    case's dtype, with the fp32 host copies the reference reads (the same values)."""

    def __init__(self, shape, device: str, seed: int, *, pool_rows: int, max_context: int):
        g = torch.Generator().manual_seed(seed)
        self.shape, self.device, self.dtype = shape, device, getattr(torch, shape.dtype)
        self.hq, self.hkv, self.d = shape.hq, shape.hkv, shape.d
        self.pool_rows, self.max_context = pool_rows, max_context
        num_slots = pool_rows * max_context + 1
        self.req_to_token_ref = (torch.randperm(num_slots - 1, generator=g) + 1).view(pool_rows, max_context)
        self.req_to_token = self.req_to_token_ref.to(device)
        k = torch.randn(num_slots, self.hkv, self.d, generator=g).to(self.dtype)
        v = torch.randn(num_slots, self.hkv, self.d, generator=g).to(self.dtype)
        self.k_cache, self.v_cache = k.to(device), v.to(device)
        self.k_ref, self.v_ref = k.float(), v.float()
        self.v_abs_ref = self.v_ref.abs()
        self.g = g

    @classmethod
    def for_case(cls, case, device: str, seed: int) -> "World":
        if isinstance(case, EagerCase):
            batches, longest_q = [(case.prefix, case.verify)], case.n * len(case.verify)
        else:
            batches, longest_q = [(r.prefix, r.verify) for r in case.replays], max(case.tiers)
        most = max(len(p) for p, _ in batches)
        longest = max(max(p) for p, _ in batches)
        # Row 0 is the padding slots' row: a padding slot reads 1 + its padded rows (<= the tier) from it.
        return cls(case.shape, device, seed, pool_rows=most + 2, max_context=max(longest + case.n, longest_q + 1) + 1)

    def batch(self, prefix, verify, num_rows):
        """Pool rows (1..), packed q and the verify rows' K/V (cache slots), padded to ``num_rows`` with slot 0."""
        rows = torch.randperm(self.pool_rows - 1, generator=self.g)[: len(prefix)] + 1
        slots = [self.req_to_token[int(r), p:p + v] for r, p, v in zip(rows.tolist(), prefix, verify)]
        out_cache_loc = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        packed = torch.cat(slots).to(torch.int64)
        out_cache_loc[: packed.numel()] = packed
        q = (QUERY_STD * torch.randn(num_rows, self.hq, self.d, generator=self.g)).to(self.dtype).to(self.device)
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

    def reference(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(reference output, rho): fp32 attention of the same values, and of ``|V|`` with the same weights."""
        from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_attention_torch

        args = (batch.q.float().cpu(), self.k_ref)
        tail = (self.req_to_token_ref, batch.req_pool_indices.cpu(), batch.prefix.cpu(), batch.verify)
        scale = 1.0 / math.sqrt(self.d)
        ref = ragged_verify_attention_torch(*args, self.v_ref, *tail, sm_scale=scale)
        rho = ragged_verify_attention_torch(*args, self.v_abs_ref, *tail, sm_scale=scale)
        return ref, rho


def _target_verify():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.TARGET_VERIFY


def _layer(world: World):
    """What both backends' ``forward_extend`` read of a RadixAttention (no sliding window, soft cap or scales)."""
    from sglang.srt.layers.radix_attention import AttentionType

    return SimpleNamespace(
        layer_id=0, sliding_window_size=-1, tp_q_head_num=world.hq, tp_k_head_num=world.hkv, tp_v_head_num=world.hkv,
        qk_head_dim=world.d, v_head_dim=world.d, head_dim=world.d, k_scale=None, v_scale=None, k_scale_float=None,
        v_scale_float=None, scaling=1.0 / math.sqrt(world.d), xai_temperature_len=-1, logit_cap=0.0,
        logit_capping_method="tanh", is_cross_attention=False, attn_type=AttentionType.DECODER,
    )


def _forward_batch(**fields):
    """A TARGET_VERIFY ForwardBatch with the fields the backends' metadata and extend code read."""
    base = dict(forward_mode=_target_verify(), seq_lens_cpu=None, seq_lens_sum=None, kv_loc_plan=None,
                extend_seq_lens=None, extend_start_loc=None, extend_seq_lens_cpu=None, encoder_lens=None,
                mha_one_shot=False, attn_attend_prefix_cache=None)
    base.update(fields)
    return SimpleNamespace(**base)


def _spec(layout, n):
    return SimpleNamespace(ragged_verify_layout=layout, num_tokens_per_req=n, custom_mask=None)


def _graph(device: str, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """On CUDA: capture ``fn`` (which returns its output tensor) in a CUDA graph and return a replay that returns the
    captured output; elsewhere ``fn`` itself."""
    if device != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up (compiles, plans) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out

    return replay


def _case_record(case, name: Optional[str] = None, **fields) -> dict:
    s = case.shape
    return dict(name=name or case.name, dtype=s.dtype, hq=s.hq, hkv=s.hkv, d=s.d, **fields)


# ---------------------------------------------------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------------------------------------------------


def make_triton_backend(world: World, n: int, max_tokens: int):
    """A TritonAttnBackend with only the fields its target-verify metadata and ``forward_extend`` read."""
    from sglang.kernels.ops.attention.extend_attention import (
        build_unified_kv_indices,
        extend_attention_fwd,
        extend_attention_fwd_unified,
    )
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    dev = world.device
    b = object.__new__(TritonAttnBackend)
    size = world.pool_rows + 1
    fields = dict(
        device=dev, dllm_attention=None, _dense_one_shot_kv_indptr=None, sliding_window_size=None,
        window_kv_indptr=None, use_sliding_window_kv_pool=False, target_verify_num_tokens_per_req=n,
        num_draft_tokens=n, max_context_len=world.max_context,
        kv_indptr=torch.zeros(size, dtype=torch.int32, device=dev),
        qo_indptr=torch.zeros(size, dtype=torch.int64, device=dev),
        mask_indptr=torch.zeros(size, dtype=torch.int64, device=dev),
        kv_index_translator=_Translator(world.req_to_token),
        cuda_graph_kv_indices=torch.zeros(max_tokens * world.max_context, dtype=torch.int64, device=dev),
        _verify_mask=None, page_size=1, token_to_kv_pool=_Pool(world.k_cache, world.v_cache),
        extend_attention_fwd=extend_attention_fwd, extend_attention_fwd_unified=extend_attention_fwd_unified,
        build_unified_kv_indices=build_unified_kv_indices, use_verify_splitkv=False, use_verify_shared_kv=False,
        forward_metadata=None, enable_deterministic=False, dcp_size=1, use_dense_fp8_chunked_prefill=False,
        allow_bidirectional_attention_in_extend=False,
    )
    for key, value in fields.items():
        setattr(b, key, value)
    return b


def triton_forward(b, fb, layer, q, k, v, *, deterministic: bool, metadata=None) -> torch.Tensor:
    """The backend's own ``forward_extend`` (KV already in the pool): the extend kernel, or with
    ``deterministic`` the unified kernel through the patched ``_forward_extend_unified``."""
    if metadata is not None:
        b.forward_metadata = metadata
    b.enable_deterministic = deterministic
    return b.forward_extend(q, k, v, layer, fb, save_kv_cache=False)


TRITON_KERNELS = (("extend_attention_fwd", False), ("extend_attention_fwd_unified", True))


def triton_eager_case(case: EagerCase, device: str, seed: int, section: dict) -> None:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_metadata

    world = World.for_case(case, device, seed)
    n, verify, prefix = case.n, list(case.verify), list(case.prefix)
    tier = n * len(verify)
    batch = world.batch(prefix, verify, tier)
    if case.host_lengths:
        layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify, device=device, grid=[tier])
    else:
        layout = RaggedVerifyLayout.from_verify_lens_device(
            verify_lens=torch.tensor(verify, dtype=torch.int32, device=device), graph_num_tokens=tier)
    fb = _forward_batch(batch_size=len(verify), req_pool_indices=batch.req_pool_indices, seq_lens=batch.prefix,
                        seq_lens_sum=sum(prefix), spec_info=_spec(layout, n), out_cache_loc=batch.out_cache_loc,
                        positions=torch.zeros(tier, dtype=torch.int64, device=device))
    b = make_triton_backend(world, n, tier)
    layer = _layer(world)
    ref, rho = world.reference(batch)

    b.init_forward_metadata(fb)  # patched
    md = b.forward_metadata
    expect = ragged_verify_metadata(prefix, verify)
    slots = torch.cat([world.req_to_token[int(r), :p] for r, p in zip(batch.req_pool_indices, prefix)])
    section["checks"][f"{case.name}: metadata"] = bool(
        md.qo_indptr.cpu().tolist() == expect.qo_indptr.tolist()
        and md.kv_indptr.cpu().tolist() == expect.prefix_indptr.tolist()
        and md.kv_indices[: slots.numel()].cpu().tolist() == slots.cpu().tolist()
        and md.max_extend_len == (max(verify) if case.host_lengths else n)
        and md.custom_mask is None
    )
    for kernel, deterministic in TRITON_KERNELS:
        out = triton_forward(b, fb, layer, batch.q, batch.k_ext, batch.v_ext, deterministic=deterministic,
                             metadata=md)
        section["cases"].append(_case_record(
            case, mode="eager", kernel=kernel, prefix_lens=prefix, verify_lens=verify,
            **attention_error(out, ref, rho, batch.num_real, case.shape.dtype)))
    section["checks"][f"{case.name}: unified restores the batch"] = (
        fb.extend_seq_lens is None and fb.extend_start_loc is None)

    # Control: upstream's own (unpatched) metadata segments the packed rows at stride N.
    TritonAttnBackend.init_forward_metadata.__wrapped__(b, fb)
    wrong = triton_forward(b, fb, layer, batch.q, batch.k_ext, batch.v_ext, deterministic=False)
    control = attention_error(wrong, ref, rho, batch.num_real, case.shape.dtype)
    section["controls"].append(dict(name=case.name, what="upstream's unpatched eager metadata",
                                    upstream_qo_indptr=b.forward_metadata.qo_indptr.cpu().tolist(),
                                    error=control["error"], tolerance=control["tolerance"],
                                    ok=not control["ok"]))  # the control must fail the check


def triton_graph_case(case: GraphCase, device: str, seed: int, section: dict) -> None:
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_capture_verify_lens

    from sglang_dspark.kernels.ragged_verify_attention import pad_verify_lens_host

    world = World.for_case(case, device, seed)
    n, max_bs, tiers = case.n, case.max_bs, case.tiers
    b = make_triton_backend(world, n, tiers[-1])
    layer = _layer(world)
    name = case.name
    # Runner-owned static buffers (decode_cuda_graph_runner: req_pool_indices / seq_lens / out_cache_loc); padding
    # slots keep seq_len fill 1 (TritonAttnBackend.get_cuda_graph_seq_len_fill_value) and pool row 0.
    rpi_buf = torch.zeros(max_bs, dtype=torch.int64, device=device)
    seq_buf = torch.ones(max_bs, dtype=torch.int64, device=device)
    loc_buf = torch.zeros(tiers[-1], dtype=torch.int64, device=device)
    q_buf = torch.zeros(tiers[-1], world.hq, world.d, dtype=world.dtype, device=device)
    k_buf = torch.zeros(tiers[-1], world.hkv, world.d, dtype=world.dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    captured = {}
    for tier in tiers:
        slots = case.slots(tier)
        cap_layout = RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=build_capture_verify_lens(num_tokens=tier, num_slots=slots, num_draft_tokens=n),
            device=device, grid=tiers)
        fb = _forward_batch(batch_size=slots, req_pool_indices=rpi_buf[:slots], seq_lens=seq_buf[:slots],
                            spec_info=_spec(cap_layout, n), out_cache_loc=loc_buf[:tier],
                            positions=torch.zeros(tier, dtype=torch.int64, device=device))
        b.init_forward_metadata_out_graph(fb, in_capture=True)
        md = b.forward_metadata
        runs = {kernel: _graph(device, partial(triton_forward, b, fb, layer, q_buf[:tier], k_buf[:tier],
                                               v_buf[:tier], deterministic=deterministic, metadata=md))
                for kernel, deterministic in TRITON_KERNELS}
        captured[tier] = SimpleNamespace(md=md, slots=slots, runs=runs, ptrs=(
            md.qo_indptr.data_ptr(), md.kv_indptr.data_ptr(), md.kv_indices.data_ptr()))
        section["checks"][f"{name} T={tier}: capture max_extend_len == N"] = md.max_extend_len == n
    for i, replay in enumerate(case.replays):
        tier, prefix, verify = replay.tier, list(replay.prefix), list(replay.verify)
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
        fb_view = _forward_batch(batch_size=slots, req_pool_indices=rpi_buf[:slots], seq_lens=seq_buf[:slots],
                                 spec_info=_spec(layout, n), out_cache_loc=live.out_cache_loc)
        b.init_forward_metadata_out_graph(fb_view)  # replay prep: refreshes the captured buffers in place
        md = cap.md
        padded = pad_verify_lens_host(verify, tier, slots, cap=n)
        qo, kv = [0], [0]
        for v in padded:
            qo.append(qo[-1] + v)
        for p in seq_buf[:slots].tolist():
            kv.append(kv[-1] + p)
        lens_buf = getattr(b, "_dspark_ragged_extend_lens_buf")
        section["checks"][f"{name} replay {i} (T={tier}, R={r}): buffers"] = bool(
            md.qo_indptr.cpu().tolist() == qo
            and md.kv_indptr.cpu().tolist() == kv
            and lens_buf[:slots].cpu().tolist() == padded
            and (md.qo_indptr.data_ptr(), md.kv_indptr.data_ptr(), md.kv_indices.data_ptr()) == cap.ptrs
            and md.max_extend_len == n
        )
        ref, rho = world.reference(live)
        for kernel, run in cap.runs.items():
            out = run()
            if device == "cuda":
                torch.cuda.synchronize()
            section["cases"].append(_case_record(
                case, name=f"{name} replay {i}", mode="graph" + ("(cuda graph)" if device == "cuda" else
                                                                  "(simulated)"),
                kernel=kernel, tier=tier, slots=slots, prefix_lens=prefix, verify_lens=verify,
                padded_verify_lens=padded, **attention_error(out, ref, rho, live.num_real, case.shape.dtype)))


# ---------------------------------------------------------------------------------------------------------------------
# SGLang's Triton layout kernels (both patches plan with their host mirror)
# ---------------------------------------------------------------------------------------------------------------------


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


def layout_kernel_checks(device: str, section: dict) -> None:
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
    section["checks"][f"PaddedToBucket/BuildQoIndptr triton kernels == host mirror ({len(batches)} batches)"] = not bad
    if bad:
        section["layout_kernel_mismatches"] = bad


# ---------------------------------------------------------------------------------------------------------------------
# FlashInfer
# ---------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def flashinfer_wrapper_class(flashinfer):
    """Upstream's ``_create_prefill_wrappers`` builds ``flashinfer_backend.BatchPrefillWithPagedKVCacheWrapper``;
    with a stand-in ``flashinfer`` module (CPU tests) that name is the stand-in's for the duration."""
    from sglang.srt.layers.attention import flashinfer_backend

    if flashinfer is None:
        yield
        return
    missing = object()
    saved = getattr(flashinfer_backend, "BatchPrefillWithPagedKVCacheWrapper", missing)
    flashinfer_backend.BatchPrefillWithPagedKVCacheWrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper
    try:
        yield
    finally:
        if saved is missing:
            del flashinfer_backend.BatchPrefillWithPagedKVCacheWrapper
        else:
            flashinfer_backend.BatchPrefillWithPagedKVCacheWrapper = saved


def make_flashinfer_backend(world: World, case: GraphCase, workspace_bytes: int):
    """A FlashInferAttnBackend (fa2, one wrapper, no sliding window) with a real FlashInferIndicesUpdaterPrefill,
    holding only the fields its verify-graph metadata and ``forward_extend`` read; buffers sized like upstream's
    ``init_cuda_graph_state`` for ``max_bs`` slots."""
    from sglang.srt.layers.attention.flashinfer_backend import (
        FlashInferAttnBackend,
        FlashInferIndicesUpdaterPrefill,
    )

    dev, slots = world.device, case.max_bs
    b = object.__new__(FlashInferAttnBackend)
    fields = dict(
        device=dev, prefill_backend="fa2", dispatch_reason=None, use_sliding_window_kv_pool=False, skip_prefill=False,
        num_wrappers=1, is_dllm_model=False, prefill_uses_dequant_workspace=False, forward_metadata=None,
        workspace_buffer=torch.empty(workspace_bytes, dtype=torch.uint8, device=dev),
        kv_indptr=[torch.zeros(slots + 1, dtype=torch.int32, device=dev)],
        qo_indptr=[torch.zeros(slots + 1, dtype=torch.int32, device=dev)],
        cuda_graph_qo_indptr=[torch.zeros(slots + 1, dtype=torch.int32, device=dev)],
        cuda_graph_kv_indices=[torch.zeros(slots * world.max_context, dtype=torch.int32, device=dev)],
        kv_last_page_len=torch.ones(slots, dtype=torch.int32, device=dev),
        kv_index_translator=_Translator(world.req_to_token), token_to_kv_pool=_Pool(world.k_cache, world.v_cache),
        prefill_wrapper_ragged=None, prefill_cuda_graph_metadata={},
    )
    for key, value in fields.items():
        setattr(b, key, value)
    updater = object.__new__(FlashInferIndicesUpdaterPrefill)
    fields = dict(num_qo_heads=world.hq, num_kv_heads=world.hkv, head_dim=world.d, data_type=world.dtype,
                  q_data_type=world.dtype, sliding_window_size=None, attn_backend=b, kv_indptr=b.kv_indptr,
                  kv_last_page_len=b.kv_last_page_len, qo_indptr=b.qo_indptr, _swa_kv_pool=None,
                  prefill_wrapper_ragged=None)
    for key, value in fields.items():
        setattr(updater, key, value)
    updater.update = updater.update_single_wrapper  # upstream's dispatch for one wrapper
    b.indices_updater_prefill = updater
    return b


def _patched_graph_metadata(b, fb, in_capture: bool) -> None:
    """``init_forward_metadata_out_graph`` through our patch: the registered hook when hooks were applied in this
    process (the harness), else the hook function around upstream's method (the in-process unit test)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from sglang_dspark.patches.flashinfer_ragged_verify import init_forward_metadata_out_graph_with_ragged_verify

    method = FlashInferAttnBackend.init_forward_metadata_out_graph
    if getattr(method, "__wrapped__", None) is not None:
        b.init_forward_metadata_out_graph(fb, in_capture)
    else:
        init_forward_metadata_out_graph_with_ragged_verify(method, b, fb, in_capture)


def _verify_input(layout, n: int, tier: int, device: str, live_seq_lens_cpu=None):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    return DFlashVerifyInput(draft_token=torch.zeros(tier, dtype=torch.int64, device=device),
                             positions=torch.zeros(tier, dtype=torch.int64, device=device), draft_token_num=n,
                             ragged_verify_layout=layout, live_seq_lens_cpu=live_seq_lens_cpu)


def flashinfer_graph_case(case: GraphCase, device: str, seed: int, section: dict, *, flashinfer=None) -> None:
    """Capture a tier wrapper per token tier through the patched ``init_forward_metadata_out_graph`` and replay live
    ragged batches (host lengths from the replay's ``lengths_from``) through the backend's ``forward_extend``.

    ``flashinfer`` may be a stand-in module (the CPU unit test passes one that honours FlashInfer's contract: q/kv
    lengths from the device buffers, output rows at the host-planned offsets); off CUDA nothing is graph-captured."""
    from sglang.srt.environ import envs as sglang_envs
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_capture_verify_lens

    from sglang_dspark.patches.flashinfer_ragged_verify import build_verify_host_plan

    world = World.for_case(case, device, seed)
    n, max_bs, tiers = case.n, case.max_bs, case.tiers
    workspace = sglang_envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get() if device == "cuda" else 8
    b = make_flashinfer_backend(world, case, workspace)
    layer = _layer(world)
    rpi_buf = torch.zeros(max_bs, dtype=torch.int64, device=device)
    seq_buf = torch.ones(max_bs, dtype=torch.int64, device=device)
    q_buf = torch.zeros(tiers[-1], world.hq, world.d, dtype=world.dtype, device=device)
    kv_ext = torch.zeros(tiers[-1], world.hkv, world.d, dtype=world.dtype, device=device)  # unused: KV in the pool

    # Control: upstream's own method refuses a ragged layout in graph mode (what the patch replaces).
    method = FlashInferAttnBackend.init_forward_metadata_out_graph
    probe = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=[1], device=device, grid=[tiers[0]])
    try:
        getattr(method, "__wrapped__", method)(b, _forward_batch(
            batch_size=1, req_pool_indices=rpi_buf[:1], seq_lens=seq_buf[:1], spec_info=_verify_input(
                probe, n, tiers[0], device), positions=torch.zeros(tiers[0], dtype=torch.int64, device=device)), True)
        refused = False
    except NotImplementedError:
        refused = True
    section["checks"][f"{case.name}: upstream refuses ragged verify graphs (control)"] = refused

    captured = {}
    with flashinfer_wrapper_class(flashinfer):
        for tier in tiers:
            slots = case.slots(tier)
            lens = build_capture_verify_lens(num_tokens=tier, num_slots=slots, num_draft_tokens=n)
            layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=device, grid=tiers)
            fb = _forward_batch(
                batch_size=slots, req_pool_indices=rpi_buf[:slots], seq_lens=seq_buf[:slots],
                seq_lens_cpu=torch.ones(slots, dtype=torch.int64), seq_lens_sum=slots,
                spec_info=_verify_input(layout, n, tier, device),
                positions=torch.zeros(tier, dtype=torch.int64, device=device))
            _patched_graph_metadata(b, fb, in_capture=True)
            md = b.forward_metadata

            def run(md=md, fb=fb, tier=tier):
                b.forward_metadata = md
                out = b.forward_extend(q_buf[:tier], kv_ext[:tier], kv_ext[:tier], layer, fb, save_kv_cache=False)
                return out.view(tier, world.hq, world.d)

            captured[tier] = SimpleNamespace(slots=slots, replay=_graph(device, run))
    wrappers = getattr(b, "_dspark_rv_wrappers", {})
    section["checks"][f"{case.name}: one wrapper set per tier, capacity T"] = bool(
        sorted(wrappers) == tiers and len({id(w[0]) for w in wrappers.values()}) == len(tiers)
        and all(w[0]._max_total_num_rows == t for t, w in wrappers.items()))

    for i, replay in enumerate(case.replays):
        tier, prefix, verify = replay.tier, list(replay.prefix), list(replay.verify)
        slots, r = captured[tier].slots, len(verify)
        live = world.batch(prefix, verify, tier)
        if replay.lengths_from == "layout":
            layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify, device=device, grid=[tier])
        else:
            layout = RaggedVerifyLayout.from_verify_lens_device(
                verify_lens=torch.tensor(verify, dtype=torch.int32, device=device), graph_num_tokens=tier)
        from_batch = replay.lengths_from == "batch"
        # The runner's load_batch into the static buffers; _run_ragged's host mirrors (prefix + verify, live prefix).
        rpi_buf[:r] = live.req_pool_indices
        rpi_buf[r:] = 0
        seq_buf[:r] = live.prefix
        seq_buf[r:] = 1
        q_buf[:tier] = live.q
        seq_cpu = torch.tensor([p + v for p, v in zip(prefix, verify)] + [1] * (slots - r)) if from_batch else None
        live_cpu = torch.tensor(prefix) if from_batch else None
        fb_view = _forward_batch(
            batch_size=slots, req_pool_indices=rpi_buf[:slots], seq_lens=seq_buf[:slots], seq_lens_cpu=seq_cpu,
            seq_lens_sum=sum(prefix) + (slots - r), spec_info=_verify_input(layout, n, tier, device, live_cpu),
            positions=torch.zeros(tier, dtype=torch.int64, device=device))
        with flashinfer_wrapper_class(flashinfer):
            _patched_graph_metadata(b, fb_view, in_capture=False)
        host = build_verify_host_plan(verify_lens_cpu=verify, prefix_lens_cpu=prefix, graph_num_tokens=tier,
                                      padded_bs=slots, seq_len_fill_value=1)
        w = wrappers[tier][0]
        same = (w._qo_indptr_buf[: slots + 1].cpu().tolist() == host.qo_indptr_host.tolist()
                and w._paged_kv_indptr_buf[: slots + 1].cpu().tolist() == host.kv_indptr_host.tolist())
        out = captured[tier].replay()
        if device == "cuda":
            torch.cuda.synchronize()
        ref, rho = world.reference(live)
        err = attention_error(out, ref, rho, live.num_real, case.shape.dtype)
        err["ok"] = err["ok"] and same
        section["cases"].append(_case_record(
            case, name=f"{case.name} replay {i}", mode="graph" + ("(cuda graph)" if device == "cuda" else
                                                                  "(stand-in)"),
            kernel="BatchPrefillWithPagedKVCacheWrapper", tier=tier, slots=slots, prefix_lens=prefix,
            verify_lens=verify, padded_verify_lens=list(host.verify_lens), lengths_from=replay.lengths_from,
            host_plan_matches_device=same, **err))


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


# ---------------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------------


def new_section() -> dict:
    return {"cases": [], "checks": {}, "controls": [], "exceptions": []}


def section_ok(section: dict, *, needs_cases: bool = True) -> bool:
    """Every check, case and control passed, nothing raised, and (a backend's section) at least one case ran."""
    return (bool(section["cases"]) or not needs_cases) and not section["exceptions"] and all(
        section["checks"].values()) and all(c["ok"] for c in section["cases"] + section["controls"])


def guarded(section: dict, name: str, fn: Callable, *args, **kwargs) -> None:
    """Run one case; an exception is recorded against the case (with where it was raised) and the run goes on."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a failing case is a verdict, not a crash of the harness
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        section["exceptions"].append(dict(
            case=name, error=f"{type(exc).__name__}: {exc}"[:400],
            where=f"{os.path.basename(frame.filename)}:{frame.lineno}"))


def _precision_facts() -> dict:
    import triton

    return dict(
        fp32_dot=triton.knobs.language.fp32_default or "tf32 (Triton's default on NVIDIA)",
        fp32_abs_tol=FP32_IEEE_ABS_TOL,
        bf16_unit_roundoff=BF16_UNIT_ROUNDOFF,
        bf16_rel_tol=BF16_REL_TOL,
        bf16_tol_basis="max |kernel - reference| / rho, rho = the reference attention of |V| (same weights)",
    )


def run_triton(device: str, section: dict, cases) -> None:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    section["checks"]["flag on after the patch"] = TritonAttnBackend.supports_ragged_verify_graph is True
    for seed, case in enumerate(cases.triton_eager):
        guarded(section, case.name, triton_eager_case, case, device, 100 + seed, section)
    for seed, case in enumerate(cases.triton_graph):
        guarded(section, case.name, triton_graph_case, case, device, 200 + seed, section)


def run_flashinfer(device: str, section: dict, cases, registration_checks) -> None:
    section["checks"].update(registration_checks())
    for seed, case in enumerate(cases.flashinfer_graph):
        guarded(section, case.name, flashinfer_graph_case, case, device, 400 + seed, section)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="all", choices=[*BACKENDS, "all"],
                    help="which patch to check (flashinfer needs CUDA; on the CPU its part is skipped)")
    ap.add_argument("--out", default=None, help="also write the JSON report here")
    args = ap.parse_args(argv)
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("on the CPU run with TRITON_INTERPRET=1 (set before triton is imported)", file=sys.stderr)
        return 2
    os.environ[F32_DEFAULT_ENV] = FP32_DOT_PRECISION  # before anything compiles (module docstring)
    torch.manual_seed(0)
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_dspark.patches import triton_ragged_verify

    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    if args.device != "cuda" and "flashinfer" in backends:
        backends.remove("flashinfer")  # FlashInfer's kernels need a GPU (the unit tests use a stand-in)
    cases = case_lists(args.device)
    ran = [*((*cases.triton_eager, *cases.triton_graph) if "triton" in backends else ()),
           *(cases.flashinfer_graph if "flashinfer" in backends else ())]
    report: dict[str, Any] = {"device": args.device, "backends": backends, "precision": _precision_facts(),
                              "coverage": {k: sorted(v) if isinstance(v, set) else v
                                           for k, v in coverage(ran).items()},
                              "shared": new_section()}
    shared = report["shared"]
    shared["checks"][f"fp32 dots compile at {FP32_DOT_PRECISION} precision ({F32_DEFAULT_ENV})"] = (
        report["precision"]["fp32_dot"] == FP32_DOT_PRECISION)
    flag_before = TritonAttnBackend.supports_ragged_verify_graph
    triton_ragged_verify.apply()
    registration = flashinfer_patch_registration() if "flashinfer" in backends else None
    HookRegistry.apply_hooks()
    guarded(shared, "layout kernels", layout_kernel_checks, args.device, shared)
    if "triton" in backends:
        report["triton"] = new_section()
        report["triton"]["checks"]["flag off before the patch"] = flag_before is False
        run_triton(args.device, report["triton"], cases)
    if "flashinfer" in backends:
        report["flashinfer"] = new_section()
        run_flashinfer(args.device, report["flashinfer"], cases, registration)
    for name in ("shared", *backends):
        report[name]["ok"] = section_ok(report[name], needs_cases=name != "shared")
    report["ok"] = all(report[name]["ok"] for name in ("shared", *backends))
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
