"""Every change to SGLang 0.5.23's behaviour that DSPARK needs on the CPU (one module, version-checked).

Upstream's DSPARK worker runs on the CPU once eight device assumptions below it are bridged. Each fix leaves non-CPU
inputs on upstream's own path; ``apply()`` refuses any SGLang but the pinned release and runs only on the CPU
platform, in every SGLang process (``sglang_dspark.plugin.register``).

| id | upstream assumes (SGLang 0.5.23) | what we do | how |
| --- | --- | --- | --- |
| B1 | ``_handle_dspark`` accepts only cuda/npu/xpu | run upstream's resolution with a view whose device reads "cuda" | called by ``engine/arg_resolution.py`` (the one AROUND hook on ``_handle_dspark``) |
| B1b | ``_handle_dspark`` caps ``max_running_requests`` at 48 unless given (a GPU graph/memory default for every speculative algorithm) | on the CPU, keep SGLang's own default (what a non-speculative server gets): at 64 users the cap queued 16 requests | same hook, after upstream's resolution |
| B2 | the draft's attention backend is in an allow-list without ``intel_amx`` (else flashinfer, absent on CPU) | add ``intel_amx`` to the list | data patch |
| B3 | the fused draft-KV write is a Triton kernel | CPU pools return no bundle: the method's own torch path runs | AROUND hook |
| B4 | ``Tensor.record_stream`` gets a CUDA stream | no-op for CPU tensors (no caching-allocator streams to record) | method patch |
| B5 | ``spec_info.tree_topk`` exists (EAGLE/NGRAM field) | ``DFlashVerifyInput.tree_topk = 1``: a verify window is a linear chain | data patch |
| B6 | QK-norm + RoPE is a Triton kernel for bf16/neox | take ``DFlashAttention``'s torch branch | AFTER hook |
| B7 | sampled accept ends in a Triton chain sampler | CPU tensors go to ``sglang_dspark.kernels.rejection_sampling`` | AROUND hook |
| B8 | intel_amx verify metadata is uniform-width | pack query rows by ``ragged_verify_layout`` | AROUND hook |
| speed | the torch Markov step draws Philox noise over the vocab for every row | ``sglang_dspark.kernels.markov_step`` (``SGLANG_DSPARK_CPU_MARKOV_STEP=upstream`` keeps upstream's) | AROUND hook |
"""

from __future__ import annotations

import logging
import types

import torch

from sglang_dspark import envs
from sglang_dspark.patches.install_once import install_once
from sglang_dspark.version_guard import require_supported_sglang

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
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    view = resolving_view(server_args)
    if view.device != "cpu":
        return original(server_args)
    user_capped = view.max_running_requests is not None
    module_globals = dict(original.__globals__)
    module_globals["resolving_view"] = lambda args: _DeviceReadsAsCuda(resolving_view(args))
    clone = types.FunctionType(
        original.__code__, module_globals, original.__name__, original.__defaults__, original.__closure__
    )
    result = clone(server_args)
    upstream_cap = resolving_view(server_args).max_running_requests
    if not user_capped and upstream_cap is not None:
        # B1b: no CUDA graphs or graph memory to bound on the CPU; a speculative server should take as many users as
        # the same server without speculation (the SPS profile covers up to 48 requests and extrapolates beyond).
        declare_resolution(server_args, "sglang_dspark.patches.cpu_dspark", max_running_requests=None)
        logger.info("sglang-dspark: on the CPU, DSPARK keeps SGLang's own max running requests (upstream caps "
                    "speculative servers at %d for GPU graphs; pass --max-running-requests to set it)", upstream_cap)
    return result


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
    from sglang_dspark.kernels.rejection_sampling import chain_speculative_sampling_torch

    return chain_speculative_sampling_torch(*args, **kwargs)


