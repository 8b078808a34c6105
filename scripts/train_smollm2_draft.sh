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
# Stage 2 (the shipped draft since 2026-12-01; WORK_DIR/stage2):
#   7. prompts:   48 inputs per BIG-bench training task (same split); answers at T = 0.7 for as long as
#                 STAGE2_GEN_MINUTES allows (the shipped run stopped at 1 411 answers, ~28 min); STS calibration set =
#                 the last 200 training prompts + 120 built-in chat prompts (the load test's kind; not the 120 held out)
#   8. train:     warm start from stage 1 over its hot vocabulary (exact FR-Spec loss: train --hot-vocab), 600 steps,
#                 peak lr 3e-4
#   9. calibrate: STS on that mix; export to WORK_DIR/stage2/draft
# Stage 3 (WORK_DIR/stage3):
#  10. prompts:   96 inputs per BIG-bench training task (same split; prompts stage 2 answered dropped) interleaved
#                 with 900 everyday instructions (code, sums, writing, how-to: `training instructions`), answers at
#                 T = 0.7 for STAGE3_GEN_MINUTES (default 28)
#  11. train:     warm start from stage 2 on stage 2's + stage 3's answers, same hot vocabulary and loss
#  12. calibrate: STS on stage 2's calibration mix; export to WORK_DIR/stage3/draft
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

# ------------------------------------------------------------------------------------------------ stage 2
S2="$WORK/stage2"
mkdir -p "$S2"
$T prompts --bigbench "$WORK/bigbench-1.0.0.tar.gz" --out-dir "$S2" --per-task 48
NTRAIN2=$(wc -l < "$S2/train_prompts.jsonl")
"$PY" - "$S2/chat_calib_prompts.jsonl" <<'PY'
import json, sys
from sglang_dspark.loadtest.prompts import builtin_prompts
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for i, text in enumerate(builtin_prompts(seed=1)[120:240]):  # [0:120] are the held-out chat prompts
        f.write(json.dumps({"task": "builtin_chat", "index": 120 + i, "text": text}) + "\n")
PY
$T generate --target "$TARGET" --prompts "$S2/train_prompts.jsonl" --skip $((NTRAIN2 - 200)) \
    --out "$S2/calib_answers.jsonl" --concurrency 48
$T generate --target "$TARGET" --prompts "$S2/chat_calib_prompts.jsonl" --out "$S2/chat_calib_answers.jsonl" \
    --concurrency 60
cat "$S2/calib_answers.jsonl" "$S2/chat_calib_answers.jsonl" > "$S2/calib_mix_answers.jsonl"
$T generate --target "$TARGET" --prompts "$S2/train_prompts.jsonl" --limit $((NTRAIN2 - 200)) \
    --out "$S2/train_answers.jsonl" --concurrency 48 --deadline-minutes "${STAGE2_GEN_MINUTES:-28}"
$T train --target "$TARGET" --data "$S2/train_answers.jsonl" --out "$S2/run" --init-from "$WORK/draft" \
    --hot-vocab "$WORK/draft" --block-size 7 --max-length 1024 --steps 600 --batch-size 8 --num-anchors 64 \
    --micro-tokens 512 --lr 3e-4 --warmup-ratio 0.03 --min-lr-ratio 0.1 --save-every 25 --keep-checkpoints 100 \
    --log-every 5 --threads 2 --omit-shared --export-dir "$S2/draft" --resume
$T calibrate --draft "$S2/draft" --target "$TARGET" --data "$S2/calib_mix_answers.jsonl" \
    --cache-dir "$S2/calib_features" --out "$S2/draft/dspark_sts.json" --threads 2
cp "$WORK/draft/dspark_hot_vocab.json" "$S2/draft/"

# ------------------------------------------------------------------------------------------------ stage 3
S3="$WORK/stage3"
mkdir -p "$S3"
$T instructions --out "$S3/instruction_prompts.jsonl" --count 900 --seed 0
$T prompts --bigbench "$WORK/bigbench-1.0.0.tar.gz" --out-dir "$S3/bb" --per-task 96
"$PY" - "$S3" "$S2" <<'PY'
import json, random, sys
s3, s2 = sys.argv[1], sys.argv[2]
answered = {json.loads(l)["messages"][0]["content"] for f in ("train_answers", "calib_mix_answers")
            for l in open(f"{s2}/{f}.jsonl", encoding="utf-8")}
bb = [json.loads(l) for l in open(f"{s3}/bb/train_prompts.jsonl", encoding="utf-8")]
bb = [p for p in bb if p["text"] not in answered]
random.Random(3).shuffle(bb)
ins = [json.loads(l) for l in open(f"{s3}/instruction_prompts.jsonl", encoding="utf-8")]
mixed = [p for i in range(max(len(bb), len(ins))) for p in (ins[i:i + 1] + bb[i:i + 1])]  # one of each in turn
with open(f"{s3}/train_prompts.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(p) + "\n" for p in mixed)
PY
$T generate --target "$TARGET" --prompts "$S3/train_prompts.jsonl" --out "$S3/train_answers.jsonl" \
    --concurrency 48 --seed 3 --deadline-minutes "${STAGE3_GEN_MINUTES:-28}"
cat "$S2/train_answers.jsonl" "$S3/train_answers.jsonl" > "$S3/train_mix_answers.jsonl"
$T train --target "$TARGET" --data "$S3/train_mix_answers.jsonl" --out "$S3/run" --init-from "$S2/draft" \
    --hot-vocab "$S2/draft" --block-size 7 --max-length 1024 --steps STAGE3_STEPS --batch-size 8 --num-anchors 64 \
    --micro-tokens 512 --lr 3e-4 --warmup-ratio 0.03 --min-lr-ratio 0.1 --save-every 50 --keep-checkpoints 100 \
    --log-every 5 --threads 2 --omit-shared --export-dir "$S3/draft" --resume
$T calibrate --draft "$S3/draft" --target "$TARGET" --data "$S2/calib_mix_answers.jsonl" \
    --cache-dir "$S2/calib_features" --out "$S3/draft/dspark_sts.json" --threads 2
echo "draft: $S3/draft  (copy config.json, model.safetensors, dspark_sts.json and dspark_hot_vocab.json to"
echo "       sglang_dspark/embedded/smollm2_draft to ship it)"
