"""Ragged (compact) DSpark verify on SGLang 0.5.23's FlashInfer MHA backend inside CUDA graphs (issue #10).

Installed (``apply()``, by ``plugin.register`` in the scheduler processes) only where the launcher chose compact on
flashinfer with CUDA graphs, which it does only after this patch passed the on-device self-check at start-up
(``engine/self_check/ragged_self_check.py``: the FlashInfer half of ``engine/self_check/ragged_verify_parity.py`` on the GPU, cached per GPU
and software); otherwise flashinfer stays static under graphs. FlashInfer's JIT kernels need a GPU, so only the host
side below is tested on the CPU (tests/unit/engine/test_ragged_verify_flashinfer.py); ``GPU_CHECKS`` lists what a
maintainer's GPU run adds (scripts/gpu_smoke.sh).

Upstream (paths under ``sglang/srt/`` unless ``FI:`` = flashinfer 0.7.4):

* ``layers/attention/flashinfer_backend.py:754-762``: ``init_forward_metadata_out_graph`` raises
  NotImplementedError for any TARGET_VERIFY batch with a ``ragged_verify_layout`` (capture dies: "Capture cuda graph
  failed", ``model_executor/runner/decode_cuda_graph_runner.py:598-604``).
* A ``BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True)`` accepts ragged q lengths per replay with a fixed
  batch size (``FI:prefill.py:4045-4051``) and total rows <= ``max_total_num_rows`` (``FI:prefill.py:3040-3050``,
  fixed by the first plan when not declared, ``:4035-4036``). But ``plan()`` is a host scheduler: it reads
  ``qo_indptr``/``kv_indptr`` on the host (``FI:prefill.py:3810``) and the kernel writes its output at the
  host-planned ``o_indptr`` (``FI:.../prefill.cuh:4424-4428``, ``FI:.../scheduler.cuh:672-676``). An upper-bound plan
  is therefore wrong: the *exact* per-request lengths must be on the host before every replay's plan.
* ``fast_prefill_plan`` (``flashinfer_backend.py:180-313``) plans from host metadata passed in (no D2H); upstream
  installs it for uniform DFLASH verify at capture (``:868-885``) and feeds it uniform host kwargs from
  ``call_begin_forward`` (``:2349-2391``) only when ``begin_forward.func is fast_prefill_plan``.

Design implemented here (AROUND ``FlashInferAttnBackend.init_forward_metadata_out_graph`` for TARGET_VERIFY batches
carrying a layout; every other batch takes upstream's path):

1. Tier keying: prefill wrappers per token tier ``T = layout.graph_num_tokens`` (``self._dspark_rv_wrappers[T]``),
   not per slot count ``S``: every tier >= max_bs has ``S = max_bs`` slots (``decode_cuda_graph_runner.py:791-794``)
   and upstream's ``prefill_cuda_graph_metadata[bs]`` would make them share one plan capacity. Capacity
   ``max_total_num_rows = T`` (the capture layout packs exactly T rows: ``build_capture_verify_lens``).
2. Device layout: ``layout.padded_to_bucket(padded_bs=S)`` (PaddedToBucket, full coverage: rows sum to T even when
   ``R == S``, so q's T rows match the plan), handed to upstream's ``DFlashVerifyInput.generate_attn_arg_prefill``
   (which then keeps it as is: same ``bs``), so the device ``qo_indptr``/``kv_indptr``/``kv_indices`` are upstream's.
3. Host plan: :func:`build_verify_host_plan` mirrors that padding on the host from the exact lengths:
   ``verify_lens`` from the layout's host copy, else ``forward_batch.seq_lens_cpu - spec_info.live_seq_lens_cpu``
   (``_run_ragged`` already put prefix + verify length there with its own D2H, ``speculative/dspark_components/
   dspark_verify.py:436-452``: no new sync), else a pinned non-blocking D2H waited on by an event right before
   planning; ``kv_lens = prefix + padded verify_lens`` (padding slots: the runner's seq-len fill value).
4. Replay plan: after the capture-time real ``plan()`` (which sets ``_cached_module``), each tier wrapper's
   ``begin_forward`` becomes :func:`ragged_fast_prefill_plan`, which adds the host plan's kwargs and calls upstream's
   ``fast_prefill_plan`` (sync-free). No custom mask: causal, bottom-right aligned, is exact for a linear chain with
   ``q_len <= kv_len``.
5. ``supports_ragged_verify_graph`` becomes a property: True only for the fa2 prefill backend, one wrapper (no
   sliding-window / cross-attention dispatch), no SWA pool (``fast_prefill_plan`` is fa2-only and single-wrapper).

Also here: :func:`generate_attn_arg_prefill_device_only_layouts`, the eager FlashInfer path of a device-only layout
(``from_verify_lens_device``: ``total_verify_tokens is None``; reachable whenever a compact graph batch falls back to
eager, e.g. a batch with ``replace_embeds``). Two faults there: ``speculative/dflash_info.py:168-171`` sizes
``kv_indices`` as ``paged_kernel_lens_sum + None`` (TypeError); and such a batch carries q for the whole tier
(``BuildRaggedVerifyWindow``: ``padded_total = layout.graph_num_tokens``, ``kernels/ops/speculative/dspark/
dspark_verify_window.py:98``) while the layout's ``qo_indptr`` ends at the real token count, which FlashInfer's
``run()`` refuses ("q.shape[0] ... does not match qo_indptr[-1]", ``FI:prefill.py:3440-3445`` in 0.7.2,
``:4840-4845`` in 0.7.4). The fix hands upstream the layout's full-coverage padding to its own size
(``padded_to_bucket(padded_bs=R)``: SGLang's PaddedToBucket, the leftover rows on the last request, exactly as a
graph replay with R == S slots does): ``qo_indptr[-1]`` is then the tier, q's row count, and ``total_verify_tokens``
the tier. The real rows attend exactly as before: causal attention is bottom-right aligned, so row i of a request
sees ``kv <= prefix + i`` however many padding rows follow it; the padding rows' outputs are never read
(``ScatterCompactToStrided`` reads the live rows only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch

from sglang_dspark.kernels.ragged_verify_attention import pad_verify_lens_host
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

BACKEND = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend"
GRAPH_METADATA_TARGET = f"{BACKEND}.init_forward_metadata_out_graph"
GENERATE_ATTN_ARG_TARGET = "sglang.srt.speculative.dflash_info.DFlashVerifyInput.generate_attn_arg_prefill"

# What a maintainer's GPU run checks beyond the start-up self-check (also in
# scripts/gpu_smoke.sh's comment and ``python -m sglang_dspark.testing.gpu_smoke --backends flashinfer``).
GPU_CHECKS = (
    "capture: every token tier T captures (no NotImplementedError / 'Capture cuda graph failed'), one wrapper set per "
    "T, plan capacity T (tiers >= max_bs share S = max_bs slots)",
    "replay: greedy output of ours and of SGLANG_RAGGED_VERIFY_MODE=static with --attention-backend flashinfer "
    "scored by no-spec in bfloat16 (FlashInfer has no fp32 attention): match rate >= 0.90 and every differing token "
    "within 1 nat of no-spec's (a tie broken the other way), at c = 1 and c = 16 (ragged rows of different "
    "lengths every step)",
    "replay: no 'fast_prefill_plan' assertion, no FlashInfer 'exceed the number of rows' / workspace-size error; "
    "steps that fall back to eager (device-only layouts) run through the dflash_info fix",
    "no device sync added: nsys shows no cudaStreamSynchronize/cudaMemcpy D2H in the verify metadata prep beyond "
    "upstream's _run_ragged verify_lens read (dspark_verify.py:445-450)",
    "throughput: compact graphs vs static graphs with --attention-backend flashinfer at c = 1, 16 (tok/s)",
)



# ---------------------------------------------------------------------------------------------------------------------
# Host plan (pure: no SGLang import)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyHostPlan:
    """The host side of a padded ragged verify plan: what ``fast_prefill_plan`` takes as keyword arguments.

    ``verify_lens`` (S rows) is SGLang's PaddedToBucket padding of the live lengths; ``qo_indptr_host`` =
    ``[0, cumsum(verify_lens)]``; ``kv_lens_host`` = ``prefix + verify_lens`` (FlashInfer's paged KV holds the verify
    rows too); ``kv_indptr_host`` = ``[0, cumsum(kv_lens_host)]``. All int32 CPU tensors.
    """

    graph_num_tokens: int
    padded_bs: int
    verify_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_lens_host: torch.Tensor
    max_q_len: int
    max_kv_len: int

    def fast_plan_kwargs(self) -> dict[str, Any]:
        """The host keyword arguments of upstream's ``fast_prefill_plan`` (flashinfer_backend.py:202-213)."""
        return dict(
            qo_indptr_host=self.qo_indptr_host,
            kv_indptr_host=self.kv_indptr_host,
            kv_lens_host=self.kv_lens_host,
            max_q_len=self.max_q_len,
            max_kv_len=self.max_kv_len,
        )


