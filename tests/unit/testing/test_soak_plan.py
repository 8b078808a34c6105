"""The request plans of the soak (sglang_dspark/testing/soak.py): shares and lengths, without a server."""

from __future__ import annotations

import random

from sglang_dspark.testing.soak import KINDS, SoakConfig, _planned_abort, _plan, scheduler_pids


def test_abort_share_is_exact_and_spread():
    flags = [_planned_abort(i, 0.2) for i in range(100)]
    assert sum(flags) == 20
    assert all(sum(flags[i:i + 5]) == 1 for i in range(0, 100, 5))
    assert not any(_planned_abort(i, 0.0) for i in range(50))


def test_near_limit_plans_fill_the_kv_pool():
    cfg = SoakConfig(max_total_tokens=2048, near_limit_share=1.0)
    rng = random.Random(0)
    plans = [_plan(rng, cfg, i) for i in range(400)]
    near = [p for p in plans if p.near_limit]
    assert near and all(p.kind.startswith("generate") for p in near)
    for plan in near:
        total = len(plan.prompt_ids) + plan.max_new_tokens
        assert 0.9 * 2048 - 48 <= total <= 1.05 * 2048 and 8 <= plan.max_new_tokens <= 48
        assert all(cfg.vocab_low <= t < cfg.vocab_high for t in plan.prompt_ids)
    assert {p.kind for p in plans} == set(KINDS)
    assert all(p.prompt_text for p in plans if p.kind.startswith("chat"))


def test_scheduler_pids_of_a_process_without_children_is_empty():
    import os

    assert scheduler_pids(os.getpid()) == []
