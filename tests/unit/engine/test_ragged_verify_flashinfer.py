"""FlashInfer ragged verify in CUDA graphs (issue #10, ``patches/flashinfer_ragged_verify.py``): the CPU-testable half.

FlashInfer's JIT kernels and ``plan()`` need a GPU; what is tested here is everything our patch computes on the host:

* the host plan (``build_verify_host_plan`` / ``with_host_plan``) against SGLang's own ``PaddedToBucket.torch`` and
  ``RaggedVerifyLayout.padded_to_bucket`` for random layouts and tiers (rows, sums, monotonicity, the padding rule);
* tier keying when tiers share a slot count S (one wrapper set per tier T, capacity T);
* the replay plan's kwargs assembly through a fake wrapper recording what ``fast_prefill_plan`` receives;
* where the host lengths come from (layout, batch mirrors, or a pinned copy), and the refusals;
* the ``speculative/dflash_info.py:168-171`` device-only layout fix, on SGLang's real ``generate_attn_arg_prefill``.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_metadata
from sglang_dspark.patches import flashinfer_ragged_verify as fi
from sglang_dspark.engine.self_check.ragged_verify_parity import random_ragged_batches


@pytest.fixture(scope="module")
def sgl():
    from sglang.kernels.ops.speculative.ragged_verify_kernels import BuildQoIndptr, PaddedToBucket
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    return SimpleNamespace(PaddedToBucket=PaddedToBucket, BuildQoIndptr=BuildQoIndptr, Layout=RaggedVerifyLayout)


def _random_prefix(seed, r):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 50, (r,), generator=g).tolist()


# ----------------------------------------------------------------------------------------------------------------------
# Host plan
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap_mode", ["full-coverage", "capped"])
def test_host_plan_matches_padded_to_bucket(sgl, cap_mode):
    batches = random_ragged_batches(seed=11, count=60)
    for i, (n, tier, slots, verify) in enumerate(batches):
        cap = n if cap_mode == "capped" else None
        prefix = _random_prefix(i, len(verify))
        plan = fi.build_verify_host_plan(verify_lens_cpu=verify, prefix_lens_cpu=prefix, graph_num_tokens=tier,
                                         padded_bs=slots, seq_len_fill_value=1, cap=cap)
        padded = sgl.PaddedToBucket.torch(verify_lens=torch.tensor(verify, dtype=torch.int32), graph_num_tokens=tier,
                                          bs=len(verify), padded_bs=slots)
        if cap is not None:
            padded = torch.clamp(padded, max=cap)
        case = (n, tier, slots, verify, cap)
        assert list(plan.verify_lens) == padded.tolist(), case
        assert plan.qo_indptr_host.tolist() == sgl.BuildQoIndptr.torch(verify_lens=padded).qo_indptr.tolist(), case
        assert plan.qo_indptr_host.numel() == slots + 1 and plan.kv_indptr_host.numel() == slots + 1
        assert plan.qo_indptr_host.dtype == plan.kv_indptr_host.dtype == plan.kv_lens_host.dtype == torch.int32
        assert all(b >= a for a, b in zip(plan.qo_indptr_host.tolist(), plan.qo_indptr_host.tolist()[1:]))
        if cap is None:
            assert int(plan.qo_indptr_host[-1]) == tier, case  # full coverage: q's T rows
        else:
            assert int(plan.qo_indptr_host[-1]) <= tier and plan.max_q_len <= n
        full_prefix = prefix + [1] * (slots - len(verify))
        want = ragged_verify_metadata(full_prefix, padded)
        assert plan.kv_lens_host.tolist() == want.kv_lens.tolist()
        assert plan.kv_indptr_host.tolist() == want.kv_indptr.tolist()
        assert plan.max_q_len == max(padded.tolist()) and plan.max_kv_len == max(want.kv_lens.tolist())
        assert list(plan.verify_lens[: len(verify)])[:-1] == verify[:-1]  # live rows kept (the last may take leftover)


def test_host_plan_padding_rule_examples():
    plan = fi.build_verify_host_plan(verify_lens_cpu=[4, 1], prefix_lens_cpu=[7, 3], graph_num_tokens=8, padded_bs=3)
    assert plan.verify_lens == (4, 1, 3) and plan.prefix_lens == (7, 3, 1)
    assert plan.qo_indptr_host.tolist() == [0, 4, 5, 8]
    assert plan.kv_lens_host.tolist() == [11, 4, 4] and plan.kv_indptr_host.tolist() == [0, 11, 15, 19]
    assert plan.fast_plan_kwargs() == dict(qo_indptr_host=plan.qo_indptr_host, kv_indptr_host=plan.kv_indptr_host,
                                           kv_lens_host=plan.kv_lens_host, max_q_len=4, max_kv_len=11)
    # R == S: the leftover lands on the last live row (PaddedToBucket), the total stays the tier.
    same = fi.build_verify_host_plan(verify_lens_cpu=[2, 3, 1], prefix_lens_cpu=[5, 8, 1, 99], graph_num_tokens=8,
                                     padded_bs=3)
    assert same.verify_lens == (2, 3, 3) and same.kv_lens_host.tolist() == [7, 11, 4]
    for bad in (dict(verify_lens_cpu=[]), dict(verify_lens_cpu=[0, 2]), dict(verify_lens_cpu=[5, 5]),
                dict(verify_lens_cpu=[1, 1], prefix_lens_cpu=[3])):
        args = dict(verify_lens_cpu=[1], prefix_lens_cpu=[3, 3], graph_num_tokens=8, padded_bs=3)
        args.update(bad)
        with pytest.raises(ValueError):
            fi.build_verify_host_plan(**args)


def test_with_host_plan_device_side_equals_host_side(sgl):
    for i, (n, tier, slots, verify) in enumerate(random_ragged_batches(seed=5, count=25)):
        for layout in (
            sgl.Layout.from_verify_lens_device(verify_lens=torch.tensor(verify, dtype=torch.int32),
                                               graph_num_tokens=tier),
            sgl.Layout.from_verify_lens(verify_lens_cpu=verify, device="cpu", grid=[tier]),
        ):
            plan = fi.build_verify_host_plan(verify_lens_cpu=verify, prefix_lens_cpu=_random_prefix(i, len(verify)),
                                             graph_num_tokens=tier, padded_bs=slots)
            out = fi.with_host_plan(layout, plan)
            assert out.bs == slots and out.graph_num_tokens == tier and out.total_verify_tokens == tier
            assert out.verify_lens.tolist() == list(plan.verify_lens)
            assert out.qo_indptr_device.tolist() == out.qo_indptr_host.tolist() == plan.qo_indptr_host.tolist()
            assert out.kv_lens_host is plan.kv_lens_host and out.max_q_len == plan.max_q_len
            assert out.max_kv_len == plan.max_kv_len and out.kv_indptr_host is plan.kv_indptr_host


# ----------------------------------------------------------------------------------------------------------------------
# Host lengths
# ----------------------------------------------------------------------------------------------------------------------


def test_host_lengths_sources(sgl):
    host = sgl.Layout.from_verify_lens(verify_lens_cpu=[2, 3], device="cpu", grid=[8])
    live = torch.tensor([10, 20])
    fb = SimpleNamespace(spec_info=SimpleNamespace(live_seq_lens_cpu=live),
                         seq_lens_cpu=torch.tensor([12, 23, 1]), seq_lens=torch.tensor([10, 20, 1]))
    assert fi.host_lengths(host, fb) == ([2, 3], [10, 20])
    device_only = sgl.Layout.from_verify_lens_device(verify_lens=torch.tensor([2, 3], dtype=torch.int32),
                                                     graph_num_tokens=8)
    assert fi.host_lengths(device_only, fb) == ([2, 3], [10, 20])  # seq_lens_cpu (prefix + verify) - live
    bare = SimpleNamespace(spec_info=SimpleNamespace(), seq_lens_cpu=None, seq_lens=torch.tensor([10, 20, 1]))
    assert fi.host_lengths(device_only, bare) == ([2, 3], [10, 20])  # the pinned-copy fallback (a plain copy on CPU)


# ----------------------------------------------------------------------------------------------------------------------
# The backend patch on a stand-in backend (tier keying, replay plan kwargs)
# ----------------------------------------------------------------------------------------------------------------------


class _Wrapper:
    def __init__(self, slots):
        self.slots = slots
        self._max_total_num_rows = None
        self.real_plans = []
        self.begin_forward = self._real_plan

    def _real_plan(self, *args, **kwargs):
        self.real_plans.append((args, kwargs))


class _Updater:
    """Stands in for FlashInferIndicesUpdaterPrefill.update -> call_begin_forward: plans wrapper 0 with the device
    qo/kv indptr ``generate_attn_arg_prefill`` derives from the (padded) layout and passes no host kwargs (the
    wrapper's begin_forward is not ``fast_prefill_plan``)."""

    def __init__(self):
        self.calls = []

    def update(self, rpi, seq_lens, seq_lens_cpu, seq_lens_sum, *, prefill_wrappers, spec_info, **kwargs):
        layout = spec_info.ragged_verify_layout
        assert layout.bs == len(rpi)  # generate_attn_arg_prefill then keeps the layout as is
        kv = ragged_verify_metadata(seq_lens.tolist(), layout.verify_lens.tolist())
        self.calls.append(dict(wrappers=prefill_wrappers, layout=layout, seq_lens_cpu=seq_lens_cpu, kwargs=kwargs))
        prefill_wrappers[0].begin_forward(
            layout.qo_indptr_device, kv.kv_indptr, torch.zeros(int(kv.kv_indptr[-1]), dtype=torch.int32),
            torch.ones(len(rpi), dtype=torch.int32), 4, 2, 16, 1, q_data_type=torch.float16,
            kv_data_type=torch.float16, custom_mask=None, non_blocking=True, fixed_split_size=None,
            prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
        )


class _FiBackend:
    prefill_backend = "fa2"
    dispatch_reason = None
    use_sliding_window_kv_pool = False
    skip_prefill = False

    def __init__(self):
        self.indices_updater_prefill = _Updater()
        self.created = []
        self.forward_metadata = None

    def _create_prefill_wrappers(self, bs, use_custom_mask=False):
        assert use_custom_mask is False
        wrappers = [_Wrapper(bs)]
        self.created.append(wrappers)
        return wrappers

    def get_cuda_graph_seq_len_fill_value(self):
        return 1


class _Mode:
    def is_target_verify(self):
        return True


def _batch(layout, slots, tier, *, seq_lens, seq_lens_cpu=None, live=None):
    return SimpleNamespace(
        forward_mode=_Mode(), batch_size=slots, positions=torch.zeros(tier, dtype=torch.int64),
        req_pool_indices=torch.arange(slots), seq_lens=torch.tensor(seq_lens), seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=sum(seq_lens) + tier, kv_loc_plan=None,
        spec_info=SimpleNamespace(ragged_verify_layout=layout, custom_mask=None, live_seq_lens_cpu=live),
    )


@pytest.fixture
def fake_upstream(monkeypatch):
    recorded = []

    def fast_prefill_plan(wrapper, *args, **kwargs):
        recorded.append((wrapper, args, kwargs))

    monkeypatch.setattr(fi, "_upstream_fast_prefill_plan", lambda: fast_prefill_plan)
    monkeypatch.setattr(fi, "_prefill_metadata", lambda wrappers: SimpleNamespace(prefill_wrappers=wrappers))
    return recorded


def _never(*args, **kwargs):
    raise AssertionError("upstream's init_forward_metadata_out_graph must not run for a ragged verify batch")


def test_tier_keying_and_replay_plan(sgl, fake_upstream):
    from sglang.kernels.ops.speculative.ragged_verify_kernels import pad_verify_lens_to_bucket
    from sglang.srt.speculative.ragged_verify import build_capture_verify_lens

    b, n = _FiBackend(), 4
    tiers = [4, 8, 12]  # every tier has S = min(T, max_bs) = 3 slots
    for tier in tiers:
        cap_layout = sgl.Layout.from_verify_lens(
            verify_lens_cpu=build_capture_verify_lens(num_tokens=tier, num_slots=3, num_draft_tokens=n),
            device="cpu", grid=tiers)
        fb = _batch(cap_layout, 3, tier, seq_lens=[1, 1, 1], seq_lens_cpu=torch.ones(3, dtype=torch.int64))
        fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, True)
        wrappers = b._dspark_rv_wrappers[tier]
        assert b.forward_metadata.prefill_wrappers is wrappers
        assert wrappers[0]._max_total_num_rows == tier  # plan capacity declared per tier
        assert len(wrappers[0].real_plans) == 1  # the capture plans with plan() (sets _cached_module)
        assert wrappers[0].begin_forward.func is fi.ragged_fast_prefill_plan  # replays plan host-fed
        assert fb.spec_info.ragged_verify_layout is cap_layout  # restored
    by_tier = b._dspark_rv_wrappers
    assert len({id(by_tier[t][0]) for t in tiers}) == 3 and all(w[0].slots == 3 for w in by_tier.values())
    assert not fake_upstream

    # Replay tier 8 with R = 2 live requests (device-only layout; host lengths from the batch's mirrors).
    live = sgl.Layout.from_verify_lens_device(verify_lens=torch.tensor([4, 1], dtype=torch.int32), graph_num_tokens=8)
    prefix = [7, 3]
    fb = _batch(live, 3, 8, seq_lens=prefix + [1], seq_lens_cpu=torch.tensor([7 + 4, 3 + 1, 1]),
                live=torch.tensor(prefix))
    fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, False)
    call = b.indices_updater_prefill.calls[-1]
    assert call["wrappers"] is by_tier[8]
    assert call["layout"].verify_lens.tolist() == pad_verify_lens_to_bucket(
        verify_lens=torch.tensor([4, 1]), graph_num_tokens=8, bs=2, padded_bs=3).tolist() == [4, 1, 3]
    wrapper, args, kwargs = fake_upstream[-1]
    assert wrapper is by_tier[8][0]
    assert kwargs["qo_indptr_host"].tolist() == args[0].tolist() == [0, 4, 5, 8]  # host plan == device qo_indptr
    assert kwargs["kv_indptr_host"].tolist() == args[1].tolist() == [0, 11, 15, 19]
    assert kwargs["kv_lens_host"].tolist() == [11, 4, 4] and (kwargs["max_q_len"], kwargs["max_kv_len"]) == (4, 11)
    assert kwargs["custom_mask"] is None and kwargs["non_blocking"] is True and "uniform_verify_width" not in kwargs
    assert fb.spec_info.ragged_verify_layout is live and b._dspark_rv_host_plan.plan is None  # restored

    # The same S, another tier: its own wrappers and plan.
    live12 = sgl.Layout.from_verify_lens(verify_lens_cpu=[4, 3, 4], device="cpu", grid=tiers)
    fb = _batch(live12, 3, 12, seq_lens=[2, 15, 6], seq_lens_cpu=torch.tensor([6, 18, 10]),
                live=torch.tensor([2, 15, 6]))
    fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, False)
    wrapper, args, kwargs = fake_upstream[-1]
    assert wrapper is by_tier[12][0]
    assert kwargs["qo_indptr_host"].tolist() == [0, 4, 7, 12]  # the leftover token on the last row


