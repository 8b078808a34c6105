"""``sgl_kernel.mamba``: importable placeholders only.

SGLang's linear-attention backends import ``causal_conv1d_fn_cpu``, ``causal_conv1d_update_cpu`` and
``chunk_gated_delta_rule_cpu`` from here at module level on CPU (srt/layers/attention/linear/gdn_backend.py,
kda_backend.py, kernels/gdn_triton.py). Hybrid linear-attention models (Qwen3-Next, Qwen3.5, Kimi-Linear) are
not supported by the stand-in: besides these names, those modules also look up C++ ops
(``torch.ops.sgl_kernel.fused_gdn_gating_cpu``, ``fused_sigmoid_gating_delta_rule_update_cpu``) that it does
not define, so they still fail to import on CPU. Models without linear attention never import them (checked:
the CPU engine, the speculative workers and the Qwen3/Llama/DFlash/DSpark model modules load without them).
"""

from __future__ import annotations

from .registry import make_module_getattr

__all__: list = []

__getattr__ = make_module_getattr("sgl_kernel.mamba")
