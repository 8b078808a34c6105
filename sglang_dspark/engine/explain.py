"""``sglang-dspark explain``: what a DSPARK launch would run on a given GPU, without the GPU (and without the model).

``explain(argv, assume_device, assume_gpu)`` parses the ``python -m sglang.launch_server`` arguments with SGLang's own
parser (``ServerArgs.add_cli_args`` + ``ServerArgs.from_cli_args``, the body of ``server_args.prepare_server_args``
minus its ``logging.basicConfig(force=True)``; no resolution runs, so nothing is loaded), then replays the few
resolution steps the verify-mode decision depends on as small pure tables, each citing SGLang 0.5.23 (paths under
``sglang/srt/``):

* attention backend: ``get_default_attn_backend`` (arg_groups/model_override_base.py:277-345) keyed by the GPU's SM
  (table ``GPUS``), plus the explicit flags and the few post-process rewrites that run before the speculative hook;
* decode CUDA graphs: ``parse_cuda_graph_config`` precedence (arg_groups/cuda_graph_hook.py:32-100);
* captured batch sizes: GPU-memory max_bs (arg_groups/memory_hook.py:88-169), the spec capture list
  (arg_groups/cuda_graph_hook.py:500-532), the runtime clamp to the request pool
  (model_executor/runner/base_cuda_graph_runner.py:77-102; DSPARK's default max_running_requests is 48,
  arg_groups/speculative_hook.py:852-857);
* gamma: ``_handle_dspark`` (arg_groups/speculative_hook.py:806-839) over the draft's config.json;
* where compact runs through our triton / flashinfer patch, the launch first runs their on-device self-check
  (``engine/self_check/ragged_self_check.py``); explain cannot run it and assumes the outcome ``ragged_self_check``
  (``pass`` by default, ``fail`` shows the fallback), and says so in ``ragged_self_check``, with what the check
  runs (precision, tolerances, shapes) and its time bound and timeout retry policy (``check_summary``).

A local ``--model-path`` / ``--speculative-draft-model-path`` folder is read (config.json only) when present; hub ids
are never fetched: a hub config.json is read from the local Hugging Face cache when it is there
(``engine/draft_head.py``, as the server reads it), else the draft's confidence head is assumed present and
``confidence_head`` says so (the server reads the config at start-up and runs verify-all without a head), and the
target is assumed to have full attention only (``model_attention`` says so).

Also shown: ``model_attention`` (sliding-window / chunked / cross-attention layers of the target, which keep
FlashInfer CUDA graphs static: ``engine/verify_mode.py`` ``model_attention``), ``flashinfer`` (the flashinfer-python
version the decision assumed: ``--flashinfer-version``, else the one installed here, else SGLang 0.5.23's pin) and
``learned_state`` (whether step records may teach the verify budget: off wherever several ranks must agree on it,
``engine/rank_learning.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform as _platform
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_dspark.engine.rank_learning import ParallelFacts, decide_rank_learning
from sglang_dspark.engine.verify_mode import (
    FLASHINFER_ABSENT,
    FLASHINFER_PATCH_VERSIONS,
    SGLANG_FLASHINFER_PIN,
    SPS_PROBES_DP_ATTENTION_SKIPPED,
    STATIC,
    VERIFY_MODE_ENV,
    EngineFacts,
    backend_support,
    VerifyModeDecision,
    decide_verify_mode,
    decode_graph_backend,
    facts_from_server_args,
    hf_config_flags,
    installed_flashinfer_version,
    model_attention,
    needs_ragged_self_check,
    verify_attention_backend,
)

OUTPUT_KEYS = ("attention_backend", "cuda_graph", "verify_mode", "reason", "admission_policy", "gamma",
               "sps_probe_shapes", "ragged_self_check", "confidence_head", "sps_profiling", "model_attention",
               "flashinfer", "learned_state", "prompt_lookup")
SELF_CHECK_OUTCOMES = ("pass", "fail")
DEFAULT_DSPARK_GAMMA = 7  # speculative/dspark_components/dspark_config.py:21
DSPARK_DEFAULT_MAX_RUNNING_REQUESTS = 48  # arg_groups/speculative_hook.py:852-857


@dataclass(frozen=True)
class GpuSpec:
    name: str
    sm: int  # major * 10 + minor
    memory_mb: Optional[int]  # what torch reports (get_device_memory_capacity, MiB); None: unknown


# Capability and reported memory per GPU model. The memory only picks the decode max_bs tier (memory_hook.py:88-160).
GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in (
    GpuSpec("H100", 90, 81559), GpuSpec("H800", 90, 81559), GpuSpec("H200", 90, 143771),
    GpuSpec("H20", 90, 97871), GpuSpec("GH200", 90, 97280),
    GpuSpec("B200", 100, 183359), GpuSpec("GB200", 100, 189471), GpuSpec("B300", 103, 275040),
    GpuSpec("A100", 80, 81251), GpuSpec("A100-40GB", 80, 40536), GpuSpec("A800", 80, 81251),
    GpuSpec("A10", 86, 22731), GpuSpec("A10G", 86, 22731), GpuSpec("A40", 86, 46068),
    GpuSpec("L40S", 89, 46068), GpuSpec("L40", 89, 46068), GpuSpec("L4", 89, 22700),
    GpuSpec("RTX4090", 89, 24564), GpuSpec("RTX5090", 120, 32607), GpuSpec("RTX-PRO-6000", 120, 97887),
)}


def gpu_spec(name: str) -> GpuSpec:
    """``H100``, ``nvidia h200``, ``A100-80GB``, ``rtx 5090`` or a bare ``sm90`` / ``sm100`` (memory unknown)."""
    key = str(name).strip().upper().replace("NVIDIA", "").replace("_", "-").replace(" ", "").strip("-")
    key = key.replace("A100-80GB", "A100").replace("A100-SXM4-80GB", "A100").replace("A100-SXM4-40GB", "A100-40GB")
    for suffix in ("-SXM", "-SXM5", "-PCIE", "-NVL", "-80GB", "-141GB"):
        if key.endswith(suffix) and key[: -len(suffix)] in GPUS:
            key = key[: -len(suffix)]
    if key in GPUS:
        return GPUS[key]
    if key.startswith("SM") and key[2:].isdigit():
        return GpuSpec(key.lower(), int(key[2:]), None)
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or smNN, e.g. sm90)")


def default_attention_backend(gpu: GpuSpec, *, use_mla: bool, speculative_algorithm: Optional[str],
                              speculative_eagle_topk: Optional[int], page_size: Optional[int],
                              asymmetric_kv: bool = False, has_flashinfer: bool = True) -> str:
    """``get_default_attn_backend`` (arg_groups/model_override_base.py:277-345) for a CUDA GPU.

    Hopper (CUDA >= 12.3 assumed) with no spec / topk 1 and page 1 -> fa3 (:301-308; utils/common.py:3960-3966);
    sm100 -> trtllm_mha only when ``speculative_eagle_topk`` is already set or the algorithm is DFLASH (:309-321):
    DSPARK declares topk=1 later, in ``_handle_dspark`` (speculative_hook.py:774-779), so a plain DSPARK launch on a
    B200 gets flashinfer (:327-330) unless ``--speculative-eagle-topk 1`` is passed. MLA: sm90 fa3, sm100 flashinfer,
    else triton (:331-345). Model-specific overrides (arg_groups/model_overrides/) are not replayed.
    """
    major = gpu.sm // 10
    no_spec_or_topk_one = speculative_eagle_topk is None or (
        speculative_eagle_topk == 1 and page_size in (None, 1))
    if use_mla:
        if major == 9:
            return "fa3"
        if major == 10:
            return "flashinfer"
        return "triton"
    if major == 9 and no_spec_or_topk_one:
        return "fa3"
    if major == 10 and no_spec_or_topk_one and (
            speculative_algorithm is None or speculative_eagle_topk is not None
            or str(speculative_algorithm).upper() == "DFLASH"):
        return "fa4" if asymmetric_kv else "trtllm_mha"
    return "flashinfer" if has_flashinfer else "triton"


def _read_json(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    candidate = Path(str(path)) / "config.json"
    if not candidate.is_file():
        return None
    try:
        return json.loads(candidate.read_text())
    except (OSError, ValueError):
        return None


def resolve_attention_backend(raw: Any, *, device: str, gpu: Optional[GpuSpec], use_mla: bool,
                              asymmetric_kv: bool = False) -> Any:
    """A namespace with attention_backend / prefill_attention_backend / decode_attention_backend /
    speculative_attention_mode as SGLang resolves them before the speculative hook."""
    attention = raw.attention_backend
    prefill, decode = raw.prefill_attention_backend, raw.decode_attention_backend
    if device == "cpu":
        if attention is None:  # arg_groups/platform_hook.py:158-168 (the sglang-dspark CPU platform declares AMX)
            attention = "torch_native" if _platform.machine().lower() in ("aarch64", "arm64") else "intel_amx"
    elif device == "npu":
        attention = attention or "ascend"
    elif device == "xpu":
        attention = attention or "intel_xpu"
    else:
        if attention is None and getattr(raw, "enable_deterministic_inference", False) and gpu is not None:
            attention = "flashinfer" if gpu.sm // 10 in (10, 12) else "fa3"  # overrides.py:1092-1123
        if prefill is not None and prefill == decode:
            attention = prefill  # overrides.py:1128-1131
        elif attention is None:
            if gpu is None:
                raise ValueError("cannot tell which attention backend SGLang would pick without the GPU: pass a GPU "
                                 "(e.g. H100, A100, B200, L40S) or --attention-backend")
            attention = default_attention_backend(
                gpu, use_mla=use_mla, speculative_algorithm=raw.speculative_algorithm or "DSPARK",
                speculative_eagle_topk=raw.speculative_eagle_topk, page_size=raw.page_size,
                asymmetric_kv=asymmetric_kv)
        if attention == "fa3" and getattr(raw, "kv_cache_dtype", None) == "fp8_e5m2":
            attention = "triton"  # overrides.py:1263-1270
    return types.SimpleNamespace(attention_backend=attention, prefill_attention_backend=prefill,
                                 decode_attention_backend=decode,
                                 speculative_attention_mode=raw.speculative_attention_mode or "prefill")


def decode_max_bs(gpu: Optional[GpuSpec], tp_size: int) -> int:
    """Default decode-graph max_bs by GPU memory (arg_groups/memory_hook.py:88-160)."""
    mem = gpu.memory_mb if gpu is not None else None
    if mem is None:
        return 160
    if mem < 20 * 1024:
        return 8
    if mem < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if mem < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if mem < 160 * 1024:
        return 256 if tp_size < 4 else 512
    return 512


def spec_capture_batch_sizes(max_bs: int, *, disable_padding: bool = False) -> list[int]:
    """``generate_decode_cuda_graph_batch_sizes`` for a speculative launch (arg_groups/cuda_graph_hook.py:500-532)."""
    if disable_padding:
        capture = list(range(1, max_bs + 1))
    else:
        capture = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
                   + list(range(272, max_bs + 1, 16)))
    capture = [bs for bs in capture if bs <= max_bs]
    if max_bs not in capture:
        capture.append(max_bs)
    return capture


def capture_batch_sizes(raw: Any, gpu: Optional[GpuSpec], *, max_running_requests: int, attn_dp_size: int = 1,
                        alignment: int = 1) -> list[int]:
    """The target-verify graph batch sizes the decode runner would capture."""
    config = raw.cuda_graph_config if isinstance(raw.cuda_graph_config, dict) else {}
    decode = config.get("decode") or {}
    explicit_bs = decode.get("bs") or raw.cuda_graph_bs_decode
    if explicit_bs:
        capture = sorted({int(b) for b in explicit_bs})
    else:
        explicit_max = decode.get("max_bs") or raw.cuda_graph_max_bs_decode
        max_bs = int(explicit_max) if explicit_max else decode_max_bs(gpu, int(raw.tp_size))
        if not explicit_max and raw.max_running_requests is not None:
            max_bs = min(max_bs, int(raw.max_running_requests))  # memory_hook.py:162-169
        capture = spec_capture_batch_sizes(max_bs, disable_padding=bool(raw.disable_cuda_graph_padding))
    # base_cuda_graph_runner.py:77-102: clamp to the request pool (max_running_requests per attention-DP worker,
    # mem_cache/kv_cache_configurator.py:3125-3129), aligned up.
    pool = max(1, max_running_requests // max(1, attn_dp_size))
    pool = -(-pool // alignment) * alignment
    if max(capture) > pool:
        capture.append(pool)
    capture = sorted({bs for bs in capture if bs % alignment == 0 and bs <= pool})
    return capture


def graph_token_tiers(capture_bs: Sequence[int], gamma: int) -> list[int]:
    """Ragged-verify graph tiers: {bs * (gamma + 1)} (decode_cuda_graph_runner.py:699-702)."""
    return sorted({int(bs) * (int(gamma) + 1) for bs in capture_bs})


ProbeShapes = Callable[[Optional[Sequence[int]], int, int], list]


def planned_probe_shapes(capture_bs: Optional[Sequence[int]], gamma: int, max_requests: int,
                         max_total_tokens: int = 1 << 20) -> list[list[int]]:
    """[requests, verify_tokens] of the start-up SPS profile, from the planner the server runs
    (``profiler.probe_plan.make_probe_plan``): with graphs only captured token tiers T at R <= min(T, max_bs)."""
    from sglang_dspark.profiler.probe_plan import make_probe_plan

    plan = make_probe_plan(
        max_requests, gamma, max_total_tokens,
        token_tiers=graph_token_tiers(capture_bs, gamma) if capture_bs else None,
        max_slots=max(capture_bs) if capture_bs else None,
    )
    return [[r, b] for r, b in plan.probes()]


def parse_launch_args(argv: Sequence[str]) -> Any:
    """SGLang's own parser, unresolved (``prepare_server_args`` without its logging side effect)."""
    from sglang.srt.server_args import ServerArgs

    argv = list(argv)
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    try:
        namespace = parser.parse_args(argv)
    except SystemExit as exc:
        raise ValueError(f"SGLang's launch_server parser rejected {argv!r} (exit {exc.code})") from None
    return ServerArgs.from_cli_args(namespace)


