"""``scripts/gpu_device_check.py`` (issue #38 item 8) on the CPU: its dry run (``--device cpu`` under
``TRITON_INTERPRET=1``, tiny shapes) reports every row, GPU-only rows as skipped; a kernel fault exits 1; it and the
files it executes by path import only torch, triton and the standard library; its copies of the self-check's
constants equal the self-check's own (its cases it reads from ``engine/self_check/ragged_verify_cases.py``).

The GPU rows themselves (TF32 vs IEEE on a real device, the step recorder under ``set_sync_debug_mode("error")``)
have not run: no GPU has been lent yet.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_device_check.py"
SKIPPED = "skipped (no GPU)"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_device_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(tmp_path, *flags):
    report_path = tmp_path / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(report_path), *flags],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads(report_path.read_text())


def rows_by_check(report):
    """``{check name prefix: row}`` for the rows this test names (every row's check text starts with one)."""
    prefixes = ("kernel parity bfloat16", "kernel parity float32", "kernel CUDA-graph replays", "kernel control",
                "precision fp32 ieee", "precision fp32 tf32", "precision bf16", "step recorder: 24 steps",
                "step recorder: no host sync", "control: sync debug mode")
    found = {p: [r for r in report["rows"] if r["check"].startswith(p)] for p in prefixes}
    assert all(len(rows) == 1 for rows in found.values()), found
    assert len(report["rows"]) == len(prefixes), [r["check"] for r in report["rows"]]
    return {p: rows[0] for p, rows in found.items()}


def test_cpu_dry_run_reports_every_row(tmp_path):
    proc, report = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["ok"] is True and report["device"] == "cpu"
    assert {"torch", "triton", "device_name", "triton_f32_default", "self_check", "kernel", "precision",
            "step_recorder", "rows", "seconds"} <= set(report)
    rows = rows_by_check(report)
    for name in ("kernel parity bfloat16", "kernel parity float32", "kernel CUDA-graph replays", "kernel control",
                 "precision fp32 ieee", "precision bf16", "step recorder: 24 steps"):
        assert rows[name]["ok"] is True and rows[name]["result"] == "pass", rows[name]
    for name in ("precision fp32 tf32", "step recorder: no host sync", "control: sync debug mode"):
        assert rows[name]["ok"] is None and rows[name]["result"] == SKIPPED, rows[name]
    assert rows["precision fp32 ieee"]["worst_error"] <= report["self_check"]["fp32_abs_tol"]
    assert rows["precision bf16"]["worst_error"] <= report["self_check"]["bf16_rel_tol"]
    assert sorted((c["dtype"], c["precision"]) for c in report["precision"]) == [("bfloat16", "bf16 dot"),
                                                                                 ("float32", "ieee")]
    assert len(report["kernel"]["parity"]) == 12 and len(report["kernel"]["graph"]) == 4
    recorder = report["step_recorder"]
    assert set(recorder["lateness"]) == {"1", "2"} and recorder["dropped"] == 0 and recorder["records"] >= 22
    assert "| check | cases | worst error | bound | result | note |" in proc.stdout
    assert proc.stdout.count(SKIPPED) == 3 and "all checks ok: True" in proc.stdout


def test_kernel_fault_fails_the_run(tmp_path):
    proc, report = dry_run(tmp_path, "--inject-kernel-fault")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = rows_by_check(report)
    for name in ("kernel parity bfloat16", "kernel parity float32", "kernel CUDA-graph replays",
                 "precision fp32 ieee", "precision bf16"):
        assert rows[name]["ok"] is False and rows[name]["result"] == "FAIL", rows[name]
    assert rows["step recorder: 24 steps"]["ok"] is True  # the fault is the kernel's only
    assert report["ok"] is False and "all checks ok: False" in proc.stdout


def imported_top_level_modules(path: Path) -> set[str]:
    """Every module an ``import``/``from`` anywhere in the file names (nested imports included), top level only."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import (would need its package)"
            names.add(node.module.split(".")[0])
    return names


def test_imports_only_torch_triton_and_stdlib():
    """A bare GPU machine has torch and triton only: the script and every repository file it executes by path (the
    kernel check, the two kernel files that check loads, the step recorder, the self-check's cases) import nothing
    else."""
    script = load_script()
    files = [SCRIPT, script.KERNEL_CHECK_PATH, script.STEP_RECORD_PATH, script.SELF_CHECK_CASES_PATH,
             REPO / "kernels" / "ragged_verify_attention.py", REPO / "kernels" / "ragged_verify_attention_triton.py"]
    allowed = set(sys.stdlib_module_names) | {"torch", "triton"}
    for path in files:
        sibling_scripts = {script.KERNEL_CHECK_PATH.stem} if path == SCRIPT else set()
        outside = imported_top_level_modules(path) - allowed - sibling_scripts
        assert not outside, (path.relative_to(REPO), outside)


def test_self_check_constants_are_the_self_checks():
    """The script copies the self-check's precision setting and tolerances (it may not import their module, which
    imports SGLang's kernels at run time)."""
    from sglang_dspark.engine.self_check import ragged_verify_parity as self_check

    script = load_script()
    assert script.SELF_CHECK_FP32_DOT_PRECISION == self_check.FP32_DOT_PRECISION
    assert script.SELF_CHECK_FP32_ABS_TOL == self_check.FP32_IEEE_ABS_TOL
    assert script.SELF_CHECK_BF16_REL_TOL == self_check.BF16_REL_TOL
