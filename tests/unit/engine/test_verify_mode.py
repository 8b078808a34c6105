"""Verify-mode decision (issue #9 "do no harm on a GPU") and ``sglang-dspark explain``, all on the CPU.

The decision table pins one expected mode per configuration; the property test re-states, independently of the
module's own table, which (backend, mode, GPU) combinations run compact verify correctly in SGLang 0.5.23, and checks
that no combination of facts ever yields compact outside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dspark.engine.verify_mode import (
    ADMISSION_POLICIES,
    COMPACT,
    STATIC,
    EngineFacts,
    compact_capable_backends,
    decide_verify_mode,
    decode_graph_backend,
    facts_from_server_args,
    needs_ragged_self_check,
    verify_attention_backend,
)

# Ground truth, written out by hand from SGLang 0.5.23 (see the module docstring of engine/verify_mode.py):
# backends whose TARGET_VERIFY runs a compact layout correctly, per mode, for MHA targets on CUDA.
GRAPH_SAFE_MHA = {"fa3", "fa4", "trtllm_mha"}
EAGER_SAFE_MHA = {"fa3", "fa4", "trtllm_mha", "flashinfer"}
# ... and through our patches, once their on-device self-check passed (engine/self_check/ragged_self_check.py)
GRAPH_SAFE_AFTER_SELF_CHECK = {"flashinfer", "triton"}
EAGER_SAFE_AFTER_SELF_CHECK = {"triton"}
NEEDS_SM10X = {"trtllm_mha"}
ALL_BACKENDS = ["fa3", "fa4", "trtllm_mha", "flashinfer", "triton", "torch_native", "intel_amx", "aiter",
                "flex_attention", "hpc_ops", "wave", "ascend", "intel_xpu", "flashmla", "trtllm_mla", None]


def gpu_facts(backend, sm, *, graph=True, **kw) -> EngineFacts:
    """A plain single-GPU launch with a confidence-head draft and profiling that cannot crash (isolates the backend)."""
    base = dict(device="cuda", attention_backend=backend, cuda_graph=graph, policy="async", has_confidence_head=True,
                gpu_sm=sm, sps_probes_tier_aligned=True, sps_profile_rank_consistent=True)
    base.update(kw)
    return EngineFacts(**base)


H100, A100, L40S, B200, RTX5090 = 90, 80, 89, 100, 120

DECISION_TABLE = [
    # id, facts, expected mode, expected admission policy, substring of the reason
    ("fa3-h100-graphs", gpu_facts("fa3", H100), COMPACT, "async", "fa3"),
    ("fa3-h100-eager", gpu_facts("fa3", H100, graph=False), COMPACT, "async", "1036-1056"),
    ("fa3-exact-policy", gpu_facts("fa3", H100, policy="exact"), COMPACT, "exact", "exact"),
    ("fa3-off-policy", gpu_facts("fa3", H100, policy="off"), COMPACT, "off", "off"),
    ("fa4-b200-graphs", gpu_facts("fa4", B200), COMPACT, "async", "fa4"),
    ("trtllm-b200-graphs", gpu_facts("trtllm_mha", B200), COMPACT, "async", "trtllm_mha"),
    ("trtllm-b300-graphs", gpu_facts("trtllm_mha", 103), COMPACT, "async", "trtllm_mha"),
    ("trtllm-h100-xqa", gpu_facts("trtllm_mha", H100), STATIC, "verify-all", "sm90"),
    ("trtllm-sm120-xqa", gpu_facts("trtllm_mha", RTX5090), STATIC, "verify-all", "sm120"),
    ("trtllm-sm120-xqa-eager", gpu_facts("trtllm_mha", RTX5090, graph=False), STATIC, "verify-all", "trtllm-gen"),
    ("trtllm-unknown-gpu", gpu_facts("trtllm_mha", None), STATIC, "verify-all", "unknown GPU"),
    ("flashinfer-a100-graphs", gpu_facts("flashinfer", A100), STATIC, "verify-all", "flashinfer_backend.py:754-762"),
    ("flashinfer-l40s-graphs", gpu_facts("flashinfer", L40S), STATIC, "verify-all", "self-check: not run"),
    ("flashinfer-b200-graphs", gpu_facts("flashinfer", B200), STATIC, "verify-all", "NotImplementedError"),
    ("flashinfer-graphs-self-check-passed", gpu_facts("flashinfer", A100, ragged_self_check=True), COMPACT, "async",
     "flashinfer_ragged_verify"),
    ("flashinfer-graphs-self-check-failed", gpu_facts("flashinfer", L40S, ragged_self_check=False,
                                                       ragged_self_check_detail="replay 2 wrong"), STATIC,
     "verify-all", "replay 2 wrong"),
    ("flashinfer-a100-eager", gpu_facts("flashinfer", A100, graph=False), COMPACT, "async", "dflash_info.py"),
    ("flashinfer-eager-needs-no-self-check", gpu_facts("flashinfer", A100, graph=False, ragged_self_check=False),
     COMPACT, "async", "dflash_info.py"),
    ("triton-graphs", gpu_facts("triton", A100), STATIC, "verify-all", "triton"),
    ("triton-eager", gpu_facts("triton", A100, graph=False), STATIC, "verify-all", "1007-1016"),
    ("triton-graphs-self-check-passed", gpu_facts("triton", A100, ragged_self_check=True), COMPACT, "async",
     "triton_ragged_verify"),
    ("triton-eager-self-check-passed", gpu_facts("triton", A100, graph=False, ragged_self_check=True), COMPACT,
     "async", "triton_ragged_verify"),
    ("triton-graphs-self-check-failed", gpu_facts("triton", A100, ragged_self_check=False), STATIC, "verify-all",
     "self-check"),
    ("mla-triton-self-check-passed", gpu_facts("triton", A100, use_mla=True, ragged_self_check=True), STATIC,
     "verify-all", "triton"),
    ("aiter-eager", gpu_facts("aiter", None, graph=False), STATIC, "verify-all", "aiter"),
    ("tp2-fa3-per-rank-tables", gpu_facts("fa3", H100, tp_size=2, sps_profile_rank_consistent=False), STATIC,
     "verify-all", "--tp-size 2"),
    ("tp2-fa3-table-file", gpu_facts("fa3", H100, tp_size=2, sps_profile_rank_consistent=False,
                                     sps_table_from_file=True), COMPACT, "async", "fa3"),
    ("tp2-fa3-consistent-profiler", gpu_facts("fa3", H100, tp_size=2), COMPACT, "async", "fa3"),
    ("tp2-flashinfer-graphs", gpu_facts("flashinfer", A100, tp_size=2), STATIC, "verify-all", "flashinfer"),
    ("tp2-flashinfer-graphs-self-checked", gpu_facts("flashinfer", A100, tp_size=2, ragged_self_check=True), COMPACT,
     "async", "flashinfer"),
    ("graphs-profiler-not-tier-aligned", gpu_facts("fa3", H100, sps_probes_tier_aligned=False), STATIC, "verify-all",
     "tier mismatch"),
    ("graphs-profiler-table-file", gpu_facts("fa3", H100, sps_probes_tier_aligned=False, sps_table_from_file=True),
     COMPACT, "async", "fa3"),
    ("eager-profiler-not-tier-aligned", gpu_facts("fa3", H100, graph=False, sps_probes_tier_aligned=False), COMPACT,
     "async", "fa3"),
    ("pd-prefill", gpu_facts("fa3", H100, pd_mode="prefill", cuda_graph=False), STATIC, "verify-all", "prefill"),
    ("pd-decode-fa3", gpu_facts("fa3", H100, pd_mode="decode"), COMPACT, "async", "fa3"),
    ("pd-decode-dsv4", gpu_facts("fa3", H100, pd_mode="decode", is_deepseek_v4=True), STATIC, "verify-all",
     "DeepSeek-V4.1"),
    ("no-confidence-head", gpu_facts("fa3", H100, has_confidence_head=False), STATIC, "verify-all",
     "confidence head"),
    ("no-confidence-head-hub-draft", gpu_facts("fa3", H100, has_confidence_head=False, confidence_head_detail=(
        "enable_confidence_head=false in org/draft in the local Hugging Face cache")), STATIC, "verify-all",
     "org/draft in the local Hugging Face cache"),
    ("verify-all-policy", gpu_facts("fa3", H100, policy="verify-all"), STATIC, "verify-all", "verify-all"),
    ("user-static", gpu_facts("fa3", H100, user_mode="static"), STATIC, "verify-all", "set by the user"),
    ("user-compact-safe", gpu_facts("fa3", H100, user_mode="compact"), COMPACT, "async", "set by the user"),
    ("user-compact-verify-all-policy", gpu_facts("fa3", H100, user_mode="compact", policy="verify-all"), COMPACT,
     "verify-all", "set by the user"),
    ("user-compact-eager-flashinfer", gpu_facts("flashinfer", A100, graph=False, user_mode="compact"), COMPACT,
     "async", "flashinfer"),
    ("dp-attention-a2a-moe", gpu_facts("fa3", H100, tp_size=4, attn_dp_size=4, moe_a2a_backend="deepep"), STATIC,
     "verify-all", "speculative_hook.py:683-696"),
    ("dp-attention-prefill-coordination", gpu_facts("fa3", H100, tp_size=4, attn_dp_size=4,
                                                    dp_spec_prefill_coordination=True), STATIC, "verify-all",
     "coordination"),
    # Issue #38: the start-up probes build no DP-attention batch; they are skipped, so compact needs a table file.
    ("dp-attention-plain", gpu_facts("fa3", H100, tp_size=4, attn_dp_size=4), STATIC, "verify-all",
     "with DP attention the plugin's start-up SPS probes"),
    ("dp-attention-eager", gpu_facts("fa3", H100, graph=False, tp_size=4, attn_dp_size=4), STATIC, "verify-all",
     "--speculative-dspark-sps-table-path for compact"),
    ("dp-attention-table-file", gpu_facts("fa3", H100, tp_size=4, attn_dp_size=4, sps_table_from_file=True),
     COMPACT, "async", "fa3"),
    ("dp-attention-probes-fixed", gpu_facts("fa3", H100, tp_size=4, attn_dp_size=4, sps_probes_dp_attention=True),
     COMPACT, "async", "fa3"),
    ("dcp", gpu_facts("fa3", H100, dcp_size=2), STATIC, "verify-all", "dcp"),
    ("tbo-graphs", gpu_facts("fa3", H100, enable_two_batch_overlap=True), STATIC, "verify-all", "two-batch-overlap"),
    ("lora-graphs", gpu_facts("fa3", H100, lora_enabled=True), STATIC, "verify-all", "LoRA"),
    ("lora-eager", gpu_facts("fa3", H100, graph=False, lora_enabled=True), COMPACT, "async", "fa3"),
    ("no-padding-graphs", gpu_facts("fa3", H100, disable_cuda_graph_padding=True), STATIC, "verify-all",
     "--disable-cuda-graph-padding"),
    ("hybrid-linear", gpu_facts("fa3", H100, hybrid_linear=True), STATIC, "verify-all", "hybrid"),
    ("replayssm", gpu_facts("fa3", H100, enable_linear_replayssm_spec=True), STATIC, "verify-all", "replayssm"),
    ("model-gate", gpu_facts("fa3", B200, model_requires_static="MiniMax-M3.1 NVFP4 DSPARK requires static"), STATIC,
     "verify-all", "MiniMax"),
    # Issue #38 item 4: what our FlashInfer graph patch does not handle is static before the self-check runs.
    ("flashinfer-graphs-sliding-window", gpu_facts("flashinfer", A100, ragged_self_check=True, model_sliding_window=(
        "SGLang's GptOssForCausalLM sets a sliding window")), STATIC, "verify-all", "WrapperDispatch.SLIDING_WINDOW"),
    ("flashinfer-graphs-cross-attention", gpu_facts("flashinfer", A100, ragged_self_check=True, model_cross_attention=(
        "MllamaForConditionalGeneration is an encoder-decoder model")), STATIC, "verify-all", "CROSS_ATTENTION"),
    ("flashinfer-graphs-0.7.4", gpu_facts("flashinfer", L40S, ragged_self_check=True, flashinfer_version="0.7.4"),
     STATIC, "verify-all", "flashinfer-python 0.7.4 is installed"),
    ("flashinfer-graphs-absent", gpu_facts("flashinfer", L40S, ragged_self_check=True, flashinfer_version="absent"),
     STATIC, "verify-all", "flashinfer-python is not installed"),
    ("flashinfer-graphs-0.7.2", gpu_facts("flashinfer", L40S, ragged_self_check=True, flashinfer_version="0.7.2"),
     COMPACT, "async", "flashinfer_ragged_verify"),
    ("flashinfer-graphs-0.7.2.post1", gpu_facts("flashinfer", L40S, ragged_self_check=True,
                                                flashinfer_version="0.7.2.post1"), COMPACT, "async", "flashinfer"),
    # Upstream's own paths keep their behaviour: FlashInfer eager, fa3, FlashInfer MLA.
    ("flashinfer-eager-sliding-window", gpu_facts("flashinfer", A100, graph=False, model_sliding_window="w",
                                                  flashinfer_version="0.7.4"), COMPACT, "async", "dflash_info.py"),
    ("fa3-sliding-window", gpu_facts("fa3", H100, model_sliding_window="w", model_cross_attention="c"), COMPACT,
     "async", "fa3"),
    ("mla-flashinfer-graphs-0.7.4", gpu_facts("flashinfer", B200, use_mla=True, flashinfer_version="0.7.4"), COMPACT,
     "async", "FlashInferMLA"),
    ("mla-flashinfer-graphs", gpu_facts("flashinfer", B200, use_mla=True), COMPACT, "async", "FlashInferMLA"),
    ("mla-trtllm-mla-graphs", gpu_facts("trtllm_mla", B200, use_mla=True), COMPACT, "async", "trtllm_mla"),
    ("mla-triton", gpu_facts("triton", A100, use_mla=True), STATIC, "verify-all", "triton"),
    ("cpu-intel-amx-eager", EngineFacts("cpu", "intel_amx", False, "async", True), COMPACT, "async", "B8"),
    ("cpu-intel-amx-torch-compile", EngineFacts("cpu", "intel_amx", True, "async", True), STATIC, "verify-all",
     "--enable-torch-compile"),
    ("cpu-torch-native", EngineFacts("cpu", "torch_native", False, "async", True), STATIC, "verify-all",
     "intel_amx"),
    ("intel-amx-on-cuda", gpu_facts("intel_amx", H100, graph=False), STATIC, "verify-all", "intel_amx"),
    ("npu", EngineFacts("npu", "ascend", True, "async", True), STATIC, "verify-all", "npu"),
    ("xpu", EngineFacts("xpu", "intel_xpu", False, "async", True), STATIC, "verify-all", "xpu"),
]


@pytest.mark.parametrize("facts,mode,policy,needle", [row[1:] for row in DECISION_TABLE],
                         ids=[row[0] for row in DECISION_TABLE])
def test_decision_table(facts, mode, policy, needle):
    decision = decide_verify_mode(facts)
    assert decision.verify_mode == mode
    assert decision.admission_policy == policy
    assert needle.lower() in decision.reason.lower(), decision.reason
    assert decision.reason.endswith(".")
    if mode == STATIC:
        assert decision.admission_policy == "verify-all"


def test_downgrade_flag_and_blockers():
    wanted = decide_verify_mode(gpu_facts("flashinfer", A100, has_confidence_head=False))
    assert wanted.downgraded is True
    assert len(wanted.blockers) == 2  # no head, flashinfer graphs: both named, the first is the reason
    assert "confidence head" in wanted.reason and "flashinfer" in wanted.blockers[1]
    asked = decide_verify_mode(gpu_facts("flashinfer", A100, policy="verify-all"))
    assert asked.downgraded is False and asked.blockers == ()
    assert decide_verify_mode(gpu_facts("fa3", H100)).downgraded is False


@pytest.mark.parametrize("facts,needles", [
    (gpu_facts("flashinfer", A100, user_mode="compact"), ["flashinfer", "SGLANG_RAGGED_VERIFY_MODE", "Unset"]),
    (gpu_facts("flashinfer", L40S, user_mode="cap-accept"), ["flashinfer", "cap-accept"]),
    (gpu_facts("triton", A100, graph=False, user_mode="compact"), ["triton", "1007-1016", "self-check"]),
    (gpu_facts("triton", A100, user_mode="compact", ragged_self_check=False, ragged_self_check_detail="timed out"),
     ["triton", "timed out"]),
    (gpu_facts("trtllm_mha", H100, user_mode="compact"), ["trtllm_mha", "sm90"]),
    (gpu_facts("fa3", H100, user_mode="compact", has_confidence_head=False), ["confidence head"]),
    (gpu_facts("fa3", H100, user_mode="compact", pd_mode="decode", is_deepseek_v4=True), ["DeepSeek-V4.1"]),
    (gpu_facts("fa3", H100, user_mode="compact", tp_size=2, sps_profile_rank_consistent=False),
     ["--speculative-dspark-sps-table-path"]),
    (gpu_facts("fa3", H100, user_mode="compact", tp_size=4, attn_dp_size=4),
     ["DP attention", "--speculative-dspark-sps-table-path"]),
    (gpu_facts("flashinfer", A100, user_mode="compact", ragged_self_check=True, model_sliding_window="gemma2 window"),
     ["gemma2 window", "SLIDING_WINDOW"]),
    (gpu_facts("flashinfer", A100, user_mode="compact", ragged_self_check=True, flashinfer_version="0.7.4"),
     ["0.7.4", "flashinfer-python==0.7.2"]),
])
def test_user_forced_compact_on_unsafe_configuration_is_refused(facts, needles):
    with pytest.raises(ValueError) as info:
        decide_verify_mode(facts)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize("facts,needed", [
    (gpu_facts("triton", A100), True),
    (gpu_facts("triton", A100, graph=False), True),
    (gpu_facts("flashinfer", A100), True),
    (gpu_facts("flashinfer", A100, graph=False), False),  # upstream's own eager path
    (gpu_facts("fa3", H100), False),
    (gpu_facts("triton", A100, policy="verify-all"), False),
    (gpu_facts("triton", A100, user_mode="static"), False),
    (gpu_facts("triton", A100, policy="verify-all", user_mode="compact"), True),
    (gpu_facts("triton", A100, has_confidence_head=False), False),  # static anyway
    (gpu_facts("triton", A100, use_mla=True), False),
    (EngineFacts("cpu", "intel_amx", False, "async", True), False),
    # Issue #38 item 4: a model or FlashInfer the patch does not handle is static without the minutes of the check.
    (gpu_facts("flashinfer", A100, model_sliding_window="w"), False),
    (gpu_facts("flashinfer", A100, model_cross_attention="c"), False),
    (gpu_facts("flashinfer", A100, flashinfer_version="0.7.4"), False),
    (gpu_facts("flashinfer", A100, flashinfer_version="0.7.2"), True),
    (gpu_facts("triton", A100, model_sliding_window="w", flashinfer_version="0.7.4"), True),  # not the FI patch
])
def test_self_check_is_run_only_where_it_decides(facts, needed):
    assert needs_ragged_self_check(facts) is needed


def test_invalid_values_are_refused():
    with pytest.raises(ValueError, match="not a verify mode"):
        decide_verify_mode(gpu_facts("fa3", H100, user_mode="fast"))
    with pytest.raises(ValueError, match="admission policy"):
        decide_verify_mode(gpu_facts("fa3", H100, policy="greedy"))
    # empty / whitespace user value means "not set"
    assert decide_verify_mode(gpu_facts("fa3", H100, user_mode=" ")).verify_mode == COMPACT


def test_policies_match_the_scheduler():
    from sglang_dspark.scheduling import ADMISSION_POLICIES as SCHEDULER_POLICIES

    assert set(ADMISSION_POLICIES) == set(SCHEDULER_POLICIES)


def test_capable_backend_sets():
    assert compact_capable_backends(cuda_graph=True, self_checked=False) == {"fa3", "fa4", "trtllm_mha"}
    assert compact_capable_backends(cuda_graph=False, self_checked=False) == {"fa3", "fa4", "trtllm_mha", "flashinfer"}
    assert compact_capable_backends(cuda_graph=True) == {"fa3", "fa4", "trtllm_mha", "flashinfer", "triton"}
    assert compact_capable_backends(cuda_graph=False) == {"fa3", "fa4", "trtllm_mha", "flashinfer", "triton"}
    assert compact_capable_backends(cuda_graph=False, device="cpu") == {"intel_amx"}
    assert compact_capable_backends(cuda_graph=True, device="cpu") == set()
    assert compact_capable_backends(cuda_graph=False, device="npu") == set()
    assert compact_capable_backends(cuda_graph=True, use_mla=True) == {"fa3", "flashinfer", "trtllm_mla",
                                                                       "cutedsl_mla"}


def _truly_safe(f: EngineFacts) -> bool:
    """Independent statement of where compact runs correctly (backend x mode x device x GPU)."""
    if f.device == "cpu":
        return f.attention_backend == "intel_amx" and not f.cuda_graph
    if f.device != "cuda" or f.use_mla:
        return False
    safe = GRAPH_SAFE_MHA if f.cuda_graph else EAGER_SAFE_MHA
    if f.ragged_self_check is True:
        safe = safe | (GRAPH_SAFE_AFTER_SELF_CHECK if f.cuda_graph else EAGER_SAFE_AFTER_SELF_CHECK)
    if f.attention_backend not in safe:
        return False
    if f.attention_backend in NEEDS_SM10X:
        return f.gpu_sm is not None and f.gpu_sm // 10 == 10
    return True


facts_strategy = st.builds(
    EngineFacts,
    device=st.sampled_from(["cuda", "cpu", "npu", "xpu", "mps"]),
    attention_backend=st.sampled_from(ALL_BACKENDS),
    cuda_graph=st.booleans(),
    policy=st.sampled_from(ADMISSION_POLICIES),
    has_confidence_head=st.booleans(),
    user_mode=st.sampled_from([None, "static", "compact", "cap-accept"]),
    tp_size=st.sampled_from([1, 2, 8]),
    attn_dp_size=st.sampled_from([1, 1, 4]),
    pd_mode=st.sampled_from(["null", "prefill", "decode"]),
    gpu_sm=st.sampled_from([None, 80, 86, 89, 90, 100, 103, 120]),
    enable_two_batch_overlap=st.booleans(),
    sps_table_from_file=st.booleans(),
    sps_probes_tier_aligned=st.booleans(),
    sps_profile_rank_consistent=st.booleans(),
    ragged_self_check=st.sampled_from([None, False, True]),
)


@settings(max_examples=600, deadline=None)
@given(facts_strategy)
def test_no_combination_yields_compact_where_the_backend_cannot_run_it(facts):
    try:
        decision = decide_verify_mode(facts)
    except ValueError:
        assert facts.user_mode in ("compact", "cap-accept")  # only a forced non-static mode is ever refused
        return
    if decision.verify_mode != STATIC:
        assert _truly_safe(facts), (facts, decision)
        assert facts.has_confidence_head
        assert facts.pd_mode != "prefill"
        if facts.cuda_graph and facts.device == "cuda":
            assert not facts.enable_two_batch_overlap
            assert facts.sps_table_from_file or facts.sps_probes_tier_aligned
        if facts.tp_size > 1:
            assert facts.sps_table_from_file or facts.sps_profile_rank_consistent
        if facts.attn_dp_size > 1:
            assert facts.sps_table_from_file  # the probes are skipped under DP attention (issue #38)
    else:
        assert decision.admission_policy == "verify-all"
    if facts.user_mode == "static":
        assert decision.verify_mode == STATIC


@settings(max_examples=300, deadline=None)
@given(facts_strategy)
def test_forced_compact_never_passes_unsafe(facts):
    forced = dataclasses.replace(facts, user_mode="compact")
    try:
        decision = decide_verify_mode(forced)
    except ValueError as exc:
        assert "SGLANG_RAGGED_VERIFY_MODE=compact" in str(exc)
        return
    assert decision.verify_mode == COMPACT and _truly_safe(forced)


# ---------------------------------------------------------------------------------------------------------------------
# The table against SGLang's source (catches drift if the pinned SGLang ever changes)
# ---------------------------------------------------------------------------------------------------------------------


def _sglang_attention_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "srt" / "layers" / "attention"


def test_graph_flag_matches_sglang_source():
    root = _sglang_attention_dir()
    flagged = {path.name for path in root.rglob("*.py")
               if "supports_ragged_verify_graph: bool = True" in path.read_text()}
    assert {"flashattention_backend.py", "trtllm_mha_backend.py", "flashinfer_mla_backend.py",
            "trtllm_mla_backend.py"} <= flagged
    assert "flashinfer_backend.py" not in flagged and "triton_backend.py" not in flagged
    flashinfer = (root / "flashinfer_backend.py").read_text()
    assert "FlashInfer does not support ragged verify in cuda graph" in flashinfer
    assert "ragged_verify_layout" not in (root / "triton_backend.py").read_text()
    trtllm = (root / "trtllm_mha_backend.py").read_text()
    assert "self.is_xqa_impl = get_platform().is_sm90 or get_platform().is_sm120" in trtllm
    assert "def _assert_ragged_verify_supported" in trtllm


def test_verify_mode_module_imports_no_sglang():
    code = ("import sys, sglang_dspark.engine.verify_mode, sglang_dspark.engine.explain; "
            "print('sglang' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


# ---------------------------------------------------------------------------------------------------------------------
# Reading SGLang's resolved arguments
# ---------------------------------------------------------------------------------------------------------------------


def _view(**kw):
    base = dict(device="cuda", attention_backend="fa3", prefill_attention_backend=None, decode_attention_backend=None,
                speculative_attention_mode="prefill", cuda_graph_config=None, tp_size=1, dp_size=1, attn_dp_size=1,
                enable_dp_attention=False, disaggregation_mode="null", moe_a2a_backend="none", dcp_size=1,
                enable_two_batch_overlap=False, enable_lora=None, lora_paths=None, disable_cuda_graph_padding=False,
                enable_linear_replayssm_spec=False, speculative_dspark_sps_table_path=None,
                enable_torch_compile=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _facts(view, **kw):
    return facts_from_server_args(view, True, "async", None, hf_config={}, use_mla=False, gpu_sm=90, **kw)


def test_facts_from_a_resolved_view():
    resolved_graphs = types.SimpleNamespace(decode=types.SimpleNamespace(backend="disabled"))
    facts = _facts(_view(cuda_graph_config=resolved_graphs, tp_size=2))
    assert (facts.device, facts.attention_backend, facts.cuda_graph, facts.tp_size) == ("cuda", "fa3", False, 2)
    assert _facts(_view(cuda_graph_config=types.SimpleNamespace(
        decode=types.SimpleNamespace(backend="breakable")))).cuda_graph is True
    # split backends: TARGET_VERIFY runs on the prefill backend unless --speculative-attention-mode decode
    split = dict(prefill_attention_backend="fa3", decode_attention_backend="flashinfer")
    assert _facts(_view(**split)).attention_backend == "fa3"
    assert _facts(_view(speculative_attention_mode="decode", **split)).attention_backend == "flashinfer"
    assert _facts(_view(enable_dp_attention=True, dp_size=4, tp_size=4)).attn_dp_size == 4
    assert _facts(_view(lora_paths=["a"])).lora_enabled is True
    assert _facts(_view(disaggregation_mode="prefill")).cuda_graph is False
    assert _facts(_view(attention_backend="torch_native")).cuda_graph is False
    assert _facts(_view(speculative_dspark_sps_table_path="/t.json")).sps_table_from_file is True
    cpu = _facts(_view(device="cpu", attention_backend="intel_amx", enable_torch_compile=False))
    assert (cpu.device, cpu.cuda_graph) == ("cpu", False)
    assert decide_verify_mode(cpu).verify_mode == COMPACT
    assert _facts(_view(device="cpu", attention_backend="intel_amx", enable_torch_compile=True)).cuda_graph is True
    hybrid = facts_from_server_args(_view(), True, "async", None, hf_config={"layer_types": ["linear_attention"]},
                                    use_mla=False, gpu_sm=90)
    assert hybrid.hybrid_linear is True


# ---------------------------------------------------------------------------------------------------------------------
# The target's attention layers and the FlashInfer version (issue #38 item 4)
# ---------------------------------------------------------------------------------------------------------------------

MODEL_CONFIGS = {
    # name: (config.json, sliding-window needle or "", cross-attention needle or "")
    "gpt-oss": ({"architectures": ["GptOssForCausalLM"], "sliding_window": 128,
                 "layer_types": ["sliding_attention", "full_attention"]}, "hybrid sliding-window", ""),
    "gemma2": ({"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096}, "sliding window of 4096", ""),
    "gemma3-multimodal": ({"architectures": ["Gemma3ForConditionalGeneration"],
                           "text_config": {"sliding_window": 1024, "sliding_window_pattern": 6}},
                          "sliding window of 1024", ""),
    "llama4-chunked": ({"architectures": ["Llama4ForConditionalGeneration"],
                        "text_config": {"attention_chunk_size": 8192}}, "attention_chunk_size 8192", ""),
    "olmo3-layer-types": ({"architectures": ["Olmo3ForCausalLM"], "sliding_window": 4096,
                           "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}, "3 sliding_attention", ""),
    "beam-without-sliding-layers": ({"architectures": ["BeamForCausalLM"], "layer_types": ["full_attention"]}, "", ""),
    "whisper": ({"architectures": ["WhisperForConditionalGeneration"], "is_encoder_decoder": True}, "",
                "encoder-decoder"),
    "mllama": ({"architectures": ["MllamaForConditionalGeneration"],
                "text_config": {"cross_attention_layers": [3, 8]}}, "", "encoder-decoder"),
    # Full attention in SGLang although the config names a window: Qwen2.5 (use_sliding_window false, SGLang's
    # qwen2.py sets none), Mistral v0.1 (SGLang's llama.py sets none), OLMo-2 (no window key).
    "qwen2.5": ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 131072, "use_sliding_window": False,
                 "max_window_layers": 28}, "", ""),
    "qwen3": ({"architectures": ["Qwen3ForCausalLM"], "sliding_window": None, "layer_types": ["full_attention"] * 4},
              "", ""),
    "mistral-v0.1": ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "", ""),
    "olmo2": ({"architectures": ["Olmo2ForCausalLM"]}, "", ""),
}


@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
def test_model_attention_from_the_target_config(name):
    from sglang_dspark.engine.verify_mode import model_attention

    config, sliding, cross = MODEL_CONFIGS[name]
    found = model_attention(config, source="config.json")
    assert (sliding in found.sliding_window) if sliding else found.sliding_window == "", found
    assert (cross in found.cross_attention) if cross else found.cross_attention == "", found
    assert found.known and "config.json" in found.note()
    # A PretrainedConfig-like object reads the same.
    as_object = types.SimpleNamespace(**{k: (types.SimpleNamespace(**v) if isinstance(v, dict) else v)
                                         for k, v in config.items()})
    assert model_attention(as_object) == dataclasses.replace(found, source="")


def test_model_attention_uses_sglang_flags_and_reports_unknown():
    from sglang_dspark.engine.verify_mode import model_attention

    plain = {"architectures": ["CustomForCausalLM"]}
    assert model_attention(plain).sliding_window == ""
    sglang = types.SimpleNamespace(is_hybrid_swa=True, attention_chunk_size=None, is_encoder_decoder=True)
    flagged = model_attention(plain, sglang_model_config=sglang)
    assert "is_hybrid_swa" in flagged.sliding_window and "is_encoder_decoder" in flagged.cross_attention
    unknown = model_attention(None, source="hub id org/x is not in the local Hugging Face cache")
    assert not unknown.known and unknown.sliding_window == unknown.cross_attention == ""
    assert "assumed full attention" in unknown.note() and "org/x" in unknown.note()


def test_facts_read_the_target_from_the_local_hf_cache(tmp_path, monkeypatch):
    """At argument resolution the target's config comes from SGLang's ModelConfig, else the local folder or the local
    Hugging Face cache (never a download)."""
    import sglang_dspark.engine.draft_head as draft_head
    from sglang_dspark.engine.verify_mode import read_target_attention

    cached = tmp_path / "config.json"
    cached.write_text(json.dumps(MODEL_CONFIGS["gpt-oss"][0]))
    monkeypatch.setattr(draft_head, "hf_cache_config_file",
                        lambda repo, revision: str(cached) if repo == "openai/gpt-oss-20b" else None)
    found = read_target_attention("openai/gpt-oss-20b")
    assert "hybrid sliding-window" in found.sliding_window and "local Hugging Face cache" in found.source
    assert not read_target_attention("org/not-cached").known
    folder = tmp_path / "whisper"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIGS["whisper"][0]))
    assert "encoder-decoder" in read_target_attention(str(folder)).cross_attention
    # facts_from_server_args: the view's model path when SGLang's ModelConfig cannot be had here.
    facts = facts_from_server_args(_view(attention_backend="flashinfer", model_path="openai/gpt-oss-20b"), True,
                                   "async", None, use_mla=False, gpu_sm=80, flashinfer_version="0.7.2")
    assert "hybrid sliding-window" in facts.model_sliding_window and facts.flashinfer_version == "0.7.2"
    decision = decide_verify_mode(dataclasses.replace(facts, ragged_self_check=True))
    assert decision.verify_mode == STATIC and "SLIDING_WINDOW" in decision.reason


def test_flashinfer_version_is_read_only_for_flashinfer(monkeypatch):
    import importlib.metadata

    from sglang_dspark.engine import verify_mode

    monkeypatch.setattr(importlib.metadata, "version",
                        lambda dist: "0.7.4" if dist == "flashinfer-python" else "1.0")
    assert verify_mode.installed_flashinfer_version() == "0.7.4"
    assert _facts(_view(attention_backend="flashinfer")).flashinfer_version == "0.7.4"
    assert _facts(_view(attention_backend="fa3")).flashinfer_version is None

    def absent(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    assert verify_mode.installed_flashinfer_version() == verify_mode.FLASHINFER_ABSENT
    assert verify_mode.FLASHINFER_PATCH_VERSIONS == ("0.7.2", "0.7.2.post1")


def test_model_tables_match_sglang_source():
    """The architecture tables are SGLang 0.5.23's: every EntryClass whose model class defines (or inherits)
    get_attention_sliding_window_size, is_hybrid_swa_model's list, is_encoder_decoder_model's list."""
    import ast

    import sglang.srt.configs.model_config as model_config

    from sglang_dspark.engine.verify_mode import (
        SGLANG_ENCODER_DECODER_ARCHS,
        SGLANG_HYBRID_SWA_ARCHS,
        SGLANG_SLIDING_WINDOW_ARCHS,
    )

    models = Path(importlib.util.find_spec("sglang.srt.models").submodule_search_locations[0])
    with_window = set()
    for path in models.rglob("*.py"):
        tree = ast.parse(path.read_text())
        classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

        def defines(name, seen=()):
            node = classes.get(name)
            if node is None or name in seen:
                return False
            if any(isinstance(f, ast.FunctionDef) and f.name == "get_attention_sliding_window_size" for f in node.body):
                return True
            return any(defines(ast.unparse(b).split(".")[-1], seen + (name,)) for b in node.bases)

        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                with_window |= {ast.unparse(v) for v in values if defines(ast.unparse(v))}
    drafts = {a for a in with_window if "DFlash" in a or "Eagle" in a or a == "MuseGlimmerAssistantModel"}
    missing = with_window - drafts - SGLANG_SLIDING_WINDOW_ARCHS
    assert not missing, sorted(missing)
    source = Path(model_config.__file__).read_text()

    def quoted(start, end):
        block = source[source.index(start):source.index(end, source.index(start))]
        return {w.strip('",') for w in block.split() if w.startswith('"') and w.endswith('",')}

    hybrid = (quoted("    hybrid_swa_archs = {", "    }") | set(model_config.SWA_SINK_ARCHS)
              | set(model_config.MIMO_V2_MODEL_ARCHS))
    assert hybrid == SGLANG_HYBRID_SWA_ARCHS
    assert all(model_config.is_hybrid_swa_model([a], None) for a in SGLANG_HYBRID_SWA_ARCHS)
    assert not model_config.is_hybrid_swa_model(["Qwen3ForCausalLM"], None)
    assert quoted("def is_encoder_decoder_model", "def is_local_attention_model") == SGLANG_ENCODER_DECODER_ARCHS
    assert all(model_config.is_encoder_decoder_model([a]) for a in SGLANG_ENCODER_DECODER_ARCHS)


def test_decode_graph_backend_precedence_on_a_raw_record():
    raw = types.SimpleNamespace(cuda_graph_config=None, disable_cuda_graph=False, disable_decode_cuda_graph=False,
                                cuda_graph_backend_decode=None)
    assert decode_graph_backend(raw) == "full"
    raw.disable_cuda_graph = True
    assert decode_graph_backend(raw) == "disabled"
    raw.cuda_graph_backend_decode = "breakable"  # per-phase flag beats the legacy switch
    assert decode_graph_backend(raw) == "breakable"
    raw.cuda_graph_config = {"decode": {"backend": "disabled"}}  # JSON beats everything
    assert decode_graph_backend(raw) == "disabled"
    assert verify_attention_backend(types.SimpleNamespace(attention_backend="triton", prefill_attention_backend=None,
                                                          decode_attention_backend=None,
                                                          speculative_attention_mode="prefill")) == "triton"


# ---------------------------------------------------------------------------------------------------------------------
# explain: simulated GPUs, SGLang's own parser, no model on disk
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture()
def draft(tmp_path):
    def make(block_size=7, head=True, name="draft"):
        folder = tmp_path / f"{name}-{block_size}-{int(head)}"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"block_size": block_size, "enable_confidence_head": head}))
        return str(folder)
    return make


@pytest.fixture()
def clean_env(monkeypatch):
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    monkeypatch.delenv("SGLANG_DSPARK_ADMISSION", raising=False)


def _argv(draft_path, *extra):
    return ["--model-path", "/nonexistent/target", "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", draft_path, *extra]


H100_CAPTURE = list(range(1, 9)) + list(range(10, 33, 2)) + [40, 44, 48]


@pytest.mark.parametrize("gpu", ["A100", "L40S", "B200"])
def test_explain_default_launch_on_flashinfer_gpus(gpu, draft, clean_env):
    from sglang_dspark.engine.explain import OUTPUT_KEYS, explain

    result = explain(_argv(draft()), None, gpu)
    assert tuple(result) == OUTPUT_KEYS
    assert json.loads(json.dumps(result)) == result
    assert result["attention_backend"] == "flashinfer"
    assert result["cuda_graph"] is True
    assert result["gamma"] == 7
    # Upstream FlashInfer raises at CUDA-graph capture on a ragged layout; our patch runs it once its on-device
    # self-check passed: compact graphs, probing the captured tiers.
    assert "runs at start-up" in result["ragged_self_check"]
    # ... and says what it checks, at which precision, and its time bound and retry policy
    for needle in ("ieee precision", "1.56e-02 of the reference attention of |V|", "time bound 600 s",
                   "retried at the first start 24 h later"):
        assert needle in result["ragged_self_check"], result["ragged_self_check"]
    assert (result["verify_mode"], result["admission_policy"]) == ("compact", "async")
    assert result["sps_probe_shapes"] and all(b % 8 == 0 for _, b in result["sps_probe_shapes"])
    assert "flashinfer_ragged_verify" in result["reason"]
    # A failed self-check: upstream's static mode, nothing profiled.
    failed = explain(_argv(draft()), None, gpu, ragged_self_check="fail")
    assert failed["verify_mode"] == "static" and failed["admission_policy"] == "verify-all"
    assert failed["sps_probe_shapes"] == []
    assert "flashinfer" in failed["reason"] and "assumed to fail" in failed["reason"]


@pytest.mark.parametrize("gpu", ["H100", "H200"])
@pytest.mark.parametrize("table_file", [False, True])
def test_explain_hopper_runs_compact_graphs_probing_only_tiers(gpu, table_file, draft, clean_env):
    from sglang_dspark.engine.explain import explain

    extra = ("--speculative-dspark-sps-table-path", "/t.json") if table_file else ()
    result = explain(_argv(draft(), *extra), None, gpu)
    assert (result["attention_backend"], result["verify_mode"], result["admission_policy"]) == (
        "fa3", "compact", "async")
    tiers = {bs * 8 for bs in H100_CAPTURE}
    shapes = result["sps_probe_shapes"]
    assert shapes, "compact graphs need a profiled table"
    # Only shapes the graph runner can replay: B is a captured tier, R <= min(B, max_bs), B >= R.
    assert all(b in tiers and r <= min(b, 48) for r, b in shapes), shapes
    assert [1, 8] in shapes and max(b for _, b in shapes) == 384


def test_explain_b200_trtllm_when_topk_is_given(draft, clean_env):
    from sglang_dspark.engine.explain import explain

    argv = _argv(draft(), "--speculative-eagle-topk", "1", "--speculative-dspark-sps-table-path", "/t.json")
    result = explain(argv, None, "B200")
    assert (result["attention_backend"], result["verify_mode"]) == ("trtllm_mha", "compact")
    # the same backend on an H100 runs xqa: static
    forced = explain(_argv(draft(), "--attention-backend", "trtllm_mha", "--speculative-dspark-sps-table-path",
                           "/t.json"), None, "H100")
    assert (forced["attention_backend"], forced["verify_mode"]) == ("trtllm_mha", "static")


def test_explain_eager_and_explicit_backend(draft, clean_env):
    from sglang_dspark.engine.explain import explain

    eager = explain(_argv(draft(), "--cuda-graph-backend-decode", "disabled"), None, "A100")
    assert (eager["attention_backend"], eager["cuda_graph"], eager["verify_mode"]) == ("flashinfer", False, "compact")
    # Eager: the planner's own grid (R = 1, 2, 4, ..., 48; B from anchors only to every draft).
    shapes = eager["sps_probe_shapes"]
    assert [1, 1] in shapes and [48, 48] in shapes and shapes[-1] == [48, 384]
    assert all(r <= b <= r * 8 for r, b in shapes)
    assert eager["ragged_self_check"] == "not needed"
    triton = explain(_argv(draft(), "--attention-backend", "triton", "--disable-cuda-graph"), None, "L40S")
    assert (triton["attention_backend"], triton["cuda_graph"], triton["verify_mode"]) == ("triton", False, "compact")
    triton = explain(_argv(draft(), "--attention-backend", "triton", "--disable-cuda-graph"), None, "L40S",
                     ragged_self_check="fail")
    assert (triton["attention_backend"], triton["cuda_graph"], triton["verify_mode"]) == ("triton", False, "static")


def test_explain_gamma_and_policy(draft, clean_env, monkeypatch):
    from sglang_dspark.engine.explain import explain

    five = explain(_argv(draft(block_size=5), "--speculative-dspark-sps-table-path", "/t.json"), None, "H100")
    assert five["gamma"] == 5 and five["sps_probe_shapes"][0] == [1, 6]  # tiers bs * (5 + 1)
    assert all(b % 6 == 0 for _, b in five["sps_probe_shapes"])
    assert explain(_argv(draft(), "--speculative-dspark-block-size", "3"), None, "H100")["gamma"] == 3
    with pytest.raises(ValueError, match="gamma"):
        explain(_argv(draft(), "--speculative-dspark-block-size", "3", "--speculative-num-draft-tokens", "8"),
                None, "H100")
    headless = explain(_argv(draft(head=False), "--disable-cuda-graph"), None, "A100")
    assert headless["verify_mode"] == "static" and "confidence head" in headless["reason"]
    monkeypatch.setenv("SGLANG_DSPARK_ADMISSION", "verify-all")
    assert explain(_argv(draft(), "--disable-cuda-graph"), None, "A100")["verify_mode"] == "static"


def test_explain_dp_attention_skips_the_probes(draft, clean_env):
    from sglang_dspark.engine.explain import explain

    dp = ("--tp-size", "4", "--attn-dp-size", "4", "--enable-dp-lm-head")
    skipped = explain(_argv(draft(), *dp), None, "H100")
    assert (skipped["verify_mode"], skipped["admission_policy"], skipped["sps_probe_shapes"]) == (
        "static", "verify-all", [])
    assert skipped["sps_profiling"].startswith("probes skipped: DP attention")
    assert "--speculative-dspark-sps-table-path" in skipped["reason"]
    table = explain(_argv(draft(), *dp, "--speculative-dspark-sps-table-path", "/t.json"), None, "H100")
    assert table["verify_mode"] == "compact" and table["sps_profiling"].startswith("no probes: the table from")
    plain = explain(_argv(draft()), None, "H100")
    assert plain["sps_profiling"].startswith("probes at start-up") and plain["confidence_head"].startswith("yes: ")
    headless = explain(_argv(draft(head=False)), None, "H100")
    assert headless["sps_profiling"].startswith("no probes: static") and headless["confidence_head"].startswith("no ")


def test_explain_refuses_user_forced_compact_on_flashinfer_graphs_without_self_check(draft, clean_env, monkeypatch):
    from sglang_dspark.engine.explain import explain

    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    with pytest.raises(ValueError, match="flashinfer"):
        explain(_argv(draft()), None, "A100", ragged_self_check="fail")
    assert explain(_argv(draft()), None, "A100")["verify_mode"] == "compact"  # after a passed self-check
    forced = explain(_argv(draft(), "--speculative-dspark-sps-table-path", "/t.json"), None, "H100")
    assert forced["verify_mode"] == "compact" and "set by the user" in forced["reason"]


def test_explain_cpu_and_unknown_gpu(draft, clean_env):
    from sglang_dspark.engine.explain import explain, gpu_spec

    cpu = explain(_argv(draft()), "cpu", None)
    assert (cpu["cuda_graph"], cpu["verify_mode"]) == (False, "compact")
    assert cpu["attention_backend"] in ("intel_amx", "torch_native")
    with pytest.raises(ValueError, match="unknown GPU"):
        explain(_argv(draft()), None, "Z9000")
    with pytest.raises(ValueError, match="without the GPU"):
        explain(_argv(draft()), "cuda", None)
    assert gpu_spec("NVIDIA H100").sm == 90 and gpu_spec("h200").memory_mb > 90 * 1024
    assert gpu_spec("a100-sxm4-40gb").name == "A100-40GB" and gpu_spec("sm100").sm == 100


def test_explain_shows_the_model_facts_and_the_flashinfer_version(draft, clean_env, tmp_path):
    """Issue #38 item 4: a sliding-window target, an unsupported FlashInfer: static on FlashInfer graphs, with why."""
    from sglang_dspark.engine.explain import explain

    target = tmp_path / "gpt-oss"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(MODEL_CONFIGS["gpt-oss"][0]))
    argv = ["--model-path", str(target), "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft()]
    swa = explain(argv, None, "A100", flashinfer_version="0.7.2")
    assert (swa["attention_backend"], swa["verify_mode"]) == ("flashinfer", "static")
    assert "SLIDING_WINDOW" in swa["reason"] and "GptOssForCausalLM" in swa["reason"]
    assert swa["model_attention"].startswith("sliding window: GptOssForCausalLM") and str(target) in \
        swa["model_attention"]
    assert swa["ragged_self_check"].startswith("not run: this launch is static before it")  # no minutes spent
    eager = explain(argv + ["--disable-cuda-graph"], None, "A100", flashinfer_version="0.7.2")
    assert eager["verify_mode"] == "compact"  # SGLang's own eager FlashInfer path: not the patch
    plain = explain(_argv(draft()), None, "A100", flashinfer_version="0.7.4")
    assert plain["verify_mode"] == "static" and "flashinfer-python 0.7.4 is installed" in plain["reason"]
    assert plain["flashinfer"].startswith("0.7.4 (given): not supported") and "0.7.2" in plain["flashinfer"]
    assert plain["model_attention"].startswith("unknown here") and "assumed full attention" in plain["model_attention"]
    ok = explain(_argv(draft()), None, "A100", flashinfer_version="0.7.2.post1")
    assert ok["verify_mode"] == "compact" and "0.7.2.post1 (given): supported" in ok["flashinfer"]
    assert explain(_argv(draft()), None, "H100")["flashinfer"] == "not used (attention backend fa3)"


def test_explain_shows_whether_step_records_may_teach_the_budget(draft, clean_env):
    """Issue #38 item 2: learned state is off wherever several ranks must agree on each step's budget."""
    from sglang_dspark.engine.explain import explain

    single = explain(_argv(draft()), None, "H100")
    assert single["learned_state"].startswith("on: one rank decides")
    tp = explain(_argv(draft(), "--tp-size", "2"), None, "H100")
    assert tp["verify_mode"] == "compact" and tp["learned_state"].startswith("off (survival prior, step overhead")
    assert "--tp-size 2" in tp["learned_state"] and "graph tier" in tp["learned_state"]
    static = explain(_argv(draft(), "--tp-size", "2"), None, "A100", ragged_self_check="fail")
    assert static["learned_state"].startswith("nothing learned")


def test_capture_batch_sizes():
    from sglang_dspark.engine.explain import GPUS, capture_batch_sizes, graph_token_tiers, parse_launch_args

    def raw(*extra):
        return parse_launch_args(["--model-path", "/x", "--speculative-algorithm", "DSPARK", *extra])

    assert capture_batch_sizes(raw(), GPUS["H100"], max_running_requests=48) == H100_CAPTURE
    assert capture_batch_sizes(raw("--max-running-requests", "16"), GPUS["H100"], max_running_requests=16) == (
        list(range(1, 9)) + [10, 12, 14, 16])
    assert capture_batch_sizes(raw(), GPUS["A100-40GB"], max_running_requests=48)[-1] == 32
    assert capture_batch_sizes(raw("--cuda-graph-max-bs-decode", "4"), GPUS["B200"], max_running_requests=48) == [
        1, 2, 3, 4]
    assert capture_batch_sizes(raw(), GPUS["H100"], max_running_requests=48, attn_dp_size=2)[-1] == 24
    assert graph_token_tiers([1, 2, 4], 7) == [8, 16, 32]


def test_explain_with_the_tiny_pair(tiny_pair, clean_env):
    from sglang_dspark.engine.explain import explain

    argv = ["--model-path", str(tiny_pair.target_dir), "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", str(tiny_pair.draft_dir), "--speculative-dspark-sps-table-path", "/t"]
    result = explain(argv, None, "H100")
    assert (result["attention_backend"], result["verify_mode"], result["gamma"]) == ("fa3", "compact", 7)


def test_explain_cli_subcommand(draft, clean_env, capsys):
    from sglang_dspark.engine.explain import OUTPUT_KEYS, add_explain_parser

    parser = argparse.ArgumentParser(prog="sglang-dspark")
    add_explain_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["explain", "--gpu", "L40S", "--", *_argv(draft())])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert tuple(printed) == OUTPUT_KEYS and printed["attention_backend"] == "flashinfer"
    args = parser.parse_args(["explain", "--gpu", "L40S", "--flashinfer-version", "0.7.4", "--", *_argv(draft())])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["verify_mode"] == "static" and printed["flashinfer"].startswith("0.7.4 (given)")
    bad = parser.parse_args(["explain", "--gpu", "Z9000", "--", *_argv(draft(name="other"))])
    assert bad.func(bad) == 2
    assert "unknown GPU" in capsys.readouterr().out