def resolve_gamma(raw: Any, draft_config: Optional[dict]) -> int:
    """gamma as ``_handle_dspark`` resolves it (speculative_hook.py:806-839): --speculative-dspark-block-size IS gamma
    (the verify window is gamma + 1); else the draft's ``dspark_block_size`` / ``dflash_config.block_size`` /
    ``block_size`` (dspark_config.py:220-297, dflash_utils.py:607-616); else --speculative-num-draft-tokens - 1;
    else 7."""
    num_draft = raw.speculative_num_draft_tokens
    gamma: Optional[int] = None
    if raw.speculative_dspark_block_size is not None:
        gamma = int(raw.speculative_dspark_block_size)
        if gamma <= 0:
            raise ValueError(f"DSpark requires --speculative-dspark-block-size to be positive, got {gamma}.")
    elif draft_config:
        nested = draft_config.get("dflash_config") or {}
        value = draft_config.get("dspark_block_size")
        if value is None:
            value = nested.get("block_size", draft_config.get("block_size"))
        gamma = int(value) if value is not None else None
    if gamma is None:
        gamma = int(num_draft) - 1 if num_draft is not None else DEFAULT_DSPARK_GAMMA
    if num_draft is not None and int(num_draft) != gamma + 1:
        raise ValueError(f"DSpark speculative_num_draft_tokens must equal gamma + 1 (= {gamma + 1} for gamma={gamma}), "
                         f"but got speculative_num_draft_tokens={num_draft}.")
    return gamma


