"""A tiny, fully offline target/draft pair for tests: a Llama (or Qwen3) target and a DSpark draft in DeepSpec's format.

``build_tiny_pair(out_dir)`` writes, in a couple of seconds on two CPU cores and without any network access:

* ``out_dir/target``: a byte-level BPE tokenizer trained on the running interpreter's stdlib sources, and a
  random float32 ``LlamaForCausalLM`` (hidden 128, 4 layers, GQA 4/2 heads, head_dim 32), or with
  ``target_arch="qwen3"`` a ``Qwen3ForCausalLM`` (same weights plus unit per-head ``q_norm``/``k_norm``);
* ``out_dir/draft``: a ``Qwen3DSparkModel`` checkpoint laid out exactly as DeepSpec saves one (top-level
  DSpark config keys, un-prefixed tensor names, copies of the target's embedding and lm_head), plus the
  tokenizer files.

Everything is a pure function of ``seed`` and the build options (and of the interpreter's stdlib files, which
feed the tokenizer): same inputs, same bytes. The builder needs torch, tokenizers and safetensors only;
transformers and SGLang are used by the tests that check the result, not here.

Initialisation choices (why the numbers below are what they are):

* A random Llama with the usual tiny init (std 0.02) collapses to one repeated token under greedy decoding.
  Here the embedding has unit std and every projection is fan-in scaled, so greedy continuations wander over
  hundreds of tokens. The attention output projection is damped (gain 0.15): the next token then depends
  mostly on the current token and partly on the context: in greedy runs the next token often equals the
  one-token-context prediction (docs/testing.md), which a bigram-style draft (below) can exploit, while
  outputs still vary. The logit scale (std 6 per unit-RMS hidden) keeps
  the top-1/top-2 gap away from zero (fp32 greedy identity across kernels needs no near-ties).
* Special tokens and the padded vocabulary rows get zero lm_head rows: their logit is exactly 0 while the
  best logit is far above, so the model never emits EOS, the mask token or an id the tokenizer cannot decode
  (runs always reach ``max_new_tokens``).
* The draft backbone is random, but its Markov head is set up as a "bigram" predictor of the target
  (``draft_init="bigram"``): ``markov_w2 @ markov_w1[t]`` peaks at the token the target predicts after ``t``
  when ``t`` is alone, and the draft's final norm is small so that this bias dominates the random base
  logits. The draft then gets a real, partial acceptance rate instead of ~0. ``draft_init="random"`` gives a
  plain random head.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

# Bump when the produced bytes change, so cached pairs built by an older version get rebuilt.
BUILDER_VERSION = 2

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# SGLang's DFLASH default mask token string is "<|MASK|>"; using the same spelling keeps both lookups happy.
MASK_TOKEN = "<|MASK|>"
TRAINED_SPECIAL_TOKENS = (EOS_TOKEN, BOS_TOKEN, PAD_TOKEN, IM_START, IM_END)

# ChatML, like Qwen: no system prompt injected, no BOS, `content` must be a string.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyPairOptions:
    """Everything that decides the produced bytes (besides the seed and the stdlib files)."""

    # tokenizer
    tokenizer_vocab: int = 4000  # BPE vocab incl. the 5 trained special tokens; the mask token comes after
    corpus_files: int = 120  # stdlib *.py files, first N in sorted order
    corpus_chars_per_file: int = 40_000
    vocab_multiple: int = 128  # config vocab_size = tokenizer size rounded up to this
    # target (Llama, or Qwen3: Llama plus per-head q/k RMSNorm)
    target_arch: str = "llama"  # or "qwen3"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    embed_std: float = 1.0
    attn_out_gain: float = 0.15  # o_proj std multiplier (see module docstring)
    mlp_out_gain: float = 1.0  # down_proj std multiplier
    logit_std: float = 6.0  # std of a target logit for a unit-RMS final hidden state
    # draft (DSpark)
    num_draft_layers: int = 2
    block_size: int = 7
    target_layer_ids: Sequence[int] = (0, 1, 2)
    markov_rank: int = 32
    markov_head_type: str = "vanilla"
    confidence_head: bool = True
    confidence_head_with_markov: bool = True
    draft_init: str = "bigram"  # or "random"
    markov_bias_scale: float = 20.0  # logit height of the bigram peak in the Markov bias
    draft_norm_scale: float = 0.1  # draft final-norm weight (bigram init only): keeps base logits small

    def stamp(self, seed: int) -> dict:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        if self.target_arch == "llama":
            del d["target_arch"]  # keeps the stamps of pairs built before the option existed valid
        return {"builder_version": BUILDER_VERSION, "seed": int(seed), "options": d}


@dataclass(frozen=True)
class TinyPair:
    target_dir: Path
    draft_dir: Path
    mask_token_id: int = field(default=-1)
    vocab_size: int = field(default=-1)


# --------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(opts: TinyPairOptions):
    """Byte-level BPE; specials 0..4, ordinary tokens next, then the mask token (first id past real tokens)."""
    from tokenizers import Tokenizer

    key = (opts.tokenizer_vocab, opts.corpus_files, opts.corpus_chars_per_file, sysconfig.get_paths()["stdlib"])
    return Tokenizer.from_str(_trained_tokenizer_json(*key))


@functools.lru_cache(maxsize=4)
def _trained_tokenizer_json(vocab: int, n_files: int, chars: int, stdlib: str) -> str:
    # Training is most of a build's time; the result is a pure function of the key, so a process that
    # builds several pairs (tests) trains once.
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(p for p in Path(stdlib).glob("*.py") if p.is_file())[:n_files]
    if not files:
        raise RuntimeError(f"no stdlib sources found under {stdlib} to train the tiny tokenizer on")
    corpus = [f.read_text(encoding="utf-8", errors="replace")[:chars] for f in files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=list(TRAINED_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(MASK_TOKEN, special=True, normalized=False)])
    return tok.to_str()


def _tokenizer_config(ids: Dict[str, int], model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in (*TRAINED_SPECIAL_TOKENS, MASK_TOKEN)
        },
    }


def _write_tokenizer(tok, out: Path, ids: Dict[str, int], opts: TinyPairOptions) -> None:
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", _tokenizer_config(ids, opts.max_position_embeddings))
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "mask_token": MASK_TOKEN},
    )


# --------------------------------------------------------------------------------------------- configs


def target_config(opts: TinyPairOptions, vocab_size: int, ids: Dict[str, int]) -> dict:
    if opts.target_arch == "qwen3":
        return qwen3_target_config(opts, vocab_size, ids)
    if opts.target_arch != "llama":
        raise ValueError(f"target_arch must be 'llama' or 'qwen3', got {opts.target_arch!r}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": opts.hidden_size,
        "intermediate_size": opts.intermediate_size,
        "num_hidden_layers": opts.num_layers,
        "num_attention_heads": opts.num_heads,
        "num_key_value_heads": opts.num_kv_heads,
        "head_dim": opts.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": opts.max_position_embeddings,
        "rms_norm_eps": opts.rms_norm_eps,
        # both spellings: transformers v5 reads rope_parameters, v4-era readers read rope_theta
        "rope_theta": opts.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": opts.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": ids[BOS_TOKEN],
        "eos_token_id": ids[EOS_TOKEN],
        "pad_token_id": ids[PAD_TOKEN],
        # fp32 on purpose: exact greedy identity with/without speculation on CPU. Note SGLang's
        # `--dtype auto` turns a float32 config into float16, so servers must pass `--dtype float32`.
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def qwen3_target_config(opts: TinyPairOptions, vocab_size: int, ids: Dict[str, int]) -> dict:
    """Exactly the key set of Qwen/Qwen3-8B's config.json, which DeepSpec deep-copies into its released drafts."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids[BOS_TOKEN],
        "eos_token_id": ids[EOS_TOKEN],
        "head_dim": opts.head_dim,
        "hidden_act": "silu",
        "hidden_size": opts.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": opts.intermediate_size,
        "max_position_embeddings": opts.max_position_embeddings,
        "max_window_layers": opts.num_layers,
        "model_type": "qwen3",
        "num_attention_heads": opts.num_heads,
        "num_hidden_layers": opts.num_layers,
        "num_key_value_heads": opts.num_kv_heads,
        "rms_norm_eps": opts.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": opts.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        # fp32 on purpose, as for the Llama target; servers must still pass `--dtype float32`.
        "torch_dtype": "float32",
        "transformers_version": "4.51.0",  # Qwen3-8B's; only informative
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def draft_config(opts: TinyPairOptions, target_cfg: dict, mask_token_id: int) -> dict:
    """DeepSpec's build_draft_config: the target config deep-copied plus top-level DSpark keys."""
    cfg = json.loads(json.dumps(target_cfg))
    cfg.update(
        {
            "architectures": ["Qwen3DSparkModel"],
            "model_type": "qwen3",
            "num_hidden_layers": opts.num_draft_layers,
            "num_target_layers": opts.num_layers,
            "block_size": opts.block_size,
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(opts.target_layer_ids),
            "num_anchors": 512,
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * opts.num_draft_layers,
            "enable_confidence_head": bool(opts.confidence_head),
            "markov_rank": opts.markov_rank,
        }
    )
    if opts.confidence_head:
        cfg["confidence_head_with_markov"] = bool(opts.confidence_head_with_markov)
    if opts.markov_rank > 0:
        cfg["markov_head_type"] = opts.markov_head_type
    return cfg


