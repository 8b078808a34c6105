"""Direct patches for DSPARK on the CPU: the three places no HookRegistry hook reaches.

Each is a data attribute or a torch method, not an SGLang function, and each is checked against the SGLang
release it was written for (``apply()`` refuses any other). Applied only on the CPU platform, in every SGLang
process, by ``sglang_dspark.plugin.register``.
"""

from __future__ import annotations

import logging

import torch

from sglang_dspark.version_guard import require_supported_sglang

logger = logging.getLogger(__name__)
_applied = False


def allow_intel_amx_draft_backend() -> None:
    """The DSPARK draft runs its block forward on the target's attention backend; on the CPU that is intel_amx,
    which upstream's draft-backend allow-list lacks (it then falls back to flashinfer and dies at start-up)."""
    from sglang.srt.arg_groups import choices

    if "intel_amx" not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.add_draft_attention_backend_choices(["intel_amx"])


def make_record_stream_noop_on_cpu() -> None:
    """DSparkWorkerV2._forward_decode calls ``seq_lens.record_stream(current_stream())``; on the CPU the stream is a
    ``torch.cpu.Stream`` the binding rejects. CPU tensors have no caching-allocator streams to record, so a no-op
    is exact."""
    original = torch.Tensor.record_stream
    if getattr(original, "_sglang_dspark_cpu_noop", False):
        return

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    record_stream._sglang_dspark_cpu_noop = True
    torch.Tensor.record_stream = record_stream


def declare_linear_chain_verify() -> None:
    """The intel_amx backend reads ``spec_info.tree_topk`` (an EAGLE/NGRAM field) to decide whether a tree mask is
    needed. DFlash/DSpark verify windows are a linear chain, i.e. tree_topk == 1: the kernel's own causal
    (target) or bidirectional (draft, ENCODER_ONLY layers) masking is exactly right."""
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    if not hasattr(DFlashVerifyInput, "tree_topk"):
        DFlashVerifyInput.tree_topk = 1


def apply() -> None:
    global _applied
    if _applied:
        return
    require_supported_sglang()
    allow_intel_amx_draft_backend()
    make_record_stream_noop_on_cpu()
    declare_linear_chain_verify()
    _applied = True
    logger.debug("sglang-dspark: CPU DSPARK patches applied")
