"""Every TP rank reads the same lagged confidences from DSPARK's confidence relay on the same steps (issue #46, item 3).

Under SGLang's overlap scheduler on CUDA, ``ConfidenceRelay.resolve`` (``srt/managers/overlap_utils.py``) hands the
planner the confidences of two steps back from a pinned ring slot, or None while that slot's device-to-host copy has
not landed: ``if not self.copy_done[slot].query(): return None``. That answer is each rank's own timing, and the planner
turns it into the step's verify budget (``dspark_planner.py`` ``prepare_verify_budget``: None is the uniform layout at
the full tier, confidences give a budget K and its smaller tier, ``local_verify_tier_num_tokens``), into the budget
planner's lag state (``note_non_decode_step`` on None) and into whether the step joins the ``DSPARK_PLAN`` broadcast
(``_schedule_verify_lens`` broadcasts only with a budget; ``spec_tp_sync.py``). Two TP ranks that read one slot
differently replay CUDA graphs of different tiers and one of them waits in a broadcast the other never joins: a hang.
Upstream's default verify mode (static) never reads the relay; this plugin opens compact under TP
(``engine/verify_mode.py``), which does.

``ConfidenceRelay.resolve`` (AROUND): where the TP group has more than one rank, the slot's copy event is waited on
(``synchronize``) before upstream reads it, so every rank reads confidences on every step the ring has a slot for and
the ranks compute the same budget, tier and broadcasts. The copy is a few kilobytes enqueued two steps earlier behind
that step's publish; the scheduler has already waited for that step's results (the overlap loop processes step t-2's
result before it prepares step t), so the wait is close to none (by reading; a GPU run times it). With one rank nothing
changes: its own timing decides alone, as upstream's does. Where upstream reads the relay without a copy stream
(non-CUDA devices, the synchronous bootstrap) there is no event and this hook does nothing.

The synchronous read has a flaw of its own that splits ranks (covered by tests/e2e/test_e2e_tp.py): without a copy
stream ``resolve`` returns ``confidence_buf[rows]`` with the request generations of *now*
(``pool.req_generation[rows]``), so every row reads as the current request's own confidences. A row the relay never
published for its request (its first decode step, a new request in a reused slot) then reads what the buffer holds:
``torch.empty`` memory on a slot's first use, which differs per process, or the previous request's confidences. The
budget planner takes them for known survivals: the ranks compute different budgets (and tiers) from different
garbage, and even one rank plans that step from garbage. On CUDA the ring snapshots the generations with each copy
(``gen_ring``, zeros before the first), so such a row reads generation 0 and upstream's rule counts it unknown
(survival 1, or our survival prior where one rank decides alone).
``FutureMap.publish`` (AROUND) keeps that snapshot on the host for the synchronous read on the CPU, the generation of
every row whose confidences it publishes, and ``FutureMap.resolve_confidence_cpu`` (AROUND) returns it instead of the
current generations: the same rule as the ring, on every rank count. Only where the indices are host tensors (the CPU):
on another device without a copy stream the snapshot would cost a host sync in the middle of the forward, and those
reads stay upstream's.
"""

from __future__ import annotations

import logging

import torch

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

_RESOLVE = "sglang.srt.managers.overlap_utils.ConfidenceRelay.resolve"
_PUBLISH = "sglang.srt.managers.overlap_utils.FutureMap.publish"
_RESOLVE_CPU = "sglang.srt.managers.overlap_utils.FutureMap.resolve_confidence_cpu"
# The FutureMap attribute holding, per request-pool row, the request generation its published confidences belong to.
PUBLISHED_GENERATION = "dspark_published_generation"


def tp_group_size() -> int:
    """Ranks in this process's TP group (SGLang's ``get_parallel().tp_size``); unreadable counts as more than one: a
    wait is always correct, only a rank that decides alone may skip it."""
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().tp_size or 1)
    except Exception:  # noqa: BLE001 - SGLang's ParallelContext raises RuntimeError/ValueError for an unpublished field
        return 2


def lagged_slot_event(relay, stream, publish_ready):
    """The copy event upstream's ``resolve`` would query for the lagged slot, or None where it queries none."""
    from sglang.srt.managers.overlap_utils import CONFIDENCE_RELAY_RING_DEPTH, CONFIDENCE_RELAY_RING_LAG

    if not relay.initialized or stream is None or publish_ready is None or relay.copy_done is None:
        return None
    if relay.ring_pos < CONFIDENCE_RELAY_RING_LAG:
        return None
    return relay.copy_done[(relay.ring_pos - CONFIDENCE_RELAY_RING_LAG) % CONFIDENCE_RELAY_RING_DEPTH]


def resolve_on_every_rank(original, self, batch, *, stream, publish_ready):
    """AROUND ``ConfidenceRelay.resolve``: under TP the lagged slot's copy is waited for, then upstream reads it."""
    event = lagged_slot_event(self, stream, publish_ready)
    if event is not None and tp_group_size() > 1:
        event.synchronize()
    return original(self, batch, stream=stream, publish_ready=publish_ready)


def reads_synchronously(future_map) -> bool:
    """Whether upstream's relay reads ``confidence_buf`` directly (no copy stream: every device but CUDA)."""
    return future_map.fwd_prepare_d2h_stream is None or future_map.publish_ready is None


def publish_with_generation(original, self, future_indices, new_seq_lens, confidence=None):
    """AROUND ``FutureMap.publish``: upstream's publish, then (synchronous read, host indices) the generation of every
    row whose confidences it published."""
    original(self, future_indices, new_seq_lens, confidence)
    if (confidence is None or not self.needs_confidence_relay or future_indices.shape[0] == 0
            or future_indices.device.type != "cpu" or not reads_synchronously(self)):
        return
    published = self.__dict__.get(PUBLISHED_GENERATION)
    if published is None:  # zeros: generation 0 is no request's (upstream counts rows from generation 1)
        published = torch.zeros(self.req_pool_size, dtype=torch.int64)
        setattr(self, PUBLISHED_GENERATION, published)
    rows = future_indices.to(torch.int64)
    published[rows] = self.confidence_relay.pool.req_generation[rows].to(torch.int64)


def resolve_with_published_generation(original, self, batch):
    """AROUND ``FutureMap.resolve_confidence_cpu``: on the synchronous read, the generations the confidences were
    published for, not the current ones."""
    resolved = original(self, batch)
    published = self.__dict__.get(PUBLISHED_GENERATION)
    if resolved is None or published is None or not reads_synchronously(self):
        return resolved
    from sglang.srt.managers.overlap_utils import ResolvedConfidence

    rows = batch.req_pool_indices_cpu.to(torch.int64)
    return ResolvedConfidence(confidence=resolved.confidence, generation=published[rows].clone())


@install_once
def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_RESOLVE, resolve_on_every_rank, HookType.AROUND)
    HookRegistry.register(_PUBLISH, publish_with_generation, HookType.AROUND)
    HookRegistry.register(_RESOLVE_CPU, resolve_with_published_generation, HookType.AROUND)
    logger.debug("sglang-dspark: the confidence relay reads the same confidences on every rank")


__all__ = ["PUBLISHED_GENERATION", "install", "lagged_slot_event", "publish_with_generation", "reads_synchronously",
           "resolve_on_every_rank", "resolve_with_published_generation", "tp_group_size"]
