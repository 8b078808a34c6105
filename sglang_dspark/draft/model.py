"""A plain-torch DSpark draft that computes exactly what SGLang 0.5.23 serves from a DeepSpec checkpoint.

Serving conventions this module reproduces (read in SGLang 0.5.23's python/sglang/srt; checked numerically by
tests/test_training.py, which runs SGLang's own Qwen3DSparkModel code through ``check_sglang_forward``):

* Context: for every committed target token at position ``j`` the draft gets ``hidden_norm(fc(cat_l H_l[j]))``
  (models/dflash.py ``project_target_hidden``), where ``H_l`` is the output of target decoder layer ``l``
  (models/llama.py ``set_dflash_layers_to_capture`` captures the residual stream entering layer ``l+1``). Each
  draft layer turns it into K (``k_proj`` -> per-head ``k_norm`` -> RoPE at ``j``) and V (``v_proj``), with no
  input layernorm (models/dspark.py ``write_target_hidden_kv``). Injected rows are the target's verify rows
  ``[anchor, accepted drafts]`` at ``prefix_len + j`` (dspark_kv_inject.py ``inject_ragged``); the next anchor
  (bonus token) has not been through the target yet, so a block sees context positions ``< anchor_pos``.
* Block: ``[anchor, mask x (gamma-1)]`` at positions ``seq_len + k`` with ``seq_len`` = anchor position
  (dspark_draft.py ``_run_forward``), ENCODER_ONLY attention (non-causal) over cache + block; with
  ``sample_from_anchor`` (default true) slot ``k`` predicts the token at ``anchor_pos + k + 1``, no slot dropped.
* Output: ``h = norm(backbone)``; base logits ``lm_head(h)`` with the target's head (``compute_base_logits``);
  Markov bias ``markov_w2(markov_w1[prev])`` with ``prev`` = anchor for slot 0, else the token drafted at the slot
  before; confidence logit ``proj([h ; markov_w1[prev]])`` in fp32 (``DSparkConfidenceHead.predict``).

``training_forward`` runs many anchors of one packed row of sequences at once (a boolean block-sparse mask and
``scaled_dot_product_attention``); ``draft_block`` runs one inference round the way the server does (context K/V
"injected" once, then an unmasked attention of the block over cache + block). Tests check they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED_MARKOV_HEADS = ("vanilla",)


# --------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DraftArch:
    """The numbers the modules need, read from a DeepSpec-style draft config dict."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_linear_factor: float
    attention_bias: bool
    block_size: int
    mask_token_id: int
    target_layer_ids: Tuple[int, ...]
    markov_rank: int
    markov_head_type: str
    confidence_head: bool
    confidence_with_markov: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "DraftArch":
        d = int(cfg["hidden_size"])
        nh = int(cfg["num_attention_heads"])
        theta, linear = rope_params(cfg)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"only silu MLPs are supported, got hidden_act={cfg.get('hidden_act')!r}")
        r = int(cfg.get("markov_rank", 0))
        head_type = str(cfg.get("markov_head_type", "vanilla")).lower()
        if r <= 0:
            raise ValueError("a DSpark draft needs markov_rank > 0 (SGLang refuses markov_rank == 0)")
        if head_type not in SUPPORTED_MARKOV_HEADS:
            raise ValueError(f"markov_head_type={head_type!r} not supported by this trainer (only 'vanilla')")
        conf = bool(cfg.get("enable_confidence_head", False))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=d,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=nh,
            num_kv_heads=int(cfg.get("num_key_value_heads") or nh),
            head_dim=int(cfg.get("head_dim") or d // nh),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_linear_factor=linear,
            attention_bias=bool(cfg.get("attention_bias", False)),
            block_size=int(cfg["block_size"]),
            mask_token_id=int(cfg["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in cfg["target_layer_ids"]),
            markov_rank=r,
            markov_head_type=head_type,
            confidence_head=conf,
            confidence_with_markov=bool(cfg.get("confidence_head_with_markov", r > 0)) if conf else False,
        )


def rope_params(cfg: dict) -> Tuple[float, float]:
    """(theta, linear scaling factor) from either transformers v5 ``rope_parameters`` or v4 ``rope_scaling``.

    SGLang builds the draft's rotary embedding from the same keys (``get_rope_config``); anything beyond plain
    and linear RoPE is refused rather than silently trained with different positions.
    """
    params = cfg.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or params
    rope_type = str(scaling.get("rope_type", scaling.get("type", "default")) or "default")
    if rope_type == "default":
        return theta, 1.0
    if rope_type == "linear":
        return theta, float(scaling["factor"])
    raise ValueError(f"rope type {rope_type!r} is not supported by this trainer (default or linear only)")


# --------------------------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics like SGLang's RMSNorm, so bf16 training sees the serving numerics.
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class Rotary:
    """Neox-style (rotate-half) RoPE, the layout SGLang's draft attention uses (``is_neox_style`` default)."""

    def __init__(self, head_dim: int, theta: float, linear_factor: float = 1.0) -> None:
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.linear_factor = linear_factor

    def cos_sin(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # float64 angles: positions up to ~1e5 times inv_freq lose digits in fp32.
        ang = (positions.to(torch.float64) / self.linear_factor)[..., None] * self.inv_freq.to(positions.device)
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().float(), ang.sin().float()

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        rotated = torch.cat([-x2, x1], dim=-1)
        c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
        return x * c + rotated * s


class DraftAttention(nn.Module):
    """Queries from block tokens only; keys/values = [injected context ; block], same projections for both."""

    def __init__(self, a: DraftArch) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = a.num_heads, a.num_kv_heads, a.head_dim
        d = a.hidden_size
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=a.attention_bias)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=a.attention_bias)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=a.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=a.attention_bias)
        self.q_norm = RMSNorm(self.hd, a.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, a.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of rows ``x`` [T, d] -> [T, nkv, hd] each. Used for context and block alike."""
        t = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(t, self.nkv, self.hd))
        v = self.v_proj(x).view(t, self.nkv, self.hd)
        return Rotary.apply(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: Optional[torch.Tensor],
    ) -> torch.Tensor:
        t = x.shape[0]
        q = Rotary.apply(self.q_norm(self.q_proj(x).view(t, self.nh, self.hd)), cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=0)
        v = torch.cat([ctx_v, v_blk], dim=0)
        rep = self.nh // self.nkv
        if rep > 1:  # GQA: query head h reads kv head h // rep (SGLang / HF grouping)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=None if mask is None else mask[None, None],
            scale=self.hd ** -0.5,
        )
        return self.o_proj(out[0].transpose(0, 1).reshape(t, self.nh * self.hd))


class DraftMLP(nn.Module):
    def __init__(self, a: DraftArch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, a: DraftArch) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = DraftAttention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = DraftMLP(a)

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class VanillaMarkovHead(nn.Module):
    """Rank-r factorised bigram transition: bias(prev) = markov_w2(markov_w1[prev]) over the full vocab."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(prev))


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (rank if with_markov else 0), 1, bias=True)

    def forward(self, h: torch.Tensor, prev_embed: Optional[torch.Tensor]) -> torch.Tensor:
        feats = torch.cat([h.float(), prev_embed.float()], dim=-1) if self.with_markov else h.float()
        return F.linear(feats, self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


# --------------------------------------------------------------------------------------------- outputs


@dataclass
class BlockOutput:
    """Per block (anchor) and slot: [A, gamma, ...]."""

    hidden: torch.Tensor  # final-normed draft hidden (what lm_head and the confidence head read)
    base_logits: torch.Tensor  # lm_head(hidden), fp32
    logits: torch.Tensor  # base + Markov bias (teacher-forced prev tokens), fp32
    confidence_logits: Optional[torch.Tensor]  # fp32, before sigmoid / STS
    prev_tokens: torch.Tensor  # the token each slot's Markov/confidence input used


@dataclass
class DraftedBlock:
    """One inference round (or many, batched over anchors): [A, gamma, ...]."""

    tokens: torch.Tensor
    logits: torch.Tensor  # corrected step logits (the draft distribution q before temperature)
    base_logits: torch.Tensor
    confidence_logits: Optional[torch.Tensor]
    hidden: torch.Tensor


# --------------------------------------------------------------------------------------------- model


class DSparkDraft(nn.Module):
    """Parameter names are DeepSpec's (no prefix), so ``state_dict()`` is the checkpoint layout."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = dict(config)
        a = self.arch = DraftArch.from_config(config)
        d = a.hidden_size
        self.embed_tokens = nn.Embedding(a.vocab_size, d)
        self.lm_head = nn.Linear(d, a.vocab_size, bias=False)
        self.fc = nn.Linear(len(a.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, a.rms_norm_eps)
        self.layers = nn.ModuleList([DraftLayer(a) for _ in range(a.num_layers)])
        self.norm = RMSNorm(d, a.rms_norm_eps)
        self.markov_head = VanillaMarkovHead(a.vocab_size, a.markov_rank)
        self.confidence_head = (
            ConfidenceHead(d, a.markov_rank, a.confidence_with_markov) if a.confidence_head else None
        )
        self.rotary = Rotary(a.head_dim, a.rope_theta, a.rope_linear_factor)
        # FR-Spec hot vocabulary (None: the whole vocabulary). Not a buffer: it is not part of the checkpoint.
        self.hot_ids: Optional[torch.Tensor] = None

    # ----------------------------------------------------------------------------- setup

    def set_hot_vocab(self, token_ids: Optional[torch.Tensor]) -> None:
        """Draft over ``token_ids`` only, as a server does with a shipped hot set (``patches/hot_vocab.py``):
        ``base_logits`` / ``markov_bias`` stay |V| wide with ``-inf`` / 0 outside the set, and ``heads(...,
        narrow=True)`` returns the [.., |H|] columns alone (training: the vocabulary-sized work shrinks |V|/|H|-fold)."""
        self.hot_ids = None if token_ids is None else token_ids.to(self.fc.weight.device, torch.long)

    @property
    def gamma(self) -> int:
        return self.arch.block_size

    def init_trainable(self, generator: torch.Generator, std: float = 0.02) -> None:
        """HF-style init (normal(0, std) weights, zero biases, unit norms) of everything but the shared modules."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith(("embed_tokens.", "lm_head.")):
                    continue
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    def set_shared(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's embedding and LM head in and freeze them (DeepSpec: frozen, shared)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed_weight)
            self.lm_head.weight.copy_(lm_head_weight)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    def trainable_state_dict(self) -> Dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed_tokens.", "lm_head."))}

    # ----------------------------------------------------------------------------- pieces

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[T, n_layers*d] raw target layer outputs -> [T, d] context rows (SGLang's project_target_hidden)."""
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def context_kv(
        self, target_hidden: torch.Tensor, positions: torch.Tensor
    ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the K/V a server writes into the draft KV pool for these committed tokens."""
        ctx = self.project_context(target_hidden)
        cos, sin = self.rotary.cos_sin(positions)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def block_input_ids(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[A] anchors -> [A, gamma] = [anchor, mask, ..., mask]."""
        ids = torch.full((anchor_tokens.shape[0], self.gamma), self.arch.mask_token_id, dtype=torch.long,
                         device=anchor_tokens.device)
        ids[:, 0] = anchor_tokens
        return ids

    def _backbone(self, block_ids, block_pos, ctx_kv, mask) -> torch.Tensor:
        """block_ids/block_pos [A, gamma]; returns final-normed hidden [A, gamma, d]."""
        a, g = block_ids.shape
        h = self.embed_tokens(block_ids.reshape(-1)).to(self.fc.weight.dtype)
        cos, sin = self.rotary.cos_sin(block_pos.reshape(-1))
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            h = layer(h, cos, sin, ck, cv, mask)
        return self.norm(h).view(a, g, -1)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft's logits of its final hidden (over the hot vocabulary when one is set)."""
        if self.hot_ids is None:
            return self.vocab_logits(hidden)
        return self._widen(self.narrow_base_logits(hidden), float("-inf"))

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The shared LM head over the whole vocabulary (the target's logits, given the target's final hidden)."""
        return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        if self.hot_ids is None:
            return self.markov_head(prev).float()
        return self._widen(self.narrow_markov_bias(prev), 0.0)

    def narrow_base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., |H|] logits of the hot tokens (column j is token ``hot_ids[j]``)."""
        w = self._hot_lm_head_weight()
        return F.linear(hidden.to(w.dtype), w).float()

    def _hot_lm_head_weight(self) -> torch.Tensor:
        """``lm_head.weight[hot_ids]``, gathered once while the (frozen, shared) head and the hot set stay the same."""
        w = self.lm_head.weight
        key = (self.hot_ids, w.data_ptr(), w._version)
        cached = getattr(self, "_hot_lm_cache", None)
        if cached is None or cached[0][0] is not key[0] or cached[0][1:] != key[1:] or w.requires_grad:
            cached = (key, w.index_select(0, self.hot_ids))
            self._hot_lm_cache = cached
        return cached[1]

    def narrow_markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        w2 = self.markov_head.markov_w2.weight.index_select(0, self.hot_ids)  # gradient reaches the hot rows
        return F.linear(self.markov_head.markov_w1(prev), w2).float()

    def _widen(self, narrow: torch.Tensor, fill: float) -> torch.Tensor:
        out = narrow.new_full((*narrow.shape[:-1], self.arch.vocab_size), fill)
        return out.index_copy(-1, self.hot_ids, narrow)

    def confidence(self, hidden: torch.Tensor, prev: torch.Tensor) -> Optional[torch.Tensor]:
        if self.confidence_head is None:
            return None
        emb = self.markov_head.markov_w1(prev) if self.confidence_head.with_markov else None
        return self.confidence_head(hidden, emb)

    # ----------------------------------------------------------------------------- training

    @staticmethod
    def training_mask(anchor_index: torch.Tensor, seq_start: torch.Tensor, num_ctx: int, gamma: int) -> torch.Tensor:
        """Boolean [A*gamma, num_ctx + A*gamma] (True = may attend).

        Block ``a`` (anchor at packed index ``p``, its sequence starting at packed index ``s``) sees context rows
        ``s <= j < p`` (strictly before the anchor: the anchor's own target feature does not exist yet at serving
        time) and every slot of its own block (bidirectional); nothing of other blocks or other sequences.
        """
        n = anchor_index.shape[0]
        j = torch.arange(num_ctx, device=anchor_index.device)
        ctx = (j[None, :] >= seq_start[:, None]) & (j[None, :] < anchor_index[:, None])  # [A, S]
        ctx = ctx.repeat_interleave(gamma, dim=0)
        blk_id = torch.arange(n, device=anchor_index.device).repeat_interleave(gamma)
        blk = blk_id[:, None] == blk_id[None, :]
        return torch.cat([ctx, blk], dim=1)

    def training_hidden(
        self,
        input_ids: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        seq_start: torch.Tensor,
        anchor_index: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Backbone part of ``training_forward``: (final-normed hidden [A, gamma, d], teacher-forced prev
        [A, gamma])."""
        s = input_ids.shape[0]
        g = self.gamma
        ctx_kv = self.context_kv(target_hidden, position_ids)
        block_ids = self.block_input_ids(input_ids[anchor_index])
        offs = torch.arange(g, device=input_ids.device)
        block_pos = position_ids[anchor_index][:, None] + offs[None, :]
        mask = self.training_mask(anchor_index, seq_start[anchor_index], s, g)
        hidden = self._backbone(block_ids, block_pos, ctx_kv, mask)
        prev = input_ids[(anchor_index[:, None] + offs[None, :]).clamp(max=s - 1)]
        return hidden, prev

    def heads(self, hidden: torch.Tensor, prev: torch.Tensor, narrow: bool = False) -> BlockOutput:
        """Vocabulary-sized part: base logits, Markov-corrected logits, confidence logits (fp32). ``narrow`` (with a
        hot vocabulary set): logits over the hot columns only."""
        if narrow and self.hot_ids is not None:
            base, bias = self.narrow_base_logits(hidden), self.narrow_markov_bias(prev)
        else:
            base, bias = self.base_logits(hidden), self.markov_bias(prev)
        return BlockOutput(
            hidden=hidden,
            base_logits=base,
            logits=base + bias,
            confidence_logits=self.confidence(hidden, prev),
            prev_tokens=prev,
        )

    def training_forward(
        self,
        input_ids: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        seq_start: torch.Tensor,
        anchor_index: torch.Tensor,
    ) -> BlockOutput:
        """All anchors of one packed row at once.

        input_ids [S] (sequences concatenated), target_hidden [S, n_layers*d], position_ids [S] (restart at 0 per
        sequence), seq_start [S] (packed index where each token's sequence starts), anchor_index [A] packed indices.
        Markov and confidence inputs are teacher forced: slot k's previous token is the data token at anchor+k.
        """
        return self.heads(*self.training_hidden(input_ids, target_hidden, position_ids, seq_start, anchor_index))

    # ----------------------------------------------------------------------------- inference

    def serial_markov(
        self,
        hidden: torch.Tensor,
        base_logits: torch.Tensor,
        anchor_tokens: torch.Tensor,
        *,
        temperature: float = 0.0,
        forced_tokens: Optional[torch.Tensor] = None,
        generator: Optional[torch.Generator] = None,
    ) -> DraftedBlock:
        """Left-to-right: step k adds the bias of the token chosen at k-1 (the anchor for k=0), then picks a token
        (argmax when temperature <= 1e-5, else a sample of softmax(logits / T)); ``forced_tokens`` [A, gamma]
        replaces the pick (teacher forcing, for consistency checks). Confidence reads the same previous tokens."""
        a, g, _ = base_logits.shape
        prev = anchor_tokens.long()
        toks, steps, prevs = [], [], []
        for k in range(g):
            step = base_logits[:, k] + self.markov_bias(prev)
            if forced_tokens is not None:
                tok = forced_tokens[:, k].long()
            elif temperature <= 1e-5:
                tok = step.argmax(-1)
            else:
                probs = torch.softmax(step / temperature, dim=-1)
                tok = torch.multinomial(probs, 1, generator=generator)[:, 0]
            prevs.append(prev)
            steps.append(step)
            toks.append(tok)
            prev = tok
        prev_stack = torch.stack(prevs, dim=1)
        return DraftedBlock(
            tokens=torch.stack(toks, dim=1),
            logits=torch.stack(steps, dim=1),
            base_logits=base_logits,
            confidence_logits=self.confidence(hidden, prev_stack),
            hidden=hidden,
        )

    @torch.no_grad()
    def draft_block(
        self,
        ctx_kv: Sequence[Tuple[torch.Tensor, torch.Tensor]],
        anchor_token: int,
        anchor_pos: int,
        *,
        temperature: float = 0.0,
        forced_tokens: Optional[torch.Tensor] = None,
        generator: Optional[torch.Generator] = None,
    ) -> DraftedBlock:
        """One serving round: ``ctx_kv`` = ``context_kv`` of the committed tokens (positions < anchor_pos, as the
        server injected them), block at positions ``anchor_pos .. anchor_pos+gamma-1``, no mask (the server runs
        the block non-causally over cache + block). Returns [1, gamma, ...] tensors."""
        dev = self.fc.weight.device
        anchor = torch.tensor([anchor_token], dtype=torch.long, device=dev)
        block_ids = self.block_input_ids(anchor)
        block_pos = anchor_pos + torch.arange(self.gamma, device=dev)[None, :]
        hidden = self._backbone(block_ids, block_pos, ctx_kv, None)
        forced = None if forced_tokens is None else forced_tokens.view(1, -1)
        return self.serial_markov(hidden, self.base_logits(hidden), anchor, temperature=temperature,
                                  forced_tokens=forced, generator=generator)

    @torch.no_grad()
    def draft_many(
        self,
        input_ids: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        seq_start: torch.Tensor,
        anchor_index: torch.Tensor,
        *,
        temperature: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> DraftedBlock:
        """``draft_block`` for many anchors at once (the block backbone does not depend on drafted tokens, so the
        batched masked backbone + the serial Markov loop give every round's proposal); used for calibration."""
        s = input_ids.shape[0]
        g = self.gamma
        ctx_kv = self.context_kv(target_hidden, position_ids)
        anchors = input_ids[anchor_index]
        block_pos = position_ids[anchor_index][:, None] + torch.arange(g, device=input_ids.device)[None, :]
        mask = self.training_mask(anchor_index, seq_start[anchor_index], s, g)
        hidden = self._backbone(self.block_input_ids(anchors), block_pos, ctx_kv, mask)
        return self.serial_markov(hidden, self.base_logits(hidden), anchors, temperature=temperature,
                                  generator=generator)


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def default_target_layer_ids(num_target_layers: int, count: int) -> List[int]:
    """Evenly spaced target layers, as z-lab/DeepSpec pick them (from layer 1 to L-3), kept inside what SGLang can
    capture (``0 <= id <= L-2``: the output of layer l is captured at the input of layer l+1)."""
    top = num_target_layers - 2
    if count < 1 or count > top + 1:
        raise ValueError(f"cannot pick {count} distinct capturable layers from a {num_target_layers}-layer target")
    if count == 1:
        return [min(num_target_layers // 2, top)]
    for lo, hi in ((1, num_target_layers - 3), (0, top)):
        if hi > lo:
            ids = [int(round(lo + i * (hi - lo) / (count - 1))) for i in range(count)]
            if len(set(ids)) == count and 0 <= ids[0] and ids[-1] <= top:
                return ids
    return list(range(count))


def init_std(cfg: dict) -> float:
    return float(cfg.get("initializer_range", 0.02))
