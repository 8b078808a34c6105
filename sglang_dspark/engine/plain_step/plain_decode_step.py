"""A step the draft gate skipped, run as SGLang's own decode step, plus the draft-KV injection of its token.

Upstream's worker has one way to run a decode step: draft, then verify through a TARGET_VERIFY forward (extend
attention over the verify window, ragged layout, scatter to the strided layout, speculative accept, commit). When the
gate skips the draft, every request verifies its anchor only, so all of that machinery computes a plain decode step
the long way round. :func:`run_plain_decode_step` runs it as one instead:

* the target forward is SGLang's DECODE forward of the anchors (decode attention, no verify layout), with the aux
  hidden states captured (``CaptureHiddenMode.FULL``, as upstream's prefill does), into the KV slot upstream's verify
  would write: column 0 of the verify window the scheduler already reserved (``alloc_verify_window``);
* the token is SGLang's own sampler's (``TpModelWorker.forward_batch_generation`` samples a decode batch): greedy is
  the argmax, sampled tokens follow the non-speculative sampler's law exactly, because it is that sampler;
* the committed token's target hidden states go into the draft KV at its position (the injection upstream's
  ``commit_hidden`` does), so the next drafted step drafts from the full context; by default held and written with
  the rest of the pause in one batch before anything reads draft KV (``engine/plain_step/pending_context_kv.py``);
* the result is built by upstream's ``build_accept_outs`` (commit length 1, out tokens in the strided layout the
  scheduler reads, new sequence lengths) and published once, like upstream's step.

Taken only where the CPU/eager path is plain (:func:`plain_decode_eligible`, on top of the compact anchor-step
conditions: no penalty or logit bias, grammar, logprobs, sampling masks, simulated acceptance); anything else keeps
upstream's verify path.
"""

from __future__ import annotations

import torch

from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input
from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window
from sglang.srt.speculative.dspark_components.dspark_verify import build_accept_outs
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

# ScheduleBatch fields the decode forward reads that a speculative step keeps differently; restored after the call.
_BATCH_FIELDS = ("input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "spec_info")


def plain_decode_eligible(worker, batch) -> bool:
    """Eager target (no CUDA-graph runner: the captured graphs are verify graphs), no hybrid (mamba) state to
    commit, no HiSparse coordinator, host sequence lengths at hand, and the batch's speculative state present."""
    runner = worker.target_worker.model_runner
    return (
        getattr(runner, "decode_cuda_graph_runner", None) is None
        and not getattr(worker, "_need_mamba_verify_commit", False)
        and getattr(batch, "hisparse_coordinator", None) is None
        and batch.seq_lens_cpu is not None
        and batch.spec_info is not None
        and worker._deferred_commit() is None
    )


def run_plain_decode_step(worker, batch, on_publish) -> GenerationBatchResult:
    """One decode step of the anchors (module docstring); ``worker`` is our DSparkWorkerV2 subclass."""
    bs = len(batch.seq_lens)
    draft_input = batch.spec_info
    prefix_lens = batch.seq_lens
    width = int(worker.verify_num_draft_tokens)
    window = alloc_verify_window(
        batch=batch,
        bs=bs,
        device=worker.device,
        verify_num_draft_tokens=width,
        block_pos_offsets=worker._block_pos_offsets,
        model_runner=worker.model_runner,
        seq_lens_cpu=batch.seq_lens_cpu,
    )
    anchors = draft_input.bonus_tokens.view(-1)
    saved = {name: getattr(batch, name) for name in _BATCH_FIELDS}
    try:
        batch.input_ids = anchors
        batch.out_cache_loc = window.verify_cache_loc_2d[:, 0].contiguous()
        batch.seq_lens = prefix_lens + 1
        batch.seq_lens_cpu = saved["seq_lens_cpu"] + 1  # a new tensor: the original may be a reused buffer
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.spec_info = None  # a plain decode batch for the forward
        output = worker.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
    finally:
        for name, value in saved.items():
            setattr(batch, name, value)
    logits_output = output.logits_output
    hidden = logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("DSpark's plain decode step needs the target's aux hidden states, got None.")
    tokens = output.next_token_ids.to(torch.int64)
    worker._tp_sync.sync(SpecTpSyncSite.DSPARK_TARGET, tokens)

    gamma = int(worker._verify_executor.gamma)
    zeros = torch.zeros(bs, dtype=torch.int32, device=tokens.device)
    accept = build_accept_outs(
        correct_len=zeros,
        bonus=tokens,
        cap_trim_lens=zeros,
        prefix_lens=prefix_lens,
        draft_tokens=anchors[:, None].expand(bs, gamma),  # no draft: only the bonus column is committed
        gamma=gamma,
        verify_num_draft_tokens=width,
        tp_sync=worker._tp_sync,
        sync_site=SpecTpSyncSite.DSPARK_ACCEPT_GREEDY,
    )
    worker.model_runner.ngram_embedding_manager.update_after_verify(
        verify_ids_2d=anchors[:, None], req_pool_indices=batch.req_pool_indices, commit_lens=accept.commit_lens
    )
    if on_publish is not None:
        on_publish(accept.new_seq_lens)

    injector = worker._kv_injector
    cache_loc = injector.ids_for(window.kv_loc_plan).view(bs, width)[:, 0]
    pending = worker._pending_context_kv
    if pending is not None and injector.swa_ring_size is None:
        pending.add(hidden, cache_loc, prefix_lens)  # written with the rest of the pause (engine/plain_step/pending_context_kv.py)
    else:
        state_slot = batch.req_pool_indices if injector.swa_ring_size is not None else None
        with worker._draft_context():
            injector.inject_target_hidden(
                target_hidden=hidden, cache_loc=cache_loc, positions=prefix_lens, state_slot=state_slot
            )
    logits_output.hidden_states = None
    verify_lens = torch.ones(bs, dtype=torch.int32, device=tokens.device)
    return accepted_step_result(logits_output, accept, verify_lens=verify_lens, width=width,
                                can_run_cuda_graph=output.can_run_cuda_graph)


def accepted_step_result(logits_output, accept, *, verify_lens, width: int, can_run_cuda_graph: bool
                         ) -> GenerationBatchResult:
    """The scheduler's result of a decode step we run ourselves, as upstream's step builds it: out tokens in a
    ``width`` stride, commit lengths, the verify lengths as cap lengths, the next draft input."""
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=accept.out_tokens.reshape(-1),
        accept_lens=accept.commit_lens,
        block_accept_lens=accept.commit_lens + accept.cap_trim_lens,
        cap_lens=verify_lens,
        can_run_cuda_graph=can_run_cuda_graph,
        next_draft_input=make_next_draft_input(bonus_tokens=accept.bonus, new_seq_lens=accept.new_seq_lens),
        speculative_num_draft_tokens=width,
        new_seq_lens=accept.new_seq_lens,
    )
