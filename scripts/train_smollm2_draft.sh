#!/usr/bin/env bash
# Reproduce the shipped SmolLM2 DSpark draft (sglang_dspark/embedded/smollm2_draft) on a CPU machine.
#
#   scripts/train_smollm2_draft.sh WORK_DIR [STEPS]
#
# Needs the dev install (scripts/install.sh cpu --dev) and the BIG-bench sdist (Apache-2.0, ~360 MB):
#   pip download --no-deps bigbench==1.0.0 -d WORK_DIR
# Steps (each resumable; progress bars on stderr):
#   1. prompts:   BIG-bench task inputs, split by task into train / held-out (benchmarks/data holds the held-out)
#   2. generate:  SmolLM2's own answers at T = 0.7 through our SGLang CPU server (train prompts; the last 200 train
#                 prompts are answered separately as the STS calibration set, never trained on)
#   3. train:     2-layer draft, block 7, Markov rank 64, 5 target layers, loss 0.1 CE + 0.9 L1 + 1.0 confidence
#                 (--micro-tokens 512: the answers are short, and smaller packs cut the block-sparse attention work
#                 ~30 % per step on 2 cores; the gradient is the same)
#   4. calibrate: STS temperatures on the calibration answers
#   5. export:    bf16, without the embedding / LM head copies (SGLang takes the target's), + dspark_sts.json
#   6. hot vocab: the 8 192 most frequent tokens of the target's answers (dspark_hot_vocab.json, FR-Spec)
set -euo pipefail
WORK=${1:?usage: scripts/train_smollm2_draft.sh WORK_DIR [STEPS]}
STEPS=${2:-1100}
GEN_MINUTES=${GEN_MINUTES:-}  # optional wall-time bound for step 2 (the shipped draft used what 2 cores made in ~45 min)
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
mkdir -p "$WORK"
TARGET=$("$PY" -m sglang_dspark.embedded.smollm2 --dtype float32)
T="$PY -m sglang_dspark.training"

$T prompts --bigbench "$WORK/bigbench-1.0.0.tar.gz" --out-dir "$WORK"
NTRAIN=$(wc -l < "$WORK/train_prompts.jsonl")
$T generate --target "$TARGET" --prompts "$WORK/train_prompts.jsonl" --skip $((NTRAIN - 200)) \
    --out "$WORK/calib_answers.jsonl" --concurrency 48
$T generate --target "$TARGET" --prompts "$WORK/train_prompts.jsonl" --limit $((NTRAIN - 200)) \
    --out "$WORK/train_answers.jsonl" --concurrency 48 ${GEN_MINUTES:+--deadline-minutes $GEN_MINUTES}

$T train --target "$TARGET" --data "$WORK/train_answers.jsonl" --out "$WORK/run" \
    --block-size 7 --layers 2 --markov-rank 64 --num-context-features 5 --mask-token-id 16 --max-length 1024 \
    --steps "$STEPS" --batch-size 8 --num-anchors 64 --micro-tokens 512 --lr 1e-3 --warmup-ratio 0.03 --min-lr-ratio 0.05 \
    --save-every 25 --log-every 5 --threads 2 --export-dtype bfloat16 --omit-shared --export-dir "$WORK/draft" --resume
$T calibrate --draft "$WORK/draft" --target "$TARGET" --data "$WORK/calib_answers.jsonl" \
    --cache-dir "$WORK/calib_features" --out "$WORK/draft/dspark_sts.json" --threads 2
"$PY" -m sglang_dspark.draft.hot_vocab build --answers "$WORK/train_answers.jsonl" --tokenizer "$TARGET" \
    --size 8192 --out "$WORK/draft"
echo "draft: $WORK/draft  (copy it to sglang_dspark/embedded/smollm2_draft to ship it)"