def test_replay_refusals(sgl, fake_upstream):
    b = _FiBackend()
    live = sgl.Layout.from_verify_lens(verify_lens_cpu=[1], device="cpu", grid=[4])
    fb = _batch(live, 3, 4, seq_lens=[5, 1, 1], seq_lens_cpu=torch.tensor([6, 1, 1]), live=torch.tensor([5]))
    with pytest.raises(RuntimeError, match="no ragged verify wrappers captured"):
        fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, False)
    fb.positions = torch.zeros(5)
    with pytest.raises(RuntimeError, match="tokens"):
        fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, True)
    b.prefill_backend = "fa3"
    with pytest.raises(NotImplementedError, match="fa2"):
        fi.init_forward_metadata_out_graph_with_ragged_verify(_never, b, fb, True)


def test_non_ragged_batches_take_upstream():
    seen = []
    fb = SimpleNamespace(forward_mode=_Mode(), spec_info=SimpleNamespace(ragged_verify_layout=None))
    fi.init_forward_metadata_out_graph_with_ragged_verify(lambda self, fb, cap: seen.append(cap), _FiBackend(), fb,
                                                         True)
    assert seen == [True]


def test_ragged_fast_prefill_plan_kwargs_assembly():
    recorded = []
    plan = fi.build_verify_host_plan(verify_lens_cpu=[2, 1], prefix_lens_cpu=[3, 4], graph_num_tokens=4, padded_bs=2)
    slot = fi.HostPlanSlot()
    qo = plan.qo_indptr_host.clone()
    rec = lambda w, *a, **k: recorded.append((w, a, k))  # noqa: E731
    with pytest.raises(RuntimeError, match="without a host plan"):
        fi.ragged_fast_prefill_plan("w", slot, qo, fast_plan=rec)
    slot.plan = plan
    # Uniform-width host kwargs (what call_begin_forward builds for fast_prefill_plan) are replaced.
    fi.ragged_fast_prefill_plan("w", slot, qo, "kv", qo_indptr_host=torch.arange(0, 9, 4), max_q_len=4,
                                uniform_verify_width=4, causal=True, fast_plan=rec)
    w, args, kwargs = recorded[-1]
    assert w == "w" and args == (qo, "kv") and kwargs["causal"] is True
    assert kwargs["qo_indptr_host"] is plan.qo_indptr_host and kwargs["max_q_len"] == 2  # [2, 1] -> [2, 2]
    assert "uniform_verify_width" not in kwargs
    with pytest.raises(NotImplementedError):
        fi.ragged_fast_prefill_plan("w", slot, qo, custom_mask=torch.ones(1), fast_plan=rec)
    with pytest.raises(RuntimeError, match="slots"):
        fi.ragged_fast_prefill_plan("w", slot, torch.zeros(5), fast_plan=rec)


