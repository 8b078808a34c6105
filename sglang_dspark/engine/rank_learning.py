"""Whether the state a server learns while serving may change the verify budget: a pure decision over the parallel
layout (issue #38, item 2: "TP > 1 can diverge under load").

Every rank of a tensor-parallel group computes the verify budget K of a step on its own host, and K picks the step's
CUDA-graph tier (``local_verify_tier_num_tokens``, ``srt/speculative/dspark_components/dspark_planner.py:431-437``,
then ``round_up_grid`` over the captured tiers). SGLang broadcasts only the verify lengths (``:542``,
``srt/speculative/spec_tp_sync.py``) and assumes K is rank-identical (comment at ``:333-334``): two ranks that pick
different tiers in the same step replay graphs of different sizes (an NCCL size mismatch or a hang). Upstream's own
inputs of K are identical by construction (the broadcast draft, replicated request generations, the SPS table, which
``profiler/tp_consensus.py`` makes byte-identical); what this plugin learns online is not. Everything below is fed by
``StepRecord``\\ s (``engine/step_record.py``), which reach the host one or two steps after their step depending on
each rank's ``event.query()`` timing (and are dropped after 4 pending steps), or by each rank's own step times:

========================  ======================================================================================
learned input             where it changes the budget / gate / tier
========================  ======================================================================================
survival prior            ``AdmissionBudgetPlanner._with_prior``: rows with no lagged confidence of their own
                          (arrivals of the last two steps, rows not drafted for during a pause) read it in the
                          capacity search (``engine/planner.py``; ``scheduling/draft_gate.py`` ``SurvivalPrior``)
step overhead             the level and draft block added to the profiled verify cost
                          (``profiler/step_overhead.py`` ``DraftedAndPlainOverheads``), read by the capacity search
table trust scale         ``OverheadAdjustedCost.verify_scale`` from ``profiler/table_trust.py`` ``TableAgreement``
draft gate                skips the draft (budget 0, anchors only): its fits (``RealizedTokens``, per load
                          bucket too, ``RealizedSeconds``), probe back-off, held pauses, skipped-step samples
========================  ======================================================================================

Construction (one mechanism: the one that already kept the learned overhead and the gate off under TP, extended to
the survival prior): where more than one rank must agree on each step's budget, every input above stays at its
rank-independent prior: no survival prior (upstream's survival 1 for unknown rows), no learned overhead (the profiled
table alone), verify scale 1.0, no draft gate (every step drafts). One log line names what is off and why. The
alternative, rank 0 deciding and broadcasting K (as upstream does for the verify lengths), was not chosen: it is a
per-step collective on the scheduler's host path that every rank waits in, where this plugin keeps its decode step
free of host synchronisation (``engine/step_record.py``); and K is only one of the inputs (the gate's decision
would need the same), while freezing makes all of them equal by construction at no cost per step.

:func:`decide_rank_learning` is pure (stdlib only: ``explain`` imports it); :func:`parallel_facts` reads SGLang's
``get_parallel()`` duck-typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# (name, what it is): every learned input of the budget / gate / tier, in the order of the module docstring's table.
LEARNED_INPUTS: tuple[tuple[str, str], ...] = (
    ("survival prior", "rows with no lagged confidence read upstream's survival 1 instead"),
    ("step overhead", "the profiled SPS table alone prices a step"),
    ("table trust scale", "the table's verify times are used as profiled"),
    ("draft gate", "every decode step drafts"),
)


@dataclass(frozen=True)
class ParallelFacts:
    """The ranks that run each decode step together (SGLang's ``get_parallel()``, or the launch arguments)."""

    tp_size: int = 1
    pp_size: int = 1
    attn_dp_enabled: bool = False


@dataclass(frozen=True)
class RankLearning:
    """``enabled``: the learned inputs may change the budget; else ``frozen`` names them and ``reason`` says why."""

    enabled: bool
    reason: str
    frozen: tuple[str, ...] = ()

    def log_line(self) -> str:
        """The one line the planner logs when learning is off (empty when it is on)."""
        if self.enabled:
            return ""
        what = "; ".join(f"{name} off ({effect})" for name, effect in LEARNED_INPUTS if name in self.frozen)
        return f"sglang-dspark: online learning off on this server ({self.reason}): {what}"


def decide_rank_learning(facts: ParallelFacts) -> RankLearning:
    """On where one rank decides alone; off (every learned input at its prior) where several ranks must agree."""
    why = []
    if facts.tp_size > 1:
        why.append(f"--tp-size {facts.tp_size}")
    if facts.pp_size > 1:
        why.append(f"--pp-size {facts.pp_size}")
    if facts.attn_dp_enabled:
        why.append("DP attention")
    if not why:
        return RankLearning(True, "one rank decides each step's verify budget alone: step records and step times "
                                  "may teach the cost model, the survival prior and the draft gate")
    reason = (f"{' and '.join(why)}: every rank computes each step's verify budget, and so its CUDA-graph tier, on "
              "its own host, while step records reach each rank's host after a timing-dependent delay; what they "
              "teach would differ per rank and the ranks would replay different graph tiers in the same step")
    return RankLearning(False, reason, tuple(name for name, _ in LEARNED_INPUTS))


def parallel_facts(parallel: Any) -> ParallelFacts:
    """ParallelFacts from SGLang's ``get_parallel()`` (missing fields: a single rank)."""

    def read(name: str, default):
        try:  # SGLang's ParallelContext raises RuntimeError / ValueError for a field it has not published
            value = getattr(parallel, name)
        except Exception:  # noqa: BLE001
            return default
        return default if value is None else value

    return ParallelFacts(tp_size=int(read("tp_size", 1)), pp_size=int(read("pp_size", 1)),
                         attn_dp_enabled=bool(read("attn_dp_enabled", False)))


__all__ = ["LEARNED_INPUTS", "ParallelFacts", "RankLearning", "decide_rank_learning", "parallel_facts"]
