"""Policy selection and the verify mode it implies (pure)."""

import json

import pytest

from sglang_dspark.scheduling.policy import draft_has_confidence_head, read_admission_policy


def test_default_policy_is_async(monkeypatch):
    monkeypatch.delenv("SGLANG_DSPARK_ADMISSION", raising=False)
    assert read_admission_policy() == "async"


def test_unknown_policy_names_the_choices(monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_ADMISSION", "greedy")
    with pytest.raises(ValueError, match="SGLANG_DSPARK_ADMISSION=.greedy. is not valid; choose one of async, exact, verify-all, off"):
        read_admission_policy()


def test_confidence_head_is_read_by_value(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": False}))
    assert draft_has_confidence_head(str(tmp_path)) is False
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": True}))
    assert draft_has_confidence_head(str(tmp_path)) is True


def _table_cost():
    from sglang_dspark.scheduling import TabulatedSps1D

    # B = 1..8 verify tokens: nearly free up to 3, then each token costs a lot.
    return TabulatedSps1D([100.0, 99.0, 98.0, 60.0, 40.0, 30.0, 25.0, 20.0])


def test_policy_object_capacity_per_policy():
    import torch

    from sglang_dspark.scheduling import capacity_from_survival
    from sglang_dspark.scheduling.policy import AdmissionPolicy

    survival = torch.tensor([[0.9, 0.8, 0.1], [0.5, 0.2, 0.1]], dtype=torch.float64)
    cost = _table_cost()
    assert AdmissionPolicy("off").capacity(survival, cost, 2) == 0
    assert AdmissionPolicy("exact").capacity(survival, cost, 2) == 6
    expected = int(capacity_from_survival(survival, cost, 2))
    assert AdmissionPolicy("async").capacity(survival, cost, 2) == expected
    assert 0 < expected < 6  # the table makes some but not all drafts pay


def test_policy_object_verify_lengths_per_policy():
    import torch

    from sglang_dspark.scheduling import admit_exact
    from sglang_dspark.scheduling.policy import AdmissionPolicy

    confidence = torch.tensor([[0.9, 0.9, 0.9], [0.1, 0.9, 0.9]])
    cost = _table_cost()
    assert AdmissionPolicy("off").verify_lengths(confidence, 2, cost, "cpu").tolist() == [1, 1]
    exact = AdmissionPolicy("exact").verify_lengths(confidence, 2, cost, "cpu")
    assert exact.dtype == torch.int32
    assert exact.tolist() == (admit_exact(confidence.double(), cost) + 1).tolist()
    assert AdmissionPolicy("async").verify_lengths(confidence, 2, cost, "cpu") is None  # upstream's device top-K
    with pytest.raises(ValueError, match="unknown admission policy"):
        AdmissionPolicy("greedy")