@pytest.mark.parametrize("attrs,needle", [
    (dict(prefill_backend="fa3"), "fa2"),
    (dict(dispatch_reason="SLIDING_WINDOW"), "dispatch"),
    (dict(use_sliding_window_kv_pool=True), "sliding-window"),
    (dict(skip_prefill=True), "skip_prefill"),
    ({}, ""),
])
def test_graph_support_reason(attrs, needle):
    b = _FiBackend()
    for k, v in attrs.items():
        setattr(b, k, v)
    reason = fi.ragged_graph_support_reason(b)
    assert (needle in reason) if needle else reason == ""
    assert fi.supports_ragged_verify_graph(b) is (not reason)


def test_gpu_checks_listed():
    assert len(fi.GPU_CHECKS) >= 4 and any("greedy" in c for c in fi.GPU_CHECKS)


# ----------------------------------------------------------------------------------------------------------------------
# speculative/dflash_info.py:168-171 with a device-only layout
# ----------------------------------------------------------------------------------------------------------------------


class _Translator:
    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, kv_start_idx=None, kind=None):
        out[: int(indptr[-1])] = 7
        return True


def test_dflash_generate_attn_arg_device_only_layout(sgl):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    layout = sgl.Layout.from_verify_lens_device(verify_lens=torch.tensor([3, 1], dtype=torch.int32),
                                                graph_num_tokens=8)
    spec = DFlashVerifyInput(draft_token=torch.zeros(8, dtype=torch.long), positions=torch.zeros(8, dtype=torch.long),
                             draft_token_num=4, ragged_verify_layout=layout)
    kwargs = dict(req_pool_indices=torch.arange(2), paged_kernel_lens=torch.tensor([5, 9]), paged_kernel_lens_sum=14,
                  translator=_Translator(), plan=None)
    upstream = DFlashVerifyInput.generate_attn_arg_prefill
    upstream = getattr(upstream, "__wrapped__", upstream)
    with pytest.raises(TypeError):  # upstream: paged_kernel_lens_sum + None
        upstream(spec, **kwargs)
    kv_indices, kv_indptr, qo_indptr, mask = fi.generate_attn_arg_prefill_device_only_layouts(upstream, spec, **kwargs)
    assert spec.ragged_verify_layout is layout  # restored
    assert kv_indices.numel() == 14 + 8  # graph_num_tokens stands in for the real 4 tokens
    assert kv_indptr.tolist() == [0, 8, 18] and qo_indptr.tolist() == [0, 3, 4] and mask is None
    # Host layouts, and a kv_indices buffer, keep upstream's path untouched.
    host = sgl.Layout.from_verify_lens(verify_lens_cpu=[3, 1], device="cpu", grid=[8])
    spec.ragged_verify_layout = host
    out = fi.generate_attn_arg_prefill_device_only_layouts(upstream, spec, **kwargs)
    assert out[0].numel() == 14 + 4


