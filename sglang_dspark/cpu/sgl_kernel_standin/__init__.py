"""Pure-torch stand-in for SGLang's CPU kernel package ``sgl_kernel`` (SGLang 0.5.23).

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a set of bookkeeping helpers from ``sgl_kernel``
at module level and, with ``--attention-backend intel_amx``, calls two attention ops through
``torch.ops.sgl_kernel``. The C++ CPU build of ``sgl_kernel`` is not on PyPI; this package provides the
part of it that the CPU engine path needs, in torch:

* module-level helpers (``kv_cache_ops``, ``speculative_ops``) and ``sgl_kernel.speculative``;
* ``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu`` (``attention``) and
  ``murmur_hash32_cpu`` (``sampling_ops``), registered through ``torch.library`` on import;
* every other name SGLang imports from ``sgl_kernel`` resolves to a placeholder that raises
  ``NotImplementedError`` when called (``registry.make_module_getattr``);
* real sgl_kernel submodules that SGLang imports inside ``try/except ImportError`` (``scalar_type``,
  ``kvcacheio``, ``allreduce``, ...) stay missing, so SGLang takes its fallbacks.

``convert_weight_packed`` is deliberately NOT registered: SGLang's ``cpu_has_amx_support()`` requires it,
and its absence keeps every layer (norms, RoPE, activations, linear, logits) on the torch-native path.

The package is imported either as ``sglang_dspark.cpu.sgl_kernel_standin`` or, through the CPU platform's
import hook, as ``sgl_kernel`` (hence relative imports only). Importing it twice under both names is
harmless: op registration skips ops that already exist.
"""

from __future__ import annotations

from . import attention as _attention
from . import mamba, speculative  # noqa: F401  (submodules SGLang imports from)
from . import sampling_ops as _sampling_ops
from .kv_cache_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
)
from .registry import StandinNotProvided, make_module_getattr
from .speculative_ops import (
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__version__ = "0.0.0+sglang.dspark.cpu.standin"

IS_SGLANG_DSPARK_STANDIN = True

# Module-level names with a real implementation.
IMPLEMENTED = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "build_draft_decode_metadata_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "verify_tree_greedy_cpu",
    "build_tree_kernel_efficient_cpu",
    "rotate_input_ids_cpu",
)

# torch.ops.sgl_kernel.* ops with a real implementation.
IMPLEMENTED_OPS = ("extend_attention_cpu", "decode_attention_cpu", "murmur_hash32_cpu")

# Submodules of the real sgl_kernel that SGLang imports guarded by ``except ImportError`` (or only on other
# platforms). They must stay missing: handing out placeholders would switch SGLang off its fallbacks.
ABSENT_SUBMODULES = frozenset(
    {
        "allreduce",
        "elementwise",
        "flash_attn",
        "flash_mla",
        "kvcacheio",
        "metal",
        "quantization",
        "scalar_type",
        "sparse_flash_attn",
        "spatial",
        "testing",
        "top_k",
        "utils",
        "version",
    }
)

__all__ = list(IMPLEMENTED) + ["speculative", "mamba", "StandinNotProvided"]

_attention.register()
_sampling_ops.register()

__getattr__ = make_module_getattr("sgl_kernel", absent=ABSENT_SUBMODULES)