def _indptr_host(lens: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    if lens:
        out[1:] = torch.cumsum(torch.tensor(list(lens), dtype=torch.int64), dim=0).to(torch.int32)
    return out


def build_verify_host_plan(
    *,
    verify_lens_cpu: Sequence[int],
    prefix_lens_cpu: Sequence[int],
    graph_num_tokens: int,
    padded_bs: int,
    seq_len_fill_value: int = 1,
    cap: Optional[int] = None,
) -> VerifyHostPlan:
    """Host plan for ``padded_bs`` slots of a tier of ``graph_num_tokens`` tokens.

    ``verify_lens_cpu``: the R live verify lengths; ``prefix_lens_cpu``: the committed prefix of each live request
    (R values, or S with the padding slots' values, which must then equal ``seq_len_fill_value``'s role: the device
    ``seq_lens`` of the padded slots); padding slots get ``seq_len_fill_value``. Padding is SGLang's PaddedToBucket
    rule (:func:`sglang_dspark.kernels.ragged_verify_attention.pad_verify_lens_host`), ``cap`` its optional clamp.
    """
    verify = [int(v) for v in verify_lens_cpu]
    r = len(verify)
    if r == 0:
        raise ValueError("a ragged verify layout has at least one request")
    if min(verify) < 1:
        raise ValueError(f"every request verifies its anchor (verify_len >= 1), got {verify}")
    if sum(verify) > graph_num_tokens:
        raise ValueError(f"{sum(verify)} verify tokens exceed the tier's {graph_num_tokens}")
    prefix_in = [int(p) for p in prefix_lens_cpu]
    if len(prefix_in) < r:
        raise ValueError(f"{len(prefix_in)} prefix lengths for {r} requests")
    padded = pad_verify_lens_host(verify, graph_num_tokens, padded_bs, cap=cap)
    prefix = prefix_in[:r] + [int(seq_len_fill_value)] * (padded_bs - r)
    kv_lens = [p + v for p, v in zip(prefix, padded)]
    return VerifyHostPlan(
        graph_num_tokens=int(graph_num_tokens),
        padded_bs=int(padded_bs),
        verify_lens=tuple(padded),
        prefix_lens=tuple(prefix),
        qo_indptr_host=_indptr_host(padded),
        kv_indptr_host=_indptr_host(kv_lens),
        kv_lens_host=torch.tensor(kv_lens, dtype=torch.int32),
        max_q_len=max(padded),
        max_kv_len=max(kv_lens),
    )


def with_host_plan(layout: Any, plan: VerifyHostPlan, *, cap: Optional[int] = None):
    """The device layout padded to the plan's slots (``padded_to_bucket``, always: even when R == S the leftover goes
    to the last row, as PaddedToBucket does) carrying the plan in its host fields (``qo_indptr_host``,
    ``kv_indptr_host``, ``kv_lens_host``, ``max_q_len``, ``max_kv_len``: ``speculative/ragged_verify.py:53-57``,
    unused upstream)."""
    import msgspec

    padded = layout.padded_to_bucket(padded_bs=plan.padded_bs, cap=cap)
    return msgspec.structs.replace(
        padded,
        qo_indptr_host=plan.qo_indptr_host,
        kv_indptr_host=plan.kv_indptr_host,
        kv_lens_host=plan.kv_lens_host,
        max_q_len=plan.max_q_len,
        max_kv_len=plan.max_kv_len,
    )


def read_lens_to_host(lens: torch.Tensor, count: int) -> list[int]:
    """Exact lengths on the host: a non-blocking copy into pinned memory and an event waited on right here (only
    when neither the layout nor the batch carries host lengths; a no-op copy on the CPU)."""
    lens = lens[:count]
    if lens.device.type == "cpu":
        return [int(v) for v in lens.tolist()]
    host = torch.empty(count, dtype=lens.dtype, pin_memory=True)
    host.copy_(lens, non_blocking=True)
    event = torch.get_device_module(lens.device).Event()
    event.record()
    event.synchronize()
    return [int(v) for v in host.tolist()]


def host_lengths(layout: Any, forward_batch: Any) -> tuple[list[int], list[int]]:
    """(verify_lens, committed prefix) of the R live requests on the host, without a new device sync when upstream
    already has them: the layout's ``verify_lens_cpu``; the batch's ``seq_lens_cpu`` (prefix + verify length for the
    live rows, set by ``_run_ragged``) minus ``spec_info.live_seq_lens_cpu`` (the committed prefix)."""
    r = int(layout.bs)
    spec_info = forward_batch.spec_info
    live = getattr(spec_info, "live_seq_lens_cpu", None)
    seq_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    if layout.verify_lens_cpu is not None:
        verify = [int(v) for v in layout.verify_lens_cpu]
    elif live is not None and seq_cpu is not None:
        verify = [int(a) - int(b) for a, b in zip(seq_cpu[:r].tolist(), live[:r].tolist())]
    else:
        verify = read_lens_to_host(layout.verify_lens, r)
    if live is not None:
        prefix = [int(v) for v in live[:r].tolist()]
    else:
        prefix = read_lens_to_host(forward_batch.seq_lens, r)
    return verify, prefix


# ---------------------------------------------------------------------------------------------------------------------
# Replay plan and kwargs assembly
# ---------------------------------------------------------------------------------------------------------------------


class HostPlanSlot:
    """The host plan of the replay being prepared (set around ``indices_updater_prefill.update``)."""

    def __init__(self) -> None:
        self.plan: Optional[VerifyHostPlan] = None


def _upstream_fast_prefill_plan() -> Callable:
    from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan

    return fast_prefill_plan


def ragged_fast_prefill_plan(wrapper, slot: HostPlanSlot, *args, fast_plan: Optional[Callable] = None, **kwargs):
    """``begin_forward`` of a tier wrapper at replay: upstream's sync-free ``fast_prefill_plan`` with the exact host
    plan of this replay. ``call_begin_forward`` (flashinfer_backend.py:2349-2414) passes no host kwargs here (our
    ``func`` is not ``fast_prefill_plan``), so this adds them; any it did pass would be uniform-width and is
    replaced."""
    plan = slot.plan
    if plan is None:
        raise RuntimeError("sglang-dspark flashinfer ragged verify: a tier wrapper was planned without a host plan")
    if kwargs.get("custom_mask") is not None:
        raise NotImplementedError("sglang-dspark flashinfer ragged verify runs without a custom mask")
    qo_indptr = args[0] if args else kwargs.get("qo_indptr")
    if qo_indptr is not None and int(qo_indptr.numel()) != plan.padded_bs + 1:
        raise RuntimeError(
            f"ragged verify host plan has {plan.padded_bs} slots but the device qo_indptr {qo_indptr.numel() - 1}")
    for key in ("qo_indptr_host", "kv_indptr_host", "kv_lens_host", "max_q_len", "max_kv_len",
                "uniform_verify_width"):
        kwargs.pop(key, None)
    kwargs.update(plan.fast_plan_kwargs())
    return (fast_plan or _upstream_fast_prefill_plan())(wrapper, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# The backend patch
# ---------------------------------------------------------------------------------------------------------------------


def ragged_graph_support_reason(backend: Any) -> str:
    """Empty when this FlashInfer backend can run ragged verify graphs, else why not."""
    if getattr(backend, "skip_prefill", False):
        return "the backend has no prefill wrappers (skip_prefill)"
    if getattr(backend, "prefill_backend", None) != "fa2":
        return f"fast_prefill_plan supports the fa2 prefill backend only (got {backend.prefill_backend!r})"
    if getattr(backend, "dispatch_reason", None) is not None:
        return f"wrapper dispatch {backend.dispatch_reason} (sliding window / cross attention) plans several wrappers"
    if getattr(backend, "use_sliding_window_kv_pool", False):
        return "a sliding-window KV pool"
    return ""


def supports_ragged_verify_graph(backend: Any) -> bool:
    return not ragged_graph_support_reason(backend)


def _prefill_metadata(wrappers):
    from sglang.srt.layers.attention.flashinfer_backend import PrefillMetadata

    return PrefillMetadata(wrappers, False, False)


def make_tier_wrappers(backend: Any, slots: int, tier: int) -> list:
    """Upstream's verify wrappers (``_create_prefill_wrappers``: fixed qo/kv indptr, kv indices and last-page
    buffers, ``use_cuda_graph=True``, no custom mask) with plan capacity declared as ``tier`` rows (the
    ``max_total_num_rows`` field, ``FI:prefill.py:3161``; the capture plan would fix it to ``tier`` anyway)."""
    wrappers = backend._create_prefill_wrappers(slots, use_custom_mask=False)
    for w in wrappers:
        if getattr(w, "_max_total_num_rows", 0) is None:
            w._max_total_num_rows = int(tier)
    return wrappers


def _tier_wrappers(backend: Any) -> dict:
    table = getattr(backend, "_dspark_rv_wrappers", None)
    if table is None:
        table = {}
        backend._dspark_rv_wrappers = table
    return table


def _host_plan_slot(backend: Any) -> HostPlanSlot:
    slot = getattr(backend, "_dspark_rv_host_plan", None)
    if slot is None:
        slot = HostPlanSlot()
        backend._dspark_rv_host_plan = slot
    return slot


def init_forward_metadata_out_graph_with_ragged_verify(original, self, forward_batch, in_capture: bool = False):
    spec_info = getattr(forward_batch, "spec_info", None)
    layout = getattr(spec_info, "ragged_verify_layout", None) if spec_info is not None else None
    if layout is None or not forward_batch.forward_mode.is_target_verify():
        return original(self, forward_batch, in_capture)
    reason = ragged_graph_support_reason(self)
    if reason:
        raise NotImplementedError(f"sglang-dspark flashinfer ragged verify in CUDA graphs: {reason}")
    if getattr(spec_info, "custom_mask", None) is not None:
        raise NotImplementedError("sglang-dspark flashinfer ragged verify runs without a custom mask")
    slots = int(forward_batch.batch_size)
    tier = int(layout.graph_num_tokens)
    positions = getattr(forward_batch, "positions", None)
    if positions is not None and int(positions.numel()) != tier:
        raise RuntimeError(f"ragged verify graph batch has {positions.numel()} tokens, layout tier {tier}")
    wrappers_by_tier = _tier_wrappers(self)
    slot = _host_plan_slot(self)
    if in_capture:
        padded = layout.padded_to_bucket(padded_bs=slots)  # the capture plan is a real plan(): reads the device
        plan = None
    else:
        verify, prefix = host_lengths(layout, forward_batch)
        plan = build_verify_host_plan(
            verify_lens_cpu=verify, prefix_lens_cpu=prefix, graph_num_tokens=tier, padded_bs=slots,
            seq_len_fill_value=self.get_cuda_graph_seq_len_fill_value(),
        )
        padded = with_host_plan(layout, plan)
        if tier not in wrappers_by_tier:
            raise RuntimeError(
                f"no ragged verify wrappers captured for tier {tier} (captured: {sorted(wrappers_by_tier)})")
    if in_capture:
        wrappers_by_tier[tier] = make_tier_wrappers(self, slots, tier)
        self.forward_metadata = _prefill_metadata(wrappers_by_tier[tier])
    wrappers = wrappers_by_tier[tier]
    seq_lens_cpu = forward_batch.seq_lens_cpu
    spec_info.ragged_verify_layout = padded
    slot.plan = plan
    try:
        self.indices_updater_prefill.update(
            forward_batch.req_pool_indices[:slots],
            forward_batch.seq_lens[:slots],
            seq_lens_cpu[:slots] if seq_lens_cpu is not None else None,
            forward_batch.seq_lens_sum,
            prefix_lens=None,
            prefill_wrappers=wrappers,
            use_ragged=False,
            encoder_lens=None,
            spec_info=spec_info,
            plan=forward_batch.kv_loc_plan,
        )
    finally:
        spec_info.ragged_verify_layout = layout
        slot.plan = None
    if in_capture:
        # After the capture's real plan() set _cached_module (fast_prefill_plan asserts it), as upstream does for its
        # uniform fast plans (flashinfer_backend.py:868-885).
        for w in wrappers:
            w.begin_forward = partial(ragged_fast_prefill_plan, w, slot)
    return None


def full_coverage_layout(layout: Any):
    """A device-only layout of R requests padded to cover its whole tier with R rows (module docstring): SGLang's
    ``padded_to_bucket(padded_bs=R)``, whose ``qo_indptr`` ends at ``graph_num_tokens`` and whose
    ``total_verify_tokens`` is ``graph_num_tokens``."""
    return layout.padded_to_bucket(padded_bs=layout.bs)


def generate_attn_arg_prefill_device_only_layouts(original, self, *args, **kwargs):
    """The eager packing of a device-only layout (module docstring). FlashInfer's MHA backend (the only caller that
    passes ``kind``: ``layers/attention/flashinfer_backend.py:2270-2293``) gets upstream's ``generate_attn_arg_prefill``
    on :func:`full_coverage_layout`, so that ``kv_indices`` has a size (``dflash_info.py:168-171``) and ``qo_indptr``
    covers the tier's rows that q carries (FlashInfer's ``run()`` check). The other callers (FlashInfer MLA
    ``flashinfer_mla_backend.py:1099-1118``, aiter) keep their layout with only the allocation sized by
    ``graph_num_tokens`` (an over-allocation). Host layouts (their q has exactly the live rows), graph replays
    (already padded: ``total_verify_tokens`` set) and the fast-plan ``kv_indices_buf`` path keep upstream's path."""
    layout = getattr(self, "ragged_verify_layout", None)
    rpi = kwargs.get("req_pool_indices", args[0] if args else None)
    if (layout is None or layout.total_verify_tokens is not None or kwargs.get("kv_indices_buf") is not None
            or rpi is None or int(rpi.numel()) != layout.bs):
        return original(self, *args, **kwargs)
    if "kind" in kwargs:
        self.ragged_verify_layout = full_coverage_layout(layout)
    else:
        import msgspec

        self.ragged_verify_layout = msgspec.structs.replace(layout, total_verify_tokens=int(layout.graph_num_tokens))
    try:
        return original(self, *args, **kwargs)
    finally:
        self.ragged_verify_layout = layout


@install_once
def install_device_only_layout_fix() -> None:
    """Register only the device-only layout fix (once per process; on every backend: it acts only on a device-only
    layout in eager mode, where upstream raises)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(GENERATE_ATTN_ARG_TARGET, generate_attn_arg_prefill_device_only_layouts, HookType.AROUND)


@install_once
def apply() -> Optional[type]:
    """Register the FlashInfer ragged-verify graph patch (plugin.register calls it only where the launcher exported
    flashinfer after a passed self-check, engine/self_check/ragged_self_check.py). Returns the class."""
    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    try:
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    except Exception as exc:  # noqa: BLE001
        logger.debug("sglang-dspark: flashinfer ragged verify not applied (%r)", exc)
        return None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name in ("init_forward_metadata_out_graph", "_create_prefill_wrappers", "get_cuda_graph_seq_len_fill_value"):
        if not callable(getattr(FlashInferAttnBackend, name, None)):
            raise RuntimeError(f"sglang-dspark flashinfer ragged verify: SGLang lacks FlashInferAttnBackend.{name}")
    HookRegistry.register(GRAPH_METADATA_TARGET, init_forward_metadata_out_graph_with_ragged_verify, HookType.AROUND)
    install_device_only_layout_fix()
    FlashInferAttnBackend.supports_ragged_verify_graph = property(supports_ragged_verify_graph)
    return FlashInferAttnBackend


__all__ = [
    "GPU_CHECKS",
    "HostPlanSlot",
    "VerifyHostPlan",
    "apply",
    "build_verify_host_plan",
    "full_coverage_layout",
    "generate_attn_arg_prefill_device_only_layouts",
    "host_lengths",
    "init_forward_metadata_out_graph_with_ragged_verify",
    "install_device_only_layout_fix",
    "make_tier_wrappers",
    "ragged_fast_prefill_plan",
    "ragged_graph_support_reason",
    "read_lens_to_host",
    "supports_ragged_verify_graph",
    "with_host_plan",
]