def _draft_path(raw: Any) -> Optional[str]:
    if raw.speculative_draft_model_path:
        return str(raw.speculative_draft_model_path)
    try:  # the plugin serves its embedded SmolLM2 target with the shipped draft (engine/arg_resolution.py)
        from sglang_dspark.embedded.defaults import is_embedded_target, packaged_draft_dir

        if is_embedded_target(raw.model_path):
            return str(packaged_draft_dir())
    except Exception:
        pass
    return None


def confidence_head_note(present: Optional[bool], source: str) -> str:
    """What explain says about the draft's confidence head (``present`` None: not readable here, assumed present)."""
    if present is None:
        return (f"unknown here: {source}; assumed present (the server reads the draft's config at start-up and runs "
                "verify-all if it has no confidence head)")
    return f"{'yes' if present else 'no (verify-all)'}: {source}"


def assumed_flashinfer_version(given: Optional[str] = None) -> tuple[str, str]:
    """(version, where it comes from): ``given``, else the one installed here, else SGLang 0.5.23's pin."""
    if given:
        return given, "given"
    installed = installed_flashinfer_version()
    if installed != FLASHINFER_ABSENT:
        return installed, "installed here"
    return SGLANG_FLASHINFER_PIN, "SGLang 0.5.23's pin; not installed here"