def test_explain_shows_where_prompt_lookup_runs(draft, clean_env, monkeypatch):
    """Issue #39 item 4: the lookup rides on the draft gate; explain says whether it runs and how."""
    from sglang_dspark.engine.explain import explain

    single = explain(_argv(draft()), None, "H100")
    assert single["prompt_lookup"].startswith("on: per request") and "overlap" in single["prompt_lookup"]
    # Issue #46: on fa3 (H100's default) rows are anchored on committed lengths, and the wait has a stated cost.
    assert "fa3 publishes no host sequence lengths" in single["prompt_lookup"]
    assert "1 ms + 25 us per request" in single["prompt_lookup"] and "without blocking" in single["prompt_lookup"]
    flashinfer = explain(_argv(draft(), "--attention-backend", "flashinfer"), None, "H100")["prompt_lookup"]
    assert "publishes no host" not in flashinfer and "committed lengths" in flashinfer
    sync = explain(_argv(draft(), "--disable-overlap-schedule"), None, "H100")["prompt_lookup"]
    assert "always current" in sync and "waits for the previous result" not in sync
    cpu = explain(_argv(draft()), "cpu", None)["prompt_lookup"]
    assert "costs no device time" in cpu
    # Issue #48: chains past the draft's block on the host's eager path only; the shared cache and its scope.
    assert "up to 31 tokens on a step without the draft" in cpu and "chains past the block need" in single["prompt_lookup"]
    assert "shared suffix cache of finished requests (SGLANG_DSPARK_SHARED_LOOKUP=key)" in cpu
    tp = explain(_argv(draft(), "--tp-size", "2"), None, "H100")
    assert tp["prompt_lookup"].startswith("off: the draft gate is off where ranks must agree")
    static = explain(_argv(draft()), None, "A100", ragged_self_check="fail")
    assert static["prompt_lookup"].startswith("off: static verify")
    monkeypatch.setenv("SGLANG_DSPARK_LOOKUP", "off")
    assert explain(_argv(draft()), None, "H100")["prompt_lookup"] == "off (SGLANG_DSPARK_LOOKUP=off)"
    monkeypatch.setenv("SGLANG_DSPARK_LOOKUP", "forced")
    assert explain(_argv(draft()), None, "H100")["prompt_lookup"].startswith("forced")
    monkeypatch.delenv("SGLANG_DSPARK_LOOKUP")
    monkeypatch.setenv("SGLANG_DSPARK_DRAFT_GATE", "off")
    assert "rides on the draft gate" in explain(_argv(draft()), None, "H100")["prompt_lookup"]
