"""Confidence-scheduled verification inside SGLang's DSPARK planner (SGLang adapter; the maths is in scheduling/).

Upstream's ``DSparkVerifyPlanner`` already carries what a per-request verify length needs: the confidence relay, a
host budget ``K`` from confidences two steps back, the device top-K and ``RaggedVerifyLayout``. What it lacks, and
what this subclass adds:

* an SPS table from the first request on: profiled at engine start-up (or cached, or upstream's JSON), 2-D in
  (requests, verify tokens) instead of upstream's 1-D floor-lookup table; plus the rest of the decode step (draft,
  sampling, bookkeeping), learned online from measured step times (profiler/step_costs.py);
* our admission policies (``SGLANG_DSPARK_ADMISSION``): ``async`` (default: upstream's production scheme, with our
  capacity search over the 2-D cost), ``exact`` (Algorithm 1 on the current confidences, host-synchronous),
  ``off`` (verify only the anchor), ``verify-all`` (static mode, decided at argument resolution);
* one chooser per decode step (``SGLANG_DSPARK_DRAFT_GATE``, ``SGLANG_DSPARK_LOOKUP``): before each step, on the
  host, this planner gathers the step's facts from its proposal sources, the draft (``engine/draft_source.py``: the
  lagged survivals and the draft gate's advice) and the prompt lookup (``engine/lookup_source.py``), and
  ``scheduling/step_choice.choose_step`` returns the step's plan: whether the draft block runs, which rows verify a
  lookup chain, how many tokens; ``engine/verify_budget.py`` writes it into SGLang's verify budget;
* the admission record our observability reads.

It replaces ``dspark_planner.DSparkVerifyPlanner`` through HookRegistry together with our worker, so upstream's
worker (``SGLANG_DSPARK_WORKER=upstream``) keeps upstream's planner.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from sglang.srt.speculative.dspark_components import dspark_planner
from sglang.srt.speculative.dspark_components.dspark_planner import (
    DSparkVerifyPlanner,
    HostConfidenceBudgetPlanner,
    VerifyBudgetDecision,
    local_verify_tier_num_tokens,
)
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

from sglang_dspark.engine.current_step import CurrentStep
from sglang_dspark.engine.draft_source import DraftSource
from sglang_dspark.engine.gate_trace import GateTrace
from sglang_dspark.engine.long_chain_step import reserve_chain_kv
from sglang_dspark.engine.lookup_source import NULL_LOOKUP, LookupSource
from sglang_dspark.engine.plan_digest import PlanDigest
from sglang_dspark.engine.rank_learning import RankLearning, decide_rank_learning, parallel_facts
from sglang_dspark.engine.step_record import StepRecord
from sglang_dspark.engine.verify_budget import step_budget, undrafted_verify_lens, write_plan_budget
from sglang_dspark.engine.verify_mode import PLUGIN_SPS_PROBES_DP_ATTENTION, SPS_PROBES_DP_ATTENTION_SKIPPED
from sglang_dspark.profiler.step_costs import StepCosts
from sglang_dspark.scheduling.acceptance import SurvivalPrior
from sglang_dspark.patches.lookup_current_tokens import LAUNCH_ATTRIBUTE
from sglang_dspark.scheduling.draft_gate import GateDecision, make_draft_gate
from sglang_dspark.scheduling.step_choice import StepFacts, choose_step
from sglang_dspark.scheduling.step_plan import DRAFTED, StepPlan
from sglang_dspark.scheduling.policy import AdmissionPolicy
from sglang_dspark.scheduling.stats import get_admission_stats

logger = logging.getLogger(__name__)

CPU_PROFILED_MAX_REQUESTS = 48
UPSTREAM_PLANNER_TARGET = "sglang.srt.speculative.dspark_components.dspark_planner.DSparkVerifyPlanner"


def sps_probes_skipped(*, attn_dp_enabled: bool, table_path: Optional[str],
                       probes_dp_attention: bool = PLUGIN_SPS_PROBES_DP_ATTENTION) -> Optional[str]:
    """Why this engine must not run the start-up SPS probes (None: it may). A table file needs no probe at all."""
    if table_path:
        return None
    if attn_dp_enabled and not probes_dp_attention:
        return SPS_PROBES_DP_ATTENTION_SKIPPED
    return None


class _UnknownCost:
    """The cost when no SPS table could be had: only verify-all runs then, which needs none."""

    def steps_per_second(self, num_requests, verify_tokens):
        return float("nan")


class AdmissionBudgetPlanner(HostConfidenceBudgetPlanner):
    """Upstream's host budget planner with our capacity rule. Lag bookkeeping (``_shift_to_lag``,
    ``_two_steps_prior_survival``: confidences two steps back) is upstream's.

    Where we diverge: upstream reads a request with no lagged confidence of its own (arrived since, or not drafted
    for while the gate paused) as survival 1 and verifies its whole block. Under load that is most of the batch on
    the first drafted step after a pause (a probe): every row verified in full, the costliest step the server can
    run, for a draft the gate has just found not worth it. Those rows read the population's recent survivals
    (``survival_prior``) instead, as the gate does; before any draft ran there is none and upstream's 1 stands."""

    cost = None
    policy: AdmissionPolicy
    survival_prior: Optional[SurvivalPrior] = None

    def _two_steps_prior_survival(self, *, lagged_confidence, lagged_generation, current_generation):
        survival = super()._two_steps_prior_survival(
            lagged_confidence=lagged_confidence,
            lagged_generation=lagged_generation,
            current_generation=current_generation,
        )
        if self.survival_prior is None:
            return survival
        # Upstream's rule for which rows are known: the lagged confidence is of the current request generation.
        current = current_generation.to(torch.int64)
        known = (current >= 1) & (lagged_generation.to(torch.int64) == current)
        return self.survival_prior.fill(survival, known)

    def latest_survival(self, *, req_pool_indices_cpu, current_generation) -> Optional[torch.Tensor]:
        """Survivals from the newest confidences in the host carry ring (the synchronous path), without shifting it.

        For the draft gate only, which may look at any past confidence: the step's draft does not exist yet. None
        when the ring is not in use (the overlap relay supplies the lag) or nothing was stored yet."""
        if self.carry_steps == 0 or self._carry_confidence is None or self._carry_pos == 0:
            return None
        slot = (self._carry_pos - 1) % self.carry_steps
        rows = req_pool_indices_cpu.to(torch.int64)
        return self._two_steps_prior_survival(
            lagged_confidence=self._carry_confidence[slot, rows],
            lagged_generation=self._carry_generation[slot, rows],
            current_generation=current_generation,
        )

    def survival_of_batch(self, batch, req_to_token_pool) -> Optional[torch.Tensor]:
        """:meth:`latest_survival` of the batch's requests (the synchronous path's survivals)."""
        rows = getattr(batch, "req_pool_indices_cpu", None)
        rows = (batch.req_pool_indices.to("cpu") if rows is None else rows).to(torch.int64)
        return self.latest_survival(req_pool_indices_cpu=rows, current_generation=req_to_token_pool.req_generation[rows])

    def lagged_survival(self, *, confidence, generation, current_generation, req_pool_indices_cpu) -> torch.Tensor:
        """``[R, γ]`` survivals two steps back (rows of no confidence of their own: the prior), shifting the lag."""
        lagged_confidence, lagged_generation = self._shift_to_lag(
            confidence=confidence, generation=generation, req_pool_indices_cpu=req_pool_indices_cpu
        )
        return self._two_steps_prior_survival(
            lagged_confidence=lagged_confidence,
            lagged_generation=lagged_generation,
            current_generation=current_generation,
        )

    def budget_for(self, survival: torch.Tensor, decision: Optional[GateDecision] = None) -> int:
        """The step's budget K: 0 for a step the gate skips (no capacity search); the gate's own search where it read
        these survivals with the served cost (``GateDecision.budget``); else the policy's."""
        num_requests, gamma = survival.shape
        if decision is not None and not decision.draft:
            budget = 0
        elif self.forced_budget_frac is not None:  # upstream's /update knob keeps working
            budget = max(0, int(float(self.forced_budget_frac) * num_requests * gamma))
        elif decision is not None and decision.budget is not None and self.policy.name == "async":
            budget = decision.budget
        else:
            budget = self.policy.capacity(survival, self.cost, num_requests)
        sps = float(self.cost.steps_per_second(num_requests, num_requests + budget))
        self.last_decision = VerifyBudgetDecision(
            budget=budget, predicted_step_seconds=1.0 / sps if sps > 0 else None
        )
        return budget

    def compute_budget(self, *, confidence, generation, current_generation, req_pool_indices_cpu) -> int:
        survival = self.lagged_survival(confidence=confidence, generation=generation,
                                        current_generation=current_generation,
                                        req_pool_indices_cpu=req_pool_indices_cpu)
        return self.budget_for(survival)


