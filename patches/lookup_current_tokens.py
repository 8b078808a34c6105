"""A DSPARK decode batch with a prompt-lookup match runs after the previous result is processed (issue #39).

Under SGLang's overlap scheduler (its default, DSPARK on the CPU included) a batch is launched before the previous
batch's result is processed, so ``req.output_ids`` lags a step and a lookup of the request's tail would propose what
follows a stale tail. ``Scheduler.is_disable_overlap_for_batch`` (AROUND) answers True for a DSPARK decode batch where
any request's tail, as the scheduler holds it, recurs in its context (``LookupBook.any_match``), so the loop processes
the previous result first and the worker's lookup reads current tokens; batches without a match keep the overlap.
Only when a result is queued: SGLang's loop pops the queue unchecked (see ``patches/spec_penalties.py``).

What it costs: on the CPU nothing measurable (the forward runs on the host either way); on a GPU (by reading) the
host's result processing of such a step no longer overlaps the device's forward, a host gap per step, which the
lookup's accepted tokens have to pay for: that is what ``LookupSource`` weighs through the measured step times.
"""

from __future__ import annotations

import logging

from sglang_dspark.lookup.book import active_book
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

_DISABLE_OVERLAP = "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch"


def needs_current_tokens(batch) -> bool:
    book = active_book()
    if book is None or batch is None or not batch.spec_algorithm.is_dspark() or not batch.forward_mode.is_decode():
        return False
    return book.any_match(batch.reqs)


def disable_overlap_for_lookup(original, self, batch, *args, **kwargs):
    if original(self, batch, *args, **kwargs):
        return True
    return len(getattr(self, "result_queue", ())) > 0 and needs_current_tokens(batch)


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_DISABLE_OVERLAP, disable_overlap_for_lookup, HookType.AROUND)
    logger.debug("sglang-dspark: lookup batches run on current tokens")
