"""The tiny offline target/draft pair: determinism, DeepSpec checkpoint layout, tokenizer, output variety,
and acceptance by SGLang 0.5.23's own DSpark config parser and ``Qwen3DSparkModel`` loader."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_dspark.cpu.startup import import_transformers
from sglang_dspark.testing.tiny_pair import (
    MASK_TOKEN,
    TinyPairOptions,
    build_tiny_pair,
    single_token_next,
)

import safetensors.torch as safetensors_torch
REPO_ROOT = Path(__file__).resolve().parents[3]

PROMPTS = [
    "def main():",
    "import os\n",
    "class Foo(object):",
    "The quick brown fox",
    "for i in range(10):",
    "return x + y",
]
NEW_TOKENS = 48


def _digests(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _load(d: Path) -> dict:
    return safetensors_torch.load_file(str(d / "model.safetensors"))


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("tiny") / "pair", seed=0)


@pytest.fixture(scope="module")
def pair_noconf(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("tiny") / "noconf", seed=0, confidence_head=False, markov_rank=16)


@pytest.fixture(scope="module")
def transformers():
    tf = import_transformers()
    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


# ------------------------------------------------------------------------------------------- determinism


def test_cli_in_a_fresh_process_gives_the_same_bytes(pair, tmp_path):
    """Same seed, separate interpreter (so the tokenizer is trained afresh): byte-identical pair."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "sglang_dspark.testing.tiny_pair", str(tmp_path / "cli"), "--seed", "0"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=True,
    ).stdout.split()
    assert out == [str(tmp_path / "cli" / "target"), str(tmp_path / "cli" / "draft")]
    for sub, built in (("target", pair.target_dir), ("draft", pair.draft_dir)):
        assert _digests(tmp_path / "cli" / sub) == _digests(built), sub


def test_other_seed_other_weights_same_tokenizer(pair, tmp_path):
    other = build_tiny_pair(tmp_path / "other", seed=1)
    assert _digests(other.target_dir)["model.safetensors"] != _digests(pair.target_dir)["model.safetensors"]
    assert _digests(other.draft_dir)["model.safetensors"] != _digests(pair.draft_dir)["model.safetensors"]
    # The tokenizer depends on the corpus only, not on the seed.
    assert _digests(other.target_dir)["tokenizer.json"] == _digests(pair.target_dir)["tokenizer.json"]
    assert other.mask_token_id == pair.mask_token_id


def test_reuse_and_force(tmp_path):
    first = build_tiny_pair(tmp_path / "p", seed=3)
    weights = first.target_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    reused = build_tiny_pair(tmp_path / "p", seed=3)
    assert reused == first and weights.stat().st_mtime_ns == mtime
    rebuilt = build_tiny_pair(tmp_path / "p", seed=3, force=True)
    assert rebuilt == first and weights.stat().st_mtime_ns != mtime
    # Different options in the same folder rebuild instead of reusing stale files.
    changed = build_tiny_pair(tmp_path / "p", seed=3, confidence_head=False)
    assert _config(changed.draft_dir)["enable_confidence_head"] is False
    assert not [p for p in (tmp_path / "p").iterdir() if p.name.startswith(".tiny-pair-")]


# ------------------------------------------------------------------------------------------- layout


def _expected_draft_shapes(cfg: dict) -> dict:
    """Written out from DeepSpec's Qwen3DSparkModel state dict (not from the builder)."""
    d, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    nh, nkv, f = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    r = cfg["markov_rank"]
    shapes = {
        "embed_tokens.weight": (v, d),
        "lm_head.weight": (v, d),
        "fc.weight": (d, len(cfg["target_layer_ids"]) * d),
        "hidden_norm.weight": (d,),
        "norm.weight": (d,),
        "markov_head.markov_w1.weight": (v, r),
        "markov_head.markov_w2.weight": (v, r),
    }
    for i in range(cfg["num_hidden_layers"]):
        shapes.update({
            f"layers.{i}.input_layernorm.weight": (d,),
            f"layers.{i}.post_attention_layernorm.weight": (d,),
            f"layers.{i}.self_attn.q_proj.weight": (nh * hd, d),
            f"layers.{i}.self_attn.k_proj.weight": (nkv * hd, d),
            f"layers.{i}.self_attn.v_proj.weight": (nkv * hd, d),
            f"layers.{i}.self_attn.o_proj.weight": (d, nh * hd),
            f"layers.{i}.self_attn.q_norm.weight": (hd,),
            f"layers.{i}.self_attn.k_norm.weight": (hd,),
            f"layers.{i}.mlp.gate_proj.weight": (f, d),
            f"layers.{i}.mlp.up_proj.weight": (f, d),
            f"layers.{i}.mlp.down_proj.weight": (d, f),
        })
    if cfg["enable_confidence_head"]:
        shapes["confidence_head.proj.weight"] = (1, d + (r if cfg["confidence_head_with_markov"] else 0))
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


