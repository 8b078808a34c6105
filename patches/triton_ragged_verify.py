"""Ragged (compact) DSpark verify on SGLang 0.5.23's Triton attention backend, eager and inside CUDA graphs (issue #10).

Upstream gap (paths under ``sglang/srt/``): in compact verify mode (``SGLANG_RAGGED_VERIFY_MODE=compact``) a
TARGET_VERIFY batch packs request ``r``'s ``verify_lens[r]`` query rows back to back and describes them with
``spec_info.ragged_verify_layout`` (``speculative/ragged_verify.py:47-57``). ``layers/attention/triton_backend.py``
never reads that layout: it segments the rows with a uniform ``qo_indptr = arange(0, (bs+1)*N, N)`` in eager mode
(``init_forward_metadata``, :1007-1016) and in the CUDA-graph buffers (``_update_target_verify_buffers``, :601-609),
so every request after the first attends with the wrong rows (wrong tokens), and ``supports_ragged_verify_graph``
stays False (``layers/attention/base_attn_backend.py:65``), so the decode graph runner never replays a compact
verify graph (``model_executor/runner/decode_cuda_graph_runner.py:927-929``).

The Triton extend kernel needs no host plan: it reads ``qo_indptr`` on the device
(``sglang/kernels/ops/attention/extend_attention.py`` ``_fwd_kernel``: ``cur_seq_len_extend = qo_indptr[i+1] -
qo_indptr[i]``) and bounds its grid by the Python int ``max_extend_len`` (``grid = (bs, heads, cdiv(max_extend_len,
BLOCK_M))``, :1075). The prefix is read through ``kv_indptr``/``kv_indices`` built from ``seq_lens`` (the committed
prefix of a TARGET_VERIFY batch) and the verify rows' K/V come beside ``q``, so only the query segmentation changes.
So the fix is graph-safe and sync-free.

Hooks (AROUND unless noted), each acting only on a TARGET_VERIFY batch that carries a layout:

* ``TritonAttnBackend.init_forward_metadata`` (eager, :870): ``forward_metadata.qo_indptr`` = the layout's device
  ``qo_indptr_device``; ``max_extend_len`` = the exact max when the layout has host lengths, else the verify window
  N = γ+1 (every real request verifies <= N rows).
* ``TritonAttnBackend._update_target_verify_buffers`` (the capture *and* replay buffer fill, :592): after upstream's
  fill, copy the padded layout's ``qo_indptr`` into the fixed ``self.qo_indptr[:bs+1]`` the captured kernels read
  (never reallocated) and its row lengths into a fixed int32 buffer.
* ``TritonAttnBackend._build_cuda_graph_forward_metadata`` (capture, :1279): ``max_extend_len`` = N, the bound the
  captured grid keeps for every replay; marks the metadata ragged.
* ``TritonAttnBackend._forward_extend_unified`` (deterministic inference, :2141): that path segments through
  ``forward_batch.extend_seq_lens``/``extend_start_loc`` (None in TARGET_VERIFY: uniform N); it gets the layout's
  for the call.
* ``TritonAttnBackend.forward_extend`` (registered only where ``is_gfx95_supported()``): the split-KV / shared-KV
  verify kernels (gfx95 only, :238-242, :93-107) assume uniform rows and accept a ragged batch whose row count
  happens to equal ``bs*N`` (``verify_splitkv.py`` ``can_handle``); they are skipped for ragged metadata.
* data: ``TritonAttnBackend.supports_ragged_verify_graph = True``, which lets the runner replay compact verify
  graphs (``decode_cuda_graph_runner.py:927-929``).

Padding in graph mode follows the runner's own staging (``_stage_ragged_verify_layout``,
``decode_cuda_graph_runner.py:822-834``): the live layout (R rows) is padded to the tier's S slots with
``padded_to_bucket(padded_bs=S, cap=N)``, so every row is <= N = ``max_extend_len`` and the rows sum to <= T (the
tier's token count, the rows of ``q``). Query rows past ``qo_indptr[S]`` are graph padding: the kernel does not write
them and nothing reads them back.

Not handled (refused loudly rather than wrong): a ragged layout with a custom (tree) mask (DSpark/DFlash verify is a
linear chain: ``custom_mask`` is None for ``TritonAttnBackend``, ``speculative/dflash_utils.py:32-42``).

``apply()`` refuses any SGLang but the pinned release. It is not tied to the CPU platform: it must run in every
SGLang process of a GPU server (``sglang_dspark.plugin.register``). Batches without a ragged layout take upstream's
path unchanged.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

BACKEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
EAGER_METADATA_TARGET = f"{BACKEND}.init_forward_metadata"
GRAPH_BUFFERS_TARGET = f"{BACKEND}._update_target_verify_buffers"
GRAPH_METADATA_TARGET = f"{BACKEND}._build_cuda_graph_forward_metadata"
UNIFIED_EXTEND_TARGET = f"{BACKEND}._forward_extend_unified"
FORWARD_EXTEND_TARGET = f"{BACKEND}.forward_extend"

# Attributes this module adds (names prefixed so they never collide with upstream's).
_RAGGED_ATTR = "_dspark_ragged_extend"  # on ForwardMetadata: (extend_seq_lens, extend_start_loc) of the layout
_LENS_BUFFER_ATTR = "_dspark_ragged_extend_lens_buf"  # on the backend: fixed int32 row lengths (graph mode)



def ragged_layout_of(forward_mode: Any, spec_info: Any):
    """The batch's ragged verify layout, or None (not TARGET_VERIFY, no spec input, or a uniform verify)."""
    if spec_info is None or forward_mode is None or not forward_mode.is_target_verify():
        return None
    return getattr(spec_info, "ragged_verify_layout", None)


