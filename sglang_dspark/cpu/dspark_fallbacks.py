"""CPU fallbacks that let SGLang 0.5.23's DSPARK pipeline run on the CPU, as HookRegistry hooks.

Upstream's worker runs on the CPU once five device assumptions below the worker are bridged (the facts and
file:line of each are in shared/notes/dspark-on-cpu.md, blockers B1, B3, B6, B7, B8). Every hook leaves non-CPU
inputs on upstream's own path. B1 is applied through sglang_dspark/arg_resolution.py, the one wrapper of
``_handle_dspark`` (two AROUND hooks on one target would have to be ordered by registration).
"""

from __future__ import annotations

import logging
import types

logger = logging.getLogger(__name__)

_FUSED_KV_WRITE = "sglang.srt.models.dspark.DSparkDraftMixin._fused_kv_write_bundle"
_DFLASH_ATTENTION_INIT = "sglang.srt.models.dflash.DFlashAttention.__init__"
_CHAIN_SAMPLING = "sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton"
_AMX_EXTEND_METADATA = "sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend._build_extend_metadata"


class _DeviceReadsAsCuda:
    """A resolving view whose ``device`` reads "cuda"; every other attribute is the real one."""

    def __init__(self, view) -> None:
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        if name == "device":
            return "cuda"
        return getattr(self._view, name)


def handle_dspark_allowing_cpu(original, server_args):
    """B1: ``_handle_dspark`` refuses every device but cuda/npu/xpu before resolving γ, draft tokens and limits.

    Only the device guard reads ``cfg.device`` there; we run upstream's own code with a view whose device reads
    "cuda", so every other resolution step stays upstream's.
    """
    from sglang.srt.arg_groups.overrides import resolving_view

    if resolving_view(server_args).device != "cpu":
        return original(server_args)
    module_globals = dict(original.__globals__)
    module_globals["resolving_view"] = lambda args: _DeviceReadsAsCuda(resolving_view(args))
    clone = types.FunctionType(
        original.__code__, module_globals, original.__name__, original.__defaults__, original.__closure__
    )
    return clone(server_args)


def fused_kv_write_bundle_off_on_cpu(original, self, pool):
    """B3: the fused draft-KV write is a Triton kernel with no device gate; on CPU pools return no bundle, which
    selects the method's own torch path (stacked-KV GEMM + torch RMSNorm/RoPE + set_kv_buffer)."""
    if str(getattr(pool, "device", "cpu")).startswith("cpu"):
        return None
    return original(self, pool)


def dflash_attention_torch_qk_norm_rope(result, self, *args, **kwargs):
    """B6: DFlashAttention picks a Triton QK-norm+RoPE kernel for bf16/neox; on the CPU take its torch branch."""
    self.use_table_qk_norm_rope = False
    return result


def chain_sampling_dispatch(original, *args, **kwargs):
    """B7: the sampled accept always ends in a Triton kernel; CPU tensors go to our torch chain sampler."""
    predicts = args[0] if args else kwargs["predicts"]
    if predicts.device.type != "cpu":
        return original(*args, **kwargs)
    from sglang_dspark.rejection_sampling import chain_speculative_sampling_torch

    return chain_speculative_sampling_torch(*args, **kwargs)


def amx_extend_metadata_with_ragged_verify(original, self, forward_batch):
    """B8: the intel_amx backend assumes every request verifies ``draft_token_num`` tokens; a ragged verify
    (per-request lengths, ``spec_info.ragged_verify_layout``) packs the query rows by its layout instead.
    The device ``seq_lens`` holds the committed prefix; the kernel needs prefix + verify length."""
    import torch

    spec_info = forward_batch.spec_info
    layout = getattr(spec_info, "ragged_verify_layout", None) if spec_info is not None else None
    if layout is None or not forward_batch.forward_mode.is_target_verify():
        return original(self, forward_batch)
    verify_lens = layout.verify_lens.to(torch.int32)
    extend_start_loc = layout.extend_start_loc.to(torch.int32)
    seq_lens = forward_batch.seq_lens + verify_lens
    return seq_lens, verify_lens, extend_start_loc, None


def register_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_FUSED_KV_WRITE, fused_kv_write_bundle_off_on_cpu, HookType.AROUND)
    HookRegistry.register(_DFLASH_ATTENTION_INIT, dflash_attention_torch_qk_norm_rope, HookType.AFTER)
    HookRegistry.register(_CHAIN_SAMPLING, chain_sampling_dispatch, HookType.AROUND)
    HookRegistry.register(_AMX_EXTEND_METADATA, amx_extend_metadata_with_ragged_verify, HookType.AROUND)
