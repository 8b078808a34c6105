"""The on-device self-check that opens compact verify on triton / flashinfer (``engine/self_check/ragged_self_check.py``), the
harness's case lists and tolerances (``engine/self_check/ragged_verify_cases.py``, ``engine/self_check/ragged_verify_parity.py``), and the
wiring: the launcher's verify-mode choice (``engine/arg_resolution.py``) and the patches ``plugin.register`` installs
in the scheduler processes.

There is no GPU here: the self-check runs through recording runners, plus once for real with the CPU harness
(``--device cpu`` under ``TRITON_INTERPRET=1``) so that the verdict is read from a genuine report.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from sglang_dspark.engine.self_check import ragged_self_check as rsc
from sglang_dspark.engine.self_check import ragged_verify_cases as rvc
from sglang_dspark.engine.self_check import ragged_verify_parity as parity
from sglang_dspark.engine import verify_mode
from sglang_dspark.engine.draft_head import DraftConfidenceHead


def _case(name, dtype="float32", error=1e-6, tolerance=2e-5, **extra):
    return {"name": name, "kernel": "extend_attention_fwd", "dtype": dtype, "error": error, "tolerance": tolerance,
            "ok": error <= tolerance, **extra}


def _section(*cases, checks=None, controls=(), exceptions=()):
    return {"cases": list(cases), "checks": dict(checks or {"flag on after the patch": True}),
            "controls": list(controls), "exceptions": list(exceptions)}


PRECISION = {"fp32_dot": "ieee", "fp32_abs_tol": 2e-5, "bf16_rel_tol": 2.0 ** -6}
PASSING_REPORT = {
    "ok": True, "precision": PRECISION, "shared": _section(checks={"layout kernels": True}),
    "triton": _section(_case("eager-fp32"), _case("graph-bf16 replay 0", "bfloat16", 3e-3, 2.0 ** -6)),
    "flashinfer": _section(_case("flashinfer replay 0", "bfloat16", 1e-2, 2.0 ** -6, host_plan_matches_device=True)),
}


def _report(**sections):
    return {**PASSING_REPORT, "ok": False, **sections}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_CACHE", str(tmp_path))
    monkeypatch.delenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", raising=False)
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})
    return tmp_path


class Runner:
    """Records every harness command; answers with a fixed HarnessRun (returncode None: timed out)."""

    def __init__(self, returncode=0, report=PASSING_REPORT, tail=""):
        self.calls: list[list[str]] = []
        self.answer = rsc.HarnessRun(returncode, json.dumps(report) if isinstance(report, dict) else report, tail)

    def __call__(self, command, timeout):
        self.calls.append(command)
        return self.answer


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def _new_start(monkeypatch):
    monkeypatch.setattr(rsc, "_THIS_PROCESS", {})


# ---------------------------------------------------------------------------------------------------------------------
# Reading the harness's report
# ---------------------------------------------------------------------------------------------------------------------


def test_verdict_passes_only_on_a_clean_report():
    outcome, detail = rsc.verdict_from_report("triton", rsc.HarnessRun(0, json.dumps(PASSING_REPORT), ""))
    assert outcome == rsc.PASSED and "matched the reference" in detail
    assert "1 fp32 at ieee dot precision within 2e-05" in detail and "1 bf16 within 1.56e-02 of rho" in detail
    outcome, detail = rsc.verdict_from_report("flashinfer", rsc.HarnessRun(0, json.dumps(PASSING_REPORT), ""))
    assert outcome == rsc.PASSED and "64%" in detail  # 1e-2 of a 2^-6 tolerance, its own cases only


@pytest.mark.parametrize("backend,returncode,report,tail,needles", [
    # the worst failing case by error over tolerance, named with its kernel, dtype, error and tolerance
    ("triton", 1, _report(triton=_section(
        _case("eager-fp32-a", error=4e-5), _case("graph-bf16 replay 3", "bfloat16", 0.31, 2.0 ** -6),
        _case("eager-fp32-b", error=1e-4))),  # 5x its tolerance; the bf16 case is 20x
     "", ["case 'graph-bf16 replay 3' (extend_attention_fwd, bfloat16) error 3.1e-01 > tolerance 1.6e-02 of rho",
          "(and 2 more)"]),
    # an exception comes first, with where it was raised
    ("triton", 1, _report(triton=_section(_case("eager-fp32-a", error=1.0), exceptions=[
        {"case": "graph-bf16-gqa8-d128-tiers", "error": "OutOfResources: shared memory", "where": "jit.py:712"}])),
     "", ["case 'graph-bf16-gqa8-d128-tiers' raised OutOfResources: shared memory (jit.py:712)"]),
    ("triton", 1, _report(triton=_section(_case("x"), checks={"flag on after the patch": False})), "",
     ["check 'flag on after the patch' failed"]),
    ("triton", 1, _report(shared=_section(checks={"fp32 dots compile at ieee precision (TRITON_F32_DEFAULT)": False})),
     "", ["fp32 dots compile at ieee"]),
    ("triton", 1, _report(triton=_section(_case("x"), controls=[{"name": "eager-fp32-a", "error": 1e-6,
                                                                   "ok": False}])), "", ["control 'eager-fp32-a'"]),
    ("flashinfer", 1, _report(flashinfer=_section(_case("fi replay 1", "bfloat16", 0.5, 2.0 ** -6,
                                                       host_plan_matches_device=False))), "",
     ["'fi replay 1'", "host plan != device layout"]),
    ("flashinfer", 0, _report(flashinfer=_section()), "", ["no flashinfer case ran"]),
    ("flashinfer", 0, {k: v for k, v in PASSING_REPORT.items() if k != "flashinfer"}, "", ["no flashinfer part"]),
    ("triton", 3, PASSING_REPORT, "", ["exit status 3"]),
    ("triton", 1, "", "Traceback ...\nRuntimeError: CUDA error: no kernel image",
     ["did not finish", "no kernel image"]),
    ("triton", 1, "{not json", "", ["exit status 1"]),
])
def test_verdict_fails_and_says_why(backend, returncode, report, tail, needles):
    text = json.dumps(report) if isinstance(report, dict) else report
    outcome, detail = rsc.verdict_from_report(backend, rsc.HarnessRun(returncode, text, tail))
    assert outcome == rsc.FAILED, detail
    for needle in needles:
        assert needle in detail, detail


def test_a_triton_failure_does_not_fail_the_flashinfer_verdict():
    report = _report(triton=_section(_case("eager-fp32-a", error=1.0)))
    assert rsc.verdict_from_report("triton", rsc.HarnessRun(1, json.dumps(report), ""))[0] == rsc.FAILED
    assert rsc.verdict_from_report("flashinfer", rsc.HarnessRun(0, json.dumps(report), ""))[0] == rsc.PASSED


def test_a_timeout_is_its_own_outcome():
    outcome, detail = rsc.verdict_from_report("triton", rsc.HarnessRun(None, "", "compiling"), timeout=600)
    assert outcome == rsc.TIMED_OUT and "timed out after 600 s" in detail


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
    for backend in rsc.SELF_CHECKED_BACKENDS:
        command = rsc.harness_command(backend, "/tmp/r.json")
        assert command[1:] == ["-m", rsc.HARNESS_MODULE, "--device", "cuda", "--backend", backend, "--out",
                               "/tmp/r.json"]


# ---------------------------------------------------------------------------------------------------------------------
# Running once, keeping the verdict
# ---------------------------------------------------------------------------------------------------------------------


def test_first_start_runs_the_check_later_starts_read_the_verdict(cache, monkeypatch):
    runner = Runner()
    first = rsc.self_check("triton", "NVIDIA A100", runner=runner)
    assert first.passed and not first.cached and first.outcome == rsc.PASSED and len(runner.calls) == 1
    assert runner.calls[0][-3:-2] == ["triton"]
    kept = list((cache / "ragged-self-check").glob("triton-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["key"]["gpu"] == "NVIDIA A100"
    assert json.loads(kept[0].read_text())["key"]["schema"] == rsc.CACHE_SCHEMA == 2
    assert rsc.self_check("triton", "NVIDIA A100", runner=runner) is first  # same process: memo
    _new_start(monkeypatch)
    later = rsc.self_check("triton", "NVIDIA A100", runner=runner)
    assert later.passed and later.cached and later.detail == first.detail and len(runner.calls) == 1
    # another GPU, another backend: their own checks
    rsc.self_check("triton", "NVIDIA L40S", runner=runner)
    rsc.self_check("flashinfer", "NVIDIA A100", runner=runner)
    assert len(runner.calls) == 3 and "flashinfer" in runner.calls[2]


def test_a_failed_check_is_kept_and_force_runs_again(cache, monkeypatch):
    failing = Runner(1, _report(flashinfer=_section(_case("fi replay 2", "bfloat16", 0.5, 2.0 ** -6))))
    result = rsc.self_check("flashinfer", "NVIDIA L40S", runner=failing)
    assert result.outcome == rsc.FAILED and "fi replay 2" in result.detail and result.retry_after is None
    _new_start(monkeypatch)
    again = rsc.self_check("flashinfer", "NVIDIA L40S", runner=Runner())
    assert again.cached and again.passed is False and "fi replay 2" in again.detail  # the kept verdict, no re-run
    _new_start(monkeypatch)
    monkeypatch.setenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", "force")
    fixed = Runner()
    assert rsc.self_check("flashinfer", "NVIDIA L40S", runner=fixed).passed and len(fixed.calls) == 1


def test_a_timeout_is_kept_and_retried_after_its_period(cache, monkeypatch, caplog):
    """Retry policy: a timeout is kept (static, no second wait at the next starts) and retried at the first start
    TIMEOUT_RETRY_HOURS later; force retries at once."""
    clock = Clock()
    slow = Runner(None, "", "compiling flashinfer ...")
    first = rsc.self_check("triton", "GPU", runner=slow, clock=clock, timeout=600)
    assert first.outcome == rsc.TIMED_OUT and first.passed is False
    assert first.retry_after == clock.now + rsc.TIMEOUT_RETRY_HOURS * 3600
    assert "timed out after 600 s" in first.detail and "static until a start after" in first.detail
    (kept,) = (cache / "ragged-self-check").glob("triton-*.json")
    assert json.loads(kept.read_text())["outcome"] == rsc.TIMED_OUT
    for hours in (1, rsc.TIMEOUT_RETRY_HOURS - 0.01):  # later starts within the period: the kept verdict
        _new_start(monkeypatch)
        clock.now = first.checked_at + hours * 3600
        kept_result = rsc.self_check("triton", "GPU", runner=slow, clock=clock)
        assert kept_result.cached and kept_result.outcome == rsc.TIMED_OUT and len(slow.calls) == 1
    _new_start(monkeypatch)
    clock.now = first.retry_after  # the period is over: run again (and it passes this time)
    fast = Runner()
    caplog.set_level(logging.INFO, logger=rsc.__name__)
    retried = rsc.self_check("triton", "GPU", runner=fast, clock=clock)
    assert retried.passed and not retried.cached and len(fast.calls) == 1
    assert "timed out at" in caplog.text and "retrying" in caplog.text
    # A timeout again within the period: force retries at once.
    _new_start(monkeypatch)
    monkeypatch.setenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", "force")
    rsc.self_check("triton", "GPU", runner=slow, clock=clock)
    _new_start(monkeypatch)
    rsc.self_check("triton", "GPU", runner=fast, clock=clock)
    assert len(slow.calls) == 2 and len(fast.calls) == 2


def test_off_runs_nothing(cache, monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_RAGGED_SELF_CHECK", "off")
    never = Runner()
    result = rsc.self_check("triton", "GPU", runner=never)
    assert result.passed is False and result.outcome == rsc.SKIPPED and "=off" in result.detail and never.calls == []
    with pytest.raises(ValueError, match="fa3"):
        rsc.self_check("fa3", "GPU", runner=never)


def test_a_damaged_verdict_is_a_miss(cache, monkeypatch, caplog):
    runner = Runner()
    rsc.self_check("triton", "GPU", runner=runner)
    (kept,) = (cache / "ragged-self-check").glob("triton-*.json")
    kept.write_text("{damaged")
    _new_start(monkeypatch)
    assert rsc.self_check("triton", "GPU", runner=runner).passed and len(runner.calls) == 2
    assert "unreadable" in caplog.text


def test_run_harness_kills_the_whole_group_at_the_time_bound(tmp_path):
    """A child that outlives the bound is killed with the processes it started (a JIT compiler, here a sleep)."""
    marker = tmp_path / "grandchild.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    started = time.monotonic()
    run = rsc.run_harness([sys.executable, "-c", code, "--out", str(tmp_path / "r.json")], timeout=2.0)
    assert run.returncode is None and run.report == "" and time.monotonic() - started < 30
    stat = Path(f"/proc/{int(marker.read_text())}/stat")
    for _ in range(50):  # gone, or a zombie waiting for init to reap it
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the harness's grandchild outlived the time bound")
    done = rsc.run_harness([sys.executable, "-c", "print('hi')", "--out", str(tmp_path / "none.json")], timeout=60)
    assert done.returncode == 0 and "hi" in done.tail and done.report == ""


def test_the_real_harness_report_is_read(cache, monkeypatch):
    """The CPU harness (SGLang's real Triton kernels under the interpreter, our patch) through run_harness."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def cpu_runner(command, timeout):
        command = [("cpu" if part == "cuda" else part) for part in command]
        return rsc.run_harness(command, timeout)

    result = rsc.self_check("triton", "cpu-interpreter", runner=cpu_runner)
    assert result.passed, result.detail
    assert "ragged cases" in result.detail and "fp32 at ieee dot precision" in result.detail


def test_check_summary_states_precision_tolerances_and_the_timeout_policy():
    summary = rsc.check_summary()
    for needle in ("ieee precision", "2e-05", "1.56e-02", "head dim 64/128", "GQA 4:1/8:1", "prefixes up to 4096",
                   "time bound 600 s", "retried at the first start 24 h later",
                   "SGLANG_DSPARK_RAGGED_SELF_CHECK=force"):
        assert needle in summary, (needle, summary)


# ---------------------------------------------------------------------------------------------------------------------
# What the check covers (pure data) and its tolerances
# ---------------------------------------------------------------------------------------------------------------------


def _all(lists):
    return [*lists.triton_eager, *lists.triton_graph, *lists.flashinfer_graph]


def test_every_case_is_a_batch_the_runner_could_build():
    for case in _all(rvc.GPU_CASES) + _all(rvc.CPU_CASES):
        rvc.validate(case)
    names = [c.name for c in _all(rvc.GPU_CASES)]
    assert len(names) == len(set(names))
    with pytest.raises(ValueError, match="not captured"):
        rvc.validate(rvc.GraphCase("bad", rvc.AttentionShape(4, 2, 16, rvc.FP32), 4, (1, 2), (rvc.Replay(12, (3,),
                                                                                                          (1,)),)))


def test_gpu_case_lists_cover_the_serving_shapes():
    for cases in (rvc.GPU_CASES.triton_eager + rvc.GPU_CASES.triton_graph, rvc.GPU_CASES.flashinfer_graph):
        got = rvc.coverage(cases)
        assert got["longest_prefix"] == rvc.GPU_COVERAGE_REQUIRED["longest_prefix"]
        assert got["min_kv_blocks"] >= rvc.GPU_COVERAGE_REQUIRED["min_kv_blocks"]
        assert got["partial_last_block"] and got["replay_with_padding_slots"] and got["tiers_sharing_slots"]
        assert got["replay_with_leftover_on_last_row"]
    triton = rvc.coverage(rvc.GPU_CASES.triton_eager + rvc.GPU_CASES.triton_graph)
    assert triton["bf16_head_dims"] >= rvc.GPU_COVERAGE_REQUIRED["bf16_head_dims"]
    assert triton["bf16_gqa_groups"] >= rvc.GPU_COVERAGE_REQUIRED["bf16_gqa_groups"]
    assert triton["max_slots"] >= rvc.GPU_COVERAGE_REQUIRED["max_slots"]
    assert triton["max_tier"] >= rvc.GPU_COVERAGE_REQUIRED["max_tier"]
    assert triton["fp32_cases"] >= 5 and triton["device_only_eager"]
    flashinfer = rvc.coverage(rvc.GPU_CASES.flashinfer_graph)
    assert flashinfer["bf16_head_dims"] == {128} and flashinfer["bf16_gqa_groups"] == {4, 8}
    assert flashinfer["lengths_from"] == set(rvc.LENGTHS_FROM)
    # The tight fp32 checks stay in the GPU lists, and stay small (fp32 tiles fit every GPU's shared memory).
    assert set(rvc.CPU_CASES.triton_eager) <= set(rvc.GPU_CASES.triton_eager)
    assert all(c.shape.d <= 32 for c in _all(rvc.GPU_CASES) if c.shape.dtype == rvc.FP32)


def test_cpu_case_lists_stay_small():
    """The CPU lists run under the Triton interpreter in the unit tests (whose bf16 tl.dot multiplies the raw bits:
    fp32 only there)."""
    cpu = rvc.CPU_CASES
    assert all(c.shape.dtype == rvc.FP32 for c in cpu.triton_eager + cpu.triton_graph)
    assert rvc.coverage(cpu.triton_eager + cpu.triton_graph)["longest_prefix"] <= 32
    assert len(cpu.triton_eager) + sum(len(c.replays) for c in cpu.triton_graph) <= 12


def test_largest_block_n_is_sglangs():
    """ragged_verify_cases.TRITON_LARGEST_BLOCK_N against the block sizes SGLang's extend kernel picks on NVIDIA."""
    import importlib.util

    root = Path(list(importlib.util.find_spec("sglang").submodule_search_locations)[0])
    source = (root / "kernels" / "ops" / "attention" / "extend_attention.py").read_text()
    body = source[source.index("def _get_block_sizes_for_extend_attention"):source.index("def _get_num_stages")]
    nvidia = body[body.index("    else:\n        if _is_cuda"):]
    block_n = {int(n) for n in re.findall(r"BLOCK_M, BLOCK_N = \(?\(\d+, (\d+)\)", nvidia)}
    assert block_n and max(block_n) == rvc.TRITON_LARGEST_BLOCK_N, block_n


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _emulated_bf16_attention(q, k, v, *, kernel, chunks=1, block=128, round_scaled_q=False):
    """One query row through a flash-attention kernel's bf16 rounding points (by reading), fp32 elsewhere: blockwise
    online softmax, weights rounded to bf16 for P.V; the normaliser sums the fp32 weights (``triton``) or the rounded
    ones (``flashinfer``); ``chunks`` > 1: split KV, each chunk's partial output stored in bf16, merged in fp32 by
    its log-sum-exp; bf16 output. ``round_scaled_q``: also round the scaled query to bf16 first (older FlashInfer
    kernels did)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    qs = _bf16(q * scale) if round_scaled_q else q * scale
    outs, lses = [], []
    size = -(-k.shape[0] // chunks)
    for lo in range(0, k.shape[0], size):
        m, acc, den = torch.tensor(-math.inf), torch.zeros(v.shape[-1]), torch.tensor(0.0)
        for start in range(lo, min(lo + size, k.shape[0]), block):
            end = min(start + block, lo + size, k.shape[0])
            s = qs @ k[start:end].T
            new_m = torch.maximum(m, s.max())
            p = torch.exp(s - new_m)
            rescale = torch.exp(m - new_m)
            den = den * rescale + (_bf16(p) if kernel == "flashinfer" else p).sum()
            acc = acc * rescale + _bf16(p) @ v[start:end]
            m = new_m
        outs.append(acc / den)
        lses.append(m + torch.log(den))
    if chunks == 1:
        return _bf16(outs[0])
    alpha = torch.softmax(torch.stack(lses), 0)
    return _bf16(sum(a * _bf16(o) for a, o in zip(alpha, outs)))


@pytest.mark.parametrize("d,kv_len", [(64, 9), (128, 9), (128, 200), (128, 4096)])
def test_bf16_tolerance_derivation(d, kv_len):
    """BF16_REL_TOL's derivation (ragged_verify_parity docstring), simulated: each kernel's bf16 roundings stay within
    its worst-case bound (and random data far inside it), an older FlashInfer's extra query rounding within the
    tolerance; a row reading its keys one slot off fails on short contexts, a dropped KV chunk on long ones."""
    g = torch.Generator().manual_seed(d + kv_len)
    rows = 8
    q = _bf16(parity.QUERY_STD * torch.randn(rows, d, generator=g))
    k, v = (_bf16(torch.randn(kv_len + 1, d, generator=g)) for _ in range(2))
    worst = {"triton": 0.0, "flashinfer": 0.0, "q rounded": 0.0, "one slot off": 0.0, "chunk dropped": 0.0}
    chunks = 8 if kv_len >= 512 else 1
    for i in range(rows):
        n = max(1, kv_len - rows + i + 1)
        w = torch.softmax((q[i].double() @ k[:n].double().T) / math.sqrt(d), 0)
        ref, rho = w @ v[:n].double(), w @ v[:n].abs().double()
        runs = {
            "triton": _emulated_bf16_attention(q[i], k[:n], v[:n], kernel="triton"),
            "flashinfer": _emulated_bf16_attention(q[i], k[:n], v[:n], kernel="flashinfer", chunks=chunks),
            "q rounded": _emulated_bf16_attention(q[i], k[:n], v[:n], kernel="flashinfer", chunks=chunks,
                                                  round_scaled_q=True),
            "one slot off": _emulated_bf16_attention(q[i], k[1:n + 1], v[1:n + 1], kernel="triton"),
            "chunk dropped": _emulated_bf16_attention(q[i], k[:n - n // 8], v[:n - n // 8], kernel="triton"),
        }
        for name, out in runs.items():
            worst[name] = max(worst[name], float(((out.double() - ref).abs() / rho).max()))
    u = parity.BF16_UNIT_ROUNDOFF
    assert worst["triton"] <= parity.BF16_ROUNDING_BOUNDS["triton"], worst
    assert worst["flashinfer"] <= parity.BF16_ROUNDING_BOUNDS["flashinfer"] / 2, worst  # random data: far inside
    assert worst["q rounded"] <= parity.BF16_REL_TOL / 2, worst
    assert parity.BF16_REL_TOL == max(parity.BF16_ROUNDING_BOUNDS.values()) == 4 * u
    if kv_len <= 200:
        assert worst["one slot off"] > 2 * parity.BF16_REL_TOL, worst
    else:  # one slot of 4096 moves rows by about 1/4096 (the short prefixes of the same batches catch it)
        assert worst["chunk dropped"] > 2 * parity.BF16_REL_TOL, worst


def _tf32(x):
    """Round fp32 to TF32 (10 explicit mantissa bits, round to nearest even), as a TF32 tensor-core dot reads it."""
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


def test_fp32_tolerance_needs_ieee_dots():
    """Why the harness forces TRITON_F32_DEFAULT=ieee: at the fp32 cases' shapes TF32 dot inputs alone miss
    FP32_IEEE_ABS_TOL by far, while fp32 dots meet it."""
    from sglang_dspark.kernels.ragged_verify_attention import ragged_verify_attention_torch

    case = rvc.CPU_TRITON_EAGER[0]
    world = parity.World.for_case(case, "cpu", seed=1)
    batch = world.batch(list(case.prefix), list(case.verify), case.n * len(case.verify))
    ref, _ = world.reference(batch)
    args = (world.req_to_token, batch.req_pool_indices, batch.prefix, batch.verify)
    oracle = ragged_verify_attention_torch(batch.q, world.k_ref, world.v_ref, *args, compute_dtype=torch.float64)
    tf32 = ragged_verify_attention_torch(_tf32(batch.q), _tf32(world.k_ref), _tf32(world.v_ref), *args)
    rows = batch.num_real
    assert float((ref[:rows].double() - oracle[:rows]).abs().max()) < parity.FP32_IEEE_ABS_TOL / 10
    assert float((tf32[:rows].double() - oracle[:rows]).abs().max()) > 2 * parity.FP32_IEEE_ABS_TOL


def test_attention_error_criteria():
    ref = torch.tensor([[[1.0, -2.0]]]).repeat(3, 1, 1)
    rho = torch.full_like(ref, 0.5)
    out = ref.clone()
    out[1, 0, 1] += 0.006  # 0.012 of rho: within 2^-6 (bf16), far out of 2e-5 (fp32)
    bf16 = parity.attention_error(out, ref, rho, 3, rvc.BF16)
    assert bf16["ok"] and bf16["error"] == pytest.approx(0.012, rel=1e-3) and bf16["tolerance"] == parity.BF16_REL_TOL
    assert not parity.attention_error(out, ref, rho, 3, rvc.FP32)["ok"]
    assert parity.attention_error(out, ref, rho, 1, rvc.FP32)["ok"]  # rows past the real ones are not compared
    out[0, 0, 0] = float("nan")
    assert parity.attention_error(out, ref, rho, 3, rvc.BF16)["error"] == math.inf


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


def test_the_log_line_names_the_failing_case_and_its_tolerance(cache, monkeypatch, caplog):
    """The launcher's warning carries the verdict's reason: the worst case, its error and tolerance."""
    from sglang_dspark.engine import arg_resolution

    report = _report(triton=_section(_case("graph-bf16-gqa8-d128-tiers replay 0", "bfloat16", 0.2, 2.0 ** -6)))
    real = rsc.self_check
    monkeypatch.setattr(rsc, "self_check", lambda backend, gpu: real(backend, gpu, runner=Runner(1, report)))
    monkeypatch.setattr(rsc, "gpu_identity", lambda: "NVIDIA A100")
    monkeypatch.setattr(arg_resolution, "_draft_head", lambda view, path: DraftConfidenceHead(True, "a test draft"))
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    caplog.set_level(logging.INFO, logger="sglang_dspark.engine.arg_resolution")
    decision = arg_resolution._apply_verify_mode(_gpu_view("triton"), "/draft", "async", None)
    assert decision.verify_mode == "static"
    line = next(r.getMessage() for r in caplog.records if "ragged verify self-check" in r.getMessage())
    assert "case 'graph-bf16-gqa8-d128-tiers replay 0' (extend_attention_fwd, bfloat16) error 2.0e-01 > tolerance " \
           "1.6e-02 of rho" in line, line
    assert "graph-bf16-gqa8-d128-tiers replay 0" in decision.reason


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
