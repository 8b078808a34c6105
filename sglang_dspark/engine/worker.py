"""Our DSPARK worker: upstream's ``DSparkWorkerV2``, swapped in for it through ``HookRegistry`` (REPLACE).

SGLang reserves the name DSPARK and builds the worker with a call-time import of
``dspark_worker_v2.DSparkWorkerV2`` (spec_info.py, ``create_worker``), so replacing that module attribute in every
scheduler process is how ``--speculative-algorithm DSPARK`` reaches this class. Upstream's pipeline (draft block,
Markov sampling, verify, accept, commit) is correct and reused as is. What we add lives in our planner
(``sglang_dspark/engine/planner.py``: admission policy, SPS table, cost model, draft gate, admission record); the
worker times each decode step and forwards it to the planner, without a host sync (``engine/step_record.py``).

Draft gate (``SGLANG_DSPARK_DRAFT_GATE``): before a decode step the planner decides whether the draft block pays
this step. When it does not, the proposer (re-classed to :class:`GatedDraftBlockProposer`) returns a placeholder
block instead of running the draft forward, the LM head over the γ slots, the Markov loop and the confidence head,
and the planner verifies the anchors only (verify length 1 for every request). Where nothing reads the strided
logits (no penalty, logit bias, grammar, logprobs) such a step runs as SGLang's own decode step plus the draft-KV
injection when the target is eager (``engine/plain_step/plain_decode_step.py``), else through upstream's verify with the logits
kept at one row per request (:class:`AnchorOnlyVerifyExecutor`, ``engine/plain_step/anchor_only_verify.py``). Otherwise
everything after the draft is upstream's step: the verify of the anchor gives the target's own next token (greedy,
or sampled through the rejection step against a one-hot placeholder, which returns a sample of the target
distribution), and
``commit_hidden`` still writes the committed token's target hidden states into the draft KV, so the next drafted
step drafts from the full context.

``SGLANG_DSPARK_WORKER=upstream`` keeps upstream's class (documented; used to compare side by side).
"""

from __future__ import annotations

import functools
import logging
import os

import msgspec
import torch

from sglang.srt.speculative.dspark_components.dspark_draft import (
    DraftBlockProposer,
    DraftBlockResult,
    DraftProposal,
    resolve_draft_params,
)
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

from sglang_dspark import envs

from sglang_dspark.engine.plain_step.anchor_only_verify import AnchorOnlyVerifyExecutor, compact_anchor_step_eligible
from sglang_dspark.engine.plain_step.pending_context_kv import PendingContextKv
from sglang_dspark.engine.plain_step.plain_decode_step import plain_decode_eligible, run_plain_decode_step
from sglang_dspark.engine.current_step import CurrentStep
from sglang_dspark.engine.long_chain_step import long_chain_batch_ok, long_chains_blocker, run_long_chain_step
from sglang_dspark.engine.step_record import StepRecorder
from sglang_dspark.engine.to_device import to_device
from sglang_dspark.scheduling.step_plan import DRAFTED, StepPlan

logger = logging.getLogger(__name__)

UPSTREAM_WORKER_TARGET = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"


def use_upstream_worker() -> bool:
    return envs.WORKER.get() == "upstream"