def _flashinfer_run_rows_check(q_rows: int, qo_indptr: torch.Tensor) -> None:
    """BatchPrefillWithPagedKVCacheWrapper.run's check (FI 0.7.2 prefill.py:3440-3445, 0.7.4 :4840-4845)."""
    if q_rows != int(qo_indptr[-1]):
        raise ValueError(f"q.shape[0] ({q_rows}) does not match qo_indptr[-1] ({int(qo_indptr[-1])}).")


def test_eager_flashinfer_device_only_layout_covers_the_tier(sgl):
    """Issue #38 item 4: a compact graph batch that runs eager on FlashInfer's MHA backend carries q for the whole tier
    (BuildRaggedVerifyWindow pads to graph_num_tokens); the layout handed to FlashInfer must cover those rows or its
    run() raises. The fix pads it to its own R rows (PaddedToBucket full coverage) and the real rows attend as
    before."""
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_attention_torch

    verify, tier, prefix = [3, 1, 2], 16, [5, 9, 4]
    layout = sgl.Layout.from_verify_lens_device(verify_lens=torch.tensor(verify, dtype=torch.int32),
                                                graph_num_tokens=tier)
    spec = DFlashVerifyInput(draft_token=torch.zeros(tier, dtype=torch.long),
                             positions=torch.zeros(tier, dtype=torch.long), draft_token_num=8,
                             ragged_verify_layout=layout)
    # FlashInfer MHA's call (flashinfer_backend.py:2270-2282) passes kind and kv_start_idx.
    kwargs = dict(req_pool_indices=torch.arange(3), paged_kernel_lens=torch.tensor(prefix), paged_kernel_lens_sum=18,
                  translator=_Translator(), plan=None, kind=None, kv_start_idx=None)
    upstream = DFlashVerifyInput.generate_attn_arg_prefill
    upstream = getattr(upstream, "__wrapped__", upstream)
    # Before: the allocation-only fix left qo_indptr at the real 6 rows, and FlashInfer refused q's 16.
    spec_alloc_only = DFlashVerifyInput(draft_token=spec.draft_token, positions=spec.positions, draft_token_num=8,
                                        ragged_verify_layout=layout)
    no_kind = {k: v for k, v in kwargs.items() if k not in ("kind", "kv_start_idx")}
    _, _, qo_alloc_only, _ = fi.generate_attn_arg_prefill_device_only_layouts(upstream, spec_alloc_only, **no_kind)
    with pytest.raises(ValueError, match="does not match qo_indptr"):
        _flashinfer_run_rows_check(tier, qo_alloc_only)
    kv_indices, kv_indptr, qo_indptr, mask = fi.generate_attn_arg_prefill_device_only_layouts(upstream, spec, **kwargs)
    assert spec.ragged_verify_layout is layout and mask is None  # restored for everything after attention
    _flashinfer_run_rows_check(tier, qo_indptr)  # q's tier rows are covered now
    padded = fi.full_coverage_layout(layout)
    assert padded.verify_lens.tolist() == [3, 1, 12] and padded.total_verify_tokens == tier == padded.graph_num_tokens
    assert qo_indptr.tolist() == [0, 3, 4, 16] and kv_indptr.tolist() == [0, 8, 18, 34]
    assert kv_indices.numel() == 18 + tier
    # The real rows attend exactly as with the unpadded layout (bottom-right causal: padding rows come after them).
    g = torch.Generator().manual_seed(3)
    q = torch.randn(tier, 4, 16, generator=g)
    k_cache, v_cache = torch.randn(64, 2, 16, generator=g), torch.randn(64, 2, 16, generator=g)
    req_to_token = torch.randperm(64, generator=g)[:3 * 20].view(3, 20)
    rows = sum(verify)
    real = ragged_verify_attention_torch(q, k_cache, v_cache, req_to_token, torch.arange(3), prefix, verify)
    covered = ragged_verify_attention_torch(q, k_cache, v_cache, req_to_token, torch.arange(3), prefix,
                                            padded.verify_lens.tolist())
    assert torch.allclose(real[:rows], covered[:rows], atol=1e-6, rtol=0)  # same rows, another matmul size