def _refuse_custom_mask(spec_info: Any) -> None:
    if getattr(spec_info, "custom_mask", None) is not None:
        raise NotImplementedError(
            "sglang-dspark triton ragged verify: a ragged verify layout with a custom (tree) mask is not supported "
            "(upstream's mask layout is uniform-width); DSpark/DFlash verify on the triton backend runs without one "
            "(speculative/dflash_utils.py:32-42)"
        )


def _verify_width(self, spec_info: Any) -> int:
    """N = γ+1, the per-request verify window: the bound on every real request's verify length."""
    return int(self._target_verify_num_tokens_per_req(spec_info))


def graph_padded_layout(layout: Any, padded_bs: int, width: int):
    """The layout as the captured kernels must see it at ``padded_bs`` slots: the runner's own rule
    (``decode_cuda_graph_runner.py:828-832``): pad (and cap rows at ``width``) unless it already is."""
    if layout.bs > padded_bs:
        raise ValueError(
            f"ragged verify layout has {layout.bs} requests but the graph batch only {padded_bs} slots"
        )
    if layout.bs != padded_bs or layout.cap is None:
        layout = layout.padded_to_bucket(padded_bs=padded_bs, cap=width)
    return layout


def eager_max_extend_len(layout: Any, width: int) -> int:
    """The grid bound for an eager verify: exact from host lengths when the layout has them (no device read), else
    the verify window N (every real request verifies <= N rows; rows of a padded layout beyond N are padding)."""
    if layout.verify_lens_cpu:
        return int(max(layout.verify_lens_cpu))
    return width


def init_forward_metadata_with_ragged_verify(original, self, forward_batch):
    """Eager: upstream builds the uniform metadata (kv_indptr/kv_indices from the committed prefix are right);
    swap in the layout's query segmentation."""
    result = original(self, forward_batch)
    spec_info = getattr(forward_batch, "spec_info", None)
    layout = ragged_layout_of(forward_batch.forward_mode, spec_info)
    if layout is None:
        return result
    _refuse_custom_mask(spec_info)
    metadata = self.forward_metadata
    bs = int(metadata.qo_indptr.numel()) - 1  # upstream: len(forward_batch.req_pool_indices)
    width = _verify_width(self, spec_info)
    if layout.bs != bs:
        layout = graph_padded_layout(layout, bs, width)
    metadata.qo_indptr = layout.qo_indptr_device
    metadata.max_extend_len = eager_max_extend_len(layout, width)
    setattr(metadata, _RAGGED_ATTR, (layout.verify_lens, layout.qo_indptr_device[:bs]))
    return result


def _ragged_lens_buffer(self) -> torch.Tensor:
    """A fixed int32 buffer for the padded row lengths (allocated once per backend, outside graph capture: the
    metadata prep runs out of graph)."""
    buf = getattr(self, _LENS_BUFFER_ATTR, None)
    if buf is None:
        buf = torch.zeros(int(self.qo_indptr.numel()) - 1, dtype=torch.int32, device=self.qo_indptr.device)
        setattr(self, _LENS_BUFFER_ATTR, buf)
    return buf


def update_target_verify_buffers_with_ragged_verify(original, self, plan, bs, seq_lens, spec_info, req_pool_indices):
    """Capture and replay: after upstream's uniform fill, copy the padded layout into the fixed buffers."""
    result = original(self, plan, bs, seq_lens, spec_info, req_pool_indices)
    layout = getattr(spec_info, "ragged_verify_layout", None) if spec_info is not None else None
    if layout is None:
        return result
    _refuse_custom_mask(spec_info)
    padded = graph_padded_layout(layout, int(bs), _verify_width(self, spec_info))
    qo_indptr = result[0]  # self.qo_indptr[:bs+1], the buffer the captured kernels read
    qo_indptr.copy_(padded.qo_indptr_device)
    _ragged_lens_buffer(self)[:bs].copy_(padded.verify_lens)
    return result