class GatedDraftBlockProposer(DraftBlockProposer):
    """Upstream's proposer, plus a plain step: on a step planned without the draft, ``propose`` runs no draft at all.

    The placeholder proposal: the anchor (the committed bonus token) in column 0 of the block ids, as upstream's
    forward writes it; the anchor repeated as the γ "draft tokens" (always a valid token id); a one-hot (greedy)
    draft distribution; no confidences. Under the anchor-only layout none of these placeholder tokens is verified.
    Should a step ever verify them (a full-width verify past the captured graph grid), acceptance stays exact:
    greedy accepts only tokens equal to the target's argmax, and rejection sampling against any draft
    distribution, one-hot included, outputs the target distribution."""

    step = CurrentStep()  # the worker's, shared when the gate is installed

    def propose(self, *, batch, draft_input, verify_window, bs, device, target_model, sampling_info,
                anchor_prepared=False):
        plan = self.step.plan
        if plan.draft:
            proposal = super().propose(
                batch=batch, draft_input=draft_input, verify_window=verify_window, bs=bs, device=device,
                target_model=target_model, sampling_info=sampling_info, anchor_prepared=anchor_prepared,
            )
            return proposal if plan.lookup is None else with_lookup_rows(proposal, plan.lookup, device)
        block_ids = self.draft_block_ids_view(bs=bs, device=batch.seq_lens.device)
        if not anchor_prepared:
            block_ids[:, 0].copy_(draft_input.bonus_tokens.view(-1))
        params = resolve_draft_params(sampling_info=sampling_info, bs=bs, device=device)
        if plan.lookup is not None:
            # The lookup chains (the rows without one verify their anchor only: their fill is never verified).
            draft_tokens = to_device(plan.lookup.tokens, device).to(block_ids.dtype)
        else:
            draft_tokens = block_ids[:, :1].expand(bs, self.gamma).contiguous()
        draft_block = DraftBlockResult(
            draft_tokens=draft_tokens,
            corrected_logits=None,
            greedy_mask=params.greedy_mask,
            temperatures=params.temperatures,
            greedy_draft=True,  # a one-hot draft distribution: exactly a lookup chain's point mass
        )
        return DraftProposal(
            draft_block_ids=block_ids if self.sample_from_anchor else block_ids[:, : self.gamma].contiguous(),
            draft_block=draft_block,
        )


def with_lookup_rows(proposal: DraftProposal, lookup, device) -> DraftProposal:
    """A drafted step's proposal with the lookup rows' chains in place of the draft's: their tokens, a point-mass
    draft distribution (logits -inf but at the chain's token, so the sampled accept's q is one-hot), and their
    acceptance estimates as confidences, which the verify-length schedule ranks with the draft's. The folded
    (in-graph) verify ids and accept read the draft graph's own buffers, so the step takes the eager path."""
    block = proposal.draft_block
    rows = to_device(lookup.rows, device)
    tokens = to_device(lookup.tokens, device).to(block.draft_tokens.dtype)
    draft_tokens = torch.where(rows[:, None], tokens, block.draft_tokens)
    corrected = block.corrected_logits
    if corrected is not None and not block.greedy_draft:
        # Only the lookup rows' [n, γ, V] point masses are built (row indices from the host plan: no device read),
        # then copied over those rows: one full-size copy of the logits, not two.
        index = to_device(lookup.rows.nonzero().squeeze(-1), device)
        point_mass = torch.full((index.shape[0], *corrected.shape[1:]), float("-inf"), dtype=corrected.dtype,
                                device=corrected.device)
        point_mass.scatter_(-1, draft_tokens.index_select(0, index).unsqueeze(-1).to(torch.int64), 0.0)
        corrected = corrected.index_copy(0, index, point_mass)
    confidence = proposal.confidence
    if confidence is not None:
        estimates = to_device(lookup.conditional, device).to(confidence.dtype)
        confidence = torch.where(rows[:, None], estimates, confidence)
    return msgspec.structs.replace(
        proposal,
        draft_block=msgspec.structs.replace(block, draft_tokens=draft_tokens, corrected_logits=corrected),
        confidence=confidence, folded=False, verify_ids=None,
    )


