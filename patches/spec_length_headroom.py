"""A speculative request near the KV limit ends with ``length``, not with an HTTP 500 abort (issue #15).

What SGLang 0.5.23 does (read from the source; seen in ``tests/e2e/test_e2e_soak.py``): ``Scheduler.
init_req_max_new_tokens`` (managers/scheduler.py ~2693-2740) clamps ``max_new_tokens`` to ``max_req_len -
input_len - 1``, with ``max_req_len = min(context_len, KV capacity) - 1`` (tp_worker.py ~568-572). That bound is
exact for plain decoding, which needs one new slot per step. A speculative decode step allocates the committed
length plus ``get_alloc_reserve_per_decode()`` slots (the verify window, doubled for the overlap lag;
``schedule_batch.py`` ``_new_tokens_required_next_decode_spec_v2``), so a request clamped to the pool's edge no
longer fits near its end: ``retract_decode`` retracts everything else and then aborts it, "Out of memory even after
retracting all other requests in the decode batch", HTTP 500, every token it generated lost.

What this module does (``install()``): an AROUND hook on ``init_req_max_new_tokens`` that, for speculative servers
only, lowers the clamp by the reserve a decode step needs (:func:`decode_headroom`). Such a request now finishes
with ``length`` a few tokens before the pool's edge, as it would on a slightly smaller pool; requests that fit
are untouched (the cap only binds within ``headroom`` tokens of the edge), and non-speculative servers keep
SGLang's bound exactly.
"""

from __future__ import annotations

import logging

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

INIT_REQ_MAX_NEW_TOKENS = "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens"


def decode_headroom(reserve_per_decode: int, page_size: int) -> int:
    """KV slots a speculative decode step may need beyond the committed tokens: the reserve rounded up to whole
    pages, plus the page the committed length may already have opened."""
    page_size = max(1, int(page_size))
    return -(-int(reserve_per_decode) // page_size) * page_size + page_size


def capped_max_new_tokens(max_new_tokens: int, input_len: int, max_req_len: int, headroom: int) -> int:
    """``max_new_tokens`` such that ``input_len + max_new_tokens + headroom`` stays within SGLang's request bound."""
    return max(0, min(int(max_new_tokens), int(max_req_len) - int(input_len) - 1 - int(headroom)))


def init_req_max_new_tokens_with_headroom(original, self, req):
    result = original(self, req)
    if self.spec_algorithm.is_none() or req.finished():
        return result
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    params = req.sampling_params
    headroom = decode_headroom(get_alloc_reserve_per_decode(), self.token_to_kv_pool_allocator.page_size)
    capped = capped_max_new_tokens(params.max_new_tokens, len(req.origin_input_ids), self.max_req_len, headroom)
    if capped < params.max_new_tokens:
        logger.info(
            "sglang-dspark: request %s: max_new_tokens %d -> %d (a speculative decode step needs %d free KV slots "
            "beyond the sequence; without them the request would be aborted near the KV limit)",
            req.rid, params.max_new_tokens, capped, headroom,
        )
        params.max_new_tokens = capped
        params.min_new_tokens = min(params.min_new_tokens, capped)  # SGLang's own invariant after clipping
    return result


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(INIT_REQ_MAX_NEW_TOKENS, init_req_max_new_tokens_with_headroom, HookType.AROUND)
