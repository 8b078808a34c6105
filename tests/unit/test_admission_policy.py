"""Policy selection and the verify mode it implies (pure)."""

import json

import pytest

from sglang_dspark.scheduling.policy import draft_has_confidence_head, read_admission_policy, verify_mode_for


def test_default_policy_is_async(monkeypatch):
    monkeypatch.delenv("SGLANG_DSPARK_ADMISSION", raising=False)
    assert read_admission_policy() == "async"


def test_unknown_policy_names_the_choices(monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_ADMISSION", "greedy")
    with pytest.raises(ValueError, match="SGLANG_DSPARK_ADMISSION=.greedy. is not valid; choose one of async, exact, verify-all, off"):
        read_admission_policy()


@pytest.mark.parametrize(
    "policy,user_mode,head,expected",
    [
        ("async", None, True, "compact"),
        ("exact", None, True, "compact"),
        ("off", None, True, "compact"),
        ("verify-all", None, True, "static"),
        ("async", None, False, "static"),
        ("async", "cap-accept", True, "cap-accept"),
    ],
)
def test_verify_mode(policy, user_mode, head, expected):
    mode, warning = verify_mode_for(policy, user_mode, head)
    assert mode == expected
    assert (warning is not None) == (not head and user_mode is None and policy != "verify-all")


def test_confidence_head_is_read_by_value(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": False}))
    assert draft_has_confidence_head(str(tmp_path)) is False
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": True}))
    assert draft_has_confidence_head(str(tmp_path)) is True
