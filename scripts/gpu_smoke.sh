#!/usr/bin/env bash
# GPU smoke check (needs an NVIDIA GPU; this project's CI has none). On a fresh GPU machine:
#   scripts/install.sh gpu && scripts/gpu_smoke.sh [--backends fa3 flashinfer] [--target T --draft D]
# Starts servers one after another on 127.0.0.1 (no-spec, upstream DSPARK static, ours) per attention backend and
# prints a JSON report: explain's prediction, start-up, greedy identity vs no-spec, tok/s at c = 1 and 16.
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
