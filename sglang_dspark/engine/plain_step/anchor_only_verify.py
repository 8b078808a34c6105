"""The verify of a step the draft gate skipped, kept at one row per request from the forward to the accept.

When the gate skips the draft, the planner verifies the anchors only (verify length 1 for every request). Upstream's
compact verify then scatters the R logits rows into the strided (R × verify width) layout, zero-filled, and runs its
accept over all R × width rows: a fill and an argmax over R × width vocabulary-wide rows to read R of them.
:class:`AnchorOnlyVerifyExecutor` (upstream's ``TargetVerifyExecutor``, re-classed) keeps the logits at one row per
request on such steps and accepts from them:

* the target forward is upstream's (``_run_ragged``: same window, KV slots, penalties-free adjustments);
* the hidden states are still scattered to the strided layout, because upstream's draft-KV injection reads them
  there (cheap: the captured width, not the vocabulary);
* the accept is upstream's accept at width 1 (``accept_draft_tokens`` with no draft token): greedy rows take the
  anchor row's argmax, sampled rows draw from the anchor row's target distribution (temperature, top-k/top-p/min-p
  as the sampled verify forms it, our exact-filter patch included); ``build_accept_outs`` then builds the commit
  lengths and the (R × width) out tokens exactly as upstream.

Greedy output is the target's argmax either way, so no token changes; a sampled token has the same law as upstream's
(``tests/unit/engine/test_anchor_only_verify.py`` compares the two samplers). The fast path is taken only where nothing
downstream reads the strided logits (:func:`compact_anchor_step_eligible`); any other step runs upstream's code.
"""

from __future__ import annotations

from sglang.kernels.ops.speculative.dspark.dspark_verify_window import (
    BuildRaggedVerifyWindow,
    ScatterCompactToStrided,
)
from sglang.srt.speculative.dspark_components import dspark_verify
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult
from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyExecutor, build_accept_outs
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

from sglang_dspark.engine.current_step import CurrentStep


def compact_anchor_step_eligible(worker, batch) -> bool:
    """Whether a gate-skipped step may keep its logits compact: a batch whose logits nothing else reads strided (no
    grammar mask, no logprobs, no sampling-mask capture, no logits adjustment such as a penalty or a logit bias, no
    simulated acceptance, no block-accept recorder) and no verify epilogue (CUDA-graph buffers)."""
    executor = worker._verify_executor
    sampling_info = batch.sampling_info
    # Read through the module: sglang-dspark's penalty patch wraps this predicate (False when penalised).
    if not dspark_verify.verify_logits_adjustments_are_noop(sampling_info):
        return False
    if getattr(sampling_info, "sampling_mask_batch_indices", None) is not None:
        return False
    if batch.has_grammar or batch.return_logprob or getattr(batch, "return_hidden_states", False):
        return False
    if executor.verify_epilogue is not None or executor._simulated_correct_len is not None:
        return False
    if getattr(worker, "_simulate_acc_greedy", False) or getattr(worker, "_sim_draw_ahead", False):
        return False
    return getattr(worker._observers, "_block_accept_recorder", None) is None


class AnchorOnlyVerifyExecutor(TargetVerifyExecutor):
    """Upstream's verify executor plus a compact anchor-only step (module docstring), taken on steps planned so
    (``StepPlan.compact_anchor``, after :func:`compact_anchor_step_eligible`)."""

    step = CurrentStep()  # the worker's, shared when the gate is installed (engine/current_step.py)

    def run_compact(self, *, batch, layout, draft_block_ids, draft_tokens, bs, device, sampling_info,
                    verify_window, inject_gate=False):
        if not self.step.plan.compact_anchor:
            return super().run_compact(
                batch=batch, layout=layout, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens, bs=bs,
                device=device, sampling_info=sampling_info, verify_window=verify_window, inject_gate=inject_gate,
            )
        if layout.verify_lens_cpu is not None and max(layout.verify_lens_cpu) != 1:
            raise RuntimeError("compact anchor step with a verify length above 1: the planner did not skip the draft")
        # Upstream's run_compact up to the forward (no epilogue: compact_anchor_step_eligible).
        ragged_window = BuildRaggedVerifyWindow.execute(
            batch=batch, layout=layout, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens, bs=bs,
            device=device, verify_num_draft_tokens=self.verify_num_draft_tokens, model_runner=self.model_runner,
        )
        target_verify = self._run_ragged(
            batch=batch, layout=layout, ragged_window=ragged_window, sampling_info=sampling_info,
            kv_loc_plan=verify_window.kv_loc_plan,
        )
        logits_output = target_verify.logits_output
        if logits_output.hidden_states is None:
            raise RuntimeError("DSpark verify requires target hidden states, got None.")
        # Where we diverge: the logits stay one row per request (the anchor's); only the hidden states take the
        # strided layout the draft-KV injection reads.
        hidden_strided = ScatterCompactToStrided.execute(
            compact=logits_output.hidden_states, layout=layout, fill_value=0.0,
            verify_num_draft_tokens=self.verify_num_draft_tokens,
        )
        logits_output.hidden_states = hidden_strided
        return target_verify, hidden_strided

    def accept_and_finalize(self, *, folded_accept, bs, verify_ids_2d, target_logits, draft_block, sampling_info,
                            draft_input, layout, prefix_lens, draft_tokens, simulate_bonus_sampling_info=None):
        if not self.step.plan.compact_anchor:
            return super().accept_and_finalize(
                folded_accept=folded_accept, bs=bs, verify_ids_2d=verify_ids_2d, target_logits=target_logits,
                draft_block=draft_block, sampling_info=sampling_info, draft_input=draft_input, layout=layout,
                prefix_lens=prefix_lens, draft_tokens=draft_tokens,
                simulate_bonus_sampling_info=simulate_bonus_sampling_info,
            )
        # Upstream's accept at verify width 1 (no draft token): greedy rows take the anchor row's argmax, sampled rows
        # draw from the anchor row's target distribution (the chain sampler with no draft samples its bonus from
        # target row 0; the same law as upstream's strided accept of the one-hot placeholder, which accepts it with
        # its target probability and otherwise resamples from the rest).
        no_draft = DraftBlockResult(
            draft_tokens=draft_tokens[:, :0],
            corrected_logits=None,
            greedy_mask=draft_block.greedy_mask,
            temperatures=draft_block.temperatures,
            greedy_draft=True,
        )
        correct_len, bonus, cap_trim_lens = dspark_verify.accept_draft_tokens(
            candidates=verify_ids_2d[:, :1],
            target_logits=target_logits,
            draft_block=no_draft,
            sampling_info=sampling_info,
            draft_input=draft_input,
            gamma=0,
            verify_num_draft_tokens=1,
            fused_argmax=self._fused_argmax,
        )
        greedy = sampling_info is None or sampling_info.is_all_greedy
        return build_accept_outs(
            correct_len=correct_len,
            bonus=bonus,
            cap_trim_lens=cap_trim_lens,
            prefix_lens=prefix_lens,
            draft_tokens=draft_tokens,
            gamma=self.gamma,
            verify_num_draft_tokens=self.verify_num_draft_tokens,
            tp_sync=self._tp_sync,
            sync_site=SpecTpSyncSite.DSPARK_ACCEPT_GREEDY if greedy else SpecTpSyncSite.DSPARK_ACCEPT_SAMPLE,
        )
