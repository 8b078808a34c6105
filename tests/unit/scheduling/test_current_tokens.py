"""When a batch with a lookup match gives up SGLang's overlap (sglang_dspark/scheduling/current_tokens.py)."""

import pytest

from sglang_dspark.scheduling.current_tokens import CurrentTokensPolicy


def test_gives_up_the_overlap_until_chains_go_unverified_then_one_batch_in_patience():
    policy = CurrentTokensPolicy(patience=4)
    assert policy.wants(16)  # nothing known: current tokens, so the scheduler can weigh the chains
    for _ in range(3):
        policy.observe(16, verified_chains=False)
    assert policy.wants(16)  # 3 declines < patience
    policy.observe(16, verified_chains=False)
    assert [policy.wants(16) for _ in range(8)] == [False, False, False, True] * 2
    assert policy.summary() == {"overlap_kept_at": [16]}
    assert policy.wants(4) and policy.wants(13) is False  # per load bucket: 13 shares 16's, 4 has its own
    policy.observe(15, verified_chains=True)  # a verified chain at that load: current tokens again
    assert all(policy.wants(16) for _ in range(5)) and policy.summary() == {"overlap_kept_at": []}


def test_bad_patience_is_refused():
    with pytest.raises(ValueError, match="patience"):
        CurrentTokensPolicy(patience=0)