# ----------------------------------------------------------------------------------------------------------------------
# The GPU check's FlashInfer flow, on a stand-in honouring FlashInfer's contract, through upstream's fast_prefill_plan
# ----------------------------------------------------------------------------------------------------------------------


class _StandInPrefillWrapper:
    """BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True) as far as the flow needs it: ``plan`` reads the device
    indptrs to the host (FI:prefill.py:3810); ``_cached_module.plan`` receives the host plan (what upstream's
    ``fast_prefill_plan`` hands it); ``forward`` reads q/kv lengths from the fixed device buffers but writes each
    request's output rows at the *host-planned* offsets (FI:prefill.cuh:4424-4428) — a host plan that disagrees with
    the device layout puts rows in the wrong place. Output in q's dtype (bf16: rounded like FlashInfer's)."""

    def __init__(self, workspace, kv_layout, *, use_cuda_graph, backend, qo_indptr_buf, paged_kv_indptr_buf,
                 paged_kv_indices_buf, paged_kv_last_page_len_buf):
        assert kv_layout == "NHD" and use_cuda_graph and backend == "fa2"
        self.is_cuda_graph_enabled, self._backend, self.device = True, backend, workspace.device
        self._float_workspace_buffer = workspace
        self._int_workspace_buffer = self._pin_memory_int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)
        self._qo_indptr_buf, self._paged_kv_indptr_buf = qo_indptr_buf, paged_kv_indptr_buf
        self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = paged_kv_indices_buf, paged_kv_last_page_len_buf
        self._custom_mask_buf = None
        self._max_total_num_rows = None
        self._cached_module = None
        self.host_plans = []

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, d, page_size, **kwargs):
        self._qo_indptr_buf.copy_(qo_indptr)
        self._paged_kv_indptr_buf.copy_(kv_indptr)
        self._paged_kv_indices_buf[: kv_indices.numel()].copy_(kv_indices)
        wrapper = self

        class _Module:
            @staticmethod
            def plan(*args):
                wrapper.host_plans.append((args[3].clone(), args[4].clone(), args[5].clone(), args[6]))
                return "plan-info"

        self._cached_module = _Module()
        _Module.plan(None, None, None, qo_indptr.cpu(), kv_indptr.cpu(), (kv_indptr[1:] - kv_indptr[:-1]).cpu(),
                     int(qo_indptr[-1]))

    begin_forward = plan

    def forward(self, q, paged_kv, causal=True, sm_scale=None, **kwargs):
        k_cache, v_cache = paged_kv  # SGLang's pool: (slots, Hkv, D), page size 1
        host_qo = self.host_plans[-1][0].tolist()
        dev_qo, dev_kv = self._qo_indptr_buf.tolist(), self._paged_kv_indptr_buf.tolist()
        out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)
        hkv, dv = k_cache.shape[1], v_cache.shape[-1]
        group = q.shape[1] // hkv
        scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
        for r in range(len(dev_qo) - 1):
            nq, nk = dev_qo[r + 1] - dev_qo[r], dev_kv[r + 1] - dev_kv[r]
            slots = self._paged_kv_indices_buf[dev_kv[r]:dev_kv[r + 1]].long()
            k, v = k_cache[slots].float(), v_cache[slots].float()
            qr = q[dev_qo[r]:dev_qo[r + 1]].float().view(nq, hkv, group, q.shape[-1])
            s = torch.einsum("qhgd,khd->hgqk", qr, k) * scale
            mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]  # bottom-right causal
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
            o = torch.einsum("hgqk,khd->qhgd", p, v).reshape(nq, hkv * group, dv)
            out[host_qo[r]:host_qo[r] + nq] = o.to(q.dtype)
        return out


