"""A step without the draft that verifies lookup chains longer than the draft's block (SGLang adapter; issue #48).

Upstream's verify is built for one width, the draft's block γ + 1: the verify window, the strided logits, the accept
views and the KV reserved per request per step (``2 × (γ + 1)`` past the committed length, so that the step after a
commit of at most γ + 1 tokens still finds its window, even when it was prepared before that commit was seen). A
lookup chain is not bound to the block: where a request copies a long span, one verify of W + 1 tokens
(W = the longest chosen chain) replaces several steps. :func:`run_long_chain_step` runs such a step from upstream's
width-generic parts, at width W + 1:

* the window: ``alloc_verify_window`` at W + 1 (the KV slots were extended at plan time, :func:`reserve_chain_kv`);
* the forward: upstream's ragged target verify (``TargetVerifyExecutor.run_compact``: ragged window, TARGET_VERIFY
  forward, logits and hidden scattered to the strided layout), on a copy of the worker's executor set to W + 1;
* the accept: upstream's ``accept_and_finalize`` at W + 1 with the chains as a point-mass draft (greedy: the tokens
  equal to the target's argmax; sampled: accept x with probability p(x), else a sample of p without x, renormalised:
  the target's law), then ``build_accept_outs`` (commit lengths, out tokens in a W + 1 stride, new lengths);
* the draft KV: the committed tokens' target hidden states written at their positions (``inject_target_hidden``,
  as upstream's commit does, at W + 1), so the next drafted step drafts from the full context;
* the result carries its stride (``speculative_num_draft_tokens`` = W + 1), which SGLang's result processor reads
  per result (``batch_result_processor._get_speculative_output_stride``).

**KV** (:func:`reserve_chain_kv`, at plan time): a row verifying L > γ chain tokens may commit L + 1 tokens, so its
slots are extended, through SGLang's own ``alloc_for_spec_decode``, to committed + L + γ + 2 (its window, plus the
next step's γ + 1 window past everything it may commit): the invariant upstream's reservation keeps holds after it.
Only from free or evictable slots (SGLang's allocation evicts cached prefixes first), keeping a margin of the batch's
next reservation, so the next step is never short; a row that cannot have them verifies at most γ tokens, an ordinary
lookup row. The slots belong to the
request (``kv_allocated_len``) and are freed with it.

**Where**: the target runs eager on the host (the CPU platform: no CUDA graph, whose captured widths are γ + 1), a
full-attention KV pool with page size 1, no hybrid (mamba) state, no HiSparse, no deferred commit, and batches whose
logits nothing else reads in the strided layout (:func:`long_chain_batch_ok`: no penalty or logit bias, grammar,
logprobs, sampling-mask capture). Elsewhere chains stop at the block, as before. On a GPU (by reading): the ragged
graph runner checks the token tier, not the row width, so a wider row would replay a γ + 1-wide graph; long chains
stay off there (docs/lookup.md).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult, resolve_draft_params
from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window
from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

from sglang_dspark import envs
from sglang_dspark.engine.plain_step.anchor_only_verify import compact_anchor_step_eligible
from sglang_dspark.engine.plain_step.plain_decode_step import accepted_step_result
from sglang_dspark.engine.to_device import to_device
from sglang_dspark.scheduling.step_plan import StepPlan


def long_chains_blocker(worker) -> Optional[str]:
    """Why this server cannot verify chains past the draft's block (None: it can; module docstring, "Where")."""
    if envs.LONG_CHAINS.get() == "off":
        return f"{envs.LONG_CHAINS.name}=off"
    runner = worker.target_worker.model_runner
    if not str(getattr(runner, "device", "")).startswith("cpu"):
        return "the target is not on the host (its previous forward may still read the KV map at plan time)"
    if getattr(runner, "decode_cuda_graph_runner", None) is not None:
        return "CUDA graphs (captured at the draft's block width)"
    if getattr(worker, "_need_mamba_verify_commit", False):
        return "hybrid (mamba) state"
    if worker._deferred_commit() is not None:
        return "deferred context-KV commit"
    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    if allocator is None or int(getattr(allocator, "page_size", 1)) != 1:
        return "a paged KV allocator"
    injector = worker._kv_injector
    if injector.swa_ring_size is not None or hasattr(injector.draft_model_runner.token_to_kv_pool,
                                                     "set_swa_key_buffer_radix_fused_norm_rope"):
        return "a sliding-window draft KV pool"
    return None


def long_chain_batch_ok(worker, batch) -> bool:
    """Whether this batch may verify chains past the block: nothing reads its logits strided besides the accept
    (``compact_anchor_step_eligible``'s conditions), no HiSparse, host sequence lengths at hand."""
    return (batch.seq_lens_cpu is not None and getattr(batch, "hisparse_coordinator", None) is None
            and compact_anchor_step_eligible(worker, batch))


