"""The DSpark draft as a proposal source of our planner: its acceptance estimates and its gate's advice, and what
each step teaches them (SGLang-free; the planner hands it the survivals its budget planner reads).

Its proposals are the draft block's tokens, made on the device during the step; what is known before the step is
their survivals two steps back (upstream's confidence relay), with rows of no confidence of their own read from the
population's recent survivals (:class:`~sglang_dspark.scheduling.acceptance.SurvivalPrior`). Whether the draft runs
is the draft gate's advice (``scheduling/draft_gate.py``), read from the rows no lookup chain serves; the step
chooser (``scheduling/step_choice.py``) takes it, and the gate tallies what the step did. No gate (``off``, or a
server where it cannot run): no advice, every step drafts.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from sglang_dspark.scheduling.acceptance import SurvivalPrior
from sglang_dspark.scheduling.draft_gate import DraftGate, ForcedGate, GateDecision
from sglang_dspark.scheduling.step_choice import without_rows


class DraftSource:
    def __init__(self, survival_prior: Optional[SurvivalPrior] = None,
                 gate: Optional[Union[DraftGate, ForcedGate]] = None) -> None:
        self.survival_prior = survival_prior if survival_prior is not None else SurvivalPrior()
        self.gate = gate
        # Whether step records may teach what changes the budget (engine/rank_learning.py); the planner sets it.
        self.learns = False

    @property
    def weighs_beside_lookup(self) -> bool:
        """The automatic gate's advice is weighed against the lookup chains (the forced test gates are obeyed)."""
        return isinstance(self.gate, DraftGate)

    def advise(self, survival: Optional[torch.Tensor], num_requests: int, lookup_rows: Optional[torch.Tensor],
               step_costs) -> tuple[Optional[GateDecision], Optional[torch.Tensor]]:
        """The gate's advice for a step of ``num_requests`` (None: no gate) and the survivals it read (``survival``,
        the lagged ones with unknown rows already from the prior; None: the population's). ``lookup_rows [R]``: rows
        with a lookup proposal, which count no draft token; ``step_costs``: ``profiler/step_costs.StepCosts``."""
        gate = self.gate
        if gate is None:
            return None, survival
        held = gate.held_advice(num_requests)  # a pause repeated without reading anything
        if held is not None:
            return held, survival
        prior = self.survival_prior.rows(num_requests)
        if survival is None:
            survival = prior
        return gate.advise(
            lagged_survival=without_rows(survival, lookup_rows),
            cost_with_draft=step_costs.drafted,
            seconds_without_draft=step_costs.plain(num_requests),
            skip_samples=step_costs.pairs(num_requests),
            num_requests=num_requests,
            prior_survival=without_rows(prior, lookup_rows),
        ), survival

    def tally(self, decision: Optional[GateDecision]) -> None:
        """What the step did, as the chooser decided it."""
        if self.gate is not None and decision is not None:
            self.gate.tally(decision)

    def observe(self, record) -> None:
        """A finished decode step (``engine/step_record.StepRecord``). The prior learns the draft rows' survivals only
        (a lookup row's confidences are the lookup's estimates); the gate learns from steps without lookup rows (a
        step with them is not what the gate predicted)."""
        lookup_rows = record.lookup.rows if record.lookup is not None else None
        survival = record.survival
        if self.learns and survival is not None and record.drafted:
            self.survival_prior.observe(survival if lookup_rows is None else survival[~lookup_rows])
        if self.gate is not None and lookup_rows is None:
            self.gate.observe(record)

    def summary(self, step_costs, **counters) -> Optional[dict]:
        """The gate's state for ``/server_info`` (None: no gate), with the learned step costs and ``counters``."""
        gate = self.gate
        if gate is None:
            return None
        summary = gate.summary()
        costs = step_costs.overheads.summary()
        summary["step_level_ms"] = costs["level_ms"]
        summary["drafted_step_overhead_ms"] = costs["drafted_step_ms"]
        # The draft block's learned cost per R bucket, from adjacent drafted / plain steps, and how many pairs taught it.
        summary["draft_ms"] = costs["draft_block_ms"]
        summary["draft_block_pairs"] = costs["pairs"]
        summary["chain_token_ms"] = step_costs.chain.summary()  # a lookup step's cost per chain token
        summary.update(counters)
        last = gate.last
        if last is not None and last.choice is not None:
            summary["last"] = {"reason": last.reason, "theta_draft": last.choice.theta_draft,
                               "theta_skip": last.choice.theta_skip, "capacity": last.choice.capacity}
        return summary


__all__ = ["DraftSource"]