class AdmissionVerifyPlanner(DSparkVerifyPlanner):
    gate_trace: Optional[GateTrace] = None
    lookup = NULL_LOOKUP  # prompt lookup beside the draft (enable_draft_gate installs it; engine/lookup_source.py)
    # install_sps_table's decision whether step records may teach what changes the budget (engine/rank_learning.py);
    # until then nothing is learned and the budget planner reads no survival prior.
    rank_learning: Optional[RankLearning] = None
    plan_digest: Optional[PlanDigest] = None  # under TP: this rank's digest of its verify layouts (the worker sets it)
    _learn_online = False  # what step records teach may change the budget (only where one rank decides alone)
    # Whether a batch may verify chains past the draft's block (None: this server cannot; engine/long_chain_step.py).
    long_chain_ok = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.policy = AdmissionPolicy.from_env()
        self.sps_table = None
        # The profiled table plus what served steps teach (profiler/step_costs.py); set by install_sps_table.
        self.step_costs: Optional[StepCosts] = None
        # The draft as a proposal source: its survivals, and its gate once enable_draft_gate installs one (without a
        # gate every decode step drafts); scheduling/step_choice.py chooses between the sources.
        self.draft = DraftSource(SurvivalPrior())
        self._chosen = None  # (draft input, StepPlan) chosen in prepare_verify_budget, for plan_for
        self.step = CurrentStep()  # the plan of the step being run; the worker shares its own (engine/current_step.py)
        self.compact_anchor_steps = 0  # skipped steps whose verify kept one logits row per request
        self.plain_decode_steps = 0  # of those, steps run as SGLang's decode step (engine/plain_step/plain_decode_step.py)
        self.pending_context_kv = None  # their draft-KV rows held for one batched write (engine/plain_step/pending_context_kv.py)
        self.last_confidence: Optional[torch.Tensor] = None
        self.gate_trace = GateTrace.from_env()  # SGLANG_DSPARK_GATE_TRACE: one line per decode step, for diagnosis
        stats = get_admission_stats()
        if self._budget_planner is None:
            # Static mode: no confidence head, or the verify-all policy (decided at argument resolution).
            stats.set_policy("verify-all")
            return
        stats.set_policy(self.policy.name)
        # The SPS table comes later (install_sps_table): the KV pools and attention backends the profiler times do
        # not exist yet while the worker is being built.
        # Our budget planner is upstream's class plus one method; re-classing the live instance keeps every piece of
        # upstream state (lag ring, carry buffers) instead of rebuilding it from private constructor arguments.
        self._budget_planner.__class__ = AdmissionBudgetPlanner
        self._budget_planner.policy = self.policy
        self._budget_planner.survival_prior = None  # attached by _apply_rank_learning where one rank decides alone
        # Upstream serves a cached verify-all layout while its table is flat; ours never is.
        self._is_verify_all = False

    def install_sps_table(self) -> None:
        """Profile (or load) the SPS table; called by the worker once pools and backends exist.

        Never kills the server: a probe that fails (an engine shape we did not foresee) logs and leaves this run on
        verify-all, which is upstream's static behaviour. Under TP the failure is raised on every rank at the same
        forward (tp_consensus), so all ranks fall back together."""
        if self._budget_planner is None:
            return
        from sglang.srt.runtime_context import get_disagg, get_parallel

        if get_disagg().disaggregation_mode == "prefill":
            return  # a PD prefill server never runs a verify forward
        table_path = dspark_planner.get_spec().speculative_dspark_sps_table_path
        skipped = sps_probes_skipped(attn_dp_enabled=bool(getattr(get_parallel(), "attn_dp_enabled", False)),
                                     table_path=table_path)
        if skipped is not None:
            # The verify-mode decision already keeps --attn-dp-size > 1 static without a table file; this guard also
            # covers what the launcher cannot see (an EP-scale joiner runs attention DP with attn_dp_size 1,
            # runtime_context.py:191-199), so that a probe never runs a forward SGLang's DP sync does not expect.
            logger.warning("sglang-dspark: SPS probes skipped: %s; this server verifies every draft token "
                           "(verify-all). Pass --speculative-dspark-sps-table-path for confidence scheduling.", skipped)
            self._fall_back_to_verify_all()
            return
        from sglang_dspark.profiler.engine_measurer import obtain_sps_table

        max_requests = int(dspark_planner.get_schedule().max_running_requests or 48)
        if str(getattr(self.model_runner, "device", "")).startswith("cpu"):
            # On the CPU SGLang's own request limit applies (patches/cpu_dspark.py B1b, thousands): profile the request
            # counts upstream's speculative default allows and extrapolate above (profiler/sps_table.py).
            max_requests = min(max_requests, CPU_PROFILED_MAX_REQUESTS)
        try:
            obtained = obtain_sps_table(
                model_runner=self.model_runner,
                gamma=self.gamma,
                max_requests=max_requests,
                upstream_table_path=table_path,
            )
        except Exception:
            logger.exception(
                "sglang-dspark: SPS profiling failed; this server verifies every draft token (verify-all). "
                "Pass --speculative-dspark-sps-table-path to skip profiling, or report the traceback."
            )
            self._fall_back_to_verify_all()
            return
        self.sps_table = obtained.table
        self.step_costs = StepCosts(self.sps_table, source=obtained.source)
        # Under TP (or any layout where several ranks must agree on each step's budget, and so its graph tier) every
        # rank computes the budget on its own host: whatever step records and local step times teach stays off there.
        self._apply_rank_learning(decide_rank_learning(parallel_facts(get_parallel())))
        self._budget_planner.cost = self.step_costs.drafted
        summary = self.sps_table.summary()
        get_admission_stats().set_sps_summary(summary)
        logger.info(
            "sglang-dspark admission: policy=%s, SPS table from %s in %.2f s (%d probes, SPS %.1f..%.1f steps/s)",
            self.policy.name,
            obtained.source,
            obtained.seconds,
            summary.get("num_probes", 0),
            summary.get("min_steps_per_second", float("nan")),
            summary.get("max_steps_per_second", float("nan")),
        )

    def _apply_rank_learning(self, decision: RankLearning) -> None:
        """The one switch for every learned input of the budget, the gate and the tier (engine/rank_learning.py): the
        learned overhead and table scale (observe_step), the survival prior (read by the budget planner, taught by
        observe_step) and the draft gate (the worker reads ``rank_learning`` before installing it)."""
        self.rank_learning = decision
        self._learn_online = self.draft.learns = decision.enabled
        if self._budget_planner is not None:
            self._budget_planner.survival_prior = self.draft.survival_prior if decision.enabled else None
        if not decision.enabled:
            logger.info("%s", decision.log_line())

    def _fall_back_to_verify_all(self) -> None:
        self.draft.gate = None
        self.policy = AdmissionPolicy("verify-all")
        self._budget_planner.policy = self.policy
        self._budget_planner.cost = _UnknownCost()
        get_admission_stats().set_policy("verify-all")

    # ------------------------------------------------------------------ choosing a step

    def draft_gate_blocker(self, *, deferred_commit: bool) -> Optional[str]:
        """Why the draft gate cannot run on this server (None: it can)."""
        if self._budget_planner is None or self.policy.name not in ("async", "exact"):
            return f"admission policy {self.policy.name!r} (the gate needs async or exact)"
        if not self.is_compact_mode:
            return f"verify mode {self.mode_value!r} (the gate needs compact)"
        if self.sps_table is None:
            return "no SPS table"
        # Every rank must take the same decision: the gate learns from per-rank step records and times, and a MoE
        # draft's forward joins collectives across DP ranks. The one switch for every learned input
        # (engine/rank_learning.py).
        from sglang.srt.runtime_context import get_parallel

        learning = self.rank_learning or decide_rank_learning(parallel_facts(get_parallel()))
        if not learning.enabled:
            return learning.reason
        if deferred_commit:
            return "deferred context-KV commit (SGLANG_DSPARK_DEFER_CONTEXT_KV)"
        return None

    def enable_draft_gate(self, mode: str, long_chain_ok=None) -> None:
        """The chooser on: the gate advises the draft, and the lookup proposes beside it (``SGLANG_DSPARK_LOOKUP``);
        ``long_chain_ok(batch)``: whether a batch may verify chains past the block (None: never on this server)."""
        self.draft.gate = make_draft_gate(mode)
        self.long_chain_ok = long_chain_ok
        self.lookup = LookupSource.from_env(self.gamma, on_host=str(self.model_runner.device).startswith("cpu"),
                                            long_chains=long_chain_ok is not None)
        if self.lookup.enabled:
            get_admission_stats().set_lookup(self.lookup.summary)
        # Read when /server_info or the metrics ask, not rebuilt on every decode step.
        get_admission_stats().set_draft_gate(self._gate_state)

    def _gates(self, batch) -> bool:
        """Whether the chooser plans this decode step (a grammar step always drafts: its mask reads the draft)."""
        return not (
            self.draft.gate is None
            or batch.spec_info is None
            or batch.forward_mode.is_extend()
            or batch.is_extend_in_batch
            or batch.batch_size() == 0
            or batch.has_grammar
        )

    def prepare_verify_budget(self, batch, future_map) -> None:
        """Overlap path: the next step's plan and budget, on the host before its forward, from the survivals the
        budget reads (a step without the draft runs no capacity search, a drafted one at most one); other steps are
        upstream's."""
        self._chosen = None
        if not self._gates(batch):
            return super().prepare_verify_budget(batch, future_map)
        resolved = future_map.resolve_confidence_cpu(batch)
        survival = None
        if resolved is None:
            self._budget_planner.note_non_decode_step()
        else:
            rows = batch.req_pool_indices_cpu
            survival = self._budget_planner.lagged_survival(
                confidence=resolved.confidence,
                generation=resolved.generation,
                current_generation=self.model_runner.req_to_token_pool.req_generation[rows.to(torch.int64)],
                req_pool_indices_cpu=rows,
            )
        plan = self._choose(batch, survival)
        self._chosen = (batch.spec_info, plan)
        draft_budget = 0  # no resolved confidences: upstream's budget (None)
        if plan.draft:
            draft_budget = self._budget_planner.budget_for(survival, plan.decision) if survival is not None else None
        write_plan_budget(batch, plan, draft_budget, self._tier_of)
        self._maybe_gather_dp_verify_tier(batch=batch, local_tier_num_tokens=batch.spec_verify_tier_num_tokens)

    def plan_for(self, batch, *, compact_ok: bool, plain_ok: bool) -> StepPlan:
        """The decode step's plan (scheduling/step_plan.py): chosen in ``prepare_verify_budget`` (overlap) or now from
        the newest carried confidences (synchronous), with how a step without the draft runs on this batch
        (``compact_ok`` / ``plain_ok``: it qualifies for the compact anchor-only verify / SGLang's decode step)."""
        chosen, self._chosen = self._chosen, None
        if self.draft.gate is None or batch.has_grammar:
            return DRAFTED
        if chosen is not None and chosen[0] is batch.spec_info:
            plan = chosen[1].with_anchor_paths(compact_ok=compact_ok, plain_ok=plain_ok)
        else:
            survival = self._budget_planner.survival_of_batch(batch, self.model_runner.req_to_token_pool)
            plan = self._choose(batch, survival, compact_ok=compact_ok, plain_ok=plain_ok)
            write_plan_budget(batch, plan, None, self._tier_of)
        self.compact_anchor_steps += int(plan.compact_anchor)
        self.plain_decode_steps += int(plan.plain_decode)
        return plan

    def _choose(self, batch, survival: Optional[torch.Tensor], **anchor_paths) -> StepPlan:
        """The sources' facts for this step (each source fails alone: the step never does), the chooser's plan, and
        what the sources learn from it before the next launch."""
        num_requests = len(batch.seq_lens)
        try:
            proposed = self.lookup.propose(batch)
        except Exception:
            logger.exception("sglang-dspark: prompt lookup failed; the draft alone from now on")
            self.lookup, proposed = NULL_LOOKUP, None
        try:
            advice, read = self.draft.advise(survival, num_requests, proposed.rows if proposed is not None else None,
                                             self.step_costs)
        except Exception:  # the gate must never take a decode step down: draft, as without it
            logger.exception("sglang-dspark: draft gate failed; drafting every step from now on")
            self.draft.gate = None
            return StepPlan(decision=GateDecision(True, "error"))
        costs, explored = self.step_costs, proposed is not None and proposed.explored
        launch = getattr(batch, LAUNCH_ATTRIBUTE, None)
        plan = choose_step(StepFacts(
            gate=advice, lookup=proposed, draft_survival=read, known_draft_survival=survival,
            cost_drafted=costs.drafted if costs is not None else None,
            cost_undrafted=costs.undrafted_for(explored) if costs is not None else None,
            weigh_draft=self.draft.weighs_beside_lookup, forced_lookup=self.lookup.forced,
            min_gain=self.lookup.config.chain_min_gain, block=self.gamma,
            long_chains=proposed is not None and self.long_chain_ok is not None and self.long_chain_ok(batch),
            overlap_given_up=launch is not None and launch.overlap_given_up, **anchor_paths))
        if plan.verifies_past(self.gamma):  # the KV its long chains need, or shorter chains
            plan = reserve_chain_kv(batch, plan, self.gamma)
        self.draft.tally(plan.decision)
        if proposed is not None:
            self.lookup.chosen(plan, num_requests, costs.undrafted if costs is not None else None)
        return plan

    def _tier_of(self, num_requests: int, budget: Optional[int]) -> int:
        return local_verify_tier_num_tokens(bs=num_requests, verify_token_budget=budget,
                                            verify_num_draft_tokens=self.verify_num_draft_tokens,
                                            min_verify_len=self._schedule_cfg.min_verify_len)

    def _gate_state(self) -> Optional[dict]:
        counters = {"compact_anchor_steps": self.compact_anchor_steps, "plain_decode_steps": self.plain_decode_steps}
        if self.pending_context_kv is not None:
            counters["pause_kv"] = self.pending_context_kv.summary()
        return self.draft.summary(self.step_costs, **counters)

    def resolve_verify_token_budget(self, **kwargs):
        plan = self.step.plan
        if not plan.draft:
            kwargs["draft_input"].verify_token_budget = step_budget(plan, None)
            return kwargs["draft_input"].verify_token_budget
        # A drafted step with chains: the draft's budget plus the chains, ranked together by the schedule.
        return step_budget(plan, super().resolve_verify_token_budget(**kwargs))

    # ------------------------------------------------------------------ after a step

    def observe_step(self, record: StepRecord) -> None:
        """A finished decode step, already on the host (the worker's StepRecorder never syncs the device); each
        learner observes it once. What changes the budget (step costs, survival prior) learns only where one rank
        decides alone (engine/rank_learning.py); the trace reads the gate as it decided, before the step teaches it."""
        costs = self.step_costs
        if self.gate_trace is not None:
            self.gate_trace.write_step(record, self.draft.gate, self.lookup, getattr(self, "sps_table", None),
                                       costs.undrafted if costs is not None else None)
        if self._learn_online and costs is not None and costs.observe(record):
            get_admission_stats().set_sps_summary(costs.table_summary())
        for source in (self.draft, self.lookup):  # each proposal source learns from the step once
            source.observe(record)
        get_admission_stats().observe(record)

    def schedule_layout(self, **kwargs):
        layout = super().schedule_layout(**kwargs)
        if self.plan_digest is not None:  # under TP: what this rank laid out (engine/plan_digest.py)
            self.plan_digest.fold(kind=self.step.plan.kind, num_requests=int(kwargs["req_pool_indices"].shape[0]),
                                  budget=kwargs.get("budget"), layout=layout)
        # A window that verifies every draft token of every request is the uniform verify: hand it to upstream's
        # non-compact path (layout None, as upstream does past its captured grid), which skips the ragged packing and
        # the compact-to-strided scatter. The decision is the admission already made, so this changes no token. Not under ragged CUDA graphs: there a target verify without a
        # layout cannot replay a graph and would run eager.
        if (
            layout is not None
            and dspark_planner.ragged_capture_num_tokens(model_runner=self.model_runner) is None
            and layout.verify_lens_cpu is not None
            and min(layout.verify_lens_cpu) == self.verify_num_draft_tokens
        ):
            return None
        return layout

    def _schedule_verify_lens(self, *, req_pool_indices, prefix_lens, device, confidence, budget):
        plan = self.step.plan
        if not plan.draft:  # no draft this step: the anchors, plus the chains chosen on the host
            self.last_confidence = None
            return undrafted_verify_lens(plan, int(req_pool_indices.shape[0]), device)
        verify_lens = None
        if self._budget_planner is not None:
            verify_lens = self.policy.verify_lengths(
                confidence, int(req_pool_indices.shape[0]), self.step_costs.drafted, device
            )
            if verify_lens is not None and self.policy.name == "exact":
                self._tp_sync.sync(SpecTpSyncSite.DSPARK_PLAN, verify_lens)
        if verify_lens is None:
            verify_lens = super()._schedule_verify_lens(
                req_pool_indices=req_pool_indices,
                prefix_lens=prefix_lens,
                device=device,
                confidence=confidence,
                budget=budget,
            )
        self.last_confidence = confidence
        return verify_lens