class DSparkWorker(DSparkWorkerV2):
    """sglang-dspark's DSPARK worker (see module docstring)."""

    implementation = "sglang-dspark"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_recorder = StepRecorder(self.device)
        self._step = CurrentStep()  # the plan of the decode step being run (engine/current_step.py)
        self._draft_gate_on = False
        self._plain_decode_on = envs.PLAIN_STEP.get() == "decode"  # read once, not on every decode step
        # Skipped steps' draft-KV rows, written in one batch before anything reads draft KV (None: on every step).
        self._pending_context_kv = None
        if self._hosts_draft:
            self._install_hot_vocab()
            self._pack_draft_context_products()
        logger.info("sglang-dspark DSPARK worker active (pid %d)", os.getpid())

    def _install_hot_vocab(self) -> None:
        """The draft's logits over its shipped hot vocabulary (patches/hot_vocab.py), before any graph capture."""
        from pathlib import Path

        from sglang_dspark.draft.hot_vocab import load_hot_vocab
        from sglang_dspark.patches.hot_vocab import attach_hot_vocab

        from sglang.srt.runtime_context import get_spec

        # The resolved path, as upstream's draft config reads it (dspark_config.py): a draft chosen at argument
        # resolution (the embedded target's shipped draft) is a declared resolution, and the raw
        # ``server_args.speculative_draft_model_path`` stays None, which left the default pair without its hot set.
        draft_path = get_spec().speculative_draft_model_path
        if envs.HOT_VOCAB.get() == "off" or not draft_path or not Path(draft_path).is_dir():
            return
        lm_head = getattr(self.draft_model, "lm_head", None)
        vocab_size = int(getattr(lm_head, "org_vocab_size", 0) or 0)
        if vocab_size == 0:
            logger.info("sglang-dspark hot vocabulary not used (the draft has no LM head attached)")
            return
        hot = load_hot_vocab(draft_path, vocab_size)  # a broken file stops start-up, naming the file and the fix
        if hot is None:
            return
        reason = attach_hot_vocab(self.draft_model, hot)
        if reason is not None:
            logger.info("sglang-dspark hot vocabulary not used (%s): the draft runs over the whole vocabulary", reason)
            return
        logger.info("sglang-dspark hot vocabulary: the draft's logits over %d of %d tokens (%s=off to disable)",
                    hot.size, vocab_size, envs.HOT_VOCAB.name)

    def _pack_draft_context_products(self) -> None:
        """On the CPU platform: the draft-KV injection's products through packed weights (patches/cpu_packed_linear.py);
        it runs on every decode step, drafted or not."""
        from sglang_dspark.patches import cpu_packed_linear

        if cpu_packed_linear.installed() and str(self.device).startswith("cpu"):
            count = cpu_packed_linear.pack_draft_context_products(self.draft_model)
            logger.info("sglang-dspark CPU platform: the draft's context projections through packed weights "
                        "(%d torch linear(s) and the stacked K/V projection)", count)

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        # Last start-up hook the scheduler calls on the worker: KV pools and attention backends exist now, so this is
        # where the SPS table is profiled (or loaded), before the first request.
        if self._hosts_draft:
            self._verify_planner.install_sps_table()
            self._install_draft_gate()
            self._install_plan_digest()

    def _install_plan_digest(self) -> None:
        """Under TP: this rank's digest of the verifies it lays out, logged when the scheduler idles
        (engine/plan_digest.py)."""
        from sglang.srt.runtime_context import get_parallel

        from sglang_dspark.engine.plan_digest import plan_digest_for
        from sglang_dspark.engine.rank_learning import parallel_facts

        tp_size = parallel_facts(get_parallel()).tp_size
        self._verify_planner.plan_digest = plan_digest_for(tp_size, get_parallel().tp_rank if tp_size > 1 else 0)

    def _install_draft_gate(self) -> None:
        mode = envs.DRAFT_GATE.get()
        if mode == "off":
            logger.info("sglang-dspark draft gate: off (%s=off): every decode step drafts", envs.DRAFT_GATE.name)
            return
        blocker = self._verify_planner.draft_gate_blocker(deferred_commit=self._deferred_commit() is not None)
        if blocker is not None:
            logger.info("sglang-dspark draft gate: off on this server (%s): every decode step drafts", blocker)
            return
        if not isinstance(self._proposer, GatedDraftBlockProposer):
            # Re-class the live proposer (its buffers, noise counter and draft sampler stay as upstream built them).
            self._proposer.__class__ = GatedDraftBlockProposer
        if not isinstance(self._verify_executor, AnchorOnlyVerifyExecutor):
            self._verify_executor.__class__ = AnchorOnlyVerifyExecutor
        # One plan per step, read by all three (engine/current_step.py).
        self._proposer.step = self._verify_executor.step = self._verify_planner.step = self._step
        blocker = long_chains_blocker(self)
        self._verify_planner.enable_draft_gate(
            mode, long_chain_ok=None if blocker is not None else functools.partial(long_chain_batch_ok, self))
        self._draft_gate_on = True
        if envs.PAUSE_KV.get() == "batched":
            self._pending_context_kv = PendingContextKv(self._write_context_rows)
            self._verify_planner.pending_context_kv = self._pending_context_kv
        logger.info("sglang-dspark draft gate: mode=%s (skips the draft block on steps where it does not pay); lookup "
                    "chains past the draft's block: %s", mode, "on" if blocker is None else f"off ({blocker})")

    @property
    def lookup_source(self):
        """The prompt lookup beside the draft, which the scheduler-side patch asks through the scheduler's draft
        worker (``patches/lookup_current_tokens.py``); the null source while the chooser is off."""
        planner = getattr(self, "_verify_planner", None)
        return getattr(planner, "lookup", None)

    def _write_context_rows(self, hidden, cache_loc, positions) -> None:
        with self._draft_context():
            self._kv_injector.inject_target_hidden(target_hidden=hidden, cache_loc=cache_loc, positions=positions)

    def _flush_context_kv(self) -> None:
        """Write the held draft-KV rows of skipped steps: called before any forward that may read or write draft KV."""
        if self._pending_context_kv is not None:
            self._pending_context_kv.flush()

    def _forward_decode(self, batch, on_publish, grammar_barrier=None, coordination_plan=None):
        # A skipped step planned as SGLang's own decode step (engine/plain_step/plain_decode_step.py); otherwise upstream's step.
        if self._step.plan.plain_decode and coordination_plan is None:
            return run_plain_decode_step(self, batch, on_publish)
        self._flush_context_kv()  # a draft forward or upstream's commit_hidden comes next
        if self._step.plan.verifies_past(self.gamma):  # chains past the block (engine/long_chain_step.py)
            return run_long_chain_step(self, batch, self._step.plan, on_publish)
        return super()._forward_decode(batch, on_publish, grammar_barrier, coordination_plan=coordination_plan)

    def _plan_step(self, batch) -> StepPlan:
        """The decode step's plan, from the planner (the gate's decision) and the batch's eligibility for the
        anchor-only paths."""
        if not self._draft_gate_on or batch.forward_mode.is_idle() or len(batch.seq_lens) == 0:
            return DRAFTED
        compact = compact_anchor_step_eligible(self, batch)
        plain = compact and self._plain_decode_on and plain_decode_eligible(self, batch)
        return self._verify_planner.plan_for(batch, compact_ok=compact, plain_ok=plain)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        is_decode = self._hosts_draft and not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
        plan = self._plan_step(batch) if is_decode else DRAFTED
        if is_decode:
            if plan.draft:
                # Before the step's clock starts: the held rows are the pause's cost, paid here in one batch, and the
                # gate would otherwise read them as the cost of drafting (a probe after a long pause most of all).
                self._flush_context_kv()
            self._step_recorder.start()
        elif self._hosts_draft:
            self._flush_context_kv()  # a prefill injects into draft KV, and may reuse a slot a held row names
            self._step_recorder.interrupt()  # the next decode step's gap includes this forward: not timed
        with self._step.running(plan):
            result = super().forward_batch_generation(
                batch, on_publish, grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        if is_decode and getattr(result, "accept_lens", None) is not None and result.accept_lens.numel() > 0:
            # Only times and forwards: no host read of a device tensor here (StepRecorder copies without blocking).
            for record in self._step_recorder.finish(
                accept_lens=result.accept_lens,
                cap_lens=result.cap_lens,
                confidence=self._verify_planner.last_confidence if plan.draft else None,
                default_verify_len=int(self.verify_num_draft_tokens),
                plan=plan,
            ):
                self._verify_planner.observe_step(record)
        return result