def generation_config(ids: Dict[str, int]) -> dict:
    # No sampling defaults here: SGLang would adopt them as the server's default sampling params.
    return {
        "_from_model_config": True,
        "bos_token_id": ids[BOS_TOKEN],
        "eos_token_id": [ids[EOS_TOKEN], ids[IM_END]],
        "pad_token_id": ids[PAD_TOKEN],
    }


# --------------------------------------------------------------------------------------------- weights


def _normal(g: torch.Generator, shape, std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32) * std


def target_weights(opts: TinyPairOptions, vocab_size: int, silent_ids: Sequence[int], seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, hd, nh, nkv, f = opts.hidden_size, opts.head_dim, opts.num_heads, opts.num_kv_heads, opts.intermediate_size
    w: Dict[str, torch.Tensor] = {"model.embed_tokens.weight": _normal(g, (vocab_size, d), opts.embed_std)}
    for i in range(opts.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(d)
        w[p + "post_attention_layernorm.weight"] = torch.ones(d)
        w[p + "self_attn.q_proj.weight"] = _normal(g, (nh * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = _normal(g, (nkv * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = _normal(g, (nkv * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.o_proj.weight"] = _normal(g, (d, nh * hd), opts.attn_out_gain / math.sqrt(nh * hd))
        if opts.target_arch == "qwen3":
            # Unit weights draw nothing from `g`, so the other tensors equal the Llama target's.
            w[p + "self_attn.q_norm.weight"] = torch.ones(hd)
            w[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        w[p + "mlp.gate_proj.weight"] = _normal(g, (f, d), 1 / math.sqrt(d))
        w[p + "mlp.up_proj.weight"] = _normal(g, (f, d), 1 / math.sqrt(d))
        w[p + "mlp.down_proj.weight"] = _normal(g, (d, f), opts.mlp_out_gain / math.sqrt(f))
    w["model.norm.weight"] = torch.ones(d)
    lm_head = _normal(g, (vocab_size, d), opts.logit_std / math.sqrt(d))
    lm_head[list(silent_ids)] = 0.0  # never emitted: see module docstring
    w["lm_head.weight"] = lm_head
    return w


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def single_token_next(opts: TinyPairOptions, w: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Greedy next token of the target for every one-token prompt (position 0), all vocab rows at once.

    With one token, attention returns that token's own value vector and RoPE at position 0 is the identity,
    so each layer reduces to matmuls; this avoids needing transformers in the builder.
    """
    eps = opts.rms_norm_eps
    group = opts.num_heads // opts.num_kv_heads
    h = w["model.embed_tokens.weight"].clone()
    for i in range(opts.num_layers):
        p = f"model.layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(-1, opts.num_kv_heads, opts.head_dim)
        attn = v.repeat_interleave(group, dim=1).reshape(h.shape[0], -1)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        act = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        h = h + act @ w[p + "mlp.down_proj.weight"].T
    logits = _rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return logits.argmax(-1)


def draft_weights(
    opts: TinyPairOptions,
    target_w: Dict[str, torch.Tensor],
    vocab_size: int,
    silent_ids: Sequence[int],
    seed: int,
) -> Dict[str, torch.Tensor]:
    # A separate stream from the target's, so draft options never change the target's bytes.
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    d, hd, nh, nkv, f = opts.hidden_size, opts.head_dim, opts.num_heads, opts.num_kv_heads, opts.intermediate_size
    n_ctx = len(opts.target_layer_ids)
    bigram = opts.draft_init == "bigram"
    if opts.draft_init not in ("bigram", "random"):
        raise ValueError(f"draft_init must be 'bigram' or 'random', got {opts.draft_init!r}")
    w: Dict[str, torch.Tensor] = {
        "embed_tokens.weight": target_w["model.embed_tokens.weight"].clone(),
        "lm_head.weight": target_w["lm_head.weight"].clone(),
        "fc.weight": _normal(g, (d, n_ctx * d), 1 / math.sqrt(n_ctx * d)),
        "hidden_norm.weight": torch.ones(d),
        "norm.weight": torch.full((d,), opts.draft_norm_scale if bigram else 1.0),
    }
    for i in range(opts.num_draft_layers):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(d)
        w[p + "post_attention_layernorm.weight"] = torch.ones(d)
        w[p + "self_attn.q_proj.weight"] = _normal(g, (nh * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = _normal(g, (nkv * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = _normal(g, (nkv * hd, d), 1 / math.sqrt(d))
        w[p + "self_attn.o_proj.weight"] = _normal(g, (d, nh * hd), 1 / math.sqrt(nh * hd))
        w[p + "self_attn.q_norm.weight"] = torch.ones(hd)
        w[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        w[p + "mlp.gate_proj.weight"] = _normal(g, (f, d), 1 / math.sqrt(d))
        w[p + "mlp.up_proj.weight"] = _normal(g, (f, d), 1 / math.sqrt(d))
        w[p + "mlp.down_proj.weight"] = _normal(g, (d, f), 1 / math.sqrt(f))
    r = opts.markov_rank
    if r > 0:
        if opts.markov_head_type != "vanilla":
            raise ValueError("only markov_head_type='vanilla' is built by the tiny pair")
        if bigram:
            # Low-rank transition matrix whose row t peaks at the target's next token after t:
            # w2 rows are unit codes u_v, w1[t] = scale * u_{next(t)}, so bias[v] = scale * <u_v, u_next(t)>.
            codes = _normal(g, (vocab_size, r), 1.0)
            codes = codes / codes.norm(dim=-1, keepdim=True)
            nxt = single_token_next(opts, target_w)
            w1 = codes[nxt] * math.sqrt(opts.markov_bias_scale)
            w2 = codes * math.sqrt(opts.markov_bias_scale)
        else:
            w1 = _normal(g, (vocab_size, r), 1.0)
            w2 = _normal(g, (vocab_size, r), 1 / math.sqrt(r))
        w2[list(silent_ids)] = 0.0
        w["markov_head.markov_w1.weight"] = w1.contiguous()
        w["markov_head.markov_w2.weight"] = w2.contiguous()
    if opts.confidence_head:
        in_dim = d + (r if opts.confidence_head_with_markov else 0)
        w["confidence_head.proj.weight"] = _normal(g, (1, in_dim), 0.05 / math.sqrt(in_dim))
        w["confidence_head.proj.bias"] = torch.tensor([0.5])  # sigmoid(0.5) ~ 0.62, a mid confidence
    return w


# --------------------------------------------------------------------------------------------- writing


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save_safetensors(tensors: Dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)  # safetensors creates 0600; servers in containers may run as another user


def expected_draft_tensor_shapes(draft_cfg: dict) -> Dict[str, tuple]:
    """Tensor name -> shape of a DeepSpec Qwen3 DSpark checkpoint for ``draft_cfg`` (vanilla Markov head)."""
    d = int(draft_cfg["hidden_size"])
    v = int(draft_cfg["vocab_size"])
    hd = int(draft_cfg.get("head_dim") or d // int(draft_cfg["num_attention_heads"]))
    nh = int(draft_cfg["num_attention_heads"])
    nkv = int(draft_cfg.get("num_key_value_heads", nh))
    f = int(draft_cfg["intermediate_size"])
    n_ctx = len(draft_cfg["target_layer_ids"])
    r = int(draft_cfg.get("markov_rank", 0))
    shapes = {
        "embed_tokens.weight": (v, d),
        "lm_head.weight": (v, d),
        "fc.weight": (d, n_ctx * d),
        "hidden_norm.weight": (d,),
        "norm.weight": (d,),
    }
    for i in range(int(draft_cfg["num_hidden_layers"])):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (nh * hd, d),
                p + "self_attn.k_proj.weight": (nkv * hd, d),
                p + "self_attn.v_proj.weight": (nkv * hd, d),
                p + "self_attn.o_proj.weight": (d, nh * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (f, d),
                p + "mlp.up_proj.weight": (f, d),
                p + "mlp.down_proj.weight": (d, f),
            }
        )
    if r > 0:
        shapes["markov_head.markov_w1.weight"] = (v, r)
        shapes["markov_head.markov_w2.weight"] = (v, r)
    if draft_cfg.get("enable_confidence_head"):
        with_markov = bool(draft_cfg.get("confidence_head_with_markov", r > 0))
        shapes["confidence_head.proj.weight"] = (1, d + (r if with_markov else 0))
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


def _build_into(tmp: Path, opts: TinyPairOptions, seed: int) -> TinyPair:
    tok = train_tokenizer(opts)
    ids = {t: tok.token_to_id(t) for t in (*TRAINED_SPECIAL_TOKENS, MASK_TOKEN)}
    n_tok = tok.get_vocab_size()  # incl. added tokens
    vocab_size = -(-n_tok // opts.vocab_multiple) * opts.vocab_multiple
    mask_id = ids[MASK_TOKEN]
    if not mask_id < vocab_size:
        raise AssertionError("mask token must index a target embedding row")
    layer_ids = list(opts.target_layer_ids)
    # SGLang captures layer l's output at the input of layer l+1 and rejects -1, so the ids must be
    # strictly increasing within [0, num_layers - 2] (DeepSpec's eval also refuses the last layer).
    if not layer_ids or layer_ids != sorted(set(layer_ids)) or layer_ids[0] < 0 or layer_ids[-1] > opts.num_layers - 2:
        raise ValueError(f"target_layer_ids {layer_ids} must be increasing ids in [0, {opts.num_layers - 2}]")
    # Ids that must never be generated: every special token and every padded row past the tokenizer.
    silent = sorted(set(ids.values()) | set(range(n_tok, vocab_size)))

    tgt_dir, drf_dir = tmp / "target", tmp / "draft"
    tgt_dir.mkdir()
    drf_dir.mkdir()

    tcfg = target_config(opts, vocab_size, ids)
    tw = target_weights(opts, vocab_size, silent, seed)
    _write_json(tgt_dir / "config.json", tcfg)
    _write_json(tgt_dir / "generation_config.json", generation_config(ids))
    _save_safetensors(tw, tgt_dir / "model.safetensors")
    _write_tokenizer(tok, tgt_dir, ids, opts)

    dcfg = draft_config(opts, tcfg, mask_id)
    dw = draft_weights(opts, tw, vocab_size, silent, seed)
    expected = expected_draft_tensor_shapes(dcfg)
    got = {k: tuple(t.shape) for k, t in dw.items()}
    if got != expected:
        raise AssertionError(f"draft tensors disagree with its config: {sorted(set(got) ^ set(expected))}")
    _write_json(drf_dir / "config.json", dcfg)
    _save_safetensors(dw, drf_dir / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tgt_dir / name, drf_dir / name)
    return TinyPair(target_dir=tgt_dir, draft_dir=drf_dir, mask_token_id=mask_id, vocab_size=vocab_size)


STAMP_NAME = "tiny_pair.json"


def build_tiny_pair(
    out_dir: Path,
    seed: int = 0,
    force: bool = False,
    *,
    confidence_head: bool = True,
    markov_rank: int = 32,
    **overrides,
) -> TinyPair:
    """Build (or reuse) ``out_dir/target`` and ``out_dir/draft``.

    An existing pair is reused when its stamp records the same seed, options and builder version, unless
    ``force``. ``overrides`` are other ``TinyPairOptions`` fields (e.g. ``num_draft_layers=1``,
    ``draft_init="random"``).
    """
    opts = TinyPairOptions(confidence_head=confidence_head, markov_rank=markov_rank, **overrides)
    out_dir = Path(out_dir)
    stamp = opts.stamp(seed)
    stamp_path = out_dir / STAMP_NAME
    if not force and stamp_path.is_file():
        try:
            old = json.loads(stamp_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if old is not None and old.get("build") == stamp:
            return TinyPair(
                target_dir=out_dir / "target",
                draft_dir=out_dir / "draft",
                mask_token_id=int(old["mask_token_id"]),
                vocab_size=int(old["vocab_size"]),
            )

    out_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the destination and swap in, so a reader never sees half a pair.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-pair-", dir=out_dir))
    try:
        built = _build_into(tmp, opts, seed)
        if stamp_path.exists():
            stamp_path.unlink()
        for sub in ("target", "draft"):
            dest = out_dir / sub
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp / sub, dest)
        _write_json(
            stamp_path,
            {"build": stamp, "mask_token_id": built.mask_token_id, "vocab_size": built.vocab_size},
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return TinyPair(
        target_dir=out_dir / "target",
        draft_dir=out_dir / "draft",
        mask_token_id=built.mask_token_id,
        vocab_size=built.vocab_size,
    )


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_dspark.testing.tiny_pair", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-confidence-head", action="store_true")
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--draft-init", choices=("bigram", "random"), default="bigram")
    args = ap.parse_args(argv)
    pair = build_tiny_pair(
        args.out_dir,
        seed=args.seed,
        force=args.force,
        confidence_head=not args.no_confidence_head,
        markov_rank=args.markov_rank,
        num_draft_layers=args.draft_layers,
        draft_init=args.draft_init,
    )
    print(pair.target_dir)
    print(pair.draft_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
