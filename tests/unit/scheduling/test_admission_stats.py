"""AdmissionStats (pure) and its SGLang adapter (hook functions on stand-ins, Prometheus on a private registry).

Fast: nothing here imports SGLang; the hook targets are checked against SGLang's source text.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.engine import observability
from sglang_dspark.scheduling.stats import (
    AdmissionStats,
    ece_from_bins,
    expected_calibration_error,
    get_admission_stats,
)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record_example_step(stats: AdmissionStats, step_seconds: float | None = 0.010) -> None:
    """Two requests, gamma = 3 (worked out in test_example_step_means_histogram_and_ece)."""
    stats.record_step(
        verify_lens=[4, 3],
        accepted_drafts=[1, 2],
        survival=torch.tensor([[0.95, 0.75, 0.35], [0.95, 0.55, 0.15]]),
        step_seconds=step_seconds,
    )


def test_empty_summary_is_json_and_has_every_key():
    summary = AdmissionStats().summary()
    assert set(summary) == {
        "policy", "sps", "steps", "mean_admitted_draft_len", "admitted_len_histogram", "mean_accept_len", "ece",
        "ece_window", "mean_predicted_survival", "mean_observed_survival", "mean_step_ms", "accepted_len_histogram", "lookup",
        "calibration_bins", "drafted_steps", "drafted_step_share", "draft_gate", "timed_steps", "step_seconds_sum",
        "timed_drafted_steps", "drafted_step_seconds_sum",
    }
    assert summary["steps"] == 0 and summary["drafted_steps"] == 0 and summary["drafted_step_share"] is None and summary["ece_window"] == 0 and summary["admitted_len_histogram"] == []
    assert summary["ece"] is None and summary["mean_accept_len"] is None and summary["sps"] is None
    json.dumps(summary)


def test_example_step_means_histogram_and_ece():
    stats = AdmissionStats()
    record_example_step(stats)
    summary = stats.summary()
    # Admitted drafts 3 and 2; accept lengths (1 + 1) and (2 + 1).
    assert summary["steps"] == 1
    assert summary["admitted_len_histogram"] == [0, 0, 1, 1]
    assert summary["mean_admitted_draft_len"] == pytest.approx(2.5)
    assert summary["mean_accept_len"] == pytest.approx(2.5)
    assert summary["mean_step_ms"] == pytest.approx(10.0)
    # Verified pairs: r0 (0.95,1) (0.75,0) (0.35,0); r1 (0.95,1) (0.55,1); r1's third draft was not verified.
    assert summary["ece_window"] == 5
    assert summary["mean_predicted_survival"] == pytest.approx(3.55 / 5, abs=1e-6)
    assert summary["mean_observed_survival"] == pytest.approx(3 / 5)
    # Bins: 9 -> 2/5 * |1 - .95|, 7 -> 1/5 * .75, 5 -> 1/5 * .45, 3 -> 1/5 * .35
    assert summary["ece"] == pytest.approx(0.02 + 0.15 + 0.09 + 0.07, abs=1e-6)
    assert summary["accepted_len_histogram"] == [0, 1, 1]
    assert ece_from_bins(**summary["calibration_bins"]) == pytest.approx(summary["ece"], abs=1e-6)
    json.dumps(summary)


def test_plain_steps_counted_on_the_host_tally_like_the_tensor_path():
    """Anchor-only steps take a torch-free path: the same summary as the same steps handed over as tensors (which
    take the general path), mixed with drafted steps; a list that is not anchor-only still takes the general path."""
    steps = [([1, 1, 1], [0, 0, 0], 0.02, False), ([1, 3], [0, 2], 0.03, True), ([1], None, None, False),
             ([1, 1], [0, 0], 0.01, True), ([2, 1], [1, 0], 0.02, True)]
    host, tensors = AdmissionStats(), AdmissionStats()
    for verify, accepted, seconds, drafted in steps:
        host.record_step(verify_lens=verify, accepted_drafts=accepted, survival=None, step_seconds=seconds,
                         drafted=drafted)
        tensors.record_step(verify_lens=torch.tensor(verify),
                            accepted_drafts=None if accepted is None else torch.tensor(accepted),
                            survival=None, step_seconds=seconds, drafted=drafted)
    assert host.summary() == tensors.summary()
    assert host.summary()["steps"] == 5 and host.summary()["admitted_len_histogram"][:3] == [8, 1, 1]
    with pytest.raises(ValueError):
        AdmissionStats().record_step(verify_lens=[1, 0], accepted_drafts=[0, 0], survival=None, step_seconds=None)


def test_ece_averages_within_a_bin_before_taking_the_gap():
    # 0.81 and 0.89 share bin 8: |mean label .5 - mean pred .85| = .35 (per-sample gaps would give .54).
    ece = expected_calibration_error(torch.tensor([0.81, 0.89]), torch.tensor([1.0, 0.0]))
    assert ece == pytest.approx(0.35)
    # 1.0 lands in the last bin, 0.0 in the first; both perfectly calibrated here.
    assert expected_calibration_error(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])) == pytest.approx(0.0)
    assert math.isnan(expected_calibration_error(torch.tensor([]), torch.tensor([])))


def test_means_accumulate_over_steps_and_histogram_grows():
    stats = AdmissionStats()
    stats.record_step(verify_lens=[1, 2], accepted_drafts=[0, 1], survival=None, step_seconds=0.01)
    stats.record_step(verify_lens=[6], accepted_drafts=[0], survival=None, step_seconds=None)
    summary = stats.summary()
    assert summary["steps"] == 2
    assert summary["admitted_len_histogram"] == [1, 1, 0, 0, 0, 1]
    assert summary["mean_admitted_draft_len"] == pytest.approx((0 + 1 + 5) / 3)
    assert summary["mean_accept_len"] == pytest.approx((1 + 2 + 1) / 3)
    assert summary["mean_step_ms"] == pytest.approx(10.0)  # the untimed step is not averaged in
    assert summary["ece"] is None and summary["ece_window"] == 0  # no confidence head, no calibration


def test_missing_accepted_drafts_leaves_accept_len_and_calibration_alone():
    stats = AdmissionStats()
    stats.record_step(verify_lens=[3], accepted_drafts=None, survival=torch.tensor([[0.5, 0.5]]), step_seconds=None)
    summary = stats.summary()
    assert summary["mean_admitted_draft_len"] == pytest.approx(2.0)
    assert summary["mean_accept_len"] is None and summary["ece_window"] == 0 and summary["mean_step_ms"] is None


def test_calibration_window_keeps_the_newest_pairs():
    stats = AdmissionStats(calibration_window=4)
    stats.record_step(verify_lens=[4], accepted_drafts=[3], survival=torch.tensor([[0.9, 0.9, 0.9]]), step_seconds=None)
    stats.record_step(verify_lens=[3], accepted_drafts=[0], survival=torch.tensor([[0.2, 0.2, 0.7]]), step_seconds=None)
    summary = stats.summary()
    # Kept: (.9,1) (.9,1) (.2,0) (.2,0); the first (.9,1) rolled out.
    assert summary["ece_window"] == 4
    assert summary["mean_predicted_survival"] == pytest.approx(0.55, abs=1e-6)
    assert summary["mean_observed_survival"] == pytest.approx(0.5)
    assert summary["ece"] == pytest.approx(2 / 4 * 0.1 + 2 / 4 * 0.2, abs=1e-6)
    # One step larger than the window: only its newest 4 pairs stay.
    stats.record_step(
        verify_lens=[6], accepted_drafts=[5], survival=torch.tensor([[0.1, 0.1, 1.0, 1.0, 1.0]]), step_seconds=None
    )
    summary = stats.summary()
    assert summary["ece_window"] == 4
    assert summary["mean_observed_survival"] == pytest.approx(1.0)
    assert summary["mean_predicted_survival"] == pytest.approx((0.1 + 3.0) / 4, abs=1e-6)
    assert summary["steps"] == 3  # the lifetime counters are not windowed
    # The lifetime bins keep all 3 + 2 + 5 pairs, and differences of snapshots isolate the traffic in between.
    bins = summary["calibration_bins"]
    assert sum(bins["count"]) == 10
    assert sum(bins["label_sum"]) == 3 + 0 + 5
    assert sum(bins["prediction_sum"]) == pytest.approx(2.7 + 0.4 + 3.2, abs=1e-5)
    assert bins["count"][2] == 2 and bins["label_sum"][2] == 0  # (.2, 0) x2
    assert bins["count"][1] == 2 and bins["label_sum"][1] == 2  # (.1, 1) x2


def test_policy_and_sps_age_at_call_time():
    clock = FakeClock(1_000.0)
    stats = AdmissionStats(clock=clock)
    stats.set_policy("prefix-threshold")
    stats.set_sps_summary({"created_at": 970.0, "path": "/tmp/sps.json", "batch_sizes": torch.tensor([1, 8])})
    summary = stats.summary()
    assert summary["policy"] == "prefix-threshold"
    assert summary["sps"]["age_seconds"] == pytest.approx(30.0)
    assert summary["sps"]["batch_sizes"] == [1, 8] and summary["sps"]["path"] == "/tmp/sps.json"
    clock.now = 1_045.0
    assert stats.summary()["sps"]["age_seconds"] == pytest.approx(75.0)
    stats.set_sps_summary({"path": "no timestamp"})
    assert stats.summary()["sps"]["age_seconds"] is None
    json.dumps(stats.summary())


def test_reset_forgets_steps_but_keeps_configuration():
    stats = AdmissionStats()
    stats.set_policy("all")
    record_example_step(stats)
    stats.reset()
    summary = stats.summary()
    assert summary["steps"] == 0 and summary["admitted_len_histogram"] == [] and summary["ece_window"] == 0
    assert summary["policy"] == "all"


def test_inputs_are_validated():
    stats = AdmissionStats()
    with pytest.raises(ValueError):
        stats.record_step(verify_lens=[0], accepted_drafts=None, survival=None, step_seconds=None)
    with pytest.raises(ValueError):
        stats.record_step(verify_lens=[2, 2], accepted_drafts=[1], survival=None, step_seconds=None)
    with pytest.raises(ValueError):  # survival has fewer columns than a request verified drafts
        stats.record_step(verify_lens=[4], accepted_drafts=[1], survival=torch.tensor([[0.5, 0.5]]), step_seconds=None)
    assert stats.summary()["steps"] == 0  # a rejected step leaves no trace


def test_tensor_inputs_and_empty_step():
    stats = AdmissionStats()
    stats.record_step(
        verify_lens=torch.tensor([2, 2], dtype=torch.int32),
        accepted_drafts=torch.tensor([1, 0]),
        survival=torch.tensor([[0.8, 0.5], [0.4, 0.1]], dtype=torch.float16),
        step_seconds=None,
    )
    stats.record_step(verify_lens=[], accepted_drafts=[], survival=None, step_seconds=None)
    summary = stats.summary()
    assert summary["steps"] == 2 and summary["admitted_len_histogram"] == [0, 2] and summary["ece_window"] == 2


def test_concurrent_record_and_read():
    stats = AdmissionStats(calibration_window=64)
    errors = []

    def reader():
        try:
            for _ in range(200):
                json.dumps(stats.summary())
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(200):
        record_example_step(stats)
    thread.join()
    assert not errors
    assert stats.summary()["steps"] == 200 and stats.summary()["admitted_len_histogram"] == [0, 0, 200, 200]


def test_singleton_per_process():
    assert get_admission_stats() is get_admission_stats()


# ---------------------------------------------------------------------------------------------- adapter


class FakeAlgorithm:
    def __init__(self, dspark: bool) -> None:
        self.dspark = dspark

    def is_dspark(self) -> bool:
        return self.dspark


def test_internal_state_hook_adds_summary_only_for_dspark(monkeypatch):
    stats = AdmissionStats()
    stats.set_policy("all")
    monkeypatch.setattr(observability, "get_admission_stats", lambda: stats)
    result = SimpleNamespace(internal_state={"avg_spec_accept_length": 2.0})
    controller = SimpleNamespace(scheduler=SimpleNamespace(spec_algorithm=FakeAlgorithm(True)))
    observability.add_admission_summary_to_internal_state(result, controller, object())
    assert result.internal_state[observability.SERVER_INFO_KEY]["policy"] == "all"
    json.dumps(result.internal_state)

    other = SimpleNamespace(internal_state={})
    observability.add_admission_summary_to_internal_state(
        other, SimpleNamespace(scheduler=SimpleNamespace(spec_algorithm=FakeAlgorithm(False))), object()
    )
    assert other.internal_state == {}


@pytest.fixture
def private_exporter(monkeypatch):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    exporter = observability.AdmissionMetricsExporter(labels={"model_name": "tiny", "tp_rank": 0}, registry=registry)
    return exporter, registry


def sample(registry, name, **labels):
    return registry.get_sample_value(name, {"model_name": "tiny", "tp_rank": "0", **labels})


def test_exporter_gauges_counters_and_policy(private_exporter):
    exporter, registry = private_exporter
    clock = FakeClock(500.0)
    stats = AdmissionStats(clock=clock)
    stats.set_sps_summary({"created_at": 380.0})
    exporter.update(stats.summary())
    assert math.isnan(sample(registry, "sglang:dspark_confidence_ece"))  # nothing measured yet
    assert sample(registry, "sglang:dspark_admission_policy_info", policy="unset") == 1.0
    assert sample(registry, "sglang:dspark_sps_table_age_seconds") == pytest.approx(120.0)

    stats.set_policy("sps-greedy")
    record_example_step(stats)
    exporter.update(stats.summary())
    assert sample(registry, "sglang:dspark_mean_admitted_draft_length") == pytest.approx(2.5)
    assert sample(registry, "sglang:dspark_mean_accept_length") == pytest.approx(2.5)
    assert sample(registry, "sglang:dspark_confidence_ece") == pytest.approx(0.33, abs=1e-6)
    assert sample(registry, "sglang:dspark_admission_policy_info", policy="unset") == 0.0
    assert sample(registry, "sglang:dspark_admission_policy_info", policy="sps-greedy") == 1.0
    assert sample(registry, "sglang:dspark_admitted_draft_length_requests_total", draft_len="3") == 1.0
    assert sample(registry, "sglang:dspark_admitted_draft_length_share", draft_len="2") == pytest.approx(0.5)

    record_example_step(stats)
    record_example_step(stats)
    exporter.update(stats.summary())
    exporter.update(stats.summary())  # a refresh without new steps adds nothing
    assert sample(registry, "sglang:dspark_admitted_draft_length_requests_total", draft_len="3") == 3.0

    stats.reset()
    stats.record_step(verify_lens=[2], accepted_drafts=[1], survival=None, step_seconds=None)
    exporter.update(stats.summary())  # counters keep counting after a reset
    assert sample(registry, "sglang:dspark_admitted_draft_length_requests_total", draft_len="1") == 1.0
    assert sample(registry, "sglang:dspark_admitted_draft_length_share", draft_len="3") == 0.0


def fake_reporter(*, enabled: bool, forward_ct: int = 0):
    return SimpleNamespace(
        current_scheduler_metrics_enabled=enabled,
        metrics_collector=SimpleNamespace(labels={"model_name": "tiny", "tp_rank": 0}) if enabled else None,
        forward_ct_decode=forward_ct,
        decode_log_interval=40,
    )


def test_metrics_hooks_create_only_when_enabled_and_refresh_on_log_ticks(monkeypatch, private_exporter):
    exporter, registry = private_exporter
    stats = AdmissionStats()
    monkeypatch.setattr(observability, "get_admission_stats", lambda: stats)
    monkeypatch.setattr(observability, "_process_exporter", exporter)  # stands in for the default-registry one

    disabled = SimpleNamespace(spec_algorithm=FakeAlgorithm(True), metrics_reporter=fake_reporter(enabled=False))
    observability.attach_metrics_exporter(None, disabled)
    assert getattr(disabled.metrics_reporter, observability.EXPORTER_ATTR) is None
    not_dspark = SimpleNamespace(spec_algorithm=FakeAlgorithm(False), metrics_reporter=fake_reporter(enabled=True))
    observability.attach_metrics_exporter(None, not_dspark)
    assert getattr(not_dspark.metrics_reporter, observability.EXPORTER_ATTR) is None

    scheduler = SimpleNamespace(spec_algorithm=FakeAlgorithm(True), metrics_reporter=fake_reporter(enabled=True))
    observability.attach_metrics_exporter(None, scheduler)
    reporter = scheduler.metrics_reporter
    assert getattr(reporter, observability.EXPORTER_ATTR) is exporter
    assert math.isnan(sample(registry, "sglang:dspark_mean_accept_length"))

    record_example_step(stats)
    reporter.forward_ct_decode = 39  # not a decode-log tick
    observability.export_at_decode_log_tick(None, reporter, True)
    assert math.isnan(sample(registry, "sglang:dspark_mean_accept_length"))
    reporter.forward_ct_decode = 40
    observability.export_at_decode_log_tick(None, reporter, True)
    assert sample(registry, "sglang:dspark_mean_accept_length") == pytest.approx(2.5)


LOOKUP_SUMMARY = {  # engine/lookup_source.LookupSource.summary()
    "mode": "on",
    "steps": {"plain": 3, "drafted": 10, "lookup": 4, "mixed": 2},
    "indexed_requests": 2,
    "lookup": {"proposals": 9, "rows": 6, "verified": 18, "accepted": 12, "accept_length": 3.0, "ece": 0.07,
               "verified_lengths": {"3": 6}, "accepted_lengths": {"0": 1, "2": 1, "3": 4}},
    "shared": {"scope": "key", "tokens": 900, "entries": 4000, "rows": 2, "verified": 6, "accepted": 5,
               "accept_length": 3.5},
    "draft": {"rows": 20, "verified": 60, "accepted": 20, "accept_length": 2.0},
    "plan_us_per_step": 41.5,
    "overlap_given_up_steps": 1,
}


def test_exporter_lookup_counters_per_step_kind_and_source(private_exporter):
    exporter, registry = private_exporter
    stats = AdmissionStats()
    stats.set_lookup(lambda: LOOKUP_SUMMARY)
    exporter.update(stats.summary())
    for kind, count in LOOKUP_SUMMARY["steps"].items():
        assert sample(registry, "sglang:dspark_lookup_steps_total", kind=kind) == count
    for source in ("lookup", "draft", "shared"):
        counts = LOOKUP_SUMMARY[source]
        assert sample(registry, "sglang:dspark_lookup_source_rows_total", source=source) == counts["rows"]
        assert sample(registry, "sglang:dspark_lookup_source_verified_tokens_total", source=source) == counts["verified"]
        assert sample(registry, "sglang:dspark_lookup_source_accepted_tokens_total", source=source) == counts["accepted"]
        assert sample(registry, "sglang:dspark_lookup_source_accept_length", source=source) == counts["accept_length"]
    assert sample(registry, "sglang:dspark_lookup_proposals_total") == 9
    assert sample(registry, "sglang:dspark_lookup_chain_rows_total", length="3", of="verified") == 6
    assert sample(registry, "sglang:dspark_lookup_chain_rows_total", length="2", of="accepted") == 1
    assert sample(registry, "sglang:dspark_lookup_shared_tokens") == 900
    assert sample(registry, "sglang:dspark_lookup_shared_entries") == 4000
    assert sample(registry, "sglang:dspark_lookup_ece") == pytest.approx(0.07)
    assert sample(registry, "sglang:dspark_lookup_plan_seconds_per_step") == pytest.approx(41.5e-6)

    # Nothing measured yet (a fresh source): NaN, not a 0 that would read as a measurement.
    fresh = {**LOOKUP_SUMMARY, "lookup": {**LOOKUP_SUMMARY["lookup"], "accept_length": None, "ece": None},
             "plan_us_per_step": None}
    stats.set_lookup(lambda: fresh)
    exporter.update(stats.summary())
    assert math.isnan(sample(registry, "sglang:dspark_lookup_ece"))
    assert math.isnan(sample(registry, "sglang:dspark_lookup_plan_seconds_per_step"))
    assert math.isnan(sample(registry, "sglang:dspark_lookup_source_accept_length", source="lookup"))
    assert sample(registry, "sglang:dspark_lookup_source_rows_total", source="lookup") == 6  # the same totals: no delta


def test_exporter_without_lookup_leaves_the_lookup_series_out(private_exporter):
    exporter, registry = private_exporter
    stats = AdmissionStats()
    record_example_step(stats)
    summary = stats.summary()
    assert summary["lookup"] is None  # the lookup is off
    exporter.update(summary)
    summary.pop("lookup")  # a summary from before the lookup existed
    exporter.update(summary)
    assert sample(registry, "sglang:dspark_mean_accept_length") == pytest.approx(2.5)  # the rest is exported
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="plain") is None
    assert sample(registry, "sglang:dspark_lookup_source_rows_total", source="lookup") is None
    assert sample(registry, "sglang:dspark_lookup_plan_seconds_per_step") is None
    exporter.update({**summary, "lookup": {"steps": None, "lookup": None}})  # a partial section: no crash either
    assert sample(registry, "sglang:dspark_lookup_source_rows_total", source="lookup") is None  # no total, no series
    assert math.isnan(sample(registry, "sglang:dspark_lookup_source_accept_length", source="lookup"))


# Every series the exporter writes, by kind: lifetime totals are counters, states are gauges.
COUNTER_FAMILIES = {
    "decode_steps", "timed_decode_steps", "decode_step_seconds", "admitted_draft_length_requests",
    "accepted_draft_length_requests", "calibration_pairs", "calibration_predicted_survival",
    "calibration_observed_survival", "draft_gate_decisions", "draft_gate_decision_reasons", "draft_gate_pauses",
    "draft_gate_resumes", "lookup_steps", "lookup_proposals", "lookup_source_rows", "lookup_source_verified_tokens",
    "lookup_source_accepted_tokens", "lookup_overlap_given_up_steps", "lookup_chain_rows",
}
GAUGE_FAMILIES = {
    "mean_admitted_draft_length", "mean_accept_length", "confidence_ece", "confidence_ece_window",
    "mean_predicted_survival", "mean_observed_survival", "mean_step_seconds", "drafted_step_share",
    "sps_table_age_seconds", "admitted_draft_length_share", "admission_policy_info", "draft_gate_paused",
    "lookup_source_accept_length", "lookup_ece", "lookup_plan_seconds_per_step", "lookup_shared_tokens",
    "lookup_shared_entries",
}
GATE_SUMMARY = {"mode": "auto", "decisions": 5, "drafted": 3, "skipped": 2, "paused": True, "pauses": 1, "resumes": 0,
                "reasons": {"pays": 3, "learn-skip": 2}}


def full_stats() -> AdmissionStats:
    """Stats with every section filled: steps (one of them timed), SPS table, draft gate, lookup."""
    stats = AdmissionStats(clock=FakeClock(500.0))
    stats.set_sps_summary({"created_at": 380.0})
    stats.set_draft_gate(lambda: GATE_SUMMARY)
    stats.set_lookup(lambda: LOOKUP_SUMMARY)
    record_example_step(stats)
    return stats


def test_every_series_is_named_sglang_dspark_and_totals_are_counters_ending_in_total_once(private_exporter):
    from prometheus_client import generate_latest

    exporter, registry = private_exporter
    exporter.update(full_stats().summary())
    families = {family.name: family for family in registry.collect()}
    assert all(name.startswith("sglang:dspark_") for name in families), sorted(families)
    kinds = {name.removeprefix("sglang:dspark_"): family.type for name, family in families.items()}
    assert {name for name, kind in kinds.items() if kind == "counter"} == COUNTER_FAMILIES
    assert {name for name, kind in kinds.items() if kind == "gauge"} == GAUGE_FAMILIES
    text = generate_latest(registry).decode()
    assert "_total_total" not in text
    for name, family in families.items():
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                assert family.type == "gauge", line  # a counter's samples carry a suffix
        if family.type == "counter":
            assert not name.endswith("_total")  # prometheus_client's family name; the sample adds _total once
            assert {s.name for s in family.samples} <= {name + "_total", name + "_created"}
            assert f"\n{name}_total{{" in text, name


def test_totals_advance_counters_by_their_deltas_across_exports(private_exporter, caplog):
    exporter, registry = private_exporter
    steps = {"plain": 3, "drafted": 10, "lookup": 4, "mixed": 2}
    lookup = {**LOOKUP_SUMMARY, "steps": steps}
    gate = dict(GATE_SUMMARY)
    stats = AdmissionStats()
    stats.set_lookup(lambda: lookup)
    stats.set_draft_gate(lambda: gate)
    record_example_step(stats)
    exporter.update(stats.summary())
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="true") == 1
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="false") == 0
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="drafted") == 10
    assert sample(registry, "sglang:dspark_draft_gate_decisions_total", outcome="skipped") == 2

    # Second export: the totals grew; each counter advances by the delta, to the new total.
    record_example_step(stats)
    stats.record_step(verify_lens=[1, 1], accepted_drafts=[0, 0], survival=None, step_seconds=0.002, drafted=False)
    steps.update(drafted=15, lookup=5)
    lookup["lookup"] = {**LOOKUP_SUMMARY["lookup"], "rows": 8, "verified": 25, "accepted": 16}
    gate.update(decisions=7, drafted=4, skipped=3, reasons={"pays": 4, "learn-skip": 3})
    exporter.update(stats.summary())
    exporter.update(stats.summary())  # a refresh without anything new adds nothing
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="true") == 2
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="false") == 1
    assert sample(registry, "sglang:dspark_timed_decode_steps_total", drafted="false") == 1
    assert sample(registry, "sglang:dspark_decode_step_seconds_total", drafted="true") == pytest.approx(0.020)
    assert sample(registry, "sglang:dspark_decode_step_seconds_total", drafted="false") == pytest.approx(0.002)
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="drafted") == 15
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="plain") == 3
    assert sample(registry, "sglang:dspark_lookup_source_rows_total", source="lookup") == 8
    assert sample(registry, "sglang:dspark_lookup_source_verified_tokens_total", source="lookup") == 25
    assert sample(registry, "sglang:dspark_lookup_source_accepted_tokens_total", source="lookup") == 16
    assert sample(registry, "sglang:dspark_draft_gate_decisions_total", outcome="drafted") == 4
    assert sample(registry, "sglang:dspark_draft_gate_decision_reasons_total", reason="learn-skip") == 3
    assert sample(registry, "sglang:dspark_calibration_pairs_total", bin="9") == 4  # 2 pairs at .95 per step
    assert sample(registry, "sglang:dspark_mean_step_seconds") == pytest.approx(0.022 / 3)  # a state: a gauge

    # A reset takes the totals back: that delta is skipped (logged once), later increases count again.
    stats.reset()
    steps.update(drafted=1)
    with caplog.at_level("WARNING", logger=observability.__name__):
        exporter.update(stats.summary())
        steps.update(drafted=0)
        exporter.update(stats.summary())
    went_back = [r.getMessage() for r in caplog.records if "went back" in r.getMessage()]
    for name in ("sglang:dspark_decode_steps_total", "sglang:dspark_lookup_steps_total"):  # once per counter
        assert sum(f"behind {name}" in message for message in went_back) == 1, went_back
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="true") == 2
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="drafted") == 15
    record_example_step(stats)
    steps.update(drafted=4)
    exporter.update(stats.summary())
    assert sample(registry, "sglang:dspark_decode_steps_total", drafted="true") == 3
    assert sample(registry, "sglang:dspark_lookup_steps_total", kind="drafted") == 19


def test_multiprocess_mode_as_sglang_runs_it(monkeypatch, tmp_path):
    """SGLang sets PROMETHEUS_MULTIPROC_DIR and /metrics merges the processes' files: counters sum, our gauges show
    the latest value without a pid label (multiprocess_mode="mostrecent")."""
    from prometheus_client import CollectorRegistry, generate_latest, values
    from prometheus_client.multiprocess import MultiProcessCollector

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    exporter = observability.AdmissionMetricsExporter(labels={"model_name": "tiny", "tp_rank": 0},
                                                      registry=CollectorRegistry())
    stats = full_stats()
    exporter.update(stats.summary())
    record_example_step(stats)
    exporter.update(stats.summary())

    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(tmp_path))
    assert sample(merged, "sglang:dspark_decode_steps_total", drafted="true") == 2
    assert sample(merged, "sglang:dspark_lookup_source_rows_total", source="draft") == 20
    assert sample(merged, "sglang:dspark_mean_accept_length") == pytest.approx(2.5)
    kinds = {family.name.removeprefix("sglang:dspark_"): family.type for family in merged.collect()}
    assert {name for name, kind in kinds.items() if kind == "counter"} == COUNTER_FAMILIES
    assert {name for name, kind in kinds.items() if kind == "gauge"} == GAUGE_FAMILIES
    text = generate_latest(merged).decode()
    assert "pid=" not in text and "_total_total" not in text and "_created" not in text
    assert re.search(r'^sglang:dspark_decode_steps_total\{[^}]*drafted="true"[^}]*\} 2\.0$', text, flags=re.M), text


# ---------------------------------------------------------------------------------------------- hook targets


def _sglang_source(relative: str) -> str:
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return (Path(list(spec.submodule_search_locations)[0]) / relative).read_text()


def _method_args(source: str, class_name: str, method: str) -> list[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return [arg.arg for arg in item.args.args]
    raise AssertionError(f"{class_name}.{method} not found")


@pytest.mark.parametrize(
    "target, expected_args, attributes_we_read",
    [
        (observability.INTERNAL_STATE_TARGET, ["self", "recv_req"], ["self.scheduler", "internal_state="]),
        (observability.METRICS_REPORTER_INIT_TARGET, ["self"], ["self.metrics_reporter = ", "spec_algorithm"]),
        (
            observability.DECODE_STATS_TARGET,
            ["self", "can_run_cuda_graph", "running_batch", "num_generated_tokens"],
            ["self.current_scheduler_metrics_enabled", "self.forward_ct_decode", "self.decode_log_interval"],
        ),
    ],
)
def test_hook_targets_exist_in_sglang_source(target, expected_args, attributes_we_read):
    module, class_name, method = target.rsplit(".", 2)
    relative = module.removeprefix("sglang.").replace(".", "/") + ".py"
    source = _sglang_source(relative)
    assert _method_args(source, class_name, method) == expected_args
    for attribute in attributes_we_read:
        assert attribute in source, f"{attribute!r} no longer in {relative}"


def test_scheduler_metrics_collector_still_exposes_its_labels():
    # attach_metrics_exporter copies SGLang's scheduler labels so our series line up with sglang:* ones.
    source = _sglang_source("srt/observability/metrics_collector.py")
    assert "self.labels = labels" in source


def test_a_nan_confidence_is_left_out_of_calibration_not_raised():
    """A NaN survival at a verified position once reached torch.bincount as INT64_MIN (RuntimeError in the
    scheduler's observe_step, which only expects ValueError)."""
    stats = AdmissionStats()
    stats.record_step(verify_lens=[4], accepted_drafts=[1], survival=torch.tensor([[0.9, float("nan"), 0.3]]),
                      step_seconds=None)
    summary = stats.summary()
    assert summary["ece_window"] == 2  # (.9, 1) and (.3, 0); the NaN pair is dropped
    assert summary["mean_predicted_survival"] == pytest.approx(0.6, abs=1e-6)
