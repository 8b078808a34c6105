"""Start-up SPS probes are never run under DP attention (issue #38, item 6).

The probes hand-build a TARGET_VERIFY batch (profiler/engine_measurer.py) without the DP-attention fields SGLang's
scheduler fills for all attention-DP ranks together, so under ``--enable-dp-attention`` / ``--attn-dp-size`` its
forward would skip the DP sync and crash or hang. The verify-mode decision keeps such launches static unless a table
file is given (tests/unit/engine/test_verify_mode.py); the planner skips the probes whatever the mode, with one log line, and
runs verify-all.
"""

from __future__ import annotations

import logging
import types

from sglang_dspark.engine.draft_source import DraftSource

import pytest

from sglang_dspark.engine import planner as planner_module
from sglang_dspark.engine.planner import AdmissionVerifyPlanner, sps_probes_skipped
from sglang_dspark.engine.verify_mode import SPS_PROBES_DP_ATTENTION_SKIPPED
from sglang_dspark.scheduling.policy import AdmissionPolicy


def test_skip_decision():
    assert sps_probes_skipped(attn_dp_enabled=True, table_path=None) == SPS_PROBES_DP_ATTENTION_SKIPPED
    assert sps_probes_skipped(attn_dp_enabled=True, table_path="/t.json") is None  # no probe runs at all
    assert sps_probes_skipped(attn_dp_enabled=False, table_path=None) is None
    assert sps_probes_skipped(attn_dp_enabled=True, table_path=None, probes_dp_attention=True) is None


@pytest.fixture()
def engine(monkeypatch):
    """A planner as the worker leaves it before ``install_sps_table``, on a simulated engine."""
    import sglang.srt.runtime_context as runtime_context

    import sglang_dspark.profiler.engine_measurer as engine_measurer

    state = {"attn_dp_enabled": True, "table_path": None, "probed": []}
    monkeypatch.setattr(runtime_context, "get_parallel",
                        lambda: types.SimpleNamespace(attn_dp_enabled=state["attn_dp_enabled"], tp_size=4))
    monkeypatch.setattr(runtime_context, "get_disagg", lambda: types.SimpleNamespace(disaggregation_mode="null"))
    monkeypatch.setattr(planner_module.dspark_planner, "get_spec",
                        lambda: types.SimpleNamespace(speculative_dspark_sps_table_path=state["table_path"]))
    monkeypatch.setattr(planner_module.dspark_planner, "get_schedule",
                        lambda: types.SimpleNamespace(max_running_requests=48))

    def obtain_sps_table(**kwargs):
        state["probed"].append(kwargs)
        raise RuntimeError("stand-in: no engine here")

    monkeypatch.setattr(engine_measurer, "obtain_sps_table", obtain_sps_table)
    planner = AdmissionVerifyPlanner.__new__(AdmissionVerifyPlanner)
    planner.policy = AdmissionPolicy("async")
    planner.draft = DraftSource(gate=object())
    planner._budget_planner = types.SimpleNamespace(policy=planner.policy, cost=None)
    planner.model_runner = types.SimpleNamespace(device="cuda:0")
    planner.gamma = 7
    return planner, state


def test_dp_attention_skips_the_probes_with_one_log_line(engine, caplog):
    planner, state = engine
    with caplog.at_level(logging.WARNING, logger="sglang_dspark.engine.planner"):
        planner.install_sps_table()
    assert state["probed"] == []  # no hand-built forward under DP attention
    assert planner.policy.name == "verify-all" and planner._budget_planner.policy is planner.policy
    assert planner.draft.gate is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "SPS probes skipped" in line and "DP attention" in line and "--speculative-dspark-sps-table-path" in line


def test_a_table_file_or_no_dp_attention_still_obtains_the_table(engine):
    planner, state = engine
    state["table_path"] = "/t.json"
    planner.install_sps_table()
    assert state["probed"][-1]["upstream_table_path"] == "/t.json"  # read from the file, no probe
    state.update(attn_dp_enabled=False, table_path=None)
    planner.install_sps_table()
    assert len(state["probed"]) == 2
