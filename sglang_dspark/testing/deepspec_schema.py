"""The schema of DeepSpec's released Qwen3 DSpark drafts, and a reduced-size random pair that has exactly it.

``RELEASED_QWEN3_8B_BLOCK7_CONFIG`` is the config.json of ``deepseek-ai/dspark_qwen3_8b_block7`` as DeepSpec's
``build_draft_config`` writes it: Qwen/Qwen3-8B's config deep-copied, then the top-level DSpark keys. Its tensor
shapes (embed/lm_head [151936, 4096], Markov [151936, 256], confidence [1, 4352]) were checked against the real file;
the config's key set is reconstructed from Qwen3-8B's config.json and DeepSpec's code, not copied from the file.

``build_released_schema_pair(out_dir)`` builds, offline and in seconds, a random float32 Qwen3 target with a
DSpark draft that has the same tensor names, the same config keys and the same size-independent values
(5 draft layers, block 7, vanilla Markov head, confidence head fed by the Markov code, embed/lm_head copies
stored), only with smaller sizes: a stand-in for the 16 GB pair in tests. ``sizes=SMOKE_SIZES`` builds it at the
released head dim 128 (what FlashInfer and FA3 serve; ``scripts/gpu_smoke.sh``'s default pair).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Optional

from sglang_dspark.testing.tiny_pair import TinyPair, build_tiny_pair, expected_draft_tensor_shapes

RELEASED_REPO = "deepseek-ai/dspark_qwen3_8b_block7"

QWEN3_8B_TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

RELEASED_QWEN3_8B_BLOCK7_CONFIG = {
    **QWEN3_8B_TARGET_CONFIG,
    "architectures": ["Qwen3DSparkModel"],
    "model_type": "qwen3",
    "num_target_layers": 36,
    "num_hidden_layers": 5,
    "block_size": 7,
    "mask_token_id": 151669,
    "target_layer_ids": [1, 9, 17, 25, 33],
    "num_anchors": 512,
    "tie_word_embeddings": False,
    "layer_types": ["full_attention"] * 5,
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "markov_rank": 256,
    "markov_head_type": "vanilla",
}

# Reduced sizes: 12 target layers give evenly spaced, non-adjacent context layers ([1, 3, 5, 7, 9]) like the
# released [1, 9, 17, 25, 33]; GQA keeps the 4:1 query:kv head ratio and hidden = heads * head_dim.
REDUCED_SIZES = {
    "num_layers": 12,
    "hidden_size": 128,
    "num_heads": 4,
    "num_kv_heads": 1,
    "head_dim": 32,
    "intermediate_size": 384,
    "markov_rank": 64,
}

# The same reduced pair at the released head dim (128), for ``scripts/gpu_smoke.sh``: FlashInfer's FA2 prefill marks
# every kernel with head dim < 64 invalid (so at head dim 32 no flashinfer server starts) and upstream FA3 runs 32 in
# its 64 kernel, not the one a real pair runs. Head dim 128 with GQA 4:1 is Qwen3-8B's attention shape, so the smoke
# runs the attention kernels the released pair runs; hidden = heads * head_dim as above. Tests that serve on the CPU
# keep ``REDUCED_SIZES`` (a quarter of the hidden size).
SMOKE_SIZES = {
    **REDUCED_SIZES,
    "hidden_size": 512,
    "head_dim": 128,
    "intermediate_size": 1536,
}


def deepspec_target_layer_ids(num_target_layers: int, num_draft_layers: int = 5) -> List[int]:
    """z-lab's build_target_layer_ids, which DeepSpec's Qwen3 configs follow: spread from layer 1 to L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def released_tensor_shapes() -> Dict[str, tuple]:
    """Tensor name -> shape of the full-size released checkpoint."""
    return expected_draft_tensor_shapes(RELEASED_QWEN3_8B_BLOCK7_CONFIG)


def build_released_schema_pair(out_dir: Path, seed: int = 0, force: bool = False,
                               sizes: Optional[Mapping[str, int]] = None) -> TinyPair:
    """The reduced released-schema pair (``sizes``: ``REDUCED_SIZES`` by default, ``SMOKE_SIZES`` for the GPU
    smoke; any mapping with the same keys)."""
    released = RELEASED_QWEN3_8B_BLOCK7_CONFIG
    sizes = dict(REDUCED_SIZES if sizes is None else sizes)
    if set(sizes) != set(REDUCED_SIZES):
        raise ValueError(f"sizes must have exactly the keys {sorted(REDUCED_SIZES)}, got {sorted(sizes)}")
    num_draft_layers = released["num_hidden_layers"]
    return build_tiny_pair(
        out_dir,
        seed=seed,
        force=force,
        target_arch="qwen3",
        rope_theta=float(QWEN3_8B_TARGET_CONFIG["rope_theta"]),
        num_draft_layers=num_draft_layers,
        block_size=released["block_size"],
        target_layer_ids=tuple(deepspec_target_layer_ids(sizes["num_layers"], num_draft_layers)),
        markov_head_type=released["markov_head_type"],
        confidence_head=released["enable_confidence_head"],
        confidence_head_with_markov=released["confidence_head_with_markov"],
        **sizes,
    )
