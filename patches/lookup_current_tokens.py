"""A DSPARK decode batch with a prompt-lookup match runs after the previous result is processed (issue #39).

Under SGLang's overlap scheduler (its default, DSPARK on the CPU included) a batch is launched before the previous
batch's result is processed, so ``req.output_ids`` lags a step and a lookup of the request's tail would propose what
follows a stale tail. ``Scheduler.is_disable_overlap_for_batch`` (AROUND) answers True for a DSPARK decode batch where
any request's tail, as the scheduler holds it, recurs in its context and chains are being verified at that load
(``LookupSource.needs_current_tokens``, reached through the scheduler's own draft worker: ``lookup_of``), so the
loop processes the previous result first and the worker's lookup reads current tokens; other batches keep the
overlap. Only when a result is queued: SGLang's loop pops the queue unchecked (see ``patches/spec_penalties.py``).

What it costs: on the CPU nothing (the forward runs on the host either way); on a GPU (by reading) the host's result
processing of such a step no longer overlaps the device's forward, a device idle gap before the step
(``StepRecord.gap_seconds``, learned by ``profiler/overlap_gap.py``): hence the overlap is given up only at loads
where chains are verified and pay for it (``scheduling/current_tokens.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

# The attribute of SGLang's ScheduleBatch that carries its BatchLaunch from the scheduler loop to our planner.
LAUNCH_ATTRIBUTE = "sglang_dspark_launch"


@dataclass(frozen=True)
class BatchLaunch:
    """What the scheduler knew of a decode batch when it launched it.

    ``tokens_current``: no earlier batch's result was still unprocessed, so every request's host tokens
    (``origin_input_ids + output_ids``) and committed KV length are current; ``overlap_given_up``: the batch waited
    for the previous result because of a lookup match (what ``scheduling/current_tokens.py`` charges)."""

    tokens_current: bool
    overlap_given_up: bool = False


_DISABLE_OVERLAP = "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch"


def lookup_of(scheduler):
    """The scheduler's prompt lookup: our DSPARK worker's (``DSparkWorker.lookup_source``; None: another worker,
    upstream's included, or no draft worker)."""
    return getattr(getattr(scheduler, "draft_worker", None), "lookup_source", None)


def _lookup_decode_batch(lookup, batch) -> bool:
    return (lookup is not None and lookup.enabled and batch is not None and batch.spec_algorithm.is_dspark()
            and batch.forward_mode.is_decode())


def needs_current_tokens(lookup, batch) -> bool:
    if not _lookup_decode_batch(lookup, batch) or batch.has_grammar:
        return False
    return lookup.needs_current_tokens(batch.reqs)


def disable_overlap_for_lookup(original, self, batch, *args, **kwargs):
    lookup = lookup_of(self)
    queued = len(getattr(self, "result_queue", ())) > 0
    disabled = bool(original(self, batch, *args, **kwargs))
    given_up = not disabled and queued and needs_current_tokens(lookup, batch)
    if _lookup_decode_batch(lookup, batch):
        # The loop processes the queued result before this launch exactly when the answer is True.
        setattr(batch, LAUNCH_ATTRIBUTE, BatchLaunch(tokens_current=disabled or given_up or not queued,
                                                     overlap_given_up=given_up))
    return disabled or given_up


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_DISABLE_OVERLAP, disable_overlap_for_lookup, HookType.AROUND)
    logger.debug("sglang-dspark: lookup batches run on current tokens")