STAND_IN_FLASHINFER = SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_StandInPrefillWrapper)


def _stand_in_run(cases):
    from sglang_dspark.engine.self_check import ragged_verify_parity as parity

    section = parity.new_section()
    for seed, case in enumerate(cases):
        parity.guarded(section, case.name, parity.flashinfer_graph_case, case, "cpu", 400 + seed, section,
                       flashinfer=STAND_IN_FLASHINFER)
    return section


def test_gpu_check_flashinfer_flow_on_a_stand_in():
    """The harness's FlashInfer half through the patch's own glue (patched init_forward_metadata_out_graph, tier
    wrappers from upstream's _create_prefill_wrappers, host lengths from all three sources, upstream's
    call_begin_forward / generate_attn_arg_prefill / fast_prefill_plan, the backend's forward_extend), on the
    stand-in."""
    from sglang_dspark.engine.self_check import ragged_verify_parity as parity
    from sglang_dspark.engine.self_check.ragged_verify_cases import CPU_FLASHINFER_GRAPH

    section = _stand_in_run(CPU_FLASHINFER_GRAPH)
    assert parity.section_ok(section), section
    assert len(section["cases"]) == sum(len(c.replays) for c in CPU_FLASHINFER_GRAPH)
    assert {c["lengths_from"] for c in section["cases"]} == {"layout", "batch", "device"}
    for r in section["cases"]:
        assert r["host_plan_matches_device"] and r["error"] <= parity.BF16_REL_TOL, r
        assert sum(r["padded_verify_lens"]) == r["tier"]
        assert r["error"] <= parity.BF16_UNIT_ROUNDOFF, r  # the stand-in rounds only its output to bf16
    assert any("upstream refuses" in name for name in section["checks"])


