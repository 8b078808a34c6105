"""Which SGLang verify mode DSPARK runs in: a pure decision over resolved engine facts (issue #9, "do no harm").

Confidence admission (policies ``async``, ``exact``, ``off``) needs SGLang's ragged ("compact") verify:
``SGLANG_RAGGED_VERIFY_MODE=compact``. Compact is only safe where the attention backend that runs TARGET_VERIFY
reads ``spec_info.ragged_verify_layout`` correctly *in the mode in use* (CUDA graphs or eager), and where no
upstream validation that already ran (or a plugin start-up step) would break. Everywhere else we run upstream's
``static`` verify (every draft token verified: admission policy ``verify-all``) and say why in one sentence.

:func:`decide_verify_mode` is pure (no SGLang import, no environment read); :func:`facts_from_server_args` reads
SGLang's resolving view inside the ``_handle_dspark`` hook and imports SGLang lazily.

Evidence (SGLang 0.5.23, paths under ``sglang/srt/``), one line per backend:

* ``fa3`` / ``fa4`` (``FlashAttentionBackend``; ``layers/attention/attention_registry.py:238-274``):
  ``supports_ragged_verify_graph = True`` (``layers/attention/flashattention_backend.py:151``); graph replay builds
  ``cu_seqlens_q`` from the padded layout on the device (``:3170-3189``); eager builds the ragged geometry
  (``:1036-1056``).
* ``trtllm_mha``: flag True (``layers/attention/trtllm_mha_backend.py:184``) but ``_assert_ragged_verify_supported``
  raises NotImplementedError for the xqa implementation (``:1177-1183``), which is what sm90 and sm120 run
  (``is_xqa_impl = is_sm90 or is_sm120``, ``:258``); the assert guards both graph prep (``:1110-1114``) and eager
  metadata (``:1270-1274``). So: sm100 (B200/GB200/B300) only.
* ``flashinfer`` (MHA): CUDA graphs raise ``NotImplementedError("FlashInfer does not support ragged verify in cuda
  graph")`` at capture (``layers/attention/flashinfer_backend.py:754-762``; re-raised as "Capture cuda graph
  failed", ``model_executor/runner/decode_cuda_graph_runner.py:598-604``). Eager is ragged-aware: TARGET_VERIFY takes
  ``DFlashVerifyInput.generate_attn_arg_prefill`` (``flashinfer_backend.py:2270-2281``), which packs by the layout
  (``speculative/dflash_info.py:153-171``).
* ``triton``: upstream's flag is False (``layers/attention/base_attn_backend.py:65``) and nothing in
  ``triton_backend.py`` reads the layout (a uniform ``qo_indptr = arange(stride N)``: eager ``:1007-1016``, graph
  buffers ``:601-609``: wrong tokens). The sglang-dspark patch ``patches/triton_ragged_verify.py`` feeds the layout's
  device ``qo_indptr`` in eager mode, copies the padded layout into the fixed graph buffers at capture and replay
  (max_extend_len = γ+1) and sets the flag; the Triton extend kernel reads ``qo_indptr`` on the device, so this adds
  no host sync (``needs_cpu_seq_lens = False``, ``triton_backend.py:153``). Compact in both modes once the patch
  passed the on-device self-check (``engine/self_check/ragged_self_check.py``).
* ``flashinfer`` inside CUDA graphs: the sglang-dspark patch ``patches/flashinfer_ragged_verify.py`` (per-tier
  wrappers, exact host plans through upstream's ``fast_prefill_plan``), behind the same self-check, and only for what
  the patch handles, decided before the self-check (which runs a synthetic dense model): one prefill wrapper, so no
  target with sliding-window / chunked-local layers or a hybrid-SWA KV pool (``FlashInferAttnBackend`` then plans two
  wrappers, ``dispatch_reason`` SLIDING_WINDOW, ``layers/attention/flashinfer_backend.py:406-419``, ``:341-344``) nor
  an encoder-decoder target (CROSS_ATTENTION, ``:414-416``): :func:`model_attention` reads them from the target's
  config; and a FlashInfer whose plan takes the 20 arguments ``fast_prefill_plan`` passes
  (``flashinfer_backend.py:293-316``): 0.7.2 (SGLang 0.5.23's pin) and 0.7.2.post1, read; 0.7.4 added
  ``fixed_uniform_q_len`` (``FI:data/csrc/batch_prefill_jit_binding.cu:22-29``), and its TVM-FFI typed export raises
  TypeError on any other count, so every replay plan would fail (:data:`FLASHINFER_PATCH_VERSIONS`).
* ``intel_amx`` (CPU): upstream metadata is uniform-width (``layers/attention/intel_amx_backend.py:83-91``); our CPU
  patch B8 packs by the layout (``patches/cpu_dspark.py``, ``amx_extend_metadata_with_ragged_verify``), and our
  ``extend_attention_cpu`` stand-in takes per-request ``extend_seq_lens`` (``cpu/sgl_kernel_standin/attention.py``).
  Eager only: the CPU graph runner (torch.compile) checks only the batch size (``model_executor/cpu_graph_runner.py:
  747-754``) and captures uniform widths (``:775-781``).
* MLA: ``flashinfer`` on an MLA model is ``FlashInferMLAAttnBackend`` (``attention_registry.py:55-77``; flag
  ``flashinfer_mla_backend.py:222``, eager ``:1099-1112``); ``trtllm_mla`` (``trtllm_mla_backend.py:208``, eager
  ``:1549-1554``); ``cutedsl_mla`` subclasses it (``cutedsl_mla_backend.py:59``).
* Everything else (``torch_native``, ``flex_attention``, ``aiter``, ``wave``, ``hpc_ops``, ``flashmla``,
  ``ascend``, ``intel_xpu``, ...): flag False and no layout reader (grep ``ragged_verify_layout`` under
  ``layers/attention``): static.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

STATIC = "static"
COMPACT = "compact"
CAP_ACCEPT = "cap-accept"
# speculative/ragged_verify.py:13-16 (RaggedVerifyMode)
VERIFY_MODES = (STATIC, CAP_ACCEPT, COMPACT)
VERIFY_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"

VERIFY_ALL = "verify-all"
# Same set as sglang_dspark.scheduling.ADMISSION_POLICIES (checked by tests/unit/engine/test_verify_mode.py); repeated here
# so this module imports nothing heavy.
ADMISSION_POLICIES = ("async", "exact", VERIFY_ALL, "off")

# Plugin capabilities the decision depends on (flip when the profiler fixes land; see the report of issue #9):
# * start-up SPS profiling probes only captured graph token tiers (today it probes B = R + k, most of which are not
#   tiers, and dies on "ragged verify tier mismatch" under compact CUDA graphs: decode_cuda_graph_runner.py:1608-1614);
# * every TP rank ends up with the same SPS table (today each rank profiles and thins its grid on its own timings:
#   different forward counts -> NCCL hang at start-up, different tables -> different graph tiers per rank).
PLUGIN_SPS_PROBES_TIER_ALIGNED = True
PLUGIN_SPS_PROFILE_RANK_CONSISTENT = True
# * the start-up probes build a batch with the DP-attention fields (global_num_tokens*, dp_padding_mode) that SGLang's
#   scheduler fills for every attention-DP rank together (managers/scheduler_components/dp_attn.py:518-);
#   today they do not, so under DP attention they are skipped (engine/planner.py) and compact needs a table file.
PLUGIN_SPS_PROBES_DP_ATTENTION = False
# Why the probes are skipped under DP attention: one sentence, shared by the verify-mode reason, the planner's log
# line and explain.
SPS_PROBES_DP_ATTENTION_SKIPPED = (
    "with DP attention the plugin's start-up SPS probes would run a hand-built verify batch without the DP-attention "
    "fields (global_num_tokens_cpu / dp_padding_mode, model_executor/forward_batch_info.py:679-680, :755) that "
    "SGLang's scheduler fills for all attention-DP ranks together (managers/scheduler_components/dp_attn.py:518-), so "
    "its forward would skip the DP sync (model_executor/model_runner.py:1729-1732) and crash or hang; they are "
    "skipped"
)
# Compact on triton (both modes) and on flashinfer inside CUDA graphs runs through our patches, checked on the CPU
# only (TRITON_INTERPRET=1, a FlashInfer stand-in): on a GPU they open after the on-device self-check passed
# (engine/self_check/ragged_self_check.py; EngineFacts.ragged_self_check), else static, which is correct everywhere.


@dataclass(frozen=True)
class BackendSupport:
    """Whether an attention backend runs compact (ragged) TARGET_VERIFY correctly, per execution mode."""

    graph: bool
    eager: bool
    graph_evidence: str
    eager_evidence: str
    requires_sm_major: Optional[int] = None  # e.g. 10: trtllm-gen only (xqa on sm90/sm120 refuses ragged)
    # the mode runs through a sglang-dspark patch that opens only after the on-device self-check passed
    graph_self_check: bool = False
    eager_self_check: bool = False

    def evidence(self, cuda_graph: bool) -> str:
        return self.graph_evidence if cuda_graph else self.eager_evidence

    def needs_self_check(self, cuda_graph: bool) -> bool:
        return self.graph_self_check if cuda_graph else self.eager_self_check


_FA = BackendSupport(
    True, True,
    "supports_ragged_verify_graph (flashattention_backend.py:151), replay metadata from the padded layout on the "
    "device (:3170-3189)",
    "eager ragged geometry (flashattention_backend.py:1036-1056)",
)
_MHA_SUPPORT: dict[str, BackendSupport] = {
    "fa3": _FA,
    "fa4": _FA,  # FlashAttentionBackend(fa_impl_ver=4), attention_registry.py:264-274
    "trtllm_mha": BackendSupport(
        True, True,
        "supports_ragged_verify_graph (trtllm_mha_backend.py:184) with the trtllm-gen kernel; the xqa kernel that "
        "sm90/sm120 run (:258) refuses ragged verify (:1177-1183)",
        "eager ragged metadata (trtllm_mha_backend.py:1270-1290), trtllm-gen kernel only (:1177-1183, :258)",
        requires_sm_major=10,
    ),
    "flashinfer": BackendSupport(
        True, True,
        "sglang-dspark patch flashinfer_ragged_verify: upstream raises NotImplementedError for ragged verify at "
        "CUDA-graph capture (flashinfer_backend.py:754-762); the patch plans per-tier wrappers from exact host lengths "
        "through fast_prefill_plan (:180-313)",
        "eager TARGET_VERIFY packs by the layout (flashinfer_backend.py:2270-2281, dflash_info.py:153-171)",
        graph_self_check=True,
    ),
    "triton": BackendSupport(
        True, True,
        "sglang-dspark patch triton_ragged_verify: the padded layout's qo_indptr copied into the fixed graph buffer at "
        "capture and replay (upstream's uniform buffers: triton_backend.py:592-609), max_extend_len = γ+1 "
        "(:1321-1339), supports_ragged_verify_graph set (base_attn_backend.py:65, decode_cuda_graph_runner.py:927-929)",
        "sglang-dspark patch triton_ragged_verify: eager qo_indptr from the layout instead of upstream's uniform "
        "arange (triton_backend.py:1007-1016)",
        graph_self_check=True, eager_self_check=True,
    ),
    "torch_native": BackendSupport(
        False, False,
        "torch_native disables CUDA graphs (attention_hook.py:124-142)",
        "torch_native has no target-verify path and reads no ragged layout",
    ),
}
_CPU_SUPPORT: dict[str, BackendSupport] = {
    "intel_amx": BackendSupport(
        False, True,
        "the CPU graph runner checks only the batch size (cpu_graph_runner.py:747-754) and captures uniform widths "
        "(:775-781)",
        "upstream intel_amx metadata is uniform (intel_amx_backend.py:83-91); the sglang-dspark CPU patch B8 packs it "
        "by the layout (patches/cpu_dspark.py, amx_extend_metadata_with_ragged_verify)",
    ),
    "torch_native": _MHA_SUPPORT["torch_native"],
}
_MLA_SUPPORT: dict[str, BackendSupport] = {
    "fa3": _FA,
    "flashinfer": BackendSupport(
        True, True,
        "FlashInferMLAAttnBackend on MLA models (attention_registry.py:72-77): supports_ragged_verify_graph "
        "(flashinfer_mla_backend.py:222)",
        "eager verify packs by the layout (flashinfer_mla_backend.py:1099-1112)",
    ),
    "trtllm_mla": BackendSupport(
        True, True, "supports_ragged_verify_graph (trtllm_mla_backend.py:208)",
        "ragged layout read in verify metadata (trtllm_mla_backend.py:1549-1554)",
    ),
    "cutedsl_mla": BackendSupport(
        True, True, "CuteDslMLABackend subclasses TRTLLMMLABackend (cutedsl_mla_backend.py:59; "
                    "trtllm_mla_backend.py:208)",
        "inherits TRTLLMMLABackend's ragged verify metadata (trtllm_mla_backend.py:1549-1554)",
    ),
}
_NO_SUPPORT = BackendSupport(
    False, False,
    "supports_ragged_verify_graph is False (base_attn_backend.py:65)",
    "the backend reads no ragged_verify_layout (none under layers/attention outside the listed backends)",
)


def _table(device: str, use_mla: bool) -> dict[str, BackendSupport]:
    if device == "cpu":
        return _CPU_SUPPORT
    if device == "cuda":
        return _MLA_SUPPORT if use_mla else _MHA_SUPPORT
    return {}


def backend_support(attention_backend: Optional[str], *, use_mla: bool = False, device: str = "cuda") -> BackendSupport:
    """The ragged-verify support of the backend that runs TARGET_VERIFY (see the module docstring)."""
    return _table(device, use_mla).get(str(attention_backend or ""), _NO_SUPPORT)


def compact_capable_backends(*, cuda_graph: bool, use_mla: bool = False, device: str = "cuda",
                             self_checked: bool = True) -> frozenset[str]:
    """Backends that run compact verify correctly in the given mode (ignoring GPU-architecture conditions);
    ``self_checked=False`` leaves out those that need our patch's on-device self-check first."""
    return frozenset(name for name, s in _table(device, use_mla).items()
                     if (s.graph if cuda_graph else s.eager) and (self_checked or not s.needs_self_check(cuda_graph)))


