"""One decode step, one plan (scheduling/step_plan.py): a frozen value, built once from the gate's decision, shared by
the worker's parts for exactly the step it was made for."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_dspark.engine.current_step import CurrentStep
from sglang_dspark.scheduling.step_plan import DRAFTED, StepPlan
from sglang_dspark.scheduling.draft_gate import DraftChoice, GateDecision

CHOICE = DraftChoice(draft=False, capacity=2, theta_draft=50.0, theta_skip=80.0, seconds_draft=0.03, seconds_skip=0.01)


def test_a_skipped_step_takes_the_paths_its_batch_qualifies_for():
    pause = GateDecision(False, "pause", CHOICE)
    assert StepPlan.decided(pause, compact_ok=True, plain_ok=True) == StepPlan(False, True, True, pause)
    assert StepPlan.decided(pause, compact_ok=True, plain_ok=False) == StepPlan(False, True, False, pause)
    # SGLang's decode step is a compact anchor-only step: without the compact path, upstream's verify runs.
    assert StepPlan.decided(pause, compact_ok=False, plain_ok=True) == StepPlan(False, False, False, pause)
    assert StepPlan.decided(pause, compact_ok=True, plain_ok=True).choice is CHOICE


def test_a_drafted_step_has_no_anchor_only_path():
    pays = GateDecision(True, "pays", CHOICE, budget=2)
    assert StepPlan.decided(pays, compact_ok=True, plain_ok=True) == StepPlan(decision=pays)
    assert StepPlan.decided(None, compact_ok=True, plain_ok=True) == DRAFTED and DRAFTED.choice is None
    with pytest.raises(ValueError, match="drafted step"):
        StepPlan(draft=True, compact_anchor=True)
    with pytest.raises(ValueError, match="compact anchor-only"):
        StepPlan(draft=False, plain_decode=True)


def test_the_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DRAFTED.draft = False


def test_the_current_step_reads_drafted_outside_a_step_even_after_a_failure():
    step = CurrentStep()
    plan = StepPlan(draft=False, compact_anchor=True)
    with step.running(plan):
        assert step.plan is plan
    assert step.plan is DRAFTED
    with pytest.raises(RuntimeError):
        with step.running(plan):
            raise RuntimeError("the forward failed")
    assert step.plan is DRAFTED
    assert CurrentStep().plan is DRAFTED  # a fresh one, and the class default, are never a skipped step


def _lookup(lengths):
    import torch

    from sglang_dspark.scheduling.step_plan import LookupChains

    lengths = torch.tensor(lengths)
    rows = len(lengths)
    return LookupChains(tokens=torch.zeros(rows, 4, dtype=torch.long), lengths=lengths,
                      match_lens=torch.full((rows,), 3), conditional=torch.zeros(rows, 4))


def test_lookup_rows_take_the_ragged_verify_and_a_draft_only_where_some_row_wants_it():
    pause = GateDecision(False, "pause", CHOICE)
    pays = GateDecision(True, "pays", CHOICE, budget=2)
    some, every, none = _lookup([3, 0]), _lookup([3, 1]), _lookup([0, 0])
    skipped = StepPlan.decided(pause, compact_ok=True, plain_ok=True, lookup=some)
    assert (skipped.draft, skipped.compact_anchor, skipped.plain_decode, skipped.kind) == (False, False, False, "lookup")
    assert StepPlan.decided(pays, compact_ok=True, plain_ok=True, lookup=some).kind == "mixed"
    # Every row takes its lookup chain: the draft forward is not run.
    assert StepPlan.decided(pays, compact_ok=True, plain_ok=True, lookup=every).kind == "lookup"
    # No lookup row at all: the plan the gate alone makes.
    assert StepPlan.decided(pause, compact_ok=True, plain_ok=True, lookup=none) == StepPlan(False, True, True, pause)
    assert StepPlan.decided(pays, compact_ok=True, plain_ok=True, lookup=none).kind == "drafted"
    with pytest.raises(ValueError, match="lookup rows"):
        StepPlan(draft=False, compact_anchor=True, lookup=some)
