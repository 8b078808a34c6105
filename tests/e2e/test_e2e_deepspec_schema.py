"""DeepSpec's released Qwen3 DSpark checkpoints (deepseek-ai/dspark_qwen3_8b_block7): a reduced-size random checkpoint
with exactly their schema loads in our trainer and is served by SGLang's DSPARK on a Qwen3 target, losslessly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all, greedy_ids
from sglang_dspark.testing.deepspec_schema import (
    QWEN3_8B_TARGET_CONFIG,
    RELEASED_QWEN3_8B_BLOCK7_CONFIG,
    build_released_schema_pair,
    deepspec_target_layer_ids,
    released_tensor_shapes,
)
from sglang_dspark.cpu.startup import import_transformers
from sglang_dspark.testing.tiny_pair import (
    TinyPairOptions,
    expected_draft_tensor_shapes,
    target_weights,
)
from sglang_dspark.draft.checkpoint import load_draft

# Size-independent values that the reduced checkpoint must share with the released one.
SHARED_VALUES = ("architectures", "model_type", "num_hidden_layers", "block_size", "num_anchors", "tie_word_embeddings",
                 "layer_types", "enable_confidence_head", "confidence_head_with_markov", "markov_head_type",
                 "attention_bias", "hidden_act", "rms_norm_eps", "rope_theta", "use_sliding_window")
GEOMETRY = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
            "rms_norm_eps", "rope_theta", "hidden_act", "attention_bias")


@pytest.fixture(scope="module")
def released_pair(tmp_path_factory):
    return build_released_schema_pair(tmp_path_factory.mktemp("released-schema"))


def _config(d) -> dict:
    return json.loads((d / "config.json").read_text())


# ------------------------------------------------------------------------------------------- schema


def test_full_size_shapes_are_the_released_files():
    shapes = released_tensor_shapes()
    assert shapes["embed_tokens.weight"] == shapes["lm_head.weight"] == (151936, 4096)
    assert shapes["markov_head.markov_w1.weight"] == shapes["markov_head.markov_w2.weight"] == (151936, 256)
    assert shapes["confidence_head.proj.weight"] == (1, 4352)
    assert shapes["confidence_head.proj.bias"] == (1,)
    assert shapes["fc.weight"] == (4096, 5 * 4096)
    assert shapes["layers.4.self_attn.q_proj.weight"] == (32 * 128, 4096)
    assert shapes["layers.4.self_attn.k_proj.weight"] == (8 * 128, 4096)
    assert shapes["layers.4.self_attn.q_norm.weight"] == (128,)
    assert shapes["layers.4.mlp.down_proj.weight"] == (4096, 12288)
    assert {k.split(".")[1] for k in shapes if k.startswith("layers.")} == {"0", "1", "2", "3", "4"}
    assert len(shapes) == 5 + 5 * 11 + 2 + 2


def test_layer_rule_gives_the_released_ids():
    assert deepspec_target_layer_ids(36) == RELEASED_QWEN3_8B_BLOCK7_CONFIG["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert deepspec_target_layer_ids(40) == [1, 10, 19, 28, 37]  # DeepSpec's Qwen3-14B config


def test_reduced_draft_has_the_released_schema(released_pair):
    released = RELEASED_QWEN3_8B_BLOCK7_CONFIG
    cfg = _config(released_pair.draft_dir)
    assert set(cfg) == set(released)
    for key in SHARED_VALUES:
        assert cfg[key] == released[key], key
    assert cfg["target_layer_ids"] == deepspec_target_layer_ids(cfg["num_target_layers"]) == [1, 3, 5, 7, 9]
    assert cfg["mask_token_id"] == released_pair.mask_token_id < cfg["vocab_size"]
    # Same per-layer geometry as the target it was copied from, as in DeepSpec's build_draft_config.
    target = _config(released_pair.target_dir)
    assert set(target) == set(QWEN3_8B_TARGET_CONFIG)
    assert all(cfg[k] == target[k] for k in GEOMETRY)

    tensors = load_file(str(released_pair.draft_dir / "model.safetensors"))
    got = {k: tuple(t.shape) for k, t in tensors.items()}
    assert set(got) == set(released_tensor_shapes())
    assert got == expected_draft_tensor_shapes(cfg)  # same shape formulas as the full-size file
    assert all(t.dtype == torch.float32 for t in tensors.values())


def test_reduced_target_is_a_complete_qwen3_checkpoint(released_pair):
    """transformers' own Qwen3ForCausalLM uses every tensor and misses none (SGLang would not complain)."""
    transformers = import_transformers()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(released_pair.target_dir, output_loading_info=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert not any(info.values()), info
    tensors = load_file(str(released_pair.target_dir / "model.safetensors"))
    assert torch.equal(tensors["model.layers.0.self_attn.q_norm.weight"], torch.ones(32))


def test_qwen3_option_leaves_the_llama_target_alone():
    llama, qwen3 = TinyPairOptions(), TinyPairOptions(target_arch="qwen3")
    assert "target_arch" not in llama.stamp(0)["options"]  # pairs cached before the option stay valid
    assert qwen3.stamp(0)["options"]["target_arch"] == "qwen3"
    w_llama, w_qwen3 = target_weights(llama, 4096, [0], 0), target_weights(qwen3, 4096, [0], 0)
    assert set(w_qwen3) - set(w_llama) == {f"model.layers.{i}.self_attn.{n}.weight"
                                           for i in range(llama.num_layers) for n in ("q_norm", "k_norm")}
    assert all(torch.equal(w_llama[k], w_qwen3[k]) for k in w_llama)


# ------------------------------------------------------------------------------------------- loaders


def test_trainer_loader_uses_every_tensor(released_pair):
    model = load_draft(released_pair.draft_dir)  # strict: raises on missing or unexpected names
    tensors = load_file(str(released_pair.draft_dir / "model.safetensors"))
    state = model.state_dict()
    assert set(state) == set(tensors)
    assert all(torch.equal(state[k], tensors[k]) for k in tensors)
    assert model.gamma == 7 and model.arch.target_layer_ids == (1, 3, 5, 7, 9)


@pytest.mark.server
def test_sglang_serves_the_released_schema_losslessly(released_pair, launch):
    with launch(released_pair.target_dir) as server:
        reference = {"bs1": greedy_ids(server), "bs8": greedy_ids(server, concurrency=8)}
    with launch(released_pair.target_dir, dspark_args(released_pair.draft_dir)) as server:
        bs1 = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        bs8 = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        log = server.log_text()
    assert_same_ids([r["output_ids"] for r in bs1], reference["bs1"], "released schema bs1")
    assert_same_ids([r["output_ids"] for r in bs8], reference["bs8"], "released schema 8 concurrent")
    for result in bs1 + bs8:
        assert result["meta_info"]["spec_verify_ct"] > 0
        assert result["meta_info"]["spec_accept_length"] >= 1.0
    assert "sglang-dspark DSPARK worker active" in log
