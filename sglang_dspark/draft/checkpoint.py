"""DeepSpec-format DSpark draft checkpoints: ``config.json`` + ``model.safetensors`` (the layout of
DeepSpec's released DSpark checkpoints).

config.json = the target's config (same per-layer geometry) with ``architectures: ["Qwen3DSparkModel"]``,
``model_type: "qwen3"`` and the DSpark keys at top level: ``num_hidden_layers`` (draft depth),
``num_target_layers``, ``block_size``, ``mask_token_id``, ``target_layer_ids``, ``num_anchors``,
``tie_word_embeddings: false``, ``layer_types``, ``enable_confidence_head``, ``confidence_head_with_markov``,
``markov_rank``, ``markov_head_type``.

Tensor names carry no prefix (``fc.weight``, ``layers.{i}.self_attn.q_proj.weight``, ``markov_head.markov_w1.weight``,
``confidence_head.proj.weight``...). ``embed_tokens.weight`` / ``lm_head.weight`` are copies of the target's; SGLang's
``DSparkDraftMixin.load_weights`` skips both and attaches the target's modules instead, so ``include_shared=False``
ships a much smaller file that SGLang serves identically (other consumers, e.g. DeepSpec's own eval, want them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from sglang_dspark.draft.model import DSparkDraft

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")

# Keys of a target config that describe the target only and would mislead a reader of the draft config.
_TARGET_ONLY_KEYS = ("auto_map", "quantization_config", "num_nextn_predict_layers", "sliding_window",
                     "use_sliding_window", "max_window_layers")


def build_draft_config(
    target_cfg: dict,
    *,
    num_draft_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: Sequence[int],
    markov_rank: int,
    markov_head_type: str = "vanilla",
    confidence_head: bool = True,
    confidence_head_with_markov: bool = True,
    num_anchors: int = 512,
    dtype: Optional[str] = None,
) -> dict:
    """DeepSpec's ``build_draft_config``: deep copy of the target config + top-level DSpark keys."""
    cfg = json.loads(json.dumps(target_cfg))
    for k in _TARGET_ONLY_KEYS:
        cfg.pop(k, None)
    d, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    cfg.setdefault("num_key_value_heads", nh)
    if not cfg.get("head_dim"):
        cfg["head_dim"] = d // nh
    if not 0 <= int(mask_token_id) < int(cfg["vocab_size"]):
        raise ValueError(f"mask_token_id {mask_token_id} must index a target embedding row (< {cfg['vocab_size']})")
    # Both rope spellings, as the target may carry only one: transformers v5 reads rope_parameters.
    params = dict(cfg.get("rope_parameters") or {})
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if not params:
        params = dict(scaling) if scaling else {"rope_type": "default"}
        params["rope_theta"] = theta
    cfg["rope_parameters"] = params
    cfg["rope_theta"] = theta
    cfg.update(
        {
            "architectures": ["Qwen3DSparkModel"],
            "model_type": "qwen3",
            "num_hidden_layers": int(num_draft_layers),
            "num_target_layers": int(target_cfg["num_hidden_layers"]),
            "block_size": int(block_size),
            "mask_token_id": int(mask_token_id),
            "target_layer_ids": [int(i) for i in target_layer_ids],
            "num_anchors": int(num_anchors),
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * int(num_draft_layers),
            "enable_confidence_head": bool(confidence_head),
            "markov_rank": int(markov_rank),
            "attention_bias": bool(cfg.get("attention_bias", False)),
        }
    )
    if confidence_head:
        cfg["confidence_head_with_markov"] = bool(confidence_head_with_markov)
    else:
        cfg.pop("confidence_head_with_markov", None)
    if markov_rank > 0:
        cfg["markov_head_type"] = markov_head_type
    if dtype is not None:
        cfg["dtype"] = cfg["torch_dtype"] = dtype
    return cfg


def draft_state_dict(
    model: DSparkDraft, *, include_shared: bool = True, dtype: Optional[torch.dtype] = None
) -> Dict[str, torch.Tensor]:
    sd = {}
    for k, v in model.state_dict().items():
        if not include_shared and k.startswith(("embed_tokens.", "lm_head.")):
            continue
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            # The confidence head stays fp32 on the server (its proj is built in fp32); keep it exact here too.
            v = v if k.startswith("confidence_head.") else v.to(dtype)
        sd[k] = v.contiguous().clone()
    return sd


def save_draft(
    model: DSparkDraft,
    out_dir: Path,
    *,
    include_shared: bool = True,
    dtype: Optional[torch.dtype] = None,
    tokenizer_dir: Optional[Path] = None,
    extra_files: Optional[Dict[str, str]] = None,
) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files copied from ``tokenizer_dir``) atomically."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp-export")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cfg = dict(model.config)
    if dtype is not None:
        cfg["dtype"] = cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    sd = draft_state_dict(model, include_shared=include_shared, dtype=dtype)
    save_file({k: sd[k] for k in sorted(sd)}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(tmp / "model.safetensors", 0o644)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text, encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def load_draft(
    draft_dir: Path,
    *,
    shared: Optional[Dict[str, torch.Tensor]] = None,
    dtype: torch.dtype = torch.float32,
) -> DSparkDraft:
    """Load a DeepSpec-format draft into the training model. ``shared`` supplies embed/lm_head when the checkpoint
    omits them (pass the target's, e.g. ``FeatureCache.shared_weights()``)."""
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    cfg = json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))
    model = DSparkDraft(cfg)
    sd = {}
    for f in sorted(draft_dir.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    for k in ("embed_tokens.weight", "lm_head.weight"):
        if k not in sd:
            if shared is None or k not in shared:
                raise ValueError(f"{draft_dir} has no {k}; pass the target's shared weights")
            sd[k] = shared[k]
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint/model mismatch: missing {missing}, unexpected {unexpected}")
    model.to(dtype)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


def expected_tensor_names(cfg: dict, *, include_shared: bool = True) -> set:
    """DeepSpec's Qwen3DSparkModel state-dict names for ``cfg`` (vanilla Markov head), written out by hand."""
    names = {"fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
             "markov_head.markov_w2.weight"}
    if include_shared:
        names |= {"embed_tokens.weight", "lm_head.weight"}
    bias = bool(cfg.get("attention_bias", False))
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names.add(p + f"self_attn.{proj}.weight")
            if bias:
                names.add(p + f"self_attn.{proj}.bias")
        names |= {p + f"mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")}
    if cfg.get("enable_confidence_head"):
        names |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    return names
