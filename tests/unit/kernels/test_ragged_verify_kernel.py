"""Our Triton ragged verify attention (``kernels/ragged_verify_attention_triton.py``) against its torch reference,
on the CPU under ``TRITON_INTERPRET=1`` through the GPU check script itself (``scripts/gpu_kernels_check.py --device
cpu``), so the script a GPU machine runs is the one tested here.

Checked (small shapes; sample sizes in the script): 12 random paged batches (bf16 and fp32; GQA 4:1, MQA, MHA; soft
cap on and off; random page tables and pool rows), tolerances 2e-2 (bf16) / 1e-4 (fp32) on |out - ref| / (1 + |ref|);
4 "graph" replays through fixed slot buffers with a different live-request count and lengths each time (padding
slots own no rows); the negative control (a compact batch read at a uniform γ+1 stride) must err by > 0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_kernels_check.py"


def test_gpu_kernels_check_dry_run_on_cpu(tmp_path):
    report_path = tmp_path / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(report_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] is True
    assert len(report["parity"]) == 12 and all(c["ok"] for c in report["parity"])
    assert {c["dtype"] for c in report["parity"]} == {"bfloat16", "float32"}
    assert max(c["max_abs_err"] for c in report["parity"] if c["dtype"] == "float32") <= 1e-4
    assert len(report["graph"]) == 4 and all(c["ok"] for c in report["graph"])
    assert len({c["live_requests"] for c in report["graph"]} | {0}) >= 2  # live counts vary (random: seeded)
    assert report["control"]["ok"] and report["control"]["max_abs_err"] > 0.1
    assert {t["mix"] for t in report["timing"]} == {"all γ+1", "half 1 / half γ+1", "geometric"}
    assert "| parity bfloat16 |" in proc.stdout and "ragged / padded" in proc.stdout


def test_gpu_kernels_check_needs_only_torch_and_triton():
    """The script must run on a bare GPU machine: no sglang / flashinfer / sglang_dspark import anywhere in it or in
    the two kernel files it loads by path."""
    for path in (SCRIPT, REPO / "kernels" / "ragged_verify_attention.py",
                 REPO / "kernels" / "ragged_verify_attention_triton.py"):
        imports = [line.strip() for line in path.read_text().splitlines()
                   if line.strip().startswith(("import ", "from "))]
        for line in imports:
            module = line.split()[1].split(".")[0]
            assert module in {"__future__", "argparse", "importlib", "json", "math", "os", "statistics", "sys",
                              "time", "pathlib", "dataclasses", "typing", "torch", "triton"}, (path.name, line)


def test_kernel_refuses_bad_shapes():
    code = (
        "import torch\n"
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('k', {str(REPO / 'kernels' / 'ragged_verify_attention_triton.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "k = torch.zeros(8, 2, 16); r2t = torch.zeros(1, 8, dtype=torch.int32)\n"
        "i = torch.zeros(1, dtype=torch.int32); qo = torch.tensor([0, 4], dtype=torch.int32)\n"
        "for heads, max_q_len in ((3, 4), (4, 0)):\n"
        "    try:\n"
        "        m.ragged_verify_attention_triton(torch.zeros(4, heads, 16), k, k, r2t, i, i, qo, max_q_len=max_q_len)\n"
        "    except ValueError as e:\n"
        "        print('refused:', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.count("refused:") == 2, proc.stdout + proc.stderr
    assert "query heads 3 not a multiple of KV heads 2" in proc.stdout and "max_q_len must be >= 1" in proc.stdout
