"""``sgl_kernel.speculative``: the submodule SGLang imports ``reconstruct_indices_from_tree_mask`` from.

Call site: kernels/ops/speculative/reconstruct_tree.py (module level, every non-CUDA/HIP/XPU platform; used by
the NGRAM worker). Other names of the real submodule import as placeholders that raise when called.
"""

from __future__ import annotations

from .registry import make_module_getattr
from .speculative_ops import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]

__getattr__ = make_module_getattr("sgl_kernel.speculative")