def flashinfer_note(facts: EngineFacts, where: str) -> str:
    """What explain says about FlashInfer: only where the verify backend is flashinfer."""
    if (facts.attention_backend or "") != "flashinfer" or facts.device != "cuda":
        return f"not used (attention backend {facts.attention_backend})"
    version = facts.flashinfer_version
    supported = version in FLASHINFER_PATCH_VERSIONS
    if not facts.cuda_graph or facts.use_mla:
        return f"{version} ({where}); compact here runs SGLang's own FlashInfer path, not sglang-dspark's graph patch"
    verdict = "supported by" if supported else "not supported by"
    return (f"{version} ({where}): {verdict} sglang-dspark's flashinfer ragged-verify graph patch "
            f"(supported: {', '.join(FLASHINFER_PATCH_VERSIONS)})")


def sps_profiling_note(facts: EngineFacts, decision: VerifyModeDecision) -> str:
    """Whether the server would run its start-up SPS probes, and why not (pure)."""
    if facts.sps_table_from_file:
        return "no probes: the table from --speculative-dspark-sps-table-path"
    if facts.attn_dp_size > 1 and not facts.sps_probes_dp_attention:
        return f"probes skipped: DP attention ({SPS_PROBES_DP_ATTENTION_SKIPPED})"
    if decision.verify_mode == STATIC:
        return "no probes: static verify needs no SPS table"
    if facts.pd_mode == "prefill":
        return "no probes: a PD prefill server never verifies"
    return "probes at start-up (sps_probe_shapes), then kept in the cache folder for the next start"


