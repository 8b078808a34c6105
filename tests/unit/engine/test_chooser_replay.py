"""Replay: the one chooser (scheduling/step_choice.choose_step, driven by the planner's ``_choose``) makes the same
plans as the choice it replaced (issue #47), on the same step facts, step after step.

The replaced choice is kept here as a reference, as it stood at commit 29c3012: the planner's ``_decide`` (the gate's
decision, then the veto beside lookup chains with ``gate.recount`` rewriting the gate's tallies) followed by
``LookupSource.rows_for`` and ``StepPlan.decided``. Both run over one seeded stream of step facts, each with its own
gate: 600 decode steps, R from 1 to 16 in spells, lagged survivals (some steps with none known), lookup proposals on
some rows (some steps with none), the automatic gate with learned step costs (so it drafts, pauses, probes, holds
pauses and refreshes), and the same outcome fed back to both gates after every step. Every plan (draft, kind,
decision, chain rows and lengths, anchor paths) and the gates' final tallies must be equal. A mutation check: the
reference without its veto makes different plans on the same stream (so the stream exercises the veto).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.engine.draft_source import DraftSource
from sglang_dspark.scheduling.acceptance import SurvivalPrior
from sglang_dspark.scheduling.draft_gate import DraftGate, GateDecision
from sglang_dspark.scheduling.step_choice import (
    draft_pays_beside_lookup,
    lookup_lengths,
    prefers_lookup,
    without_rows,
)
from sglang_dspark.scheduling.step_plan import LookupChains, StepPlan

GAMMA = 4
STEPS = 600


class _Cost:
    def __init__(self, base, per_token):
        self.base, self.per_token = base, per_token

    def steps_per_second(self, num_requests, verify_tokens):
        return 1.0 / (self.base + 0.0005 * num_requests + self.per_token * verify_tokens)


class _StepCosts:
    """What the gate and the chooser read of profiler/step_costs.StepCosts: learned, so the gate decides on costs."""

    drafted = _Cost(0.016, 0.0010)
    undrafted = _Cost(0.010, 0.0010)

    def plain(self, num_requests):
        return 1.0 / float(self.undrafted.steps_per_second(num_requests, num_requests))

    def pairs(self, num_requests):
        return 10

    def undrafted_for(self, explored):  # one cost whether the step explores or not: the replay compares choosers
        return self.undrafted


def _facts_stream(seed: int = 7):
    """One step's facts at a time: (R, lagged survival or None, lookup proposals or None, compact_ok, plain_ok)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_requests = 4
    for step in range(STEPS):
        if step % 40 == 0:
            num_requests = rng.choice([1, 2, 4, 8, 16])
        quality = rng.choice([0.05, 0.3, 0.6, 0.9])  # the draft's survivals swing between useless and strong
        survival = None
        if rng.random() > 0.1:
            conditional = (quality + 0.1 * torch.rand(num_requests, GAMMA, generator=gen, dtype=torch.float64)).clamp(0, 1)
            survival = torch.cumprod(conditional, dim=1)
        proposals = None
        if rng.random() < 0.6:
            lengths = torch.tensor([rng.choice([0, 0, 2, 4]) for _ in range(num_requests)])
            if bool(lengths.any()):
                chain_quality = rng.choice([0.2, 0.7, 0.97])
                conditional = torch.where(torch.arange(GAMMA) < lengths[:, None],
                                          torch.full((num_requests, GAMMA), chain_quality, dtype=torch.float64),
                                          torch.zeros(num_requests, GAMMA, dtype=torch.float64))
                proposals = LookupChains(tokens=torch.randint(0, 100, (num_requests, GAMMA), generator=gen),
                                         lengths=lengths, match_lens=torch.where(lengths > 0, 4, 0),
                                         conditional=conditional)
        compact_ok = rng.random() < 0.8
        yield num_requests, survival, proposals, compact_ok, compact_ok and rng.random() < 0.5


# ------------------------------------------------------------------ the choice before issue #47 (reference)


def _recount(gate, counted, final):
    gate.reasons[counted.reason] -= 1
    if not gate.reasons[counted.reason]:
        del gate.reasons[counted.reason]
    gate.reasons[final.reason] = gate.reasons.get(final.reason, 0) + 1
    gate.drafted += int(final.draft) - int(counted.draft)
    gate.skipped += int(counted.draft) - int(final.draft)
    gate.last = final


def _old_rows_for(proposed, *, drafted, draft_survival, cost):
    conditional = proposed.conditional
    lengths = lookup_lengths(conditional, cost, forced=False, proposed=proposed.lengths)
    if drafted:
        known = draft_survival if draft_survival is not None and draft_survival.shape == conditional.shape else None
        lengths = torch.where(prefers_lookup(conditional, known), lengths, torch.zeros_like(lengths))
    if not bool((lengths > 0).any()):
        return None
    conditional = torch.where(torch.arange(GAMMA) < lengths[:, None], conditional, torch.zeros_like(conditional))
    return LookupChains(tokens=proposed.tokens, lengths=lengths, match_lens=proposed.match_lens,
                        conditional=conditional)


