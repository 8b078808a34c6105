"""On the CPU platform, SGLang's unquantized linear layers and LM head run through oneDNN with packed weights.

Why: ``sglang_dspark/cpu/packed_linear.py`` (MKL's fp32 GEMM makes a verify row cost almost a decode step on a CPU;
a packed oneDNN linear does not, and is faster at one row too). Every server the plugin loads into on the CPU platform
takes it, speculative or not, so side-by-side comparisons stay like with like. ``SGLANG_DSPARK_CPU_LINEAR=torch``
keeps SGLang's own products.

Two AROUND hooks, each falling through to SGLang's code unless its input is the plain case, and for products of at
most ``MAX_PACKED_ROWS`` rows only (decode, verify, draft blocks; prefills stay on MKL: ``ROW_BUCKETS`` says why the
row counts are bounded):

* ``UnquantizedLinearMethod.apply``: CPU input of the weight's dtype (fp32/bf16), a 2-D strided weight, the layer not
  on SGLang's AMX path (our platform never enables it), bias absent or of the same dtype;
* ``LogitsProcessor._compute_lm_head``: the branch SGLang takes for a plain LM head (``torch.matmul(hidden,
  weight.T)``): no LoRA wrapper, no quantized head, no fp32 LM-head upcast, no AMX, no RL on-policy bf16 cast.

The draft's context injection (the committed tokens' target hidden states into the draft KV, once per decode step
whether the step drafts or not) multiplies through torch's own products, not SGLang's linear method, so it gets two
more routes, for the same reason:

* the draft's ``torch.nn.Linear`` modules (DFlash's ``fc``, which projects the concatenated target layers):
  :func:`pack_draft_context_products` gives each an instance ``forward`` that takes the packed path, called by our worker;
* the stacked K/V projection of all draft layers (``DSparkDraftMixin._project_ctx_kv_stacked``, one ``F.linear``
  over a weight upstream concatenates once and caches): an AFTER hook on ``_stacked_ctx_kv_params`` attaches a packed
  copy to that cached tensor, and ``sglang.srt.models.dspark.F`` becomes :class:`_FunctionalWithPackedLinear`, the
  same functions whose ``linear`` uses a weight's attached copy (every other weight, and every other function, is
  torch's own).

A packed copy is made on first use and remade when the weight tensor is replaced (pointer, shape or dtype change) or
after any of SGLang's weight updates (an AFTER hook bumps a generation: in-place ``.data`` copies do not change a
tensor's version counter, so nothing else would notice them).
"""

from __future__ import annotations

import logging
import types

import torch
import torch.nn.functional as torch_functional

from sglang_dspark.cpu.packed_linear import (
    PackedWeight,
    can_pack,
    fits,
    pack_weight,
    packed_linear,
    packing_available,
)
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

LINEAR_APPLY = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
COMPUTE_LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
_WEIGHT_UPDATERS = tuple(
    f"sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.{name}"
    for name in ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                 "update_weights_from_ipc")
)
_PACKED_ATTR = "_dspark_packed_weight"
STACKED_CONTEXT_KV = "sglang.srt.models.dspark.DSparkDraftMixin._stacked_ctx_kv_params"
DRAFT_MODEL_MODULE = "sglang.srt.models.dspark"
_generation = 0


def packed_for(module, weight) -> PackedWeight:
    """The module's packed copy of ``weight``, (re)made when missing or stale."""
    packed = module.__dict__.get(_PACKED_ATTR)
    if packed is None or not packed.matches(weight, _generation):
        packed = pack_weight(weight, _generation)
        module.__dict__[_PACKED_ATTR] = packed  # not a submodule or buffer: kept out of state_dict and .to()
    return packed


def weights_changed(result, *args, **kwargs):
    """AFTER a weight update: every packed copy is stale."""
    global _generation
    _generation += 1
    return result


def linear_through_packed_weight(original, self, layer, x, bias=None):
    weight = getattr(layer, "weight", None)
    if (
        x.device.type != "cpu"
        or getattr(layer, "use_intel_amx_backend", False)
        or not can_pack(weight)
        or not fits(x)
        or x.dtype != weight.dtype
        or (bias is not None and bias.dtype != x.dtype)
    ):
        return original(self, layer, x, bias)
    return packed_linear(x, packed_for(layer, weight), bias)


