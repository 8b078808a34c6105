"""Run one DSpark draft round with SGLang 0.5.23's own ``Qwen3DSparkModel`` code, on CPU, without a server.

    python -m sglang_dspark.engine.offline.check_sglang_forward DRAFT_DIR INPUTS.pt OUTPUTS.pt [--port N]

INPUTS.pt: ``{"target_hidden": [n, k*d] (committed tokens 0..n-1), "anchor_token": int, "anchor_pos": int (= n),
"forced_tokens": [gamma] long, "shared": {"embed_tokens.weight", "lm_head.weight"}}``.

What runs is SGLang's: ``load_weights``, ``write_target_hidden_kv`` (fc + hidden_norm + per-layer k_proj/k_norm/RoPE
+ v_proj, written into a KV pool), the draft layers (fused QKV, q/k norm, RoPE, MLP, norms) and
``compute_base_logits``, the Markov head's ``step_bias`` and the confidence head's ``predict``. Only two things are
stand-ins: the KV pool (a dict) and RadixAttention, replaced by plain attention of the block's queries over
[injected context K/V ; block K/V] without a mask, which is what SGLang's backends do for the draft's
ENCODER_ONLY layers in TARGET_VERIFY mode (prefix = committed tokens, non-causal). Greedy/forced tokens stand in for
the sampling kernel. OUTPUTS.pt gets the hidden states, base logits, corrected step logits and confidence logits,
to compare with ``DSparkDraft.draft_block``.

Exit status: 0 ran, 2 SGLang's model code cannot be imported/initialised here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn


class _Pool:
    def __init__(self):
        self.k, self.v = {}, {}

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        idx = loc.loc if hasattr(loc, "loc") else loc
        idx = getattr(loc, "ids", idx)
        self.k.setdefault(layer.layer_id, {})
        self.v.setdefault(layer.layer_id, {})
        for row, i in enumerate(torch.as_tensor(idx).tolist()):
            self.k[layer.layer_id][i] = k[row].clone()
            self.v[layer.layer_id][i] = v[row].clone()

    def context(self, layer_id):
        locs = sorted(self.k[layer_id])
        return (torch.stack([self.k[layer_id][i] for i in locs]), torch.stack([self.v[layer_id][i] for i in locs]))


class _Attn(nn.Module):
    """Non-causal attention over the injected context + the block (the ENCODER_ONLY draft semantics)."""

    def __init__(self, orig, pool):
        super().__init__()
        self.layer_id = orig.layer_id
        self.scaling = orig.scaling
        self.nh = orig.tp_q_head_num
        self.nkv = orig.tp_k_head_num
        self.hd = orig.head_dim
        self.k_scale = getattr(orig, "k_scale", None)
        self.v_scale = getattr(orig, "v_scale", None)
        self.pool = pool

    def forward(self, q, k, v, forward_batch=None, **kw):
        t = q.shape[0]
        ck, cv = self.pool.context(self.layer_id)
        kk = torch.cat([ck.reshape(-1, self.nkv, self.hd), k.reshape(t, self.nkv, self.hd)])
        vv = torch.cat([cv.reshape(-1, self.nkv, self.hd), v.reshape(t, self.nkv, self.hd)])
        rep = self.nh // self.nkv
        kk = kk.repeat_interleave(rep, 1).transpose(0, 1).float()
        vv = vv.repeat_interleave(rep, 1).transpose(0, 1).float()
        qq = q.reshape(t, self.nh, self.hd).transpose(0, 1).float()
        att = torch.softmax(qq @ kk.transpose(1, 2) * self.scaling, dim=-1)
        return (att @ vv).transpose(0, 1).reshape(t, self.nh * self.hd).to(q.dtype)


class _Head(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.org_vocab_size = weight.shape[0]
        self.quant_method = None
        self.tp_size = 1


def run(draft_dir: str, inputs: dict) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from sglang.srt.models.dspark import Qwen3DSparkModel

    cfg = AutoConfig.from_pretrained(draft_dir)
    model = Qwen3DSparkModel(cfg).float()
    ckpt = {}
    for f in sorted(os.listdir(draft_dir)):
        if f.endswith(".safetensors"):
            ckpt.update(load_file(os.path.join(draft_dir, f)))
    model.load_weights(iter(sorted((k, v.float()) for k, v in ckpt.items())))
    shared = inputs["shared"]
    emb = nn.Embedding.from_pretrained(shared["embed_tokens.weight"].float(), freeze=True)
    model.attach_shared_modules(embed_tokens=emb, lm_head=_Head(shared["lm_head.weight"].float()))

    pool = _Pool()
    th = inputs["target_hidden"].float()
    n = th.shape[0]
    with torch.no_grad():
        model.write_target_hidden_kv(target_hidden=th, pool=pool, positions=torch.arange(n),
                                     cache_loc=torch.arange(n))
        for layer in model.layers:
            layer.self_attn.attn = _Attn(layer.self_attn.attn, pool)
        gamma = int(model.gamma)
        anchor = int(inputs["anchor_token"])
        ids = torch.full((gamma,), int(cfg.mask_token_id), dtype=torch.long)
        ids[0] = anchor
        positions = int(inputs["anchor_pos"]) + torch.arange(gamma)
        out = model.forward(ids, positions, None, input_embeds=model.forward_embed(ids))
        hidden = out.hidden_states
        base, conf_feats = model.compute_base_logits(hidden)
        forced = inputs["forced_tokens"].long()
        prev = torch.tensor([anchor])
        steps = []
        for k in range(gamma):
            bias, _ = model.markov_head.step_bias(prev, hidden_states=hidden[k : k + 1], state=None)
            steps.append((base[k : k + 1].float() + bias.float())[0])
            prev = forced[k : k + 1]
        res = {"hidden": hidden.float(), "base_logits": base.float(), "logits": torch.stack(steps)}
        if model.confidence_head is not None:
            _, raw = model.compute_confidence(anchor_tokens=torch.tensor([anchor]), draft_tokens=forced.view(1, -1),
                                              confidence_features=conf_feats)
            res["confidence_logits"] = raw.float().view(-1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("draft_dir")
    ap.add_argument("inputs")
    ap.add_argument("outputs")
    ap.add_argument("--port", type=int, default=29655)
    args = ap.parse_args(argv)
    os.environ.setdefault("SGLANG_RAGGED_VERIFY_MODE", "compact")  # builds the confidence head
    torch.set_num_threads(1)
    from sglang_dspark.engine.offline.check_sglang_load import prepare_sglang_model_process

    error = prepare_sglang_model_process(args.port)
    if error:
        print(json.dumps({"environment_error": error}))
        return 2
    res = run(args.draft_dir, torch.load(args.inputs, weights_only=False))
    torch.save(res, args.outputs)
    print(json.dumps({"ok": True, "keys": sorted(res)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