def _old_plan(gate, prior, costs, num_requests, survival, proposed, compact_ok, plain_ok, *, veto=True):
    lookup_rows = proposed.rows if proposed is not None else None
    decision = gate.held_pause(num_requests)
    if decision is None:
        read = survival if survival is not None else prior.rows(num_requests)
        prior_rows = prior.rows(num_requests)
        decision = gate.decide(lagged_survival=without_rows(read, lookup_rows), cost_with_draft=costs.drafted,
                               seconds_without_draft=costs.plain(num_requests), skip_samples=costs.pairs(num_requests),
                               num_requests=num_requests, prior_survival=without_rows(prior_rows, lookup_rows))
        if veto and decision.draft and proposed is not None and not draft_pays_beside_lookup(
                proposed.conditional, read, costs.drafted, costs.undrafted):
            counted, decision = decision, GateDecision(False, "lookup", decision.choice)
            _recount(gate, counted, decision)
    rows = None if proposed is None else _old_rows_for(proposed, drafted=decision.draft, draft_survival=survival,
                                                       cost=costs.undrafted)
    return StepPlan.decided(decision, compact_ok=compact_ok, plain_ok=plain_ok, lookup=rows)


# ------------------------------------------------------------------ the one chooser, as the planner drives it


def _new_planner(costs):
    from sglang_dspark.engine.planner import AdmissionVerifyPlanner

    lookup = SimpleNamespace(proposals=None, forced=False, config=SimpleNamespace(chain_min_gain=0.05),
                             chosen=lambda plan, num_requests, cost: None)
    lookup.propose = lambda batch: lookup.proposals
    planner = SimpleNamespace(lookup=lookup, draft=DraftSource(SurvivalPrior(), DraftGate()), step_costs=costs,
                              gamma=GAMMA, long_chain_ok=None)
    return planner, lambda batch, survival, **paths: AdmissionVerifyPlanner._choose(planner, batch, survival, **paths)


def _key(plan: StepPlan):
    chains = None if plan.lookup is None else (plan.lookup.lengths.tolist(), plan.lookup.conditional.tolist())
    return (plan.draft, plan.kind, plan.compact_anchor, plan.plain_decode, plan.decision, chains)


def _outcome(rng, plan, num_requests):
    """The same realized step for both gates: committed tokens and seconds from the plan's kind."""
    tokens = num_requests * (1 + (rng.random() * 2 if plan.draft else 0))
    seconds = 0.02 if plan.draft else 0.012
    return tokens, seconds


def _replay(veto: bool = True):
    costs = _StepCosts()
    old_gate, old_prior = DraftGate(), SurvivalPrior()
    planner, choose = _new_planner(costs)
    rng_old, rng_new = random.Random(1), random.Random(1)
    plans = []
    for num_requests, survival, proposed, compact_ok, plain_ok in _facts_stream():
        old = _old_plan(old_gate, old_prior, costs, num_requests, survival, proposed, compact_ok, plain_ok, veto=veto)
        planner.lookup.proposals = proposed
        batch = SimpleNamespace(seq_lens=[0] * num_requests)
        new = choose(batch, survival, compact_ok=compact_ok, plain_ok=plain_ok)
        plans.append((_key(old), _key(new)))
        for gate, plan, rng in ((old_gate, old, rng_old), (planner.draft.gate, new, rng_new)):
            tokens, seconds = _outcome(rng, plan, num_requests)
            if plan.lookup is None:  # the gate learns from steps without lookup rows (both paths)
                gate.observe_outcome(plan.choice, plan.draft, tokens, seconds, num_requests)
        if survival is not None:
            for prior in (old_prior, planner.draft.survival_prior):
                prior.observe(survival)
    return plans, old_gate, planner.draft.gate


def test_the_one_chooser_replays_the_old_choice_plan_for_plan():
    plans, old_gate, new_gate = _replay()
    differing = [i for i, (old, new) in enumerate(plans) if old != new]
    assert not differing, f"plans differ at steps {differing[:10]}: {plans[differing[0]]}"
    assert old_gate.summary() == new_gate.summary()
    kinds = {new[1] for _, new in plans}
    reasons = {new[4].reason for _, new in plans if new[4] is not None}
    # The stream reaches every kind of step and the gate's rules, the veto ("lookup") included.
    assert kinds == {"drafted", "plain", "lookup", "mixed"}
    assert {"pays", "pause", "lookup"} <= reasons and len(plans) == STEPS


def test_the_replay_would_see_a_missing_veto():
    plans, _, _ = _replay(veto=False)
    assert any(old != new for old, new in plans)


@pytest.mark.parametrize("survival", [None, torch.full((2, GAMMA), 0.5, dtype=torch.float64)])
def test_a_failing_gate_never_takes_a_step_down(survival, caplog):
    """The chooser's guard: a gate that raises is dropped (every later step drafts) and this step drafts."""
    planner, choose = _new_planner(_StepCosts())

    def broken(**_):
        raise RuntimeError("stand-in")

    planner.draft.gate.advise = broken
    plan = choose(SimpleNamespace(seq_lens=[0, 0]), survival, compact_ok=True, plain_ok=True)
    assert plan.draft and plan.decision.reason == "error" and planner.draft.gate is None
