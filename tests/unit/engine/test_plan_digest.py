"""Each TP rank's digest of its verify layouts (engine/plan_digest.py): what it folds, the log line, the idle hook."""

from __future__ import annotations

import logging
import types

from sglang_dspark.engine.plan_digest import PlanDigest, log_digest_at_idle, parse_digest_lines, plan_digest_for


def _layout(tier, lens=None):
    return types.SimpleNamespace(graph_num_tokens=tier, verify_lens_cpu=lens)


def _fold_all(digest, steps):
    for kind, r, budget, layout in steps:
        digest.fold(kind=kind, num_requests=r, budget=budget, layout=layout)
    return digest.hexdigest


STEPS = [("drafted", 2, None, None), ("drafted", 3, 4, _layout(8, [2, 3, 2])), ("drafted", 3, 5, _layout(16))]


def test_equal_verifies_give_equal_digests_and_any_difference_shows():
    assert plan_digest_for(1, 0) is None  # one rank decides alone: nothing to compare
    same = _fold_all(plan_digest_for(2, 0), STEPS), _fold_all(plan_digest_for(2, 1), STEPS)
    assert same[0] == same[1]
    variants = {
        "budget K instead of None": [("drafted", 2, 0, None), *STEPS[1:]],
        "another budget": [STEPS[0], ("drafted", 3, 5, _layout(8, [2, 3, 2])), STEPS[2]],
        "another request count": [STEPS[0], ("drafted", 4, 4, _layout(8, [2, 3, 2])), STEPS[2]],
        "other verify lengths": [STEPS[0], ("drafted", 3, 4, _layout(8, [3, 2, 2])), STEPS[2]],
        "another graph tier": [*STEPS[:2], ("drafted", 3, 5, _layout(24))],
        "another step kind": [*STEPS[:2], ("plain", 3, 5, _layout(16))],
        "one verify fewer": STEPS[:2],
    }
    for name, steps in variants.items():
        assert _fold_all(PlanDigest(1), steps) != same[0], name


def test_the_line_round_trips_through_the_log_parser():
    digests = []
    for rank in (0, 1):
        digest = PlanDigest(rank)
        _fold_all(digest, STEPS)
        digests.append(digest)
    log = "\n".join(f"[2026-12-05 08:11:46 TP{d.tp_rank}] {d.line()}" for d in digests)
    assert parse_digest_lines(log) == {0: {3: digests[0].hexdigest}, 1: {3: digests[1].hexdigest}}


def _scheduler(digest, idle=True):
    planner = types.SimpleNamespace(plan_digest=digest)
    return types.SimpleNamespace(draft_worker=types.SimpleNamespace(_verify_planner=planner),
                                 is_fully_idle=lambda: idle), planner


def test_logged_once_per_idle_period_after_new_verifies(caplog):
    digest = PlanDigest(1)
    scheduler, _ = _scheduler(digest)
    with caplog.at_level(logging.INFO, logger="sglang_dspark.engine.plan_digest"):
        log_digest_at_idle(scheduler)  # nothing verified yet
        digest.fold(kind="drafted", num_requests=1, budget=None, layout=None)
        busy, _ = _scheduler(digest, idle=False)
        log_digest_at_idle(busy)  # not idle: requests still wait or run
        log_digest_at_idle(scheduler)
        log_digest_at_idle(scheduler)  # the same idle period: no second line
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [digest.line()] and "tp_rank=1 verifies=1 " in lines[0]


def test_a_failing_hook_stops_logging_instead_of_raising(caplog):
    digest = PlanDigest(0)
    digest.fold(kind="drafted", num_requests=1, budget=None, layout=None)

    def broken():
        raise RuntimeError("boom")

    scheduler, planner = _scheduler(digest)
    scheduler.is_fully_idle = broken
    with caplog.at_level(logging.ERROR, logger="sglang_dspark.engine.plan_digest"):
        log_digest_at_idle(scheduler)
        log_digest_at_idle(scheduler)
    assert planner.plan_digest is None and len(caplog.records) == 1
    log_digest_at_idle(types.SimpleNamespace())  # a scheduler without a DSPARK worker (no-spec server)
