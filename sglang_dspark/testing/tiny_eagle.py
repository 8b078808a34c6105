"""A random one-layer EAGLE draft head for the tiny target (tests only: proves our plugin leaves EAGLE alone).

SGLang's ``LlamaForCausalLMEagle`` reads: model.embed_tokens, model.fc ([2d -> d], with bias), one Llama decoder
layer without input_layernorm, and lm_head. Offline, deterministic for a seed, float32 like the target.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tiny_eagle(target_dir: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    if (out_dir / "model.safetensors").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((target_dir / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1, tie_word_embeddings=False)
    d, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or d // config["num_attention_heads"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {
        "model.embed_tokens.weight": normal(vocab, d),
        "model.fc.weight": normal(d, 2 * d),
        "model.fc.bias": torch.zeros(d),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(d),
        "model.layers.0.self_attn.q_proj.weight": normal(q_out, d),
        "model.layers.0.self_attn.k_proj.weight": normal(kv_out, d),
        "model.layers.0.self_attn.v_proj.weight": normal(kv_out, d),
        "model.layers.0.self_attn.o_proj.weight": normal(d, q_out),
        "model.layers.0.mlp.gate_proj.weight": normal(inter, d),
        "model.layers.0.mlp.up_proj.weight": normal(inter, d),
        "model.layers.0.mlp.down_proj.weight": normal(d, inter),
        "lm_head.weight": normal(vocab, d),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, out_dir / name)
    return out_dir