@pytest.mark.parametrize("which", ["pair", "pair_noconf"])
def test_draft_checkpoint_layout(which, request):
    p = request.getfixturevalue(which)
    tcfg, dcfg = _config(p.target_dir), _config(p.draft_dir)
    assert tcfg["architectures"] == ["LlamaForCausalLM"] and tcfg["model_type"] == "llama"
    assert tcfg["dtype"] == tcfg["torch_dtype"] == dcfg["dtype"] == "float32"
    assert dcfg["architectures"] == ["Qwen3DSparkModel"] and dcfg["model_type"] == "qwen3"
    # DeepSpec deep-copies the target config: same per-layer geometry.
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "rms_norm_eps", "rope_parameters", "max_position_embeddings", "hidden_act"):
        assert dcfg[key] == tcfg[key], key
    assert dcfg["num_target_layers"] == tcfg["num_hidden_layers"]
    assert dcfg["block_size"] == 7 and dcfg["tie_word_embeddings"] is False
    assert dcfg["layer_types"] == ["full_attention"] * dcfg["num_hidden_layers"]
    ids = dcfg["target_layer_ids"]
    # SGLang captures the output of layer l before layer l+1: the last layer can never be captured.
    assert ids == sorted(set(ids)) and 0 <= ids[0] and ids[-1] < tcfg["num_hidden_layers"] - 1
    assert 0 <= dcfg["mask_token_id"] < tcfg["vocab_size"] and dcfg["mask_token_id"] == p.mask_token_id
    assert dcfg["markov_head_type"] == "vanilla" and dcfg["markov_rank"] > 0
    if which == "pair":
        assert dcfg["enable_confidence_head"] is True and dcfg["confidence_head_with_markov"] is True
        assert dcfg["markov_rank"] == 32
    else:
        assert dcfg["enable_confidence_head"] is False and "confidence_head_with_markov" not in dcfg
        assert dcfg["markov_rank"] == 16

    tensors = _load(p.draft_dir)
    assert {k: tuple(t.shape) for k, t in tensors.items()} == _expected_draft_shapes(dcfg)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    target = _load(p.target_dir)
    assert torch.equal(tensors["embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(tensors["lm_head.weight"], target["lm_head.weight"])
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in target.values())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (p.draft_dir / name).read_bytes() == (p.target_dir / name).read_bytes()


def test_target_loads_in_transformers_with_expected_config(pair, transformers):
    cfg = transformers.AutoConfig.from_pretrained(pair.target_dir)
    assert type(cfg).__name__ == "LlamaConfig" and cfg.dtype == torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(pair.target_dir, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    dcfg = transformers.AutoConfig.from_pretrained(pair.draft_dir)
    assert type(dcfg).__name__ == "Qwen3Config" and dcfg.block_size == 7 and dcfg.num_hidden_layers == 2


# ------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_chat_template(pair, transformers):
    tok = transformers.AutoTokenizer.from_pretrained(pair.target_dir)
    assert 2000 <= len(tok) <= _config(pair.target_dir)["vocab_size"]
    for text in ["def f(x):\n    return x * 2  # ok\n", "Grüße, 世界 🙂 \t tabs", ""]:
        ids = tok(text, add_special_tokens=True).input_ids
        assert tok.decode(ids) == text
    assert tok.eos_token_id is not None and tok.bos_token_id is not None and tok.pad_token_id is not None
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == pair.mask_token_id
    assert tok.mask_token_id == pair.mask_token_id
    gen = json.loads((pair.target_dir / "generation_config.json").read_text())
    assert tok.eos_token_id in gen["eos_token_id"]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids and pair.mask_token_id not in ids


# ------------------------------------------------------------------------------------------- behaviour


@pytest.fixture
def one_thread():
    # Tiny matmuls: extra threads only contend for the shared cores (2 threads made this test 10x slower).
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_target_greedy_outputs_vary(pair, transformers, one_thread):
    tok = transformers.AutoTokenizer.from_pretrained(pair.target_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(pair.target_dir, dtype=torch.float32).eval()
    special = set(tok.all_special_ids) | {pair.mask_token_id}
    outs, gaps = [], []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            res = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
        new = res.sequences[0, ids.shape[1]:].tolist()
        assert len(new) == NEW_TOKENS  # never stops early: EOS has a zero lm_head row
        assert not special & set(new) and max(new) < len(tok)
        outs.append(new)
        for s in res.scores:
            top2 = s[0].topk(2).values
            gaps.append(float(top2[0] - top2[1]))
    assert len({tuple(o) for o in outs}) == len(outs)  # prompts lead to different continuations
    for o in outs:
        assert len(set(o)) >= NEW_TOKENS // 3  # not one token (or a short loop) repeated
        assert len(set(o[NEW_TOKENS // 2:])) >= 4  # still moving at the end
    assert len({t for o in outs for t in o}) >= 100
    # No near-ties: greedy identity across different fp32 kernels stays exact.
    assert min(gaps) > 1e-4


def test_bigram_markov_head_predicts_the_target(pair):
    """The draft's Markov bias alone drafts the target's one-token-context prediction (cheap usefulness)."""
    d, t = _load(pair.draft_dir), _load(pair.target_dir)
    nxt = single_token_next(TinyPairOptions(), t)
    bias = d["markov_head.markov_w1.weight"] @ d["markov_head.markov_w2.weight"].T
    real = torch.arange(pair.mask_token_id)
    hit = (bias[real].argmax(-1) == nxt[real]).float().mean().item()
    assert hit > 0.9


# ------------------------------------------------------------------------------------------- SGLang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sglang_parses_and_loads_the_drafts(pair, pair_noconf):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), SGLANG_USE_CPU_ENGINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_dspark.engine.offline.check_sglang_load", str(pair.draft_dir),
         str(pair_noconf.draft_dir), "--mode", "static", "--mode", "compact", "--port", str(_free_port())],
        capture_output=True, text=True, env=env, cwd=pair.draft_dir, timeout=240,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode != 2, f"SGLang's model code does not import: {proc.stderr[-2000:]}"
    assert lines, proc.stderr[-4000:]
    by = {(r["draft_dir"], r["kind"], r.get("mode")): r for r in lines}
    for p in (pair, pair_noconf):
        cfg = by[(str(p.draft_dir), "config", None)]
        dcfg = _config(p.draft_dir)
        assert cfg["hf_config_class"] == "Qwen3Config" and cfg["parsed_equal_raw"]
        assert cfg["parsed"]["gamma"] == 7 and cfg["parsed"]["markov_head_type"] == "vanilla"
        assert cfg["parsed"]["markov_rank"] == dcfg["markov_rank"]
        assert cfg["parsed"]["target_layer_ids"] == dcfg["target_layer_ids"]
        assert cfg["parsed"]["num_target_layers"] == 4 and cfg["parsed"]["num_hidden_layers"] == 2
        assert cfg["runtime"] == {"gamma": 7, "verify_num_draft_tokens": 8, "mask_token_id": p.mask_token_id}
        static = by[(str(p.draft_dir), "model", "static")]
        assert static["ok"], static
        assert static["gamma"] == 7 and static["num_context_features"] == 3 and static["sample_from_anchor"]
        assert not static["has_confidence_head"]  # upstream builds no head in static mode
    compact = by[(str(pair.draft_dir), "model", "compact")]
    assert compact["ok"] and compact["has_confidence_head"], compact
    assert compact["params"]["confidence_head.proj.weight"] == [1, 128 + 32]
    # Upstream 0.5.23 builds the head whenever the mode is not static, ignoring enable_confidence_head=false,
    # then refuses a checkpoint without head weights. Accept a future fix too.
    noconf = by[(str(pair_noconf.draft_dir), "model", "compact")]
    assert noconf["ok"] or "confidence" in noconf.get("load_error", ""), noconf
