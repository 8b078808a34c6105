"""Sampled DSPARK verify draws from exactly the non-speculative sampler's distribution under min_p and top-k + top-p.

What SGLang 0.5.23 does (read from the source; measured with ``tests/e2e/test_e2e_sampled_exactness.py``):

* The sampled verify forms its target distribution in ``_accept_sampling_core``
  (``sglang/kernels/ops/speculative/dspark/dspark_accept.py:108-121``): ``SoftmaxTemp`` (temperature only) when
  neither top-k nor top-p is on, else ``build_speculative_verify_target_probs``
  (``sglang/srt/speculative/dflash_utils.py:1038-1105``: temperature, then top-k, then top-p). **min_p is read
  nowhere on this path** (``grep min_p`` in ``speculative/dspark_components/``, ``dflash_utils.py`` and
  ``dspark_accept.py``: only the simulated-acceptance gate ``dspark_worker_v2.py:1054``, an observability mask
  and the sampling-mask refusal ``spec_sampling_mask.py:30`` mention it). Every token a min_p request gets from a
  verify step (accepted draft, resampled or bonus token) therefore follows the distribution *without* the min_p
  cut, while the first token (prefill, the ordinary sampler) has it.
* The non-speculative sampler on the CPU (``--sampling-backend pytorch``, forced for ``--device cpu`` by
  ``srt/arg_groups/platform_hook.py:169-173``) is ``Sampler.forward`` (``srt/layers/sampler.py:275-297``:
  ``logits / T``, softmax) then ``top_k_top_p_min_p_sampling_from_probs_torch`` (``sampler.py:785-858``): sort
  descending; zero ranks ``>= top_k``; zero where ``cumsum - p > top_p`` with the cumsum of the *full* sorted
  distribution (``probs_sum`` is taken before the top-k zeroing: top-k and top-p cut jointly); zero where
  ``p < min_p * (largest kept p)``; ``torch.multinomial`` (which renormalises the survivors).
* So besides min_p, top-k and top-p *together* differ too: upstream's verify applies top-p to the
  top-k-renormalised distribution ("top-k-first", ``dflash_utils.py:1072-1087``), the CPU sampler to the full one.
  Example: ``p = (0.4, 0.3, 0.3)``, ``top_k = 2``, ``top_p = 0.5``: the sampler keeps both top tokens
  (0.4/0.7, 0.3/0.7), upstream's verify only the first (tests/unit/patches/test_exact_verify_filters.py).

What this module does (``apply()``; called from ``patches/cpu_dspark.py`` ``apply()``, so CPU platform only):
an AROUND hook on ``_accept_sampling_core``. When the batch needs min_p, or top-k and top-p together, it computes
per verify row the set of tokens the non-speculative sampler could emit from those logits
(:func:`nonspec_support`, the same operations in the same order and dtype as ``sampler.py:785-847``), sets every
other logit to ``-inf``, and runs upstream's function with the temperature-only branch (``SoftmaxTemp``). The
target distribution is then ``softmax(logits / T)`` restricted to that set and renormalised: exactly the law
``torch.multinomial`` samples in the non-speculative sampler, which the rejection sampler (accept, residual,
bonus) then reproduces. Batches with top-k only, top-p only or temperature only keep upstream's path, which already
matches (top-p alone: ``top_p_normalize_probs_torch``, the same formula; top-k alone: softmax of the top-k logits).
Greedy rows in a mixed batch have ``top_k = 1`` (``sampling_params.py:245-248``): their support is the argmax, and
their accept is upstream's greedy one anyway.

The verify logits this hook sees already carry penalties / logit_bias when another hook adds them earlier in the
verify (``patches/spec_penalties.py`` adjusts them in ``TargetVerifyExecutor.run_*``), the non-speculative order.
Not covered: GPU paths (flashinfer's min_p sampler is sequential, not joint; the CUDA-only block-wise rejection
and sampling-accept graph paths, ``dspark_verify.py:1213-1224``, ``dspark_worker_v2.py:1346-1364``, also ignore
min_p). Non-CPU tensors go to upstream's code unchanged.
"""