# ---------------------------------------------------------------------------------------------------------------------
# What our FlashInfer CUDA-graph patch handles (patches/flashinfer_ragged_verify.py, ragged_graph_support_reason)
# ---------------------------------------------------------------------------------------------------------------------

# FlashInfer releases whose ``BatchPrefillWithKVCachePlan`` takes the 20 arguments SGLang 0.5.23's ``fast_prefill_plan``
# passes (flashinfer_backend.py:293-316), with the graph-mode scheduler the patch was read against: 0.7.2 (SGLang's pin,
# sglang-0.5.23.dist-info/METADATA) and 0.7.2.post1 (same data/csrc/batch_prefill*.cu and attention/scheduler.cuh).
# 0.7.4 takes 21 (fixed_uniform_q_len).
FLASHINFER_PATCH_VERSIONS = ("0.7.2", "0.7.2.post1")
SGLANG_FLASHINFER_PIN = "0.7.2"
FLASHINFER_ABSENT = "absent"

# Architectures whose SGLang 0.5.23 model class defines ``get_attention_sliding_window_size`` (models/*.py), which
# sets ``model_runner.sliding_window_size`` (model_executor/model_runner_components/load_model_utils.py:144-157) and so
# FlashInfer's two-wrapper SLIDING_WINDOW dispatch; those methods read the config's sliding_window (or
# sliding_window_size). Checked against SGLang's sources by tests/unit/engine/test_verify_mode.py.
SGLANG_SLIDING_WINDOW_ARCHS = frozenset({
    "AfmoeForCausalLM", "BeamForCausalLM", "DiffusionGemmaForBlockDiffusion", "EmbeddingGemma2Model",
    "EmbeddingGemmaModel", "Exaone4ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration", "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration",
    "Gemma4AssistantForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedAssistantForCausalLM", "GptOssForCausalLM", "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP", "JetNemotronForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "Olmo2ForCausalLM", "Spark2_5ForCausalLM", "UnlimitedOCRForCausalLM",
    "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN",
})
# configs/model_config.py:2651-2695 (is_hybrid_swa_model, with SWA_SINK_ARCHS :88-96 and MIMO_V2_MODEL_ARCHS :74-77):
# a SWA KV pool (flashinfer_backend.py:341-344) and, with the config's window, the SLIDING_WINDOW dispatch.
SGLANG_HYBRID_SWA_ARCHS = frozenset({
    "BeamForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
    "DeepseekV4ForCausalLMDSpark", "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM",
    "IQuestQ1ForCausalLM", "IQuestQ1MTP", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP",
    "Step3p5ForCausalLM", "Step3p5MTP", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration",
    "DiffusionGemmaForBlockDiffusion", "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP",
    "UnlimitedOCRForCausalLM",
})
# configs/model_config.py:2540-2546 (is_encoder_decoder_model): FlashInfer's CROSS_ATTENTION dispatch.
SGLANG_ENCODER_DECODER_ARCHS = frozenset({
    "WhisperForConditionalGeneration", "MllamaForConditionalGeneration", "MossVLForConditionalGeneration",
})


