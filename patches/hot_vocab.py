"""The draft's logits over a frequency-ranked hot vocabulary (FR-Spec), when the draft ships one.

Why: on a small target the draft's two vocabulary-wide products dominate a drafted step's draft block: the LM head
over the γ block slots (``project_through_lm_head``: γ × |V| × d) and the Markov bias per slot (``VanillaMarkov.
step_bias``: |V| × r). With a hot set H both run over |H| rows; the maths and why verification stays exact are in
``sglang_dspark/draft/hot_vocab.py``.

Three AROUND hooks on SGLang 0.5.23's dense DSpark draft, each a no-op unless :func:`attach_hot_vocab` marked the
instance (``_dspark_hot``):

* ``DSparkDraftMixin.compute_base_logits``: ``h·W[H]ᵀ`` into an ``-inf``-filled ``[N, |V|]`` (same shape as before);
* ``VanillaMarkov.step_bias``: ``e(prev)·W2[H]ᵀ`` into a zero-filled ``[N, |V|]``;
* ``VanillaMarkov.greedy_w2_weight``: None, so the fused greedy kernel (which recomputes the bias over the whole of
  ``W2``) is not taken; the shared step reads our bias instead.

:func:`attach_hot_vocab` refuses (returns the reason, the draft then runs over the whole vocabulary) where these
hooks would not be the whole story: a quantized, fp8 or vocab-parallel LM head, a sharded or non-GEMV Markov head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dspark.cpu.packed_linear import PackedWeight, can_pack, pack_weight
from sglang_dspark.draft.hot_vocab import HotVocab, hot_logits, hot_markov_bias

logger = logging.getLogger(__name__)
_installed = False

COMPUTE_BASE_LOGITS = "sglang.srt.models.dspark.DSparkDraftMixin.compute_base_logits"
MARKOV_STEP_BIAS = "sglang.srt.models.dspark.VanillaMarkov.step_bias"
MARKOV_GREEDY_W2 = "sglang.srt.models.dspark.VanillaMarkov.greedy_w2_weight"


@dataclass(frozen=True)
class _HotRows:
    ids: torch.Tensor  # [|H|] int64 on the weights' device
    weight: torch.Tensor  # the hot rows of the LM head ([|H|, d]) or of markov_w2 ([|H|, r])
    vocab_size: int
    packed: Optional[PackedWeight] = None  # ``weight`` packed for oneDNN where the CPU platform packs linears


def _hot_rows(ids: torch.Tensor, weight: torch.Tensor, vocab_size: int) -> _HotRows:
    from sglang_dspark.patches import cpu_packed_linear

    rows = weight.index_select(0, ids).contiguous()
    packed = pack_weight(rows) if cpu_packed_linear.installed() and can_pack(rows) else None
    return _HotRows(ids, rows, vocab_size, packed)


def compute_base_logits_over_hot_vocab(original, self, hidden):
    hot: Optional[_HotRows] = getattr(self, "_dspark_hot", None)
    if hot is None:
        return original(self, hidden)
    confidence_features = hidden
    if self.logits_mup_width_multiplier:  # as upstream: the folded-head scale, divided once
        hidden = hidden / self.logits_mup_width_multiplier
    return hot_logits(hidden, hot.weight, hot.ids, hot.vocab_size, hot.packed), confidence_features


def step_bias_over_hot_vocab(original, self, prev_tokens, *, hidden_states, state):
    hot: Optional[_HotRows] = getattr(self, "_dspark_hot", None)
    if hot is None:
        return original(self, prev_tokens, hidden_states=hidden_states, state=state)
    return hot_markov_bias(self.get_prev_embeddings(prev_tokens), hot.weight, hot.ids, hot.vocab_size,
                           hot.packed), state


def greedy_w2_weight_unless_hot(original, self):
    if getattr(self, "_dspark_hot", None) is not None:
        return None
    return original(self)


def hot_vocab_blocker(draft_model, hot: HotVocab) -> Optional[str]:
    """Why the hot set cannot be used with this draft (None: it can)."""
    from sglang.srt.models import dspark

    lm_head = getattr(draft_model, "lm_head", None)
    head = getattr(draft_model, "markov_head", None)
    if lm_head is None or not isinstance(getattr(lm_head, "weight", None), torch.Tensor):
        return "the draft has no plain LM head attached"
    if not isinstance(draft_model, dspark.DSparkDraftMixin):
        return f"{type(draft_model).__name__} is not a dense DSpark draft"
    if int(getattr(lm_head, "tp_size", 1)) > 1 or getattr(draft_model, "_base_logits_gatherer", None) is not None:
        return "the LM head is vocab-parallel (tensor parallelism)"
    quant_method = getattr(lm_head, "quant_method", None)
    if (quant_method is not None and dspark.should_apply_lm_head_quant_method(lm_head, quant_method)) or getattr(
            dspark, "_DSPARK_FP8_LM_HEAD", False):
        return "the LM head is quantized (or fp8)"
    if not lm_head.weight.is_floating_point():
        return "the LM head weight is not floating point"
    if int(lm_head.org_vocab_size) != hot.vocab_size:
        return f"the hot set was made for {hot.vocab_size} tokens, the LM head has {int(lm_head.org_vocab_size)}"
    if not isinstance(head, dspark.VanillaMarkov) or not head._bias_is_w2_gemv():
        return f"Markov head {type(head).__name__} (hot sets need the vanilla GEMV bias)"
    if head.vocab_shard is not None or head._w2_rows is not None or head.vocab_size != hot.vocab_size:
        return "the Markov head is vocab-sharded or sized for another vocabulary"
    return None


def attach_hot_vocab(draft_model, hot: HotVocab) -> Optional[str]:
    """Mark the draft (and its Markov head) to run over ``hot``; returns why not, or None once attached."""
    reason = hot_vocab_blocker(draft_model, hot)
    if reason is not None:
        return reason
    if not _installed:
        return "the hot-vocabulary hooks are not installed (the sglang-dspark plugin did not load)"
    lm_weight = draft_model.lm_head.weight
    head = draft_model.markov_head
    ids = hot.token_ids.to(lm_weight.device)
    with torch.no_grad():
        draft_model._dspark_hot = _hot_rows(ids, lm_weight, hot.vocab_size)
        w2 = head.markov_w2.weight
        head._dspark_hot = _hot_rows(ids.to(w2.device), w2, hot.vocab_size)
    return None


def install() -> None:
    global _installed
    if _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(COMPUTE_BASE_LOGITS, compute_base_logits_over_hot_vocab, HookType.AROUND)
    HookRegistry.register(MARKOV_STEP_BIAS, step_bias_over_hot_vocab, HookType.AROUND)
    HookRegistry.register(MARKOV_GREEDY_W2, greedy_w2_weight_unless_hot, HookType.AROUND)
    _installed = True
