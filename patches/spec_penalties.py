"""Exact frequency/presence/repetition/min_new_tokens penalties for DSPARK (SGLang 0.5.23 hooks; maths in
``sglang_dspark.kernels.verify_penalties``).

What SGLang 0.5.23 does with a penalised DSPARK request (read from the source, and measured: at T=0 DSPARK returned
its own no-penalty output while no-spec's output changed):

* Bookkeeping never runs. ``ScheduleBatch.prepare_for_decode`` hands speculative batches to
  ``spec_prepare_for_decode`` and returns before ``cumulate_penalty_output_tokens`` (managers/schedule_batch.py
  3754-3770); EAGLE feeds one token itself (speculative/eagle_utils.py 860-863), DFLASH/DSPARK's
  ``DFlashDraftInputV2.prepare_for_decode`` (speculative/dflash_info_v2.py 114-) never does. The penalizer state of
  a DSPARK request stays at "nothing generated" (and min_new_tokens would mask stop ids forever).
* The verify ignores it anyway. The forward sees ``copy_for_forward()`` (sampling_batch_info.py 679-682:
  ``penalizer_orchestrator=None``, penalties pre-accumulated into ``acc_additive_penalties`` /
  ``acc_scaling_penalties``), but ``apply_dflash_verify_logits_adjustments`` (speculative/dflash_utils.py 201-287)
  reads ``penalizer_orchestrator`` (None) and ``acc_linear_penalties`` (a name no 0.5.23 code sets), so it adds
  only ``logit_bias``. ``verify_logits_adjustments_are_noop`` (dspark_verify.py 92-108) therefore also lets a
  penalised greedy batch take the folded in-graph accept on GPU.
* Even when it applies one, it is one row added to every window position (``linear_penalty[:, None, :]``,
  dflash_utils.py 249-262): position j ignores the draft tokens before it, and a multiplicative repetition penalty
  cannot be written as an added row at all.

What this module installs (``install()``, HookRegistry):

1. ``ScheduleBatch.prepare_for_extend`` (AFTER): remember per request how many output tokens the penalizer rows
   have seen (a fresh row after a prefill, as SGLang's own rows are fresh then).
2. ``Scheduler.run_batch`` (AROUND): before a DSPARK decode forward whose batch needs penalties, feed every output
   token committed since, in order, one step per token (``cumulate_committed_tokens``), so the state equals what a
   non-speculative decode of the same output has (``cumulate_output_tokens`` once per token).
3. ``Scheduler.is_disable_overlap_for_batch`` (AROUND): such a batch runs after the previous result is processed,
   so ``req.output_ids`` holds every committed token when (2) reads it. Only when a result is queued: the overlap
   loop answers True with ``result_queue.popleft()`` unchecked (scheduler.py ``event_loop_overlap`` ~2068-2097),
   and the queue is empty after an iteration that ran no batch (``update_running_batch`` returns None when the KV
   pool is full and a request finishes in flight, scheduler.py ~4466-4471): answering True with an empty queue
   raises ``IndexError`` in the loop (fatal to the scheduler). An empty queue means ``output_ids`` is already
   current. (DSPARK runs overlapped on the CPU too: SGLang disables overlap on a CPU for EAGLE and NGRAM only.)
4. ``SamplingBatchInfo.copy_for_forward`` (AROUND): the forward copy carries the penalizer tensors
   (``_dspark_penalty_state``), which the orchestrator-less copy otherwise loses.
5. ``TargetVerifyExecutor.run_non_compact`` / ``run_compact`` (AROUND): with penalties, run upstream's verify
   without its adjustments, then penalise every window position exactly (``penalize_verify_window``), then add
   ``logit_bias`` and run custom logit processors, in the non-speculative sampler's order (penalties, bias, then
   processors). Greedy accept, rejection sampling, the bonus token and logprobs all read these logits.
6. ``verify_logits_adjustments_are_noop`` (AROUND): False with penalties, so the GPU folded/greedy-graph accept
   paths (which never see our logits) are not taken.

Non-DSPARK batches and DSPARK batches without penalties take upstream's code unchanged.
"""

from __future__ import annotations

import logging

import torch

from sglang_dspark.kernels.verify_penalties import PenaltyState, cumulate_committed_tokens, penalize_verify_window
from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

STATE_ATTR = "_dspark_penalty_state"
FED_ATTR = "_dspark_penalty_fed"

