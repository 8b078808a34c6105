"""The step costs the capacity search and the gate read (profiler/step_costs.py), and the one door served steps
teach them through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dspark.profiler.step_costs import StepCosts


class LinearTable:
    """verify(R, B) = 10 ms + 1 ms per verified token."""

    def step_seconds(self, num_requests, verify_tokens):
        return 0.010 + 0.001 * verify_tokens

    def step_seconds_tensor(self, num_requests, verify_tokens):
        return 0.010 + 0.001 * verify_tokens.to(float)

    def summary(self):
        return {"source": "test"}


def record(requests, verify_lens, drafted, seconds):
    return SimpleNamespace(commit_lens=[1] * requests, verify_lens=verify_lens, drafted=drafted, seconds=seconds)


def test_plain_is_unknown_until_a_plain_step_was_timed_then_table_plus_level():
    costs = StepCosts(LinearTable())
    assert costs.plain(2) is None and costs.pairs(2) == 0
    costs.observe(record(2, [1, 1], drafted=False, seconds=0.020))  # 12 ms of verify, 8 ms of the rest
    assert costs.plain(2) == pytest.approx(0.020)
    assert costs.observe(record(2, [1, 1], drafted=False, seconds=None)) is False  # an untimed step teaches nothing


def test_a_drafted_plain_pair_teaches_the_draft_block():
    costs = StepCosts(LinearTable())
    for _ in range(4):
        costs.observe(record(1, [4], drafted=True, seconds=0.014 + 0.005 + 0.003))  # verify + level + block
        costs.observe(record(1, [1], drafted=False, seconds=0.011 + 0.005))
    assert costs.pairs(1) >= 3
    assert 1.0 / costs.drafted.steps_per_second(1, 4) == pytest.approx(0.022, abs=0.002)
    assert costs.plain(1) == pytest.approx(0.016, abs=0.001)


def test_a_table_slower_than_the_served_steps_is_scaled_down():
    costs = StepCosts(LinearTable(), source="test")
    changed = [costs.observe(record(1, [1], drafted=False, seconds=0.0055)) for _ in range(40)]  # half the table
    assert any(changed) and costs.drafted.verify_scale == pytest.approx(0.5, rel=0.05)
    summary = costs.table_summary()
    assert summary["source"] == "test" and summary["corrections"] >= 1


def test_a_lookup_step_teaches_its_chain_cost_and_the_level_net_of_it():
    costs = StepCosts(LinearTable())
    costs.observe(record(2, [1, 1], drafted=False, seconds=0.020))  # plain: level 8 ms
    assert costs.undrafted.steps_per_second(2, 6) == pytest.approx(1 / (0.016 + 0.008))  # no chain cost known yet
    # A lookup step verifying 4 chain tokens: 16 ms of verify, 8 ms of level, 2 ms per chain token on top.
    costs.observe(record(2, [3, 3], drafted=False, seconds=0.016 + 0.008 + 4 * 0.002))
    assert costs.chain.seconds(2) == pytest.approx(0.002) and costs.chain.summary() == {2: 2.0}
    assert costs.undrafted.steps_per_second(2, 6) == pytest.approx(1 / 0.032)
    import torch

    rates = costs.undrafted.steps_per_second(2, torch.tensor([2, 6]))
    assert rates.tolist() == pytest.approx([1 / 0.020, 1 / 0.032])
    assert costs.plain(2) == pytest.approx(0.020)  # the level was taught net of the chain cost
    assert costs.chain.seconds(64) == 0.0  # another load bucket: nothing learned there


def test_a_stalled_lookup_step_does_not_price_chains_out_for_good():
    """A chain step that stalls (another process on the cores) among a load's first ones: the chain cost starts at
    the lower quartile of the first samples and later moves by at most a quarter of the step's share a step, so it
    stays near the real 4 ms a token; an exploring step prices chains without it."""
    costs = StepCosts(LinearTable())
    for _ in range(3):
        costs.observe(record(16, [1] * 16, drafted=False, seconds=0.2))
    plain = costs.plain(16)

    def chain_step(seconds_over_plain):  # 16 rows, 40 chain tokens
        costs.observe(record(16, [3] * 8 + [2] * 8, drafted=False, seconds=plain + seconds_over_plain))

    chain_step(3.0)  # the first chain step stalls for 3 s: 75 ms a token
    for _ in range(4):
        chain_step(40 * 0.004)
    learned = costs.chain.seconds(16)
    assert learned < 0.010, learned
    chain_step(3.0)  # a later stall moves it a bounded step, and normal steps bring it back
    assert costs.chain.seconds(16) < 0.025
    for _ in range(10):
        chain_step(40 * 0.004)
    assert costs.chain.seconds(16) < 0.010
    # Exploring: chain tokens at the table verify alone (no learned per-token cost).
    exploring, planning = costs.undrafted_for(explored=True), costs.undrafted_for(explored=False)
    assert exploring.steps_per_second(16, 56) > planning.steps_per_second(16, 56)
    assert costs.undrafted_for(explored=False) is costs.undrafted
