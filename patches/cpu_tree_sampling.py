"""NGRAM and EAGLE sample on the CPU: their verify draws from the target's law instead of committing the argmax.

What SGLang 0.5.23 does (read from the source; measured with ``benchmarks/cpu_greedy_verify.py``): NGRAM and EAGLE
verify through ``eagle_utils.eagle_sample``, whose ``_verify_uses_greedy`` answers True for ``is_cpu``
(``speculative/eagle_utils.py:485-500``). On the CPU every verify step therefore commits the target's argmax at
any temperature: a T = 0.7 answer is its first token (sampled at prefill) followed by greedy text, with no error or
warning. The sampling branch could not run there anyway: its tree sampler and the top-k / top-p renormalisers
resolve to ``None`` off CUDA (``kernels/ops/speculative/verify_sampling.py``, ``kernels/ops/sampling/renorm.py``).

What this module does (``apply()``; called from ``plugin.register`` on the CPU platform only):

* ``eagle_utils.tree_speculative_sampling_target_only`` (``None`` on the CPU) becomes
  ``sglang_dspark.kernels.tree_sampling.tree_speculative_sampling_target_only_torch`` (the same contract);
* ``_verify_uses_greedy`` (AROUND) is asked with ``is_cpu=False``, so a batch that is not all greedy samples;
* ``eagle_sample`` (AROUND), for CPU batches that sample: the target law is formed as the non-speculative CPU
  sampler forms it. ``eagle_utils.sampling_softmax`` sees the verify logits last, after upstream's penalties, logit
  bias, grammar mask and watermark; while this call runs it sets every token the sampler cannot emit (top-k, top-p
  and min_p cut jointly: ``exact_verify_filters.filtered_verify_logits``) to ``-inf`` before the softmax, out of
  place (the logits that logprobs read stay upstream's). The batch is shown to ``eagle_sample`` with its top-k /
  top-p switches off (``exact_verify_filters.TemperatureOnly``): the filters are already in the law. Greedy rows of
  a mixed batch have ``top_k = 1``, so their law is the argmax. Without this, upstream's sampling branch would also
  ignore min_p and apply top-p after top-k (see ``exact_verify_filters``).

The drafts are proposals chosen without sampling, so the target-only tree sampler is exact for them: each emitted
token follows the target's law (the tests: ``tests/unit/kernels/test_tree_sampling.py`` exactly,
``tests/e2e/test_e2e_sampled_exactness.py`` through a server). Non-CPU tensors keep upstream's path.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging

from sglang_dspark.patches.exact_verify_filters import TemperatureOnly, filtered_verify_logits
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
_EAGLE_SAMPLE = f"{EAGLE_UTILS}.eagle_sample"
_VERIFY_USES_GREEDY = f"{EAGLE_UTILS}._verify_uses_greedy"
# (sampling_info, verify rows per request) of the CPU eagle_sample call in progress.
_current_law: contextvars.ContextVar = contextvars.ContextVar("sglang_dspark_tree_verify_law", default=None)
_noted = False


class TemperatureOnlyBatch:
    """The ``ScheduleBatch`` as ``eagle_sample`` reads it, its ``sampling_info`` with top-k / top-p switched off."""

    def __init__(self, batch) -> None:
        self._batch = batch
        self.sampling_info = TemperatureOnly(batch.sampling_info)

    def __getattr__(self, name):
        return getattr(self._batch, name)


def verify_samples_on_cpu(original, **kwargs) -> bool:
    """AROUND ``_verify_uses_greedy`` (keyword-only upstream): the CPU has a tree sampler now."""
    return original(**{**kwargs, "is_cpu": False})


def _filters_needed(sampling_info) -> bool:
    return bool(sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling
                or sampling_info.need_min_p_sampling)


@functools.cache
def _signature(function) -> inspect.Signature:
    return inspect.signature(function)  # once, not every verify step


def eagle_sample_exact_on_cpu(original, *args, **kwargs):
    """AROUND ``eagle_sample``: a CPU batch that samples runs with the exact target law (module docstring)."""
    bound = _signature(original).bind(*args, **kwargs)
    batch = bound.arguments["batch"]
    info = batch.sampling_info
    if str(batch.device) != "cpu" or info is None or info.is_all_greedy:
        return original(*args, **kwargs)
    global _noted
    if not _noted:
        _noted = True
        logger.info("sglang-dspark: NGRAM / EAGLE verify samples on the CPU (torch tree sampler, exact target law)")
    rows_per_request = int(bound.arguments["verify_input"].draft_token_num)
    bound.arguments["batch"] = TemperatureOnlyBatch(batch)
    token = _current_law.set((info, rows_per_request))
    try:
        return original(*bound.args, **bound.kwargs)
    finally:
        _current_law.reset(token)


def exact_law_softmax(original):
    """``eagle_utils.sampling_softmax`` that, inside a CPU ``eagle_sample`` call, applies the sampler's filters."""

    def softmax(logits, temperatures=None):
        law = _current_law.get()
        if law is None or logits.device.type != "cpu" or not _filters_needed(law[0]):
            return original(logits, temperatures=temperatures)
        return original(filtered_verify_logits(logits, law[0], law[1]), temperatures=temperatures)

    return softmax


@install_once
def apply() -> None:
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dspark.kernels.tree_sampling import tree_speculative_sampling_target_only_torch

    eagle_utils = importlib.import_module(EAGLE_UTILS)
    if eagle_utils.tree_speculative_sampling_target_only is not None:
        return  # the platform has its own kernel
    eagle_utils.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only_torch
    eagle_utils.sampling_softmax = exact_law_softmax(eagle_utils.sampling_softmax)
    HookRegistry.register(_VERIFY_USES_GREEDY, verify_samples_on_cpu, HookType.AROUND)
    HookRegistry.register(_EAGLE_SAMPLE, eagle_sample_exact_on_cpu, HookType.AROUND)
    logger.debug("sglang-dspark: NGRAM / EAGLE sampled verify on the CPU")
