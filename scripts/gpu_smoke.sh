#!/usr/bin/env bash
# GPU smoke check (needs an NVIDIA GPU; this project's CI has none). Runs on the official lmsysorg/sglang:v0.5.23
# image after `pip install` of this package (or after `scripts/install.sh gpu`):
#   scripts/gpu_smoke.sh [--backends fa3,flashinfer,triton] [--target T --draft D] [--json report.json] [--log-dir D]
# (the same as `python -m sglang_dspark.testing.gpu_smoke ...`, which is all this script runs besides nvidia-smi).
# Default pair: a random Qwen3 target + DeepSpec-format draft of the released schema at reduced size and the released
# head dim 128 (FlashInfer serves head dim >= 64 only), built offline; --target/--draft: a real pair on disk (e.g.
# Qwen/Qwen3-8B + deepseek-ai/dspark_qwen3_8b_block7). --backends chooses the rows (default fa3,flashinfer).
# Per backend, four servers on 127.0.0.1 one after another: upstream DSPARK static, ours with the prompt lookup on,
# ours with SGLANG_DSPARK_LOOKUP=off, then no-spec, which scores the others. Workload: 16 code prompts and 16 echo
# prompts (P + the model's own 32-token continuation of P + P: the answer is in the prompt whatever the weights) at
# c = 1 and 16. Prints a table per run, one per backend (lookup on and off side by side) and per backend what it
# proved, each PASS / FAIL / INFO / SKIP:
#   servers     all four started and served (flashinfer with a head dim < 64: not run, FAIL);
#   verify mode ours (lookup on and off) logged the verify mode `sglang-dspark explain` predicts;
#   match       greedy match against no-spec >= 0.90 (bf16) / 0.95 (fp32, triton only) and every differing token
#               within 1 nat of no-spec's (a tie broken the other way), lookup-chain tokens included;
#   lookup      where explain says the lookup is on and ours verifies compact: it proposed at least once (FAIL if
#               never: the lookup path is broken on that backend); chains verified / accepted are reported;
#   lookup off  SGLANG_DSPARK_LOOKUP=off ran no lookup;
#   speed       INFO only: ours vs upstream static at c = 16, lookup on vs off (no speed claim with the random pair).
# Exit 1 if any check fails; see sglang_dspark/testing/gpu_smoke.py.
#
# Ragged (compact) verify inside CUDA graphs on triton / flashinfer (issue #10), what a GPU run must show:
#   0. bare GPU (torch + triton only, < 8 min): `python scripts/gpu_kernels_check.py`: our Triton ragged verify kernel
#      vs the torch oracle in bf16/fp32, CUDA-graph replays with changing lengths, time ragged vs padded to γ+1.
#   1. kernels, ~1 min: `python -m sglang_dspark.engine.self_check.ragged_verify_parity --device cuda` (exit 0); the server runs
#      the same harness at start-up before it opens compact there (engine/self_check/ragged_self_check.py):
#      - triton: patched metadata + SGLang's extend_attention_fwd / extend_attention_fwd_unified captured in real CUDA
#        graphs per token tier, replayed with ragged layouts of fewer requests: max_abs_err <= 2e-5 (fp32);
#      - flashinfer: per-tier BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True) captured, replays planned by
#        patches/flashinfer_ragged_verify.py's host plan through fast_prefill_plan: host plan == device layout and
#        max_abs_err <= 3e-2 (bf16) on every replay.
#   2. servers: `scripts/gpu_smoke.sh --backends triton,flashinfer` must show the log line "ragged verify self-check
#      (...): ... matched the reference", compact in the verify mode column, result ok for dspark-ours, no
#      'Capture cuda graph failed' / NotImplementedError / 'ragged verify tier mismatch' in the logs (--log-dir), and
#      tok/s next to dspark-upstream-static; see patches/flashinfer_ragged_verify.py GPU_CHECKS for the full list.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${SGLANG_DSPARK_VENV:-$repo/.venv}/bin/python"
[[ -x "$py" ]] || py="$(command -v python3)"  # the official image: its system python, where pip installed us
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
exec "$py" -m sglang_dspark.testing.gpu_smoke "$@"
