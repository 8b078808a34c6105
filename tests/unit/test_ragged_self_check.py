"""The on-device self-check that opens compact verify on triton / flashinfer (``engine/ragged_self_check.py``), and
its wiring: the launcher's verify-mode choice (``engine/arg_resolution.py``) and the patches ``plugin.register``
installs in the scheduler processes.

There is no GPU here: the self-check runs through a recording runner, plus once for real with the CPU harness
(``--device cpu`` under ``TRITON_INTERPRET=1``) so that the verdict is read from a genuine report.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types

import pytest

from sglang_dspark.engine import ragged_self_check as rsc
from sglang_dspark.engine import verify_mode
from sglang_dspark.engine.draft_head import DraftConfidenceHead

PASSING_REPORT = {"ok": True, "checks": {"flag on after the patch": True},
                  "cases": [{"max_abs_err": 1e-6}, {"max_abs_err": 3e-6}],
                  "flashinfer": [{"max_abs_err": 1e-2, "host_plan_matches_device": True}]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_CACHE", str(tmp_path))
    monkeypatch.delenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", raising=False)
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    return tmp_path


class Runner:
    """Records every harness command; answers with a fixed (returncode, report, log tail)."""

    def __init__(self, returncode=0, report=PASSING_REPORT, tail=""):
        self.calls: list[list[str]] = []
        self.answer = (returncode, json.dumps(report) if isinstance(report, dict) else report, tail)

    def __call__(self, command, timeout):
        self.calls.append(command)
        return self.answer


# ---------------------------------------------------------------------------------------------------------------------
# Reading the harness's report
# ---------------------------------------------------------------------------------------------------------------------


def test_verdict_passes_only_on_a_clean_report():
    passed, detail = rsc.verdict_from_report("triton", 0, json.dumps(PASSING_REPORT), "")
    assert passed and "matched the reference" in detail and "3.0e-06" in detail
    passed, detail = rsc.verdict_from_report("flashinfer", 0, json.dumps(PASSING_REPORT), "")
    assert passed and "1.0e-02" in detail  # flashinfer replays counted


@pytest.mark.parametrize("backend,returncode,report,tail,needle", [
    ("triton", 1, {**PASSING_REPORT, "ok": False, "checks": {"flag on after the patch": False}}, "",
     "flag on after the patch"),
    ("triton", 1, {**PASSING_REPORT, "ok": False, "cases": [{"max_abs_err": 0.4}]}, "", "4.0e-01"),
    ("triton", 0, {**PASSING_REPORT, "ok": False}, "", "failed"),
    ("flashinfer", 0, {**PASSING_REPORT, "flashinfer": []}, "", "failed"),  # FlashInfer part never ran
    ("triton", 1, "", "Traceback ...\nRuntimeError: CUDA error: no kernel image", "no kernel image"),
    ("triton", -1, "", "timed out after 600 s", "timed out"),
    ("triton", 1, "{not json", "", "exit status 1"),
])
def test_verdict_fails_and_says_why(backend, returncode, report, tail, needle):
    text = json.dumps(report) if isinstance(report, dict) else report
    passed, detail = rsc.verdict_from_report(backend, returncode, text, tail)
    assert passed is False and needle in detail, detail


def test_gpu_identity_from_nvidia_smi_without_a_cuda_context(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n[ \"$4\" = GPU-abc ] && echo 'NVIDIA H100 80GB HBM3, 550.54.15'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")
    assert rsc.gpu_identity() == "NVIDIA H100 80GB HBM3, 550.54.15"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the fake knows no GPU 3: empty answer
    assert rsc.gpu_identity() == "unknown GPU"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert rsc.gpu_identity() == "unknown GPU"


def test_harness_command_per_backend():
    triton = rsc.harness_command("triton", "/tmp/r.json")
    assert triton[1:] == ["-m", rsc.HARNESS_MODULE, "--device", "cuda", "--out", "/tmp/r.json", "--no-flashinfer"]
    assert "--no-flashinfer" not in rsc.harness_command("flashinfer", "/tmp/r.json")


# ---------------------------------------------------------------------------------------------------------------------
# Running once, keeping the verdict
# ---------------------------------------------------------------------------------------------------------------------


def test_first_start_runs_the_check_later_starts_read_the_verdict(cache, monkeypatch):
    runner = Runner()
    first = rsc.self_check("triton", "NVIDIA A100", runner=runner)
    assert first.passed and not first.cached and len(runner.calls) == 1
    assert "--no-flashinfer" in runner.calls[0]
    kept = list((cache / "ragged-self-check").glob("triton-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["key"]["gpu"] == "NVIDIA A100"
    assert rsc.self_check("triton", "NVIDIA A100", runner=runner) is first  # same process: memo
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})  # a later start
    later = rsc.self_check("triton", "NVIDIA A100", runner=runner)
    assert later.passed and later.cached and len(runner.calls) == 1
    # another GPU, another backend: their own checks
    rsc.self_check("triton", "NVIDIA L40S", runner=runner)
    rsc.self_check("flashinfer", "NVIDIA A100", runner=runner)
    assert len(runner.calls) == 3 and "--no-flashinfer" not in runner.calls[2]


def test_a_failed_check_is_kept_and_force_runs_again(cache, monkeypatch):
    failing = Runner(1, {**PASSING_REPORT, "ok": False, "cases": [{"max_abs_err": 0.5}]})
    assert rsc.self_check("flashinfer", "NVIDIA L40S", runner=failing).passed is False
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    again = rsc.self_check("flashinfer", "NVIDIA L40S", runner=Runner())
    assert again.cached and again.passed is False  # the kept verdict, no re-run
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    monkeypatch.setenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", "force")
    fixed = Runner()
    assert rsc.self_check("flashinfer", "NVIDIA L40S", runner=fixed).passed and len(fixed.calls) == 1


def test_timeouts_are_not_kept_and_off_runs_nothing(cache, monkeypatch):
    slow = Runner(-1, "", "timed out after 600 s")
    assert rsc.self_check("triton", "GPU", runner=slow).passed is False
    assert not list(cache.glob("ragged-self-check/*.json"))
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    monkeypatch.setenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", "off")
    never = Runner()
    result = rsc.self_check("triton", "GPU", runner=never)
    assert result.passed is False and "=off" in result.detail and never.calls == []
    with pytest.raises(ValueError, match="fa3"):
        rsc.self_check("fa3", "GPU", runner=never)


def test_a_damaged_verdict_is_a_miss(cache, monkeypatch, caplog):
    runner = Runner()
    rsc.self_check("triton", "GPU", runner=runner)
    (kept,) = (cache / "ragged-self-check").glob("triton-*.json")
    kept.write_text("{damaged")
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    assert rsc.self_check("triton", "GPU", runner=runner).passed and len(runner.calls) == 2
    assert "unreadable" in caplog.text


def test_the_real_harness_report_is_read(cache, monkeypatch):
    """The CPU harness (SGLang's real Triton kernels under the interpreter, our patch) through run_harness."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def cpu_runner(command, timeout):
        command = [("cpu" if part == "cuda" else part) for part in command]
        return rsc.run_harness(command, timeout)

    result = rsc.self_check("triton", "cpu-interpreter", runner=cpu_runner)
    assert result.passed, result.detail
    assert "ragged cases" in result.detail


# ---------------------------------------------------------------------------------------------------------------------
# Wiring: the launcher's choice and the scheduler's patches
# ---------------------------------------------------------------------------------------------------------------------


def _gpu_view(backend, **extra):
    fields = dict(device="cuda", attention_backend=backend, prefill_attention_backend=None,
                  decode_attention_backend=None, speculative_attention_mode="prefill", disaggregation_mode="null",
                  cuda_graph_backend_decode=None, disable_cuda_graph=False, disable_decode_cuda_graph=False,
                  cuda_graph_config=None, tp_size=1, dp_size=1, attn_dp_size=1, enable_dp_attention=False,
                  moe_a2a_backend="none", dcp_size=1, enable_two_batch_overlap=False, enable_lora=None,
                  lora_paths=None, disable_cuda_graph_padding=False, enable_linear_replayssm_spec=False,
                  speculative_dspark_sps_table_path=None, model_path="/nonexistent")
    fields.update(extra)
    return types.SimpleNamespace(**fields)


@pytest.mark.parametrize("backend,passed,mode,patches", [
    ("triton", True, "compact", "triton"),
    ("triton", False, "static", None),
    ("flashinfer", True, "compact", "flashinfer"),
    ("flashinfer", False, "static", None),
])
def test_launcher_opens_compact_only_after_the_check(backend, passed, mode, patches, monkeypatch, caplog):
    from sglang_dspark.engine import arg_resolution

    caplog.set_level(logging.INFO, logger="sglang_dspark.engine.arg_resolution")
    calls = []

    def fake_check(name, gpu_name):
        calls.append(name)
        return rsc.SelfCheckResult(name, passed, "fake verdict")

    monkeypatch.setattr(rsc, "self_check", fake_check)
    monkeypatch.setattr(arg_resolution, "_draft_head", lambda view, path: DraftConfidenceHead(True, "a test draft"))
    monkeypatch.setattr(verify_mode, "installed_flashinfer_version", lambda: "0.7.2")  # a GPU machine's, SGLang's pin
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    monkeypatch.setenv(rsc.PATCHES_ENV, "stale")
    decision = arg_resolution._apply_verify_mode(_gpu_view(backend), "/draft", "async", None)
    assert calls == [backend]
    assert decision.verify_mode == mode and os.environ["SGLANG_RAGGED_VERIFY_MODE"] == mode
    assert os.environ.get(rsc.PATCHES_ENV) == patches
    assert f"ragged verify self-check ({backend}" in caplog.text
    if not passed:
        assert "fake verdict" in decision.reason
        assert "SGLANG_DSPARK_RAGGED_SELF_CHECK=force runs it again" in caplog.text


@pytest.mark.parametrize("version", ["0.7.4", "absent"])
def test_launcher_keeps_flashinfer_graphs_static_for_an_unsupported_flashinfer(version, monkeypatch):
    """Issue #38 item 4: the installed FlashInfer is checked before the self-check (which then does not run)."""
    from sglang_dspark.engine import arg_resolution

    monkeypatch.setattr(rsc, "self_check", lambda *a: pytest.fail("self-check run for an unsupported FlashInfer"))
    monkeypatch.setattr(arg_resolution, "_draft_head", lambda view, path: DraftConfidenceHead(True, "a test draft"))
    monkeypatch.setattr(verify_mode, "installed_flashinfer_version", lambda: version)
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    decision = arg_resolution._apply_verify_mode(_gpu_view("flashinfer"), "/draft", "async", None)
    assert decision.verify_mode == "static" and "flashinfer-python" in decision.reason
    assert rsc.PATCHES_ENV not in os.environ


@pytest.mark.parametrize("view,policy,user_mode", [
    (_gpu_view("fa3"), "async", None),  # compact without any patch
    (_gpu_view("triton"), "verify-all", None),  # static asked for
    (_gpu_view("triton"), "async", "static"),
    (_gpu_view("triton", enable_two_batch_overlap=True), "async", None),  # static for another reason anyway
    (_gpu_view("flashinfer", cuda_graph_backend_decode="disabled"), "async", None),  # eager: upstream's own path
])
def test_launcher_skips_the_check_where_it_decides_nothing(view, policy, user_mode, monkeypatch):
    from sglang_dspark.engine import arg_resolution

    monkeypatch.setattr(rsc, "self_check", lambda *a: pytest.fail("self-check run where it decides nothing"))
    monkeypatch.setattr(arg_resolution, "_draft_head", lambda view, path: DraftConfidenceHead(True, "a test draft"))
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    arg_resolution._apply_verify_mode(view, "/draft", policy, user_mode)
    assert rsc.PATCHES_ENV not in os.environ


@pytest.mark.parametrize("exported,flag", [("triton", True), ("", False), ("flashinfer", False)])
def test_plugin_installs_exactly_the_exported_patches(exported, flag):
    code = (
        "from sglang_dspark.plugin import register\n"
        "register()\n"
        "from sglang.srt.layers.attention.triton_backend import TritonAttnBackend\n"
        "print('FLAG', TritonAttnBackend.supports_ragged_verify_graph)\n"
    )
    env = {**os.environ, rsc.PATCHES_ENV: exported}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert f"FLAG {flag}" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_patched_backends_round_trip(monkeypatch):
    monkeypatch.delenv(rsc.PATCHES_ENV, raising=False)
    rsc.export_patched_backends(["triton", "fa3"])
    assert os.environ[rsc.PATCHES_ENV] == "triton" and rsc.patched_backends() == {"triton"}
    rsc.export_patched_backends([])
    assert rsc.PATCHES_ENV not in os.environ and rsc.patched_backends() == frozenset()
