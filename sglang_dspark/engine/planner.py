"""Confidence-scheduled verification inside SGLang's DSPARK planner (SGLang adapter; the maths is in scheduling/).

Upstream's ``DSparkVerifyPlanner`` already carries what a per-request verify length needs: the confidence relay, a
host budget ``K`` from confidences two steps back, the device top-K and ``RaggedVerifyLayout``. What it lacks, and
what this subclass adds:

* an SPS table from the first request on: profiled at engine start-up (or cached, or upstream's JSON), 2-D in
  (requests, verify tokens) instead of upstream's 1-D floor-lookup table; plus the rest of the decode step (draft,
  sampling, bookkeeping), learned online from measured step times (profiler/step_overhead.py);
* our admission policies (``SGLANG_DSPARK_ADMISSION``): ``async`` (default: upstream's production scheme, with our
  capacity search over the 2-D cost), ``exact`` (Algorithm 1 on the current confidences, host-synchronous),
  ``off`` (verify only the anchor), ``verify-all`` (static mode, decided at argument resolution);
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
)
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

from sglang_dspark.scheduling.policy import read_admission_policy
from sglang_dspark.scheduling.stats import get_admission_stats
from sglang_dspark.profiler.step_overhead import OverheadAdjustedCost, StepOverhead
from sglang_dspark.scheduling import admit_exact, capacity_from_survival

logger = logging.getLogger(__name__)

UPSTREAM_PLANNER_TARGET = "sglang.srt.speculative.dspark_components.dspark_planner.DSparkVerifyPlanner"


class AdmissionBudgetPlanner(HostConfidenceBudgetPlanner):
    """Upstream's host budget planner with our capacity rule. Lag bookkeeping (``_shift_to_lag``,
    ``_two_steps_prior_survival``: confidences two steps back, fresh requests at survival 1) is upstream's."""

    cost = None
    policy = "async"

    def compute_budget(self, *, confidence, generation, current_generation, req_pool_indices_cpu) -> int:
        lagged_confidence, lagged_generation = self._shift_to_lag(
            confidence=confidence, generation=generation, req_pool_indices_cpu=req_pool_indices_cpu
        )
        survival = self._two_steps_prior_survival(
            lagged_confidence=lagged_confidence,
            lagged_generation=lagged_generation,
            current_generation=current_generation,
        )
        num_requests, gamma = survival.shape
        if self.forced_budget_frac is not None:  # upstream's /update knob keeps working
            budget = max(0, int(float(self.forced_budget_frac) * num_requests * gamma))
        elif self.policy == "off":
            budget = 0
        elif self.policy == "exact":
            budget = num_requests * gamma  # an upper bound only: exact admits from the current confidences
        else:
            budget = int(capacity_from_survival(survival, self.cost, num_requests))
        sps = float(self.cost.steps_per_second(num_requests, num_requests + budget))
        self.last_decision = VerifyBudgetDecision(
            budget=budget, predicted_step_seconds=1.0 / sps if sps > 0 else None
        )
        return budget


class AdmissionVerifyPlanner(DSparkVerifyPlanner):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.admission_policy = read_admission_policy()
        self.sps_table = None
        self.step_overhead = StepOverhead()
        self.step_cost = None  # profiled verify cost + learned step overhead; set by install_sps_table
        self.last_confidence: Optional[torch.Tensor] = None
        stats = get_admission_stats()
        if self._budget_planner is None:
            # Static mode: no confidence head, or the verify-all policy (decided at argument resolution).
            stats.set_policy("verify-all")
            return
        stats.set_policy(self.admission_policy)
        # The SPS table comes later (install_sps_table): the KV pools and attention backends the profiler times do
        # not exist yet while the worker is being built.
        # Our budget planner is upstream's class plus one method; re-classing the live instance keeps every piece of
        # upstream state (lag ring, carry buffers) instead of rebuilding it from private constructor arguments.
        self._budget_planner.__class__ = AdmissionBudgetPlanner
        self._budget_planner.policy = self.admission_policy
        # Upstream serves a cached verify-all layout while its table is flat; ours never is.
        self._is_verify_all = False

    def install_sps_table(self) -> None:
        """Profile (or load) the SPS table; called by the worker once pools and backends exist."""
        if self._budget_planner is None:
            return
        from sglang_dspark.profiler.engine_measurer import obtain_sps_table

        max_requests = int(dspark_planner.get_schedule().max_running_requests or 48)
        obtained = obtain_sps_table(
            model_runner=self.model_runner,
            gamma=self.gamma,
            max_requests=max_requests,
            upstream_table_path=dspark_planner.get_spec().speculative_dspark_sps_table_path,
        )
        self.sps_table = obtained.table
        self.step_cost = OverheadAdjustedCost(self.sps_table, self.step_overhead)
        self._budget_planner.cost = self.step_cost
        summary = self.sps_table.summary()
        get_admission_stats().set_sps_summary(summary)
        logger.info(
            "sglang-dspark admission: policy=%s, SPS table from %s in %.2f s (%d probes, SPS %.1f..%.1f steps/s)",
            self.admission_policy,
            obtained.source,
            obtained.seconds,
            summary.get("num_probes", 0),
            summary.get("min_steps_per_second", float("nan")),
            summary.get("max_steps_per_second", float("nan")),
        )

    def schedule_layout(self, **kwargs):
        layout = super().schedule_layout(**kwargs)
        # A window that verifies every draft token of every request is the uniform verify: hand it to upstream's
        # non-compact path (layout None, as upstream does past its captured grid), which skips the ragged packing and
        # the compact-to-strided scatter. On the CPU that is ~6 % of a tiny-model step. The decision is the admission
        # already made, so this changes no token.
        if (
            layout is not None
            and layout.verify_lens_cpu is not None
            and min(layout.verify_lens_cpu) == self.verify_num_draft_tokens
        ):
            return None
        return layout

    def _schedule_verify_lens(self, *, req_pool_indices, prefix_lens, device, confidence, budget):
        if self.admission_policy == "off" and self._budget_planner is not None:
            # Anchor only, also on steps where upstream would fall back to verify-all (no lagged budget yet).
            verify_lens = torch.ones(int(req_pool_indices.shape[0]), dtype=torch.int32, device=device)
        elif self.admission_policy == "exact" and confidence is not None and self._budget_planner is not None:
            # Algorithm 1 with its first-non-improvement stop, on this step's confidences. It needs them on the host,
            # so it synchronises; that is the price of the exact policy (async is the zero-sync default).
            lengths = admit_exact(confidence.detach().to("cpu", torch.float64), self.step_cost)
            verify_lens = (lengths + 1).to(device=device, dtype=torch.int32)
            self._tp_sync.sync(SpecTpSyncSite.DSPARK_PLAN, verify_lens)
        else:
            verify_lens = super()._schedule_verify_lens(
                req_pool_indices=req_pool_indices,
                prefix_lens=prefix_lens,
                device=device,
                confidence=confidence,
                budget=budget,
            )
        self.last_confidence = confidence
        return verify_lens
