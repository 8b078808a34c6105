"""Exact frequency/presence/repetition/min_new_tokens penalties for non-speculative batches under SGLang's overlap
scheduler (SGLang 0.5.23 hooks; switch ``SGLANG_DSPARK_OVERLAP_PENALTIES``).

Why we diverge from upstream (read from the source; measured against a transformers ground truth on the CPU,
``tests/e2e/test_e2e_penalties.py``): the penalizers count a decode step's input token (the token generated last)
in ``ScheduleBatch.cumulate_penalty_output_tokens``, called from ``prepare_for_decode`` (managers/schedule_batch.py
3715-3770), which reads it from ``req.output_ids[-1]``. The overlap loop (scheduler.py ``event_loop_overlap``
2061-2134) prepares batch k before it processes the result of step k-1, so ``output_ids`` still lacks that token:
step k counts the token of step k-2; the first decode, with no output yet, counts the last *prompt* token
(``origin_input_ids[-1]``); and when a prefill runs between two decode steps, one token is never counted and the
next is counted twice. Without overlap the result is processed first and the count is exact; the overlap loop is
SGLang's default for no-spec, on GPUs and on the CPU. Checked by ``tests/e2e/test_e2e_penalties.py``'s lag probe:
with this module every request equals the ground truth, and its control (upstream's count) must be off it
(docs/reliability.md, Penalties).

What this module installs (``install()``, HookRegistry), only for non-speculative batches of an overlap server:

1. ``ScheduleBatch.cumulate_penalty_output_tokens`` (AROUND): feed nothing; mark each request's row as owing one
   token (``PENDING_ATTR``) instead.
2. ``Scheduler._forward_isolation`` (AROUND, ``overlap=True``; scheduler.py 4568-4612, entered at 4683): at
   forward entry, on the forward stream, the batch's ``input_ids`` already hold each row's real input token
   (``resolve_forward_inputs`` gathers them from the ``FutureMap``, where the previous forward's sampler left them).
   Feed the owing rows that token (a mixed chunk's prefill rows owe nothing), then let upstream's
   ``copy_for_forward`` accumulate the penalties this step samples with. So each generated token is counted before
   the next one is sampled, exactly as without overlap, from a device tensor: no host sync, and no host-to-device
   copy for a decode batch. The schedule stream then waits (on the device) for this point of the forward stream:
   the next batch's ``filter``/``merge`` read and replace the penalizer tensors there.

Speculative batches (DSPARK: ``spec_penalties``; EAGLE feeds itself), non-overlap servers and batches without
penalties take upstream's code unchanged.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from sglang_dspark.kernels.verify_penalties import cumulate_committed_tokens
from sglang_dspark.patches.install_once import install_once
from sglang_dspark.patches.spec_penalties import penalty_state

logger = logging.getLogger(__name__)

PENDING_ATTR = "_dspark_penalty_token_pending"

_CUMULATE = "sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens"
_FORWARD_ISOLATION = "sglang.srt.managers.scheduler.Scheduler._forward_isolation"


def defer_cumulate_to_forward(original, self, *args, **kwargs):
    """AROUND ScheduleBatch.cumulate_penalty_output_tokens: under overlap (non-speculative) the token upstream would
    feed is one step stale; mark the rows instead, the forward feeds their real input token."""
    if not (self.enable_overlap and self.spec_algorithm.is_none()):
        return original(self, *args, **kwargs)
    for req in self.reqs:
        setattr(req, PENDING_ATTR, True)
    return None


def _orchestrator(batch):
    info = batch.sampling_info
    return getattr(info, "penalizer_orchestrator", None) if info is not None else None


def _last_input_tokens(batch) -> torch.Tensor:
    """Each request row's last input token of this forward, [len(reqs)] int64 on the batch's device.

    Decode: ``input_ids`` holds one token per row (a beam tail's rows follow the requests' rows). Extend-shaped
    batches (a mixed chunk, a decode viewed as extend under DP attention): each row's tokens are contiguous, in
    row order, ``extend_lens[i]`` of them."""
    input_ids = batch.input_ids
    if batch.forward_mode.is_decode():
        return input_ids[: len(batch.reqs)].to(torch.int64)
    from sglang.srt.utils.common import is_pin_memory_available

    ends, total = [], 0
    for length in batch.extend_lens:
        total += int(length)
        ends.append(total - 1)
    positions = torch.tensor(ends, dtype=torch.int64, pin_memory=is_pin_memory_available(input_ids.device))
    return input_ids[positions.to(input_ids.device, non_blocking=True)].to(torch.int64)


def feed_pending_input_tokens(batch) -> bool:
    """Count, in the batch's penalizers, the input token of every row that owes one (marked by
    :func:`defer_cumulate_to_forward`), with the device ops of upstream's ``cumulate_output_tokens``; clear the marks.

    Precondition: ``batch.input_ids`` is resolved (forward entry). Runs on the current stream, reads no value back
    to the host. Returns whether anything was fed."""
    orchestrator = _orchestrator(batch)
    if orchestrator is None or not orchestrator.is_required:
        return False
    owing = [bool(getattr(req, PENDING_ATTR, False)) for req in batch.reqs]
    if not any(owing):
        return False
    for req, owes in zip(batch.reqs, owing):
        if owes:
            setattr(req, PENDING_ATTR, False)
    tokens = _last_input_tokens(batch)
    if all(owing):  # every decode batch: upstream's own call, with the right tokens
        orchestrator.cumulate_output_tokens(tokens)
        return True
    # A mixed chunk: prefill rows owe nothing, decode rows one token each.
    from sglang.srt.utils.common import is_pin_memory_available

    state = penalty_state(orchestrator)
    if state is not None:
        num_new = torch.tensor(owing, dtype=torch.int64, pin_memory=is_pin_memory_available(tokens.device))
        cumulate_committed_tokens(state, tokens[:, None], num_new.to(tokens.device, non_blocking=True))
    return True


def forward_isolation_feeding_penalties(original, self, batch, *args, overlap: bool, **kwargs):
    """AROUND Scheduler._forward_isolation: under overlap, feed the owing rows before upstream accumulates the
    penalties of this forward (its ``copy_for_forward`` on entry)."""
    if not overlap or batch is None or not batch.spec_algorithm.is_none():
        return original(self, batch, *args, overlap=overlap, **kwargs)
    return _isolation_after_feed(original, self, batch, *args, **kwargs)


@contextlib.contextmanager
def _isolation_after_feed(original, scheduler, batch, *args, **kwargs):
    fed = feed_pending_input_tokens(batch)
    with original(scheduler, batch, *args, overlap=True, **kwargs):
        if fed:
            # The fed tensors and the penalties read from them live on the forward stream; the next batch's
            # filter/merge run on the schedule stream. Order them on the device, the host does not wait.
            scheduler.schedule_stream.wait_stream(scheduler.forward_stream)
        yield


@install_once
def install() -> None:
    """Register the hooks (every SGLang process; they act only on non-speculative batches of overlap servers)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_CUMULATE, defer_cumulate_to_forward, HookType.AROUND)
    HookRegistry.register(_FORWARD_ISOLATION, forward_isolation_feeding_penalties, HookType.AROUND)
    logger.debug("sglang-dspark: exact penalties under the overlap scheduler installed")
