"""When a batch with a lookup match gives up SGLang's overlap (sglang_dspark/scheduling/current_tokens.py)."""

import pytest

from sglang_dspark.lookup.config import LookupConfig
from sglang_dspark.scheduling.current_tokens import CurrentTokensPolicy


def test_gives_up_the_overlap_until_chains_go_unverified_then_one_batch_in_patience():
    policy = CurrentTokensPolicy(LookupConfig(overlap_patience=4))
    assert policy.wants(16)  # nothing known: current tokens, so the scheduler can weigh the chains
    for _ in range(3):
        policy.observe(16, verified_chains=False)
    assert policy.wants(16)  # 3 declines < patience
    policy.observe(16, verified_chains=False)
    assert [policy.wants(16) for _ in range(8)] == [False, False, False, True] * 2
    assert policy.summary()["overlap_kept_at"] == [16]
    assert policy.wants(4) and policy.wants(13) is False  # per load bucket: 13 shares 16's, 4 has its own
    policy.observe(15, verified_chains=True)  # a verified chain at that load: current tokens again
    assert all(policy.wants(16) for _ in range(5)) and policy.summary()["overlap_kept_at"] == []


def test_the_wait_is_given_up_only_where_the_chains_save_more_than_it_costs():
    policy = CurrentTokensPolicy(LookupConfig(overlap_patience=4, saving_rate=0.5))
    assert policy.wants(8, gap_seconds=0.002)  # no saving known yet: the chains may pay
    policy.observe(8, verified_chains=True, saved_seconds=0.001)  # verified, but saved less than a 2 ms wait
    assert [policy.wants(8, gap_seconds=0.002) for _ in range(4)] == [False, False, False, True]
    assert policy.summary()["overlap_kept_at"] == [8] and policy.summary()["chain_saving_ms"] == {8: 1.0}
    assert policy.wants(8, gap_seconds=0.0005)  # a cheaper wait (the same saving) pays
    assert policy.wants(8, gap_seconds=0.0)  # a free wait (the CPU) always does, as without a gap
    policy.observe(8, verified_chains=True, saved_seconds=0.009)  # mean saving now 5 ms
    assert all(policy.wants(8, gap_seconds=0.002) for _ in range(6))
    for _ in range(3):  # matched steps that verified nothing save 0: the mean falls below the gap again
        policy.observe(8, verified_chains=False)
    assert policy.summary()["chain_saving_ms"] == {8: 0.625} and not policy.wants(8, gap_seconds=0.002)


def test_an_unknown_saving_is_not_counted_as_zero():
    policy = CurrentTokensPolicy(LookupConfig(overlap_patience=4, saving_rate=0.5))
    policy.observe(8, verified_chains=True, saved_seconds=None)  # no step costs yet
    assert policy.summary()["chain_saving_ms"] == {} and policy.wants(8, gap_seconds=1.0)


def test_bad_patience_is_refused():
    with pytest.raises(ValueError, match="patience"):
        CurrentTokensPolicy(LookupConfig(overlap_patience=0))
    with pytest.raises(ValueError, match="saving_rate"):
        CurrentTokensPolicy(LookupConfig(saving_rate=0.0))