_PREPARE_FOR_EXTEND = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
_DISABLE_OVERLAP = "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch"
_COPY_FOR_FORWARD = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward"
_RUN_NON_COMPACT = "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor.run_non_compact"
_RUN_COMPACT = "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor.run_compact"
_ADJUSTMENTS_NOOP = "sglang.srt.speculative.dspark_components.dspark_verify.verify_logits_adjustments_are_noop"

# The penalizers penalty_state reads; any other is logged once and not applied inside verify windows.
KNOWN_PENALIZERS = {
    "BatchedFrequencyPenalizer",
    "BatchedPresencePenalizer",
    "BatchedRepetitionPenalizer",
    "BatchedMinNewTokensPenalizer",
}
_warned_unknown = False


def penalty_state(orchestrator) -> PenaltyState | None:
    """The live penalizer tensors of an orchestrator (references, not copies), or None when none is prepared."""
    global _warned_unknown
    if orchestrator is None or not orchestrator.is_required:
        return None
    state = PenaltyState()
    for penalizer in orchestrator.penalizers.values():
        if not penalizer.is_prepared():
            continue
        name = type(penalizer).__name__
        if name == "BatchedFrequencyPenalizer":
            state.frequency = penalizer.frequency_penalties
            state.cum_frequency = penalizer.cumulated_frequency_penalties
        elif name == "BatchedPresencePenalizer":
            state.presence = penalizer.presence_penalties
            state.cum_presence = penalizer.cumulated_presence_penalties
        elif name == "BatchedRepetitionPenalizer":
            state.repetition = penalizer.repetition_penalties
            state.cum_repetition = penalizer.cumulated_repetition_penalties
        elif name == "BatchedMinNewTokensPenalizer":
            state.min_new_tokens = penalizer.min_new_tokens
            state.len_output = penalizer.len_output_tokens
            state.stop_penalties = penalizer.stop_token_penalties
        elif not _warned_unknown:
            _warned_unknown = True
            logger.warning("sglang-dspark: penalizer %s is not applied inside DSPARK verify windows", name)
    return state if state.active else None


def _is_penalised_dspark_decode(batch) -> bool:
    if batch is None or not batch.spec_algorithm.is_dspark() or not batch.forward_mode.is_decode():
        return False
    info = batch.sampling_info
    orchestrator = getattr(info, "penalizer_orchestrator", None) if info is not None else None
    return orchestrator is not None and orchestrator.is_required


# ---- bookkeeping (scheduler side) ----


def remember_prefilled_outputs(result, self, *args, **kwargs):
    """AFTER ScheduleBatch.prepare_for_extend: this batch's penalizer rows start fresh (SGLang creates them with
    zero counts), so they have seen none of the request's current output tokens (non-empty after a retraction)."""
    for req in self.reqs:
        setattr(req, FED_ATTR, len(req.output_ids))
    return result


def feed_committed_tokens(batch) -> None:
    """Feed each request's output tokens committed since the last feed, one SGLang step per token."""
    state = penalty_state(batch.sampling_info.penalizer_orchestrator)
    if state is None:
        return
    new_tokens = []
    for req in batch.reqs:
        fed = getattr(req, FED_ATTR, None)
        if fed is None:  # joined without a prefill we saw: treat its penalizer row as fresh now
            fed = len(req.output_ids)
        new_tokens.append(req.output_ids[fed:])
        setattr(req, FED_ATTR, len(req.output_ids))
    longest = max((len(t) for t in new_tokens), default=0)
    if longest == 0:
        return
    tokens = torch.zeros((len(new_tokens), longest), dtype=torch.int64)
    for row, toks in enumerate(new_tokens):
        if toks:
            tokens[row, : len(toks)] = torch.as_tensor(toks, dtype=torch.int64)
    num_new = torch.tensor([len(t) for t in new_tokens], dtype=torch.int64)
    device = state.cum_frequency.device if state.cum_frequency is not None else batch.device
    cumulate_committed_tokens(state, tokens.to(device, non_blocking=True), num_new.to(device, non_blocking=True))


def run_batch_feeding_penalties(original, self, batch, *args, **kwargs):
    """AROUND Scheduler.run_batch: bring a penalised DSPARK decode batch's penalizer state up to date first."""
    if _is_penalised_dspark_decode(batch):
        feed_committed_tokens(batch)
    return original(self, batch, *args, **kwargs)