from __future__ import annotations

import logging

import torch

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)
_noted = False

ACCEPT_SAMPLING_CORE = "sglang.kernels.ops.speculative.dspark.dspark_accept._accept_sampling_core"


def nonspec_support(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor | None,
) -> torch.Tensor:
    """Boolean ``(rows, V)``: the tokens SGLang's pytorch sampler can emit from each row of ``logits``.

    ``temperatures``, ``top_ks``, ``top_ps``, ``min_ps`` hold one value per row (any shape with ``rows`` elements);
    ``min_ps=None`` means no min_p cut (``need_min_p_sampling`` false). Same operations, order and dtype as
    ``Sampler.forward`` + ``top_k_top_p_min_p_sampling_from_probs_torch`` (SGLang 0.5.23), so the cut-offs fall on
    the same tokens for the same logits.
    """
    rows = logits.shape[0]
    probs = torch.softmax(logits / temperatures.reshape(rows, 1).to(logits.dtype), dim=-1)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    ranks = torch.arange(probs_sort.shape[-1], device=logits.device).view(1, -1)
    probs_sort[ranks >= top_ks.reshape(rows, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.reshape(rows, 1)] = 0.0
    if min_ps is not None:
        thresholds = probs_sort[:, 0] * min_ps.reshape(rows).to(probs_sort.dtype)
        probs_sort[probs_sort < thresholds.view(-1, 1)] = 0.0
    keep_sorted = probs_sort > 0
    return torch.zeros_like(keep_sorted).scatter_(-1, probs_idx, keep_sorted)


def needs_exact_filters(sampling_info) -> bool:
    """True where upstream's verify target differs from the sampler's: min_p, or top-k together with top-p."""
    if sampling_info is None or getattr(sampling_info, "is_all_greedy", False):
        return False
    if getattr(sampling_info, "need_min_p_sampling", False):
        return True
    return bool(getattr(sampling_info, "need_top_k_sampling", False)) and bool(
        getattr(sampling_info, "need_top_p_sampling", False)
    )


class TemperatureOnly:
    """``sampling_info`` as ``_accept_sampling_core`` reads it, with its top-k/top-p branch switched off (the
    filters are already in the logits)."""

    need_top_k_sampling = False
    need_top_p_sampling = False

    def __init__(self, info) -> None:
        self._info = info

    def __getattr__(self, name):
        return getattr(self._info, name)


def filtered_verify_logits(target_logits: torch.Tensor, sampling_info, rows_per_request: int) -> torch.Tensor:
    """``target_logits`` (``bs * rows_per_request``, V) with every token the sampler cannot emit set to ``-inf``."""

    def per_row(values):
        return torch.repeat_interleave(values.reshape(-1), rows_per_request, dim=0)

    min_ps = per_row(sampling_info.min_ps) if sampling_info.need_min_p_sampling else None
    keep = nonspec_support(
        target_logits,
        per_row(sampling_info.temperatures),
        per_row(sampling_info.top_ks),
        per_row(sampling_info.top_ps),
        min_ps,
    )
    return target_logits.masked_fill(~keep, float("-inf"))


def accept_sampling_core_exact(original, *args, **kwargs):
    """AROUND ``_accept_sampling_core``: see the module docstring. Keyword-only upstream (``*`` signature)."""
    sampling_info = kwargs.get("sampling_info")
    target_logits = kwargs.get("target_logits")
    if args or target_logits is None or target_logits.device.type != "cpu" or not needs_exact_filters(sampling_info):
        return original(*args, **kwargs)
    global _noted
    if not _noted:
        _noted = True
        logger.info("sglang-dspark: sampled verify applies min_p / joint top-k+top-p exactly (first such step)")
    kwargs["target_logits"] = filtered_verify_logits(
        target_logits, sampling_info, int(kwargs["verify_num_draft_tokens"])
    )
    kwargs["sampling_info"] = TemperatureOnly(sampling_info)
    return original(*args, **kwargs)


@install_once
def apply() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ACCEPT_SAMPLING_CORE, accept_sampling_core_exact, HookType.AROUND)