def test_gpu_flashinfer_case_list_on_the_stand_in():
    """A realistic shape of the GPU list (head dim 128, GQA 4:1, a 4096-token prefix, four tiers sharing 8 slots)
    through the same glue, torch only (one replay: CPU time)."""
    from sglang_dspark.engine.self_check import ragged_verify_parity as parity
    from sglang_dspark.engine.self_check.ragged_verify_cases import GPU_FLASHINFER_GRAPH

    realistic = GPU_FLASHINFER_GRAPH[0]
    section = _stand_in_run([dataclasses.replace(realistic, replays=realistic.replays[1:2])])
    assert parity.section_ok(section), section
    assert max(max(c["prefix_lens"]) for c in section["cases"]) == 4096


def test_a_host_plan_off_by_one_fails_the_stand_in_case(monkeypatch):
    """The check can fail: a host plan one row off puts FlashInfer's output rows in the wrong place."""
    from sglang_dspark.engine.self_check import ragged_verify_parity as parity
    from sglang_dspark.engine.self_check.ragged_verify_cases import CPU_FLASHINFER_GRAPH

    real = fi.build_verify_host_plan

    def off_by_one(**kwargs):
        plan = real(**kwargs)
        qo = plan.qo_indptr_host.clone()
        qo[1:-1] -= 1  # every request's rows one row early (still inside q)
        return fi.VerifyHostPlan(**{**plan.__dict__, "qo_indptr_host": qo})

    monkeypatch.setattr(fi, "build_verify_host_plan", off_by_one)
    section = _stand_in_run(CPU_FLASHINFER_GRAPH[:1])
    assert not parity.section_ok(section)
    assert any(not c["ok"] and c["error"] > parity.BF16_REL_TOL for c in section["cases"])
