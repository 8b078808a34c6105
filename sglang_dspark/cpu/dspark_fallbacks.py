"""CPU fallbacks that let SGLang 0.5.23's DSPARK pipeline run on the CPU, as HookRegistry hooks.

Upstream's worker runs on the CPU once five device assumptions below the worker are bridged (the facts and
file:line of each are in shared/notes/dspark-on-cpu.md, blockers B1, B3, B6, B7, B8); one more hook is for speed
(the Markov sampling step). Every hook leaves non-CPU inputs on upstream's own path. B1 is applied through
sglang_dspark/arg_resolution.py, the one wrapper of ``_handle_dspark`` (two AROUND hooks on one target would have
to be ordered by registration).
"""

from __future__ import annotations

import logging
import os
import types

logger = logging.getLogger(__name__)

_FUSED_KV_WRITE = "sglang.srt.models.dspark.DSparkDraftMixin._fused_kv_write_bundle"
_DFLASH_ATTENTION_INIT = "sglang.srt.models.dflash.DFlashAttention.__init__"
_CHAIN_SAMPLING = "sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton"
_AMX_EXTEND_METADATA = "sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend._build_extend_metadata"
_MARKOV_SAMPLE_TORCH = "sglang.kernels.ops.speculative.dspark.markov_sample.MarkovSampleStep.torch"


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


def markov_step_on_cpu(original, cls, **kwargs):
    """Speed, not a blocker: the Markov sampling step of every draft slot, on the CPU.

    Upstream's torch path (the CPU's) draws Philox4x32-10 Gumbel noise over the whole vocabulary for every row and
    every slot whenever the step logits are kept, greedy rows included (``has_sampled_rows=None``: a CUDA graph
    cannot read the temperatures on the host). Philox written as int64 torch ops costs many passes over the vocab;
    measured on SmolLM2 at concurrency 1 (py-spy) it was about a third of a whole DSPARK decode step. On the CPU
    there is no graph and the host read is free, so:

    * all rows greedy: no noise (a greedy row's key is its logit whatever the noise, so the tokens are upstream's);
    * some row samples: Gumbel-max with noise from torch's CPU generator, seeded from upstream's (key, offset, step)
      so a server seed still reproduces a run. Any exact sampler of the step distribution keeps verification
      lossless (the kept step logits, not the noise, enter the acceptance test); these are not upstream's Philox
      bits, which only matter for TP ranks agreeing on noise (TP > 1 is not supported on CPU).

    Sharded vocabularies and empty shards stay on upstream's path.
    """
    temperatures = kwargs.get("temperatures")
    if temperatures is None or temperatures.device.type != "cpu" or kwargs.get("gather") is not None \
            or kwargs.get("vocab_start", 0) or kwargs["bias"].shape[1] == 0:
        return original(cls, **kwargs)
    sampled = temperatures != 0
    seed = None
    if kwargs.get("has_sampled_rows") is not False and bool(sampled.any()):
        seed = markov_noise_seed(int(kwargs["key"]), int(kwargs["offset"].reshape(-1)[0]), int(kwargs["step"]))
    return cpu_markov_step(kwargs["base_logits"], kwargs["bias"], temperatures, kwargs["step_dtype"],
                           kwargs.get("logits_out"), noise_seed=seed)


def markov_noise_seed(key: int, offset: int, step: int) -> int:
    """One generator seed per (server key, block offset, slot): distinct blocks and slots draw distinct noise."""
    return (key * 0x9E3779B1 + (offset & 0xFFFFFFFF) * 0x85EBCA77 + step * 0xC2B2AE3D) & 0x7FFFFFFFFFFFFFFF


def cpu_markov_step(base_logits, bias, temperatures, step_dtype, logits_out=None, noise_seed=None):
    """Upstream's step on one unsharded vocabulary, in few passes. Step logits = base + bias on the first
    ``width = bias.shape[1]`` columns, rounded through ``step_dtype`` and kept in ``logits_out`` (padding
    included, as upstream keeps them). Greedy rows (temperature 0, or every row when ``noise_seed`` is None) take
    the first maximum, or the first NaN (``torch.argmax`` order = upstream's lowest-index tie-break); sampled rows
    take argmax(logits / T + Gumbel noise), an exact sample of softmax(logits / T). Returns int64 ids [rows]."""
    import torch

    width = bias.shape[1]
    value = base_logits.to(torch.float32, copy=True)
    value[:, :width] += bias.float()
    value = value.to(step_dtype).float()
    if logits_out is not None:
        logits_out.copy_(value)
    keys = value[:, :width]
    if noise_seed is not None:
        sampled = temperatures != 0
        rows = sampled.nonzero().squeeze(1)
        gen = torch.Generator().manual_seed(noise_seed)
        gumbel = torch.empty(rows.numel(), width).exponential_(generator=gen).log_().neg_()
        keys = keys.clone()
        keys[rows] = keys[rows] / temperatures[rows, None] + gumbel
    return keys.argmax(dim=1)


def register_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_FUSED_KV_WRITE, fused_kv_write_bundle_off_on_cpu, HookType.AROUND)
    HookRegistry.register(_DFLASH_ATTENTION_INIT, dflash_attention_torch_qk_norm_rope, HookType.AFTER)
    HookRegistry.register(_CHAIN_SAMPLING, chain_sampling_dispatch, HookType.AROUND)
    HookRegistry.register(_AMX_EXTEND_METADATA, amx_extend_metadata_with_ragged_verify, HookType.AROUND)
    if os.environ.get("SGLANG_DSPARK_CPU_MARKOV_STEP", "ours").strip().lower() != "upstream":
        HookRegistry.register(_MARKOV_SAMPLE_TORCH, markov_step_on_cpu, HookType.AROUND)