def explain(argv: list[str], assume_device: Optional[str] = None, assume_gpu: Optional[str] = None, *,
            policy: Optional[str] = None, user_mode: Optional[str] = None,
            probe_shapes: ProbeShapes = planned_probe_shapes, ragged_self_check: str = "pass",
            flashinfer_version: Optional[str] = None) -> dict:
    """What a DSPARK launch with ``argv`` would run (see the module docstring). Keys: ``OUTPUT_KEYS``.

    ``policy`` defaults to SGLANG_DSPARK_ADMISSION, ``user_mode`` to SGLANG_RAGGED_VERIFY_MODE; ``ragged_self_check``
    (``pass`` / ``fail``) is the assumed outcome of the on-device self-check where the launch would run one;
    ``flashinfer_version`` the flashinfer-python on the GPU machine (default: installed here, else SGLang's pin).
    Raises ValueError where the launch itself would be refused (e.g. a user-forced compact verify on an unsafe backend).
    """
    if ragged_self_check not in SELF_CHECK_OUTCOMES:
        raise ValueError(f"ragged_self_check must be one of {SELF_CHECK_OUTCOMES}, got {ragged_self_check!r}")
    from sglang_dspark import envs
    from sglang_dspark.engine.draft_head import read_draft_confidence_head

    raw = parse_launch_args(argv)
    if raw.speculative_algorithm not in (None, "DSPARK"):
        raise ValueError(f"explain covers --speculative-algorithm DSPARK, got {raw.speculative_algorithm!r}")
    gpu = gpu_spec(assume_gpu) if assume_gpu else None
    device = (assume_device or raw.device or ("cuda" if gpu is not None else "cpu")).split(":", 1)[0]
    if device != "cuda":
        gpu = None
    from sglang_dspark.engine.draft_head import read_local_config

    target_json, target_source = read_local_config(raw.model_path, getattr(raw, "revision", None))
    target_config = target_json or {}
    attention = model_attention(target_json, source=target_source)
    flashinfer_version, flashinfer_where = assumed_flashinfer_version(flashinfer_version)
    flags = hf_config_flags(target_config)
    asymmetric_kv = (target_config.get("v_head_dim") is not None
                     and target_config.get("v_head_dim") != target_config.get("head_dim"))
    backends = resolve_attention_backend(raw, device=device, gpu=gpu, use_mla=flags["use_mla"],
                                         asymmetric_kv=asymmetric_kv)
    draft_path = _draft_path(raw)
    draft_config = _read_json(draft_path)
    gamma = resolve_gamma(raw, draft_config)
    head = read_draft_confidence_head(draft_path, raw.speculative_draft_model_revision)
    has_head = head.present is not False  # not readable here: assumed present (see confidence_head)
    policy = policy or envs.ADMISSION.get()
    if user_mode is None:
        user_mode = os.environ.get(VERIFY_MODE_ENV, "").strip() or None

    view = types.SimpleNamespace(**{name: getattr(raw, name, None) for name in (
        "tp_size", "dp_size", "attn_dp_size", "enable_dp_attention", "disaggregation_mode", "moe_a2a_backend",
        "dcp_size", "enable_two_batch_overlap", "enable_lora", "lora_paths", "disable_cuda_graph_padding",
        "enable_linear_replayssm_spec", "speculative_dspark_sps_table_path", "enable_torch_compile",
        "cuda_graph_config", "disable_cuda_graph", "disable_decode_cuda_graph", "cuda_graph_backend_decode")})
    view.device = device
    view.__dict__.update(vars(backends))
    facts = facts_from_server_args(view, has_head, policy, user_mode, hf_config=target_config,
                                   use_mla=flags["use_mla"], gpu_sm=gpu.sm if gpu is not None else None,
                                   confidence_head_detail=head.source, target_attention=attention,
                                   flashinfer_version=flashinfer_version)
    self_check_note = "not needed"
    if facts.device == "cuda" and backend_support(facts.attention_backend, use_mla=facts.use_mla).needs_self_check(
            facts.cuda_graph):
        self_check_note = "not run: this launch is static before it (see reason)"
    if needs_ragged_self_check(facts):
        from sglang_dspark.engine.self_check.ragged_self_check import check_summary

        passed = ragged_self_check == "pass"
        self_check_note = (f"runs at start-up on the GPU (our {facts.attention_backend} ragged-verify patch, once per "
                           f"GPU and software); assumed to {ragged_self_check}: compact if it passes, static if not; "
                           f"what it checks: {check_summary()}")
        facts = dataclasses.replace(facts, ragged_self_check=passed, ragged_self_check_detail=(
            "assumed to pass by explain" if passed else "assumed to fail by explain"))
    decision = decide_verify_mode(facts)

    max_requests = int(raw.max_running_requests or DSPARK_DEFAULT_MAX_RUNNING_REQUESTS)
    capture_bs = None
    if facts.cuda_graph and device != "cpu":
        capture_bs = capture_batch_sizes(raw, gpu, max_running_requests=max_requests, attn_dp_size=facts.attn_dp_size,
                                         alignment=2 if raw.enable_two_batch_overlap else 1)
    shapes = [] if decision.verify_mode == STATIC else [list(map(int, s)) for s in
                                                          probe_shapes(capture_bs, gamma, max_requests)]
    return {
        "attention_backend": facts.attention_backend,
        "cuda_graph": facts.cuda_graph,
        "verify_mode": decision.verify_mode,
        "reason": decision.reason,
        "admission_policy": decision.admission_policy,
        "gamma": gamma,
        "sps_probe_shapes": shapes,
        "ragged_self_check": self_check_note,
        "confidence_head": confidence_head_note(head.present, head.source),
        "sps_profiling": sps_profiling_note(facts, decision),
        "model_attention": attention.note(),
        "flashinfer": flashinfer_note(facts, flashinfer_where),
        "learned_state": learned_state_note(raw, facts, decision),
        "prompt_lookup": lookup_note(raw, facts, decision, gamma),
    }