def build_cuda_graph_forward_metadata_with_ragged_verify(original, self, bs, forward_mode, spec_info, *args,
                                                         **kwargs):
    """Capture: the graph keeps ``max_extend_len`` (its grid) for every replay: N bounds every padded row."""
    metadata = original(self, bs, forward_mode, spec_info, *args, **kwargs)
    layout = ragged_layout_of(forward_mode, spec_info)
    if layout is None:
        return metadata
    metadata.max_extend_len = _verify_width(self, spec_info)
    setattr(metadata, _RAGGED_ATTR, (_ragged_lens_buffer(self)[:bs], self.qo_indptr[:bs]))
    return metadata


def forward_extend_unified_with_ragged_verify(original, self, q, o, layer, forward_batch, *args, **kwargs):
    """Deterministic inference: the unified kernel segments the extend part through the batch's
    ``extend_seq_lens``/``extend_start_loc`` (triton_backend.py:2213-2237); give it the layout's for this call."""
    ragged = getattr(self.forward_metadata, _RAGGED_ATTR, None)
    if ragged is None or not forward_batch.forward_mode.is_target_verify():
        return original(self, q, o, layer, forward_batch, *args, **kwargs)
    saved = (forward_batch.extend_seq_lens, forward_batch.extend_start_loc)
    forward_batch.extend_seq_lens, forward_batch.extend_start_loc = ragged
    try:
        return original(self, q, o, layer, forward_batch, *args, **kwargs)
    finally:
        forward_batch.extend_seq_lens, forward_batch.extend_start_loc = saved


def forward_extend_without_uniform_verify_kernels(original, self, *args, **kwargs):
    """gfx95: the split-KV / shared-KV verify kernels assume every request has N rows; off for ragged metadata."""
    if getattr(self.forward_metadata, _RAGGED_ATTR, None) is None or not (
            getattr(self, "use_verify_splitkv", False) or getattr(self, "use_verify_shared_kv", False)):
        return original(self, *args, **kwargs)
    saved = (self.use_verify_splitkv, self.use_verify_shared_kv)
    self.use_verify_splitkv = self.use_verify_shared_kv = False
    try:
        return original(self, *args, **kwargs)
    finally:
        self.use_verify_splitkv, self.use_verify_shared_kv = saved


def _uniform_verify_kernels_possible() -> bool:
    try:
        from sglang.srt.utils import is_gfx95_supported

        return bool(is_gfx95_supported())
    except Exception:  # noqa: BLE001 - unknown platform: register the (harmless) guard
        return True


def hook_table() -> list[tuple[str, Any]]:
    """(target, AROUND hook) pairs ``apply()`` registers (the gfx95 guard only where it can matter)."""
    hooks = [
        (EAGER_METADATA_TARGET, init_forward_metadata_with_ragged_verify),
        (GRAPH_BUFFERS_TARGET, update_target_verify_buffers_with_ragged_verify),
        (GRAPH_METADATA_TARGET, build_cuda_graph_forward_metadata_with_ragged_verify),
        (UNIFIED_EXTEND_TARGET, forward_extend_unified_with_ragged_verify),
    ]
    if _uniform_verify_kernels_possible():
        hooks.append((FORWARD_EXTEND_TARGET, forward_extend_without_uniform_verify_kernels))
    return hooks


@install_once
def apply() -> Optional[type]:
    """Register the hooks and open ``supports_ragged_verify_graph`` (once per process; refuses any SGLang but the
    pinned release). Returns the patched class, or None where SGLang's Triton backend cannot be imported."""
    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    try:
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    except Exception as exc:  # noqa: BLE001 - no triton backend on this platform: nothing to patch
        logger.debug("sglang-dspark: triton ragged verify not applied (%r)", exc)
        return None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = hook_table()
    missing = [t for t, _ in hooks if not callable(getattr(TritonAttnBackend, t.rsplit(".", 1)[1], None))]
    if missing:  # never open the graph flag without every hook in place
        raise RuntimeError(f"sglang-dspark triton ragged verify: SGLang lacks {missing}")
    for target, hook in hooks:
        HookRegistry.register(target, hook, HookType.AROUND)
    TritonAttnBackend.supports_ragged_verify_graph = True
    logger.debug("sglang-dspark: triton ragged verify hooks registered (%d)", len(hooks))
    return TritonAttnBackend


__all__ = [
    "apply",
    "build_cuda_graph_forward_metadata_with_ragged_verify",
    "eager_max_extend_len",
    "forward_extend_unified_with_ragged_verify",
    "forward_extend_without_uniform_verify_kernels",
    "graph_padded_layout",
    "hook_table",
    "init_forward_metadata_with_ragged_verify",
    "ragged_layout_of",
    "update_target_verify_buffers_with_ragged_verify",
]