def lm_head_through_packed_weight(original, self, hidden_states, lm_head, embedding_bias=None, *, out=None):
    from sglang.srt.layers import logits_processor

    weight = getattr(lm_head, "weight", None)
    if (
        hidden_states.device.type != "cpu"
        or (hasattr(lm_head, "set_lora") and hasattr(lm_head, "apply_lora"))
        or logits_processor.should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
        or not can_pack(weight)
        or not fits(hidden_states)
        or self.use_fp32_lm_head
        or getattr(lm_head, "use_intel_amx_backend", False)
        or self.rl_on_policy_target is not None
    ):
        return original(self, hidden_states, lm_head, embedding_bias, out=out)
    # SGLang's plain branch casts the hidden states to the weight's dtype and ignores ``out`` and the bias too.
    return packed_linear(hidden_states.to(weight.dtype), packed_for(lm_head, weight))


def _plain_case(x, weight, bias) -> bool:
    return (
        x.device.type == "cpu"
        and fits(x)
        and x.dtype == weight.dtype
        and (bias is None or bias.dtype == x.dtype)
    )


def _torch_linear_forward(self, x):
    """``torch.nn.Linear.forward`` through a packed copy of the weight (the instance override of
    pack_draft_context_products). SGLang builds DFlash's ``fc`` as a plain ``nn.Linear`` whose parameters keep
    ``requires_grad=True``; serving runs it without grad, so the packed path is taken unless autograd would record
    the product (then torch's)."""
    weight, bias = self.weight, self.bias
    recorded = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if recorded or not can_pack(weight.detach()) or not _plain_case(x, weight, bias):
        return torch_functional.linear(x, weight, bias)
    return packed_linear(x, packed_for(self, weight.detach()), bias)


def pack_draft_context_products(draft_model) -> int:
    """Called by our worker once the draft is loaded: the draft's plain ``torch.nn.Linear`` modules through packed
    weights (subclasses, which may compute something else, are left alone) and the draft model module's ``F`` routed
    (the stacked K/V projection). Returns how many modules; does nothing unless the hooks are installed."""
    if not installed():
        return 0
    _route_draft_model_functional()
    count = 0
    for module in draft_model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_torch_linear_forward, module)
            count += 1
    return count


def attach_packed_copy(result, *args, **kwargs):
    """AFTER ``_stacked_ctx_kv_params``: its cached stacked K/V weight gets a packed copy (made once; the dict and
    its tensor are upstream's cache, so the copy lives exactly as long as the weight it was made from)."""
    weight = result.get("weight") if isinstance(result, dict) else None
    if can_pack(weight):
        packed = weight.__dict__.get(_PACKED_ATTR)
        if packed is None or not packed.matches(weight, _generation):
            weight.__dict__[_PACKED_ATTR] = pack_weight(weight, _generation)
    return result


class _FunctionalWithPackedLinear(types.ModuleType):
    """``torch.nn.functional`` for one SGLang module, except ``linear``: a weight carrying a current packed copy
    (:func:`attach_packed_copy`) goes through it in the plain case; anything else is torch's ``F.linear``."""

    def __init__(self) -> None:
        super().__init__(torch_functional.__name__)

    def __getattr__(self, name):
        return getattr(torch_functional, name)

    @staticmethod
    def linear(x, weight, bias=None):
        packed = weight.__dict__.get(_PACKED_ATTR) if isinstance(weight, torch.Tensor) else None
        if packed is None or not packed.matches(weight, _generation) or not _plain_case(x, weight, bias):
            return torch_functional.linear(x, weight, bias)
        return packed_linear(x, packed, bias)


def _route_draft_model_functional() -> None:
    import importlib

    module = importlib.import_module(DRAFT_MODEL_MODULE)
    if getattr(module, "F", None) is torch_functional:
        module.F = _FunctionalWithPackedLinear()


def installed() -> bool:
    """Whether this process runs linears through packed weights (the draft's hot rows follow it)."""
    return install.result() is True


@install_once
def install() -> bool:
    """Register the hooks (once per process); False when this torch has no oneDNN linear or the switch says torch."""
    from sglang_dspark import envs

    if envs.CPU_LINEAR.get() == "torch":
        return False
    if not packing_available():
        logger.info("sglang-dspark CPU platform: this torch has no oneDNN linear; linear layers stay on F.linear")
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(LINEAR_APPLY, linear_through_packed_weight, HookType.AROUND)
    HookRegistry.register(COMPUTE_LM_HEAD, lm_head_through_packed_weight, HookType.AROUND)
    for target in _WEIGHT_UPDATERS:
        HookRegistry.register(target, weights_changed, HookType.AFTER)
    HookRegistry.register(STACKED_CONTEXT_KV, attach_packed_copy, HookType.AFTER)
    return True