def lookup_note(raw: Any, facts: EngineFacts, decision: VerifyModeDecision, gamma: int) -> str:
    """Whether prompt lookup runs beside the draft (engine/lookup_source.py) and what it does on this engine: it rides
    on the draft gate, which needs compact verify, the async or exact policy and one rank deciding alone."""
    from sglang_dspark import envs
    from sglang_dspark.lookup.config import DEFAULT as config

    mode = envs.LOOKUP.get()
    if mode == "off":
        return f"off ({envs.LOOKUP.name}=off)"
    if envs.DRAFT_GATE.get() == "off":
        return f"off: it rides on the draft gate, and {envs.DRAFT_GATE.name}=off"
    if decision.verify_mode == STATIC or decision.admission_policy not in ("async", "exact"):
        return "off: static verify / verify-all has no per-request verify length (the draft gate needs compact)"
    learning = decide_rank_learning(ParallelFacts(tp_size=facts.tp_size, pp_size=int(getattr(raw, "pp_size", 1) or 1),
                                                  attn_dp_enabled=facts.attn_dp_size > 1))
    if not learning.enabled:
        return f"off: the draft gate is off where ranks must agree ({learning.reason})"
    where = "on the host, in the planner; a ragged verify of each lookup row's chain"
    if bool(getattr(raw, "disable_overlap_schedule", False)):
        overlap = "no overlap scheduler (--disable-overlap-schedule): the host's tokens are always current"
    else:
        publishes = facts.attention_backend in ("flashinfer", None) or facts.device == "cpu"
        anchors = ("" if publishes else f"{facts.attention_backend} publishes no host sequence lengths under the "
                   "overlap scheduler, so ")
        gap = ("a wait costs no device time here (the forward runs on the host)" if facts.device == "cpu" else
               f"a wait costs the device an idle gap, {1e3 * config.gap_prior_seconds:g} ms + "
               f"{1e6 * config.gap_prior_seconds_per_request:g} us per request until the step records time it")
        overlap = (f"{anchors}rows are anchored on the scheduler's committed lengths (proposals on every backend); "
                   "a decode batch with a lookup match waits for the previous result (gives up SGLang's overlap for "
                   "that step) only while chains are verified at that load and their predicted saving per step is at "
                   f"least the wait's cost: {gap}; otherwise it keeps the overlap (one batch in "
                   f"{config.overlap_patience} still waits, to weigh the chains again)")
    if facts.device != "cpu":
        where += (" (the step's token tier widened to the chains), its lengths and tokens copied to the device "
                  "pinned and without blocking; a drafted step with lookup rows takes the eager accept")
    where += f"; {overlap}"
    shared = envs.SHARED_LOOKUP.get()
    source = ("its own prompt + output" if shared == "off" else "its own prompt + output or the shared suffix cache "
              f"of finished requests ({envs.SHARED_LOOKUP.name}={shared})")
    length = (f"up to {config.max_chain_tokens} tokens on a step without the draft (chains past the draft's block: "
              f"the target runs eager on the host), else γ = {gamma}" if facts.device == "cpu" else
              f"up to γ = {gamma} tokens (chains past the block need the eager host path; CUDA graphs are captured "
              "γ + 1 wide)")
    return (f"{'forced (every proposal verified in full)' if mode == 'forced' else 'on'}: per request and step, the "
            f"continuation of the longest recent match ({config.min_ngram}..{config.max_ngram} tokens) of its tail in "
            f"{source}, {length}, verified when its learned acceptance (per source, match length and sampling class) "
            f"× step speed beats the step without it by {config.chain_min_gain:.0%}; the draft "
            f"runs only where it pays on the requests without a proposal; {where}")