@dataclass(frozen=True)
class ModelAttention:
    """The target's attention layers as far as our FlashInfer graph patch cares: ``sliding_window`` and
    ``cross_attention`` hold the evidence ("" for none); ``known`` False when no config could be read (then both are
    empty: assumed full attention, and ``source`` says why)."""

    sliding_window: str = ""
    cross_attention: str = ""
    source: str = ""
    known: bool = True

    def note(self) -> str:
        """One line for ``explain``."""
        where = f" ({self.source})" if self.source else ""
        if not self.known:
            return (f"unknown here{where}; assumed full attention (the server reads the target's config at start-up "
                    "and keeps FlashInfer CUDA graphs static for sliding-window or cross-attention layers)")
        found = [f"sliding window: {self.sliding_window}"] if self.sliding_window else []
        found += [f"cross-attention: {self.cross_attention}"] if self.cross_attention else []
        if not found:
            return f"full attention only: no sliding-window, chunked or cross-attention layers{where}"
        return "; ".join(found) + where


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def model_attention(config: Any, *, source: str = "", sglang_model_config: Any = None) -> ModelAttention:
    """Sliding-window / chunked-local and cross-attention layers of the target, from its HF config (a ``config.json``
    dict or a ``PretrainedConfig``; multimodal configs are read at the top level and in ``text_config``), plus SGLang's
    own ``ModelConfig`` flags where the launcher has them (``is_hybrid_swa``, ``attention_chunk_size``,
    ``is_encoder_decoder``). Pure; errs toward reporting a layer (a false report only keeps FlashInfer graphs
    static)."""
    if config is None and sglang_model_config is None:
        return ModelAttention(source=source or "no config read", known=False)
    texts = [config]
    text = _config_get(config, "text_config")
    if text is not None:
        texts.append(text)

    def first(key):
        for c in texts:
            value = _config_get(c, key)
            if value is not None:
                return value
        return None

    archs = [str(a) for a in (_config_get(config, "architectures") or [])]
    layer_types = [str(t).lower() for c in texts for t in (_config_get(c, "layer_types") or [])]
    window = first("sliding_window")
    if window is None:
        window = first("sliding_window_size")
    sliding: list[str] = []
    hybrid = next((a for a in archs if a in SGLANG_HYBRID_SWA_ARCHS), None)
    if hybrid == "BeamForCausalLM" and not any("sliding" in t for t in layer_types):
        hybrid = None  # SGLang's own exceptions (model_config.py:2681-2691): no sliding layers, no window
    if hybrid == "LagunaForCausalLM" and not window:
        hybrid = None
    if hybrid is not None:
        sliding.append(f"{hybrid} is a hybrid sliding-window model in SGLang (SWA KV pool; "
                       "configs/model_config.py:2651-2695)")
    elif first("is_hybrid_swa") or getattr(sglang_model_config, "is_hybrid_swa", False):
        sliding.append("SGLang serves it as a hybrid sliding-window model (is_hybrid_swa)")
    named = [a for a in archs if a in SGLANG_SLIDING_WINDOW_ARCHS]
    if named and window is not None and not sliding:
        sliding.append(f"SGLang's {named[0]} sets a sliding window of {window} tokens "
                       "(get_attention_sliding_window_size)")
    chunk = first("attention_chunk_size")
    if chunk is None:
        chunk = getattr(sglang_model_config, "attention_chunk_size", None)
    if chunk is not None:
        sliding.append(f"attention_chunk_size {chunk} (chunked local attention, which SGLang runs as a sliding window: "
                       "model_executor/model_runner_components/load_model_utils.py:152-157)")
    windowed = [t for t in layer_types if "sliding" in t or "chunked" in t or t.startswith("local")]
    if windowed and not sliding:
        sliding.append(f"layer_types declares {len(windowed)} {windowed[0]} layers")
    if first("sliding_window_pattern") is not None and window is not None and not sliding:
        sliding.append(f"sliding_window_pattern {first('sliding_window_pattern')} with sliding_window {window}")
    cross = ""
    encoder_decoder = [a for a in archs if a in SGLANG_ENCODER_DECODER_ARCHS]
    if encoder_decoder:
        cross = (f"{encoder_decoder[0]} is an encoder-decoder model in SGLang (configs/model_config.py:2540-2546)")
    elif getattr(sglang_model_config, "is_encoder_decoder", False):
        cross = "SGLang serves it as an encoder-decoder model (is_encoder_decoder)"
    elif _config_get(config, "is_encoder_decoder") is True or first("cross_attention_layers"):
        cross = "its config declares encoder-decoder cross-attention (is_encoder_decoder / cross_attention_layers)"
    return ModelAttention(sliding_window="; ".join(sliding), cross_attention=cross, source=source)