def reserve_chain_kv(batch, plan: StepPlan, block: int) -> StepPlan:
    """``plan`` with the KV its chains past ``block`` need (module docstring, "KV"): extended for the rows that can
    have it, the other rows cut to ``block`` tokens; the plan's chains cut to ``block`` wide when none is longer."""
    from sglang.srt.mem_cache.allocation import alloc_for_spec_decode

    chains = plan.lookup
    lengths = chains.lengths.tolist()
    allocator = batch.token_to_kv_pool_allocator
    row_width = int(batch.req_to_token_pool.req_to_token.shape[1])
    # Free and evictable (cached prefixes SGLang's own allocation evicts first), less the next step's reservation.
    free = int(allocator.available_size()) + int(batch.tree_cache.evictable_size()) - len(lengths) * 2 * (block + 1)
    rows, cur, nxt, keep = [], [], [], list(lengths)
    for i, length in enumerate(lengths):
        if length <= block:
            continue
        kv = batch.reqs[i].kv
        end = int(kv.kv_committed_len) + length + block + 2
        need = max(0, end - int(kv.kv_allocated_len))
        if end > row_width or need > free:
            keep[i] = block
            continue
        free -= need
        if need:
            rows.append(i)
            cur.append(int(kv.kv_allocated_len))
            nxt.append(end)
    if rows:
        device = batch.seq_lens.device
        index = torch.tensor(rows, dtype=torch.int64)
        cur_cpu, nxt_cpu = torch.tensor(cur, dtype=torch.int64), torch.tensor(nxt, dtype=torch.int64)
        alloc_for_spec_decode(
            batch.tree_cache, batch.req_to_token_pool, reqs=[batch.reqs[i] for i in rows],
            req_pool_indices=batch.req_pool_indices[index.to(device)], cur_kv_lens=cur_cpu.to(device),
            cur_kv_lens_cpu=cur_cpu, nxt_kv_lens=nxt_cpu.to(device), nxt_kv_lens_cpu=nxt_cpu,
            num_needed_tokens=int((nxt_cpu - cur_cpu).sum()), batch=batch,
        )
    if keep == lengths:
        return plan
    cut = torch.minimum(chains.lengths, torch.tensor(keep, dtype=chains.lengths.dtype))
    width = max(block, int(cut.max()))
    conditional = torch.where(torch.arange(chains.width) < cut[:, None], chains.conditional, 0.0)
    shortened = type(chains)(tokens=chains.tokens, lengths=cut, match_lens=chains.match_lens, conditional=conditional,
                             explored=chains.explored, kinds=chains.kinds,
                             sources=chains.sources).clipped(width)
    return StepPlan(draft=False, decision=plan.decision, lookup=shortened, overlap_given_up=plan.overlap_given_up)


def run_long_chain_step(worker, batch, plan: StepPlan, on_publish) -> GenerationBatchResult:
    """One step verifying ``plan``'s chains at their own width (module docstring); ``worker`` is our DSparkWorker."""
    chains = plan.lookup
    bs = len(batch.seq_lens)
    device = worker.device
    gamma = chains.width  # the step's "block": its longest chain
    width = gamma + 1
    draft_input = batch.spec_info
    prefix_lens = batch.seq_lens
    window = alloc_verify_window(
        batch=batch, bs=bs, device=device, verify_num_draft_tokens=width,
        block_pos_offsets=torch.arange(width, dtype=prefix_lens.dtype, device=prefix_lens.device),
        model_runner=worker.model_runner, seq_lens_cpu=batch.seq_lens_cpu,
    )
    verify_lens_cpu = (1 + chains.lengths).tolist()
    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens_cpu, device=device,
                                                 grid=(sum(verify_lens_cpu),))
    anchors = draft_input.bonus_tokens.view(-1)
    draft_block_ids = anchors[:, None].expand(bs, width).contiguous()
    draft_tokens = to_device(chains.tokens, device).to(anchors.dtype)
    sampling_info = batch.sampling_info
    params = resolve_draft_params(sampling_info=sampling_info, bs=bs, device=device)
    draft_block = DraftBlockResult(draft_tokens=draft_tokens, corrected_logits=None, greedy_mask=params.greedy_mask,
                                   temperatures=params.temperatures, greedy_draft=True)  # point masses

    executor = copy.copy(worker._verify_executor)
    executor.gamma, executor.verify_num_draft_tokens = gamma, width
    executor.verify_epilogue = None
    executor._rejection_noise = None  # the classic accept: its noise buffers are sized for the block
    target_verify, hidden_strided = executor.run_compact(
        batch=batch, layout=layout, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens, bs=bs,
        device=device, sampling_info=sampling_info, verify_window=window,
    )
    logits_output = target_verify.logits_output
    verify_ids_2d = torch.cat([anchors[:, None], draft_tokens], dim=1).contiguous()
    accept = executor.accept_and_finalize(
        folded_accept=False, bs=bs, verify_ids_2d=verify_ids_2d, target_logits=logits_output.next_token_logits,
        draft_block=draft_block, sampling_info=sampling_info, draft_input=draft_input, layout=layout,
        prefix_lens=prefix_lens, draft_tokens=draft_tokens,
    )
    worker.model_runner.ngram_embedding_manager.update_after_verify(
        verify_ids_2d=verify_ids_2d, req_pool_indices=batch.req_pool_indices, commit_lens=accept.commit_lens
    )
    if on_publish is not None:
        on_publish(accept.new_seq_lens)

    # The committed tokens' target hidden states into the draft KV (upstream's commit, at this step's width).
    injector = worker._kv_injector
    cache_loc = injector.ids_for(window.kv_loc_plan)
    with worker._draft_context():
        injector.inject_target_hidden(
            target_hidden=hidden_strided.reshape(bs * width, -1), cache_loc=cache_loc,
            cache_loc_2d=cache_loc.view(bs, width), positions=window.positions_2d.reshape(-1),
            commit_lens=accept.commit_lens,
        )
    logits_output.hidden_states = None
    return accepted_step_result(logits_output, accept, verify_lens=layout.verify_lens.to(torch.int32), width=width,
                                can_run_cuda_graph=False)


__all__ = ["long_chain_batch_ok", "long_chains_blocker", "reserve_chain_kv", "run_long_chain_step"]
