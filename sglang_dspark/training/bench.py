"""Synthetic training-throughput estimate for a draft of a given geometry (no target, no data needed).

    python -m sglang_dspark.training.bench [--hidden 576 --heads 9 --kv-heads 3 --head-dim 64 --intermediate 1536
        --vocab 49152 --layers 2 --features 3 --markov-rank 64 --block-size 7 --seq-len 1024 --seqs 2
        --num-anchors 64 --steps 3 --threads 2 --hot 0]

Random context features and tokens stand in for a feature cache; each step is what ``Trainer.train_step`` does
(forward, DeepSpec loss, backward, clip, AdamW). Prints context tokens/s and block slots/s (anchors x gamma), per
wall second and per CPU second (all threads; on a shared machine the CPU-second figure is the steadier one).
Defaults are SmolLM2-135M's geometry. ``--hot N``: the vocabulary-sized heads and the loss over N hot tokens (FR-Spec
training, ``train --hot-vocab``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sglang_dspark.draft.model import DSparkDraft, num_params
from .features import CachedSequence
from .trainer import TrainConfig, micro_backward, pack, sample_anchors
from .loss import slot_weights


def synthetic_config(a) -> dict:
    return {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": a.vocab, "hidden_size": a.hidden,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "intermediate_size": a.intermediate, "num_hidden_layers": a.layers, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "hidden_act": "silu", "block_size": a.block_size, "mask_token_id": 0,
        "target_layer_ids": list(range(a.features)), "markov_rank": a.markov_rank, "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": True,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    for name, default in (("hidden", 576), ("heads", 9), ("kv-heads", 3), ("head-dim", 64), ("intermediate", 1536),
                          ("vocab", 49152), ("layers", 2), ("features", 3), ("markov-rank", 64), ("block-size", 7),
                          ("seq-len", 1024), ("seqs", 2), ("num-anchors", 64), ("steps", 3), ("threads", 2), ("hot", 0)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    model = DSparkDraft(synthetic_config(a))
    model.init_trainable(g)
    model.set_shared(torch.randn(a.vocab, a.hidden, generator=g), torch.randn(a.vocab, a.hidden, generator=g) * 0.05)
    if a.hot:
        model.set_hot_vocab(torch.randperm(a.vocab, generator=g)[: a.hot])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    cfg = TrainConfig(out_dir="/dev/null")
    seqs = [CachedSequence(input_ids=torch.randint(1, a.vocab, (a.seq_len,), generator=g),
                           loss_mask=torch.ones(a.seq_len, dtype=torch.bool),
                           aux=torch.randn(a.seq_len, a.features * a.hidden, generator=g).bfloat16(),
                           last=torch.randn(a.seq_len, a.hidden, generator=g).bfloat16(),
                           lse=torch.randn(a.seq_len, generator=g) + 12.0) for _ in range(a.seqs)]
    times, cpu = [], []
    for step in range(a.steps + 1):  # first step is warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        mbs = [pack([(s, sample_anchors(s.loss_mask, a.num_anchors, g))], a.block_size) for s in seqs]
        denom = sum(float(slot_weights(mb.valid).sum()) for mb in mbs)
        opt.zero_grad(set_to_none=True)
        for mb in mbs:
            micro_backward(model, mb, cfg, denom)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    sec = sum(times) / len(times)
    cpu_sec = sum(cpu) / len(cpu)
    ctx = a.seqs * a.seq_len
    slots = a.seqs * a.num_anchors * a.block_size
    print(json.dumps({"trainable_params_M": round(num_params(model) / 1e6, 2), "sec_per_step": round(sec, 3),
                      "ctx_tokens_per_s": round(ctx / sec, 1), "block_slots_per_s": round(slots / sec, 1),
                      "cpu_sec_per_step": round(cpu_sec, 3),
                      "ctx_tokens_per_cpu_s": round(ctx / cpu_sec, 1),
                      "threads": a.threads, "seq_len": a.seq_len, "seqs_per_step": a.seqs,
                      "anchors_per_seq": a.num_anchors, "block_size": a.block_size, "hot": a.hot}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