def learned_state_note(raw: Any, facts: EngineFacts, decision: VerifyModeDecision) -> str:
    """Whether step records may teach anything that changes the verify budget (engine/rank_learning.py)."""
    if decision.verify_mode == STATIC:
        return "nothing learned: static verify has no verify budget"
    learning = decide_rank_learning(ParallelFacts(tp_size=facts.tp_size, pp_size=int(getattr(raw, "pp_size", 1) or 1),
                                                  attn_dp_enabled=facts.attn_dp_size > 1))
    if learning.enabled:
        return f"on: {learning.reason}"
    return f"off ({', '.join(learning.frozen)} at their rank-independent priors): {learning.reason}"


def add_explain_parser(subparsers) -> None:
    """Register ``sglang-dspark explain [--device D] [--gpu G] -- <launch_server args>`` on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "explain", help="what a DSPARK launch would run on a GPU (attention backend, verify mode, why), no GPU needed",
        epilog="example: sglang-dspark explain --gpu H100 -- --model-path Qwen/Qwen3-8B --speculative-algorithm DSPARK "
               "--speculative-draft-model-path ./draft")
    parser.add_argument("--device", dest="assume_device", default=None, help="cuda (default with --gpu) or cpu")
    parser.add_argument("--gpu", dest="assume_gpu", default=None,
                        help=f"GPU to simulate: {', '.join(GPUS)}, or smNN")
    parser.add_argument("--ragged-self-check", choices=SELF_CHECK_OUTCOMES, default="pass",
                        help="assumed outcome of the start-up ragged-verify self-check on triton / flashinfer graphs "
                             "(default pass; fail shows the static fallback)")
    parser.add_argument("--flashinfer-version", default=None,
                        help="flashinfer-python on the GPU machine (default: the one installed here, else SGLang "
                             f"0.5.23's pin {SGLANG_FLASHINFER_PIN})")
    parser.add_argument("launch_args", nargs=argparse.REMAINDER,
                        help="the python -m sglang.launch_server arguments, after --")
    parser.set_defaults(func=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    launch_args = list(args.launch_args)
    if launch_args[:1] == ["--"]:
        launch_args = launch_args[1:]
    try:
        result = explain(launch_args, args.assume_device, args.assume_gpu,
                         ragged_self_check=args.ragged_self_check,
                         flashinfer_version=getattr(args, "flashinfer_version", None))
    except ValueError as exc:
        print(f"sglang-dspark explain: {exc}")
        return 2
    print(json.dumps(result, indent=2))
    return 0


__all__ = [
    "GPUS",
    "OUTPUT_KEYS",
    "GpuSpec",
    "add_explain_parser",
    "capture_batch_sizes",
    "decode_graph_backend",
    "default_attention_backend",
    "explain",
    "gpu_spec",
    "graph_token_tiers",
    "parse_launch_args",
    "resolve_gamma",
    "run_explain",
    "planned_probe_shapes",
    "spec_capture_batch_sizes",
    "verify_attention_backend",
]