def disable_overlap_for_penalised_dspark(original, self, batch, *args, **kwargs):
    """AROUND Scheduler.is_disable_overlap_for_batch: under overlap, req.output_ids lags one step; process the
    previous result first so the feed in run_batch sees every committed token. With no result queued there is
    nothing to process (and SGLang's loop would pop an empty queue): upstream's own grammar sync checks the same."""
    if original(self, batch, *args, **kwargs):
        return True
    return _is_penalised_dspark_decode(batch) and len(getattr(self, "result_queue", ())) > 0


def copy_for_forward_with_penalty_state(original, self, *args, **kwargs):
    """AROUND SamplingBatchInfo.copy_for_forward: keep the penalizer tensors on the orchestrator-less copy."""
    copy = original(self, *args, **kwargs)
    state = penalty_state(self.penalizer_orchestrator)
    if state is not None:
        object.__setattr__(copy, STATE_ATTR, state)
    return copy


# ---- verify (worker side) ----


def apply_exact_verify_adjustments(next_token_logits, sampling_info, window_ids, state) -> None:
    """Penalties per position, then logit_bias, then custom logit processors (the non-speculative order:
    ``apply_logits_bias`` in the model runner, processors in the sampler). In place on [bs * W, V]."""
    bs, width = window_ids.shape
    penalize_verify_window(next_token_logits, window_ids, state)
    logit_bias = getattr(sampling_info, "logit_bias", None)
    if logit_bias is not None:
        next_token_logits.view(bs, width, -1).add_(
            logit_bias.to(device=next_token_logits.device, dtype=next_token_logits.dtype)[:, None, :]
        )
    if sampling_info.has_custom_logit_processor:
        from sglang.srt.layers.sampler import apply_custom_logit_processor

        apply_custom_logit_processor(next_token_logits, sampling_info, num_tokens_in_batch=width)


def _state_for(sampling_info):
    return getattr(sampling_info, STATE_ATTR, None) if sampling_info is not None else None


def run_non_compact_with_penalties(original, self, *, sampling_info, verify_ids_2d, **kwargs):
    state = _state_for(sampling_info)
    if state is None:
        return original(self, sampling_info=sampling_info, verify_ids_2d=verify_ids_2d, **kwargs)
    result = original(self, sampling_info=None, verify_ids_2d=verify_ids_2d, **kwargs)
    apply_exact_verify_adjustments(result.logits_output.next_token_logits, sampling_info, verify_ids_2d, state)
    return result


def run_compact_with_penalties(original, self, *, sampling_info, draft_block_ids, draft_tokens, **kwargs):
    state = _state_for(sampling_info)
    if state is None:
        return original(
            self, sampling_info=sampling_info, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens, **kwargs
        )
    target_verify, hidden_strided = original(
        self, sampling_info=None, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens, **kwargs
    )
    bs = draft_tokens.shape[0]
    # The strided window the worker verifies: anchor then draft tokens (dspark_worker_v2 builds verify_ids_2d so).
    window_ids = torch.cat([draft_block_ids[:bs, :1], draft_tokens], dim=1)
    apply_exact_verify_adjustments(target_verify.logits_output.next_token_logits, sampling_info, window_ids, state)
    return target_verify, hidden_strided


def adjustments_noop_unless_penalised(original, sampling_info, *args, **kwargs):
    if _state_for(sampling_info) is not None:
        return False
    return original(sampling_info, *args, **kwargs)


@install_once
def install() -> None:
    """Register the hooks (every SGLang process; they act only on DSPARK batches with penalties)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_PREPARE_FOR_EXTEND, remember_prefilled_outputs, HookType.AFTER)
    HookRegistry.register(_RUN_BATCH, run_batch_feeding_penalties, HookType.AROUND)
    HookRegistry.register(_DISABLE_OVERLAP, disable_overlap_for_penalised_dspark, HookType.AROUND)
    HookRegistry.register(_COPY_FOR_FORWARD, copy_for_forward_with_penalty_state, HookType.AROUND)
    HookRegistry.register(_RUN_NON_COMPACT, run_non_compact_with_penalties, HookType.AROUND)
    HookRegistry.register(_RUN_COMPACT, run_compact_with_penalties, HookType.AROUND)
    HookRegistry.register(_ADJUSTMENTS_NOOP, adjustments_noop_unless_penalised, HookType.AROUND)
    logger.debug("sglang-dspark: exact DSPARK penalties installed")