def flashinfer_version_supported(version: Optional[str]) -> bool:
    return version in FLASHINFER_PATCH_VERSIONS


def installed_flashinfer_version() -> str:
    """``flashinfer-python``'s installed version (importlib.metadata: FlashInfer itself is not imported), or
    :data:`FLASHINFER_ABSENT`."""
    import importlib.metadata

    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return FLASHINFER_ABSENT


@dataclass(frozen=True)
class EngineFacts:
    """What the verify-mode decision depends on, read from SGLang's resolved arguments (or simulated by explain).

    ``attention_backend`` is the backend that executes TARGET_VERIFY: the prefill backend under the default
    ``--speculative-attention-mode prefill``, the decode backend under ``decode`` (hybrid_attn_backend.py:57-62).
    ``cuda_graph`` is "target-verify graphs are captured and replayed": decode graphs on a GPU, the torch.compile CPU
    graph on the CPU (cuda_graph_setup.py:730-735).
    """

    device: str
    attention_backend: Optional[str]
    cuda_graph: bool
    policy: str
    has_confidence_head: bool
    user_mode: Optional[str] = None
    tp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1  # --attn-dp-size, or deprecated --dp-size N --enable-dp-attention (parallel_hook.py:39-61)
    pd_mode: str = "null"
    gpu_sm: Optional[int] = None  # e.g. 90 (H100), 100 (B200), 120 (RTX 5090); None when unknown / not CUDA
    use_mla: bool = False
    moe_a2a_backend: str = "none"
    dp_spec_prefill_coordination: bool = False  # SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION
    dcp_size: int = 1
    enable_two_batch_overlap: bool = False
    lora_enabled: bool = False
    disable_cuda_graph_padding: bool = False
    hybrid_linear: bool = False  # mamba / GDN / linear-attention hybrid target
    enable_linear_replayssm_spec: bool = False
    is_deepseek_v4: bool = False
    model_requires_static: Optional[str] = None  # an upstream model gate that demands static (its message)
    sps_table_from_file: bool = False  # --speculative-dspark-sps-table-path: no start-up probes, same table per rank
    sps_probes_tier_aligned: bool = PLUGIN_SPS_PROBES_TIER_ALIGNED
    sps_profile_rank_consistent: bool = PLUGIN_SPS_PROFILE_RANK_CONSISTENT
    sps_probes_dp_attention: bool = PLUGIN_SPS_PROBES_DP_ATTENTION
    # where has_confidence_head was read, or why the draft's config could not be read (engine/draft_head.py); "" when
    # not said (simulations): goes into the reason when there is no head
    confidence_head_detail: str = ""
    # the on-device ragged-verify self-check of our triton / flashinfer patches (engine/self_check/ragged_self_check.py):
    # True passed, False failed or skipped, None not run; the detail goes into the reason
    ragged_self_check: Optional[bool] = None
    ragged_self_check_detail: str = ""
    # the target's attention layers that our FlashInfer graph patch does not handle (ModelAttention evidence; ""
    # none or not known) and the installed flashinfer-python (None: not read, as in simulations: no check)
    model_sliding_window: str = ""
    model_cross_attention: str = ""
    flashinfer_version: Optional[str] = None


