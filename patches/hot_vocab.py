"""The draft's logits over a frequency-ranked hot vocabulary (FR-Spec), when the draft ships one.

Why: on a small target the draft's two vocabulary-wide products dominate a drafted step's draft block: the LM head
over the γ block slots (``project_through_lm_head``: γ × |V| × d) and the Markov bias per slot (``VanillaMarkov.
step_bias``: |V| × r). With a hot set H both run over |H| rows; the maths and why verification stays exact are in
``sglang_dspark/draft/hot_vocab.py``.

Four AROUND hooks on SGLang 0.5.23's dense DSpark draft, each a no-op unless :func:`attach_hot_vocab` marked the
instance (``_dspark_hot``):

* ``DSparkDraftMixin.compute_base_logits``: ``h·W[H]ᵀ`` into an ``-inf``-filled ``[N, |V|]`` (same shape as before);
* ``VanillaMarkov.step_bias``: ``e(prev)·W2[H]ᵀ`` into a zero-filled ``[N, |V|]``;
* ``VanillaMarkov.greedy_w2_weight``: None, so the fused greedy kernel (which recomputes the bias over the whole of
  ``W2``) is not taken; the shared step reads our bias instead;
* ``dspark_draft.sample_draft_block`` (CPU, where sglang-dspark's Markov step runs): the serial loop over the hot
  columns only (``hot_markov_block``), same tokens and kept logits as the wide loop. Elsewhere (a GPU: upstream's
  fused Markov kernels; ``SGLANG_DSPARK_CPU_MARKOV_STEP=upstream``) the wide loop runs as before.

:func:`attach_hot_vocab` refuses (returns the reason, the draft then runs over the whole vocabulary) where these
hooks would not be the whole story: a quantized, fp8 or vocab-parallel LM head, a sharded or non-GEMV Markov head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dspark.cpu.packed_linear import PackedWeight, can_pack, pack_weight
from sglang_dspark.draft.hot_vocab import (
    HotVocab,
    hot_logits_columns,
    hot_markov_bias,
    hot_markov_bias_columns,
    hot_markov_block,
    widen,
)
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

COMPUTE_BASE_LOGITS = "sglang.srt.models.dspark.DSparkDraftMixin.compute_base_logits"
MARKOV_STEP_BIAS = "sglang.srt.models.dspark.VanillaMarkov.step_bias"
MARKOV_GREEDY_W2 = "sglang.srt.models.dspark.VanillaMarkov.greedy_w2_weight"
SAMPLE_DRAFT_BLOCK = "sglang.srt.speculative.dspark_components.dspark_draft.sample_draft_block"
_BLOCK_COLUMNS = "_dspark_hot_block_columns"


@dataclass(frozen=True)
class _HotRows:
    ids: torch.Tensor  # [|H|] int64 on the weights' device, ascending (the hot-space loop's column order)
    weight: torch.Tensor  # the hot rows of the LM head ([|H|, d]) or of markov_w2 ([|H|, r]), in ``ids`` order
    vocab_size: int
    packed: Optional[PackedWeight] = None  # ``weight`` packed for oneDNN where the CPU platform packs linears
    # ``weight``ᵀ stored contiguous, for the Markov head's one-row products on the CPU (hot_markov_bias_columns)
    transposed: Optional[torch.Tensor] = None


def _hot_rows(ids: torch.Tensor, weight: torch.Tensor, vocab_size: int, *, one_row_layout: bool = False) -> _HotRows:
    """The hot rows of ``weight`` in ascending id order: the frequency order of the file matters only for cutting
    a hot set to size; ascending order lets the hot-space loop keep the wide loop's tie-break and summation order.
    ``one_row_layout``: also keep them transposed for one-row products on the CPU (the Markov head's)."""
    from sglang_dspark.patches import cpu_packed_linear

    ids = torch.sort(ids).values
    rows = weight.index_select(0, ids).contiguous()
    packed = pack_weight(rows) if cpu_packed_linear.installed() and can_pack(rows) else None
    transposed = rows.T.contiguous() if one_row_layout and rows.device.type == "cpu" else None
    return _HotRows(ids, rows, vocab_size, packed, transposed)


def compute_base_logits_over_hot_vocab(original, self, hidden):
    hot: Optional[_HotRows] = getattr(self, "_dspark_hot", None)
    if hot is None:
        return original(self, hidden)
    confidence_features = hidden
    if self.logits_mup_width_multiplier:  # as upstream: the folded-head scale, divided once
        hidden = hidden / self.logits_mup_width_multiplier
    columns = hot_logits_columns(hidden, hot.weight, hot.packed)
    wide = widen(columns, hot.ids, hot.vocab_size, float("-inf"))
    if wide.device.type == "cpu" and _cpu_markov_step_runs():
        # Kept for this block's hot-space loop (sample_draft_block_in_hot_space), which would otherwise gather the
        # same columns back out of the wide tensor.
        self.markov_head.__dict__[_BLOCK_COLUMNS] = (wide, columns)
    return wide, confidence_features


def step_bias_over_hot_vocab(original, self, prev_tokens, *, hidden_states, state):
    hot: Optional[_HotRows] = getattr(self, "_dspark_hot", None)
    if hot is None:
        return original(self, prev_tokens, hidden_states=hidden_states, state=state)
    return hot_markov_bias(self.get_prev_embeddings(prev_tokens), hot.weight, hot.ids, hot.vocab_size,
                           hot.packed, hot.transposed), state


def greedy_w2_weight_unless_hot(original, self):
    if getattr(self, "_dspark_hot", None) is not None:
        return None
    return original(self)


def sample_draft_block_in_hot_space(original, **kwargs):
    """The draft block's Markov loop over the hot columns, on the CPU (module docstring); the wide loop elsewhere."""
    head = kwargs["markov_head"]
    hot: Optional[_HotRows] = getattr(head, "_dspark_hot", None)
    base_logits = kwargs["base_logits"]
    block_columns = head.__dict__.pop(_BLOCK_COLUMNS, None)
    if hot is None or base_logits.device.type != "cpu" or not _cpu_markov_step_runs():
        return original(**kwargs)
    from sglang.srt.speculative.dspark_components.dspark_draft import (
        DraftBlockResult,
        SpecTpSyncSite,
        resolve_draft_params,
    )
    from sglang_dspark.kernels.markov_step import markov_noise_seed

    greedy_draft, noise, tp_sync = kwargs["greedy_draft"], kwargs["noise"], kwargs["tp_sync"]
    params = resolve_draft_params(sampling_info=kwargs["sampling_info"], bs=base_logits.shape[0],
                                  device=kwargs["device"])
    seeded = not greedy_draft and bool((params.step_temperatures != 0).any())
    offset = int(noise.offset.reshape(-1)[0]) if seeded else 0
    tokens, step_logits = hot_markov_block(
        _hot_base_columns(base_logits, hot, block_columns),
        kwargs["anchor_tokens"],
        ascending_ids=hot.ids,
        step_bias=lambda prev: hot_markov_bias_columns(head.get_prev_embeddings(prev), hot.weight, hot.packed,
                                                       hot.transposed),
        temperatures=params.step_temperatures,
        step_dtype=head.step_logits_dtype(base_logits.dtype),
        noise_seed=lambda slot: markov_noise_seed(int(noise.key), offset, slot) if seeded else None,
        vocab_size=hot.vocab_size,
        keep_logits=not greedy_draft,
        after_step=lambda drafted: tp_sync.sync(SpecTpSyncSite.DSPARK_DRAFT, drafted),
    )
    if not greedy_draft:
        noise.offset.add_(1)  # as upstream's loop: the next block draws fresh noise
    return DraftBlockResult(draft_tokens=tokens, corrected_logits=step_logits, greedy_mask=params.greedy_mask,
                            temperatures=params.temperatures, greedy_draft=greedy_draft)


def _hot_base_columns(base_logits: torch.Tensor, hot: _HotRows, block_columns) -> torch.Tensor:
    """``base_logits`` ``[bs, γ, |V|]`` on the hot columns: the columns compute_base_logits kept, when
    ``base_logits`` is (a view of) the wide tensor it returned with them; else gathered from the wide tensor."""
    if block_columns is not None:
        wide, columns = block_columns
        if wide.data_ptr() == base_logits.data_ptr() and wide.numel() == base_logits.numel():
            return columns.view(*base_logits.shape[:-1], columns.shape[-1])
    return base_logits.index_select(-1, hot.ids)


def _cpu_markov_step_runs() -> bool:
    from sglang_dspark.patches import cpu_dspark

    return cpu_dspark.markov_step_is_ours()


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
    if not install.ran():
        return "the hot-vocabulary hooks are not installed (the sglang-dspark plugin did not load)"
    lm_weight = draft_model.lm_head.weight
    head = draft_model.markov_head
    ids = hot.token_ids.to(lm_weight.device)
    with torch.no_grad():
        draft_model._dspark_hot = _hot_rows(ids, lm_weight, hot.vocab_size)
        w2 = head.markov_w2.weight
        head._dspark_hot = _hot_rows(ids.to(w2.device), w2, hot.vocab_size, one_row_layout=True)
    return None


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(COMPUTE_BASE_LOGITS, compute_base_logits_over_hot_vocab, HookType.AROUND)
    HookRegistry.register(MARKOV_STEP_BIAS, step_bias_over_hot_vocab, HookType.AROUND)
    HookRegistry.register(MARKOV_GREEDY_W2, greedy_w2_weight_unless_hot, HookType.AROUND)
    HookRegistry.register(SAMPLE_DRAFT_BLOCK, sample_draft_block_in_hot_space, HookType.AROUND)