def amx_extend_metadata_with_ragged_verify(original, self, forward_batch):
    """B8: the intel_amx backend assumes every request verifies ``draft_token_num`` tokens; a ragged verify
    (per-request lengths, ``spec_info.ragged_verify_layout``) packs the query rows by its layout instead.
    The device ``seq_lens`` holds the committed prefix; the kernel needs prefix + verify length."""
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
    on small models it is a large share of a whole DSPARK decode step (docs/cpu.md). On the CPU there is no
    graph and the host read is free, so:

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
    from sglang_dspark.kernels.markov_step import cpu_markov_step, markov_noise_seed

    sampled = temperatures != 0
    seed = None
    if kwargs.get("has_sampled_rows") is not False and bool(sampled.any()):
        seed = markov_noise_seed(int(kwargs["key"]), int(kwargs["offset"].reshape(-1)[0]), int(kwargs["step"]))
    return cpu_markov_step(kwargs["base_logits"], kwargs["bias"], temperatures, kwargs["step_dtype"],
                           kwargs.get("logits_out"), noise_seed=seed)


def markov_step_is_ours() -> bool:
    """Whether the draft's Markov steps run :func:`markov_step_on_cpu` (CPU platform applied, not switched off)."""
    return apply.ran() and envs.CPU_MARKOV_STEP.get() != "upstream"


def allow_intel_amx_draft_backend() -> None:
    """The DSPARK draft runs its block forward on the target's attention backend; on the CPU that is intel_amx,
    which upstream's draft-backend allow-list lacks (it then falls back to flashinfer and dies at start-up)."""
    from sglang.srt.arg_groups import choices

    if "intel_amx" not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.add_draft_attention_backend_choices(["intel_amx"])


def make_record_stream_noop_on_cpu() -> None:
    """DSparkWorkerV2._forward_decode calls ``seq_lens.record_stream(current_stream())``; on the CPU the stream is a
    ``torch.cpu.Stream`` the binding rejects. CPU tensors have no caching-allocator streams to record, so a no-op
    is exact."""
    original = torch.Tensor.record_stream
    if getattr(original, "_sglang_dspark_cpu_noop", False):
        return

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    record_stream._sglang_dspark_cpu_noop = True
    torch.Tensor.record_stream = record_stream


def declare_linear_chain_verify() -> None:
    """The intel_amx backend reads ``spec_info.tree_topk`` (an EAGLE/NGRAM field) to decide whether a tree mask is
    needed. DFlash/DSpark verify windows are a linear chain, i.e. tree_topk == 1: the kernel's own causal
    (target) or bidirectional (draft, ENCODER_ONLY layers) masking is exactly right."""
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    if not hasattr(DFlashVerifyInput, "tree_topk"):
        DFlashVerifyInput.tree_topk = 1


@install_once
def apply() -> None:
    """All of the above, once per process (CPU platform only; refuses any SGLang but the pinned release)."""
    require_supported_sglang()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    allow_intel_amx_draft_backend()  # B2
    make_record_stream_noop_on_cpu()  # B4
    declare_linear_chain_verify()  # B5
    HookRegistry.register(_FUSED_KV_WRITE, fused_kv_write_bundle_off_on_cpu, HookType.AROUND)  # B3
    HookRegistry.register(_DFLASH_ATTENTION_INIT, dflash_attention_torch_qk_norm_rope, HookType.AFTER)  # B6
    HookRegistry.register(_CHAIN_SAMPLING, chain_sampling_dispatch, HookType.AROUND)  # B7
    HookRegistry.register(_AMX_EXTEND_METADATA, amx_extend_metadata_with_ragged_verify, HookType.AROUND)  # B8
    from sglang_dspark.patches import exact_verify_filters

    exact_verify_filters.apply()  # min_p and top-k + top-p exact in sampled verify (see that module)
    if envs.CPU_MARKOV_STEP.get() != "upstream":
        HookRegistry.register(_MARKOV_SAMPLE_TORCH, markov_step_on_cpu, HookType.AROUND)
    logger.debug("sglang-dspark: CPU DSPARK patches applied")
