"""A DSPARK decode batch with a prompt-lookup match runs after the previous result is processed (issue #39).

Under SGLang's overlap scheduler (its default, DSPARK on the CPU included) a batch is launched before the previous
batch's result is processed, so ``req.output_ids`` lags a step and a lookup of the request's tail would propose what
follows a stale tail. ``Scheduler.is_disable_overlap_for_batch`` (AROUND) answers True for a DSPARK decode batch where
any request's tail, as the scheduler holds it, recurs in its context and chains are being verified at that load
(``LookupSource.needs_current_tokens``), so the loop processes the previous result first and the worker's lookup
reads current tokens; other batches keep the overlap. Only when a result is queued: SGLang's loop pops the queue
unchecked (see ``patches/spec_penalties.py``).

What it costs: on the CPU nothing measurable (the forward runs on the host either way); on a GPU (by reading) the
host's result processing of such a step no longer overlaps the device's forward, a host gap per step that the step
records do not time (they start at the forward): hence the overlap is given up only at loads where the scheduler
verifies chains (``scheduling/current_tokens.py``).
"""

from __future__ import annotations

import logging

from sglang_dspark.lookup.active import active_lookup
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

_DISABLE_OVERLAP = "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch"


def needs_current_tokens(batch) -> bool:
    source = active_lookup()
    if source is None or batch is None or not batch.spec_algorithm.is_dspark() or not batch.forward_mode.is_decode():
        return False
    return source.needs_current_tokens(batch.reqs)


def disable_overlap_for_lookup(original, self, batch, *args, **kwargs):
    if original(self, batch, *args, **kwargs):
        return True
    return len(getattr(self, "result_queue", ())) > 0 and needs_current_tokens(batch)


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_DISABLE_OVERLAP, disable_overlap_for_lookup, HookType.AROUND)
    logger.debug("sglang-dspark: lookup batches run on current tokens")