def needs_ragged_self_check(f: "EngineFacts") -> bool:
    """Whether compact is wanted here (by the policy or the user) and hangs only on the on-device self-check of our
    patch, so that the check is worth running."""
    forced = (f.user_mode or "").strip().lower()
    wants_compact = forced in (COMPACT, CAP_ACCEPT) or (not forced and (f.policy or "").strip().lower() != VERIFY_ALL)
    device = (f.device or "").split(":", 1)[0]
    if device != "cuda" or not wants_compact:
        return False
    support = backend_support(f.attention_backend, use_mla=f.use_mla)
    if not support.needs_self_check(f.cuda_graph):
        return False
    return not _blockers(replace(f, ragged_self_check=True))


@dataclass(frozen=True)
class VerifyModeDecision:
    verify_mode: str  # value for SGLANG_RAGGED_VERIFY_MODE
    reason: str  # one sentence: why, and (when static) what would enable compact
    admission_policy: str  # the admission policy actually in effect (verify-all whenever static)
    downgraded: bool = False  # the policy wanted compact and did not get it: log ``reason`` as a warning
    blockers: tuple[str, ...] = field(default=())  # every reason compact is unsafe here (first one is ``reason``)


def _flashinfer_graph_patch_blockers(f: EngineFacts) -> list[str]:
    """What our FlashInfer CUDA-graph patch does not handle (empty where it is not the path: another backend, eager,
    MLA's own FlashInfer backend)."""
    if (f.attention_backend or "") != "flashinfer" or not f.cuda_graph or f.use_mla:
        return []
    out = []
    fix = "use --attention-backend fa3 (sm80/sm90) / trtllm_mha (sm100) for compact"
    if f.flashinfer_version is not None and not flashinfer_version_supported(f.flashinfer_version):
        installed = ("flashinfer-python is not installed" if f.flashinfer_version == FLASHINFER_ABSENT
                     else f"flashinfer-python {f.flashinfer_version} is installed")
        out.append(
            f"{installed}, and sglang-dspark's flashinfer ragged-verify patch replans through SGLang's "
            "fast_prefill_plan, whose 20 plan arguments (layers/attention/flashinfer_backend.py:293-316) match "
            f"flashinfer-python {' and '.join(FLASHINFER_PATCH_VERSIONS)} only (0.7.4 takes 21, fixed_uniform_q_len: "
            "every replay plan would raise TypeError, and SGLang's own fast-plan graphs with it); install "
            f"flashinfer-python=={SGLANG_FLASHINFER_PIN} (SGLang 0.5.23's pin) or {fix}"
        )
    what = [(f.model_sliding_window, "sliding-window / chunked-local attention", "SLIDING_WINDOW"),
            (f.model_cross_attention, "cross-attention", "CROSS_ATTENTION")]
    for evidence, kind, dispatch in what:
        if evidence:
            out.append(
                f"the target model has {kind} ({evidence}): SGLang's FlashInfer backend then plans two wrappers per "
                f"batch (WrapperDispatch.{dispatch}, layers/attention/flashinfer_backend.py:406-419) where "
                "sglang-dspark's flashinfer ragged-verify patch plans one, so the target's CUDA-graph capture would "
                f"raise (patches/flashinfer_ragged_verify.py, ragged_graph_support_reason); {fix}"
            )
    return out


