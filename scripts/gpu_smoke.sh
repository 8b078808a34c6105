#!/usr/bin/env bash
# GPU smoke check (needs an NVIDIA GPU; this project's CI has none). On a fresh GPU machine:
#   scripts/install.sh gpu && scripts/gpu_smoke.sh [--backends fa3 flashinfer] [--target T --draft D]
# Starts servers one after another on 127.0.0.1 (no-spec, upstream DSPARK static, ours) per attention backend and
# prints a JSON report: explain's prediction, start-up, greedy identity vs no-spec, tok/s at c = 1 and 16.
#
# Ragged (compact) verify inside CUDA graphs on triton / flashinfer (issue #10), what a GPU run must show:
#   0. bare GPU (torch + triton only, < 8 min): `python scripts/gpu_kernels_check.py`: our Triton ragged verify kernel
#      vs the torch oracle in bf16/fp32, CUDA-graph replays with changing lengths, time ragged vs padded to γ+1.
#   1. kernels, ~1 min: `python -m sglang_dspark.engine.ragged_verify_parity --device cuda` (exit 0); the server runs
#      the same harness at start-up before it opens compact there (engine/ragged_self_check.py):
#      - triton: patched metadata + SGLang's extend_attention_fwd / extend_attention_fwd_unified captured in real CUDA
#        graphs per token tier, replayed with ragged layouts of fewer requests: max_abs_err <= 2e-5 (fp32);
#      - flashinfer: per-tier BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True) captured, replays planned by
#        patches/flashinfer_ragged_verify.py's host plan through fast_prefill_plan: host plan == device layout and
#        max_abs_err <= 3e-2 (bf16) on every replay.
#   2. servers: `scripts/gpu_smoke.sh --backends triton flashinfer` must show the log line "ragged verify self-check
#      (...): ... matched the reference", compact verify named in the log, greedy_identical true for dspark-ours, no
#      'Capture cuda graph failed' / NotImplementedError / 'ragged verify tier mismatch', and tok/s next to
#      dspark-upstream-static; see patches/flashinfer_ragged_verify.py GPU_CHECKS for the full list.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${SGLANG_DSPARK_VENV:-$repo/.venv}/bin/python"
[[ -x "$py" ]] || py="$(command -v python3)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for gpu_backend in fa3 flashinfer; do
  echo "explain ($gpu_backend):"
  "$py" -m sglang_dspark.cli explain --device cuda -- --model-path Qwen/Qwen3-8B \
    --speculative-algorithm DSPARK --speculative-draft-model-path deepseek-ai/dspark_qwen3_8b_block7 \
    --attention-backend "$gpu_backend" || true
done
exec "$py" -m sglang_dspark.testing.gpu_smoke "$@"