def _blockers(f: EngineFacts) -> list[str]:
    """Every reason compact verify would crash, hang, be refused or give wrong tokens here, each naming the fix."""
    out: list[str] = []
    device = (f.device or "").split(":", 1)[0]
    backend = f.attention_backend or "unknown"
    mode = "CUDA graphs" if f.cuda_graph else "eager mode"
    if not f.has_confidence_head:
        where = f": {f.confidence_head_detail}" if f.confidence_head_detail else ""
        out.append(
            f"the DSpark draft has no confidence head (enable_confidence_head{where}), which per-request admission "
            "needs (upstream refuses to start without one: models/dspark.py:672-696, "
            "speculative/dspark_components/dspark_planner.py:137-147); use a draft trained with a confidence head"
        )
    if f.pd_mode == "prefill":
        out.append(
            "a PD prefill server never runs target verify (model_runner_components/cuda_graph_setup.py:720-724), "
            "so compact would only add the confidence head and start-up profiling; compact applies to the decode server"
        )
    elif f.pd_mode != "null" and f.is_deepseek_v4:
        out.append(
            "DeepSeek-V4.1 DSpark PD requires static verify (arg_groups/deepseek_v4_hook.py:355-382, validated before "
            "the speculative hook); serve it colocated (no --disaggregation-mode) for compact"
        )
    if device == "cuda":
        support = backend_support(backend, use_mla=f.use_mla)
        works = support.graph if f.cuda_graph else support.eager
        patch_blockers = _flashinfer_graph_patch_blockers(f) if works else []
        if patch_blockers:  # decided before the self-check, which then does not run
            out.extend(patch_blockers)
        elif not works:
            fix = ("disable decode CUDA graphs (--cuda-graph-backend-decode disabled) or use --attention-backend fa3 "
                   "(sm80/sm90) / trtllm_mha (sm100)") if (support.eager and f.cuda_graph) else (
                "use --attention-backend fa3 (sm80/sm90) or trtllm_mha (sm100)")
            out.append(f"attention backend {backend} cannot run compact verify in {mode} "
                       f"({support.evidence(f.cuda_graph)}); {fix}")
        elif support.needs_self_check(f.cuda_graph) and f.ragged_self_check is not True:
            out.append(
                f"attention backend {backend} runs compact verify in {mode} only through sglang-dspark's patch "
                f"({support.evidence(f.cuda_graph)}), opened after its on-device self-check passes (self-check: "
                f"{f.ragged_self_check_detail or 'not run'}); see the server log, or use --attention-backend fa3 "
                "(sm80/sm90) / trtllm_mha (sm100)"
            )
        elif support.requires_sm_major is not None and (
                f.gpu_sm is None or f.gpu_sm // 10 != support.requires_sm_major):
            arch = f"sm{f.gpu_sm}" if f.gpu_sm is not None else "an unknown GPU architecture"
            out.append(
                f"attention backend {backend} runs compact verify only with its trtllm-gen kernel "
                f"(sm{support.requires_sm_major}x: B200/GB200/B300), not on {arch} "
                f"({support.evidence(f.cuda_graph)}); on sm90 use --attention-backend fa3"
            )
    elif device == "cpu":
        support = backend_support(backend, device="cpu")
        if backend != "intel_amx" or not support.eager:
            out.append(
                f"attention backend {backend} on the CPU reads no ragged layout ({support.eager_evidence}); use "
                "--attention-backend intel_amx (the sglang-dspark CPU platform)"
            )
        elif f.cuda_graph:
            out.append(
                f"the CPU graph (--enable-torch-compile) replays uniform verify widths ({support.graph_evidence}); "
                "drop --enable-torch-compile for compact"
            )
    else:
        out.append(
            f"no {device or 'unknown-device'} attention backend reads ragged verify layouts in SGLang 0.5.23 "
            "(layers/attention has no layout reader for it); compact needs CUDA (fa3/trtllm_mha) or the CPU (intel_amx)"
        )
    if f.cuda_graph and (f.enable_two_batch_overlap or f.lora_enabled or f.disable_cuda_graph_padding):
        conflicts = (("two-batch-overlap", f.enable_two_batch_overlap), ("LoRA", f.lora_enabled),
                     ("--disable-cuda-graph-padding", f.disable_cuda_graph_padding))
        what = ", ".join(name for name, on in conflicts if on)
        out.append(
            f"compact CUDA graphs refuse {what} (model_executor/runner/decode_cuda_graph_runner.py:410-421); turn it "
            "off or disable decode CUDA graphs"
        )
    if f.attn_dp_size > 1 and device != "npu" and (f.moe_a2a_backend != "none" or f.dp_spec_prefill_coordination):
        out.append(
            "DSpark DP attention with an all-to-all MoE backend or DP prefill coordination requires static verify "
            "(arg_groups/speculative_hook.py:683-696); use --moe-a2a-backend none without "
            "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION"
        )
    if f.dcp_size > 1:
        out.append(
            "decode context parallelism (--dcp-size > 1) is not validated with compact verify upstream "
            "(arg_groups/model_overrides/kimi_k3.py:69-75 refuses it); use --dcp-size 1 for compact"
        )
    if f.enable_linear_replayssm_spec:
        out.append(
            "--enable-linear-replayssm-spec accepts compact only for KDA with a triton/nv_cutedsl verify kernel and "
            "was validated before the speculative hook (arg_groups/attention_hook.py:470-496); drop it for compact"
        )
    if f.hybrid_linear:
        out.append(
            "hybrid linear-attention (mamba/GDN) targets need both backends to support ragged verify "
            "(layers/attention/hybrid_linear_attn_backend.py:1233-1237) and the plugin's start-up probes build no "
            "mamba state; not validated, so static"
        )
    if f.model_requires_static:
        out.append(f"{f.model_requires_static}")
    if device != "cpu" or f.tp_size > 1:  # the plugin's start-up SPS profiling (CPU graphs are refused above)
        if f.cuda_graph and device != "cpu" and not (f.sps_table_from_file or f.sps_probes_tier_aligned):
            out.append(
                "the plugin's start-up SPS profiling probes verify sizes that are not captured graph tiers and would "
                "abort on 'ragged verify tier mismatch' (decode_cuda_graph_runner.py:1608-1614); pass "
                "--speculative-dspark-sps-table-path or disable decode CUDA graphs"
            )
        if f.tp_size > 1 and not (f.sps_table_from_file or f.sps_profile_rank_consistent):
            out.append(
                f"with --tp-size {f.tp_size} each rank would profile its own SPS table (different forward counts: "
                "NCCL hang; different tables: different graph tiers per rank); pass "
                "--speculative-dspark-sps-table-path so every rank loads the same table"
            )
    if f.attn_dp_size > 1 and not (f.sps_table_from_file or f.sps_probes_dp_attention):
        out.append(f"{SPS_PROBES_DP_ATTENTION_SKIPPED}; pass --speculative-dspark-sps-table-path for compact")
    return out


def decide_verify_mode(facts: EngineFacts) -> VerifyModeDecision:
    """The verify mode DSPARK should run in (pure; see the module docstring for the evidence).

    * The user's ``SGLANG_RAGGED_VERIFY_MODE=static`` always wins.
    * ``compact`` (or ``cap-accept``) set by the user wins only where it is safe; otherwise ``ValueError`` naming the
      backend, the reason and what to do (rather than a crash at graph capture or wrong tokens later).
    * Otherwise compact when the admission policy needs it and nothing blocks it, else static with the first blocker
      as the reason and ``downgraded=True``.
    """
    policy = (facts.policy or "").strip().lower()
    if policy not in ADMISSION_POLICIES:
        raise ValueError(f"admission policy {facts.policy!r} is not one of {', '.join(ADMISSION_POLICIES)}")
    user_mode = (facts.user_mode or "").strip().lower() or None
    if user_mode is not None and user_mode not in VERIFY_MODES:
        raise ValueError(
            f"{VERIFY_MODE_ENV}={facts.user_mode!r} is not a verify mode; expected one of {', '.join(VERIFY_MODES)} "
            "or unset it (sglang-dspark then chooses)."
        )
    if user_mode == STATIC:
        return VerifyModeDecision(STATIC, f"{VERIFY_MODE_ENV}=static was set by the user: every draft token is "
                                          "verified (unset it to let sglang-dspark choose).", VERIFY_ALL)
    if user_mode is None and policy == VERIFY_ALL:
        return VerifyModeDecision(STATIC, "admission policy verify-all verifies every draft token, which is upstream's "
                                          "static verify (set SGLANG_DSPARK_ADMISSION=async to schedule per "
                                          "request).", VERIFY_ALL)
    blockers = _blockers(facts)
    backend = facts.attention_backend or "unknown"
    where = f"{backend} on {facts.device}" + (" with CUDA graphs" if facts.cuda_graph and facts.device != "cpu" else
                                              " with the CPU graph" if facts.cuda_graph else " in eager mode")
    if user_mode is not None:  # compact / cap-accept forced by the user
        if blockers:
            raise ValueError(
                f"{VERIFY_MODE_ENV}={user_mode} is not safe for attention backend {where}: "
                + "; ".join(blockers)
                + f". Unset {VERIFY_MODE_ENV} (sglang-dspark then picks static here) or change the configuration."
            )
        return VerifyModeDecision(user_mode, f"{VERIFY_MODE_ENV}={user_mode} was set by the user and attention backend "
                                             f"{where} runs ragged verify.", policy)
    if blockers:
        return VerifyModeDecision(
            STATIC,
            f"Static verify (admission verify-all instead of {policy}): {blockers[0]}.",
            VERIFY_ALL,
            downgraded=True,
            blockers=tuple(blockers),
        )
    support = backend_support(backend, use_mla=facts.use_mla, device=(facts.device or "").split(":", 1)[0])
    return VerifyModeDecision(
        COMPACT,
        f"Compact verify for admission policy {policy}: attention backend {where} runs ragged verify "
        f"({support.evidence(facts.cuda_graph)}).",
        policy,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Reading SGLang's resolved arguments (lazy SGLang imports only)
# ---------------------------------------------------------------------------------------------------------------------


def _get(view: Any, name: str, default: Any = None) -> Any:
    try:
        value = getattr(view, name)
    except AttributeError:
        return default
    return default if value is None else value


def decode_graph_backend(view: Any) -> str:
    """The decode-phase CUDA graph backend ("full" / "breakable" / "disabled") of a resolving view or a raw record.

    A resolving view past ``handle_cuda_graph_config`` (arg_groups/pipeline.py:191) carries a ``CudaGraphConfig``;
    for a raw record this replays the precedence of ``parse_cuda_graph_config`` (arg_groups/cuda_graph_hook.py:32-100):
    JSON > per-phase flags > ``--disable-decode-cuda-graph`` > legacy ``--disable-cuda-graph`` > default "full"
    (model_executor/cuda_graph_config.py:185-190).
    """
    config = _get(view, "cuda_graph_config")
    decode = getattr(config, "decode", None)
    if decode is not None and getattr(decode, "backend", None):
        return str(decode.backend)
    backend = "full"
    if _get(view, "disable_cuda_graph", False):
        backend = "disabled"
    if _get(view, "disable_decode_cuda_graph", False):
        backend = "disabled"
    if _get(view, "cuda_graph_backend_decode"):
        backend = str(_get(view, "cuda_graph_backend_decode"))
    if isinstance(config, dict) and isinstance(config.get("decode"), dict) and config["decode"].get("backend"):
        backend = str(config["decode"]["backend"])
    return backend


def verify_attention_backend(view: Any) -> Optional[str]:
    """The backend that executes TARGET_VERIFY: prefill or decode backend per ``speculative_attention_mode``
    (arg_groups/fields/spec.py:129-136, layers/attention/hybrid_attn_backend.py:57-62); split fields fall back to
    ``attention_backend`` (arg_groups/model_override_base.py:138-152)."""
    base = _get(view, "attention_backend")
    if _get(view, "speculative_attention_mode", "prefill") == "decode":
        return _get(view, "decode_attention_backend") or base
    return _get(view, "prefill_attention_backend") or base


def hf_config_flags(config: Any) -> dict[str, bool]:
    """use_mla / hybrid_linear / is_deepseek_v4 from an HF config (object or dict); heuristics, documented."""
    def get(key, default=None):
        if isinstance(config, dict):
            return config.get(key, default)
        return getattr(config, key, default)

    if config is None:
        return {"use_mla": False, "hybrid_linear": False, "is_deepseek_v4": False}
    archs = [str(a) for a in (get("architectures") or [])]
    layer_types = [str(t).lower() for t in (get("layer_types") or [])]
    hybrid = any(("linear" in t or "mamba" in t or "conv" in t) for t in layer_types) or any(
        get(k) is not None for k in ("linear_num_value_heads", "linear_conv_kernel_dim", "mamba_d_state", "ssm_cfg")
    )
    return {
        "use_mla": get("kv_lora_rank") is not None,
        "hybrid_linear": bool(hybrid),
        "is_deepseek_v4": any("DeepseekV4" in a or "DeepSeekV4" in a for a in archs),
    }


def _model_requires_static(config: Any) -> Optional[str]:
    archs = []
    if config is not None:
        archs = [str(a) for a in ((config.get("architectures") if isinstance(config, dict)
                                   else getattr(config, "architectures", None)) or [])]
    if any(a.startswith("MiniMaxM3") for a in archs):
        return ("MiniMax-M3.1 NVFP4 DSPARK requires static verify (arg_groups/model_overrides/minimax_m3.py:55-72, "
                "validated before the speculative hook)")
    return None


def _sglang_gpu_sm() -> Optional[int]:
    try:
        from sglang.srt.runtime_context import get_platform

        platform = get_platform()
        if platform.is_sm100:
            return 100
        if platform.is_sm120:
            return 120
        if platform.is_sm90:
            return 90
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major * 10 + minor
    except Exception:  # no CUDA here: unknown
        return None
    return None


def facts_from_server_args(
    server_args_view: Any,
    draft_has_confidence_head: bool,
    policy: str,
    user_mode: Optional[str],
    *,
    hf_config: Any = None,
    use_mla: Optional[bool] = None,
    gpu_sm: Optional[int] = None,
    sps_probes_tier_aligned: bool = PLUGIN_SPS_PROBES_TIER_ALIGNED,
    sps_profile_rank_consistent: bool = PLUGIN_SPS_PROFILE_RANK_CONSISTENT,
    confidence_head_detail: str = "",
    target_attention: Optional[ModelAttention] = None,
    flashinfer_version: Optional[str] = None,
) -> EngineFacts:
    """EngineFacts from SGLang's resolving view (``resolving_view(server_args)``) inside ``_handle_dspark``.

    Everything read here is resolved before the speculative hook (arg_groups/pipeline.py: cuda graphs :191, device
    backends :205-209, attention backend :242, all before handle_speculative_decoding :306). ``hf_config`` (the
    target's), ``use_mla`` and ``gpu_sm`` are looked up through SGLang when not given (pass them to keep SGLang out,
    as explain does). An unknown ``gpu_sm`` keeps trtllm_mha static; a failed model-config lookup leaves the model flags
    (MLA, hybrid, DeepSeek-V4) False, and SGLang's own validations still apply. ``target_attention`` (the target's
    sliding-window / cross-attention layers) is read from that config and SGLang's ModelConfig when not given; where
    SGLang cannot build one, the target's config comes from the local folder or the local Hugging Face cache (never a
    download). ``flashinfer_version`` is the installed ``flashinfer-python`` where the verify backend is flashinfer.
    """
    view = server_args_view
    device = str(_get(view, "device", "cuda"))
    is_cpu = device.startswith("cpu")
    pd_mode = str(_get(view, "disaggregation_mode", "null"))
    backend = verify_attention_backend(view)
    if is_cpu:
        cuda_graph = bool(_get(view, "enable_torch_compile", False))
    else:
        cuda_graph = decode_graph_backend(view) != "disabled"
        if pd_mode == "prefill" or backend in ("torch_native", "flex_attention"):
            cuda_graph = False  # cuda_graph_setup.py:720-724; attention_hook.py:124-160
    sglang_model_config = None
    config_source = "the target's config"
    if hf_config is None:
        try:
            from sglang.srt.arg_groups.overrides import model_config_of

            sglang_model_config = model_config_of(view)
            hf_config = sglang_model_config.hf_config
        except Exception:
            sglang_model_config = hf_config = None
    if hf_config is None:  # the local folder or the local Hugging Face cache: never a download
        from sglang_dspark.engine.draft_head import read_local_config

        hf_config, config_source = read_local_config(_get(view, "model_path"), _get(view, "revision"))
    if target_attention is None:
        target_attention = model_attention(hf_config, source=config_source, sglang_model_config=sglang_model_config)
    if flashinfer_version is None and backend == "flashinfer" and not is_cpu:
        flashinfer_version = installed_flashinfer_version()
    flags = hf_config_flags(hf_config)
    if use_mla is None:
        use_mla = flags["use_mla"]
        try:
            from sglang.srt.arg_groups.overrides import use_mla_backend

            use_mla = bool(use_mla_backend(view))
        except Exception:
            pass
    if gpu_sm is None and device.startswith("cuda"):
        gpu_sm = _sglang_gpu_sm()
    attn_dp_size = int(_get(view, "attn_dp_size", 1))
    if _get(view, "enable_dp_attention", False) and attn_dp_size == 1:
        attn_dp_size = int(_get(view, "dp_size", 1))  # parallel_hook.py:39-61 (deprecated spelling)
    lora = _get(view, "enable_lora")
    lora_enabled = bool(lora) or (lora is None and bool(_get(view, "lora_paths")))
    coordination = os.environ.get("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION", "").strip().lower() in (
        "1", "true", "yes", "y")
    return EngineFacts(
        device=device.split(":", 1)[0],
        attention_backend=backend,
        cuda_graph=cuda_graph,
        policy=policy,
        has_confidence_head=bool(draft_has_confidence_head),
        user_mode=user_mode,
        tp_size=int(_get(view, "tp_size", 1)),
        dp_size=int(_get(view, "dp_size", 1)),
        attn_dp_size=attn_dp_size,
        pd_mode=pd_mode,
        gpu_sm=gpu_sm,
        use_mla=use_mla,
        moe_a2a_backend=str(_get(view, "moe_a2a_backend", "none")),
        dp_spec_prefill_coordination=coordination,
        dcp_size=int(_get(view, "dcp_size", 1)),
        enable_two_batch_overlap=bool(_get(view, "enable_two_batch_overlap", False)),
        lora_enabled=lora_enabled,
        disable_cuda_graph_padding=bool(_get(view, "disable_cuda_graph_padding", False)),
        hybrid_linear=flags["hybrid_linear"],
        enable_linear_replayssm_spec=bool(_get(view, "enable_linear_replayssm_spec", False)),
        is_deepseek_v4=flags["is_deepseek_v4"],
        model_requires_static=_model_requires_static(hf_config),
        sps_table_from_file=bool(_get(view, "speculative_dspark_sps_table_path")),
        sps_probes_tier_aligned=sps_probes_tier_aligned,
        sps_profile_rank_consistent=sps_profile_rank_consistent,
        confidence_head_detail=confidence_head_detail,
        model_sliding_window=target_attention.sliding_window,
        model_cross_attention=target_attention.cross_attention,
        flashinfer_version=flashinfer_version,
    )


def read_target_attention(model_path: Optional[str], revision: Optional[str] = None, **kwargs) -> ModelAttention:
    """:func:`model_attention` of the target's ``config.json`` from a local folder or the local Hugging Face cache
    (``engine/draft_head.py``: nothing is downloaded); unknown when neither has it."""
    from sglang_dspark.engine.draft_head import read_local_config

    config, source = read_local_config(model_path, revision, **kwargs)
    if config is None:
        return ModelAttention(source=source, known=False)
    return model_attention(config, source=source)


__all__ = [
    "ADMISSION_POLICIES",
    "BackendSupport",
    "COMPACT",
    "EngineFacts",
    "FLASHINFER_PATCH_VERSIONS",
    "ModelAttention",
    "SGLANG_FLASHINFER_PIN",
    "SPS_PROBES_DP_ATTENTION_SKIPPED",
    "STATIC",
    "VERIFY_MODES",
    "VERIFY_MODE_ENV",
    "VerifyModeDecision",
    "backend_support",
    "compact_capable_backends",
    "decide_verify_mode",
    "decode_graph_backend",
    "facts_from_server_args",
    "hf_config_flags",
    "installed_flashinfer_version",
    "model_attention",
    "needs_ragged_self_check",
    "read_target_attention",
    "verify_attention_backend",
]
