"""Shows ``AdmissionStats`` through SGLang 0.5.23: ``/server_info`` and, with ``--enable-metrics``, ``/metrics``.

Both sides live in the scheduler process, next to the worker that records the steps:

* ``/server_info``: the HTTP server asks every scheduler for its internal state (``GetInternalStateReq``); the
  scheduler answers with ``SchedulerInternalStateController.get_internal_state`` (the same place that adds
  ``avg_spec_accept_length`` and ``dspark_info_record``). An AFTER hook there adds ``dspark_admission``, so it shows
  up in ``internal_states[i]`` (with the draft gate's ``drafted_step_share`` and ``draft_gate`` state).
* ``/metrics``: SGLang runs prometheus_client in multiprocess mode (the launcher sets ``PROMETHEUS_MULTIPROC_DIR``
  before it spawns the schedulers; the HTTP server's ``/metrics`` merges every process's files with a
  ``MultiProcessCollector``). Metrics created in the scheduler therefore appear there without any HTTP-side code.
  We create ours right after the scheduler builds its metrics reporter, only on the ranks where SGLang's own
  scheduler metrics are live, and with the same labels; we refresh them at the decode-log ticks
  (``--decode-log-interval``), the cadence of SGLang's own ``sglang:spec_accept_length``.

Names: ``sglang:dspark_<thing>``, in SGLang's ``sglang:`` namespace next to ``sglang:spec_accept_length`` (dashboards
that select ``sglang:*`` pick them up), the ``dspark_`` prefix keeping them apart from upstream's names. As SGLang's
own, counters are named ``..._total`` (prometheus_client strips that suffix and puts it back once on the sample),
lengths say ``length`` and times are in seconds.

Kinds: every lifetime total of the summary (decode steps, their time, request-steps per admitted / accepted draft
length, calibration bin sums, draft gate decisions, the lookup's steps per kind and rows / verified / accepted tokens
per source) is a **counter**, advanced at each refresh by the delta since the previous one (``_LifetimeCounter``:
never negative; a total that went back, e.g. after ``AdmissionStats.reset()``, adds nothing that time and is logged
once); ``rate()`` / ``increase()`` over them give any window's traffic. States (means, shares, ECEs, the SPS table's
age, the policy in use) are **gauges** with ``multiprocess_mode="mostrecent"``, as SGLang's: /metrics shows the
last value a process wrote, per label set, without a ``pid`` label. Counters need no mode: the multiprocess collector
sums them over processes, and each scheduler rank has its own label set. With prompt lookup beside the draft
(``SGLANG_DSPARK_LOOKUP``, ``engine/lookup_source.py``) the summary's ``lookup`` section adds the
``sglang:dspark_lookup_*`` series; they are absent while the lookup is off.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from sglang_dspark.scheduling.stats import get_admission_stats

logger = logging.getLogger(__name__)

INTERNAL_STATE_TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state"
)
METRICS_REPORTER_INIT_TARGET = "sglang.srt.managers.scheduler.Scheduler.init_metrics_reporter"
DECODE_STATS_TARGET = (
    "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats"
)
SERVER_INFO_KEY = "dspark_admission"
# Attribute we hang on SGLang's SchedulerMetricsReporter: one exporter per reporter, None where metrics are off.
EXPORTER_ATTR = "dspark_admission_exporter"
UNSET_POLICY = "unset"
# Our metrics sit in SGLang's namespace (module docstring): sglang:dspark_<thing>, counters ending in _total.
METRIC_PREFIX = "sglang:dspark_"
# Proposal sources of a decode step with prompt lookup beside the draft (engine/lookup_source.py summary()).
# "shared": the lookup rows whose chain came from the shared suffix cache (a part of "lookup").
LOOKUP_SOURCES = ("lookup", "draft", "shared")

_hooks_registered = False
_process_exporter: AdmissionMetricsExporter | None = None


def register_observability_hooks() -> None:
    """Called by the plugin in every SGLang process; idempotent (a second registration would wrap twice)."""
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(INTERNAL_STATE_TARGET, add_admission_summary_to_internal_state, HookType.AFTER)
    HookRegistry.register(METRICS_REPORTER_INIT_TARGET, attach_metrics_exporter, HookType.AFTER)
    HookRegistry.register(DECODE_STATS_TARGET, export_at_decode_log_tick, HookType.AFTER)


def _is_dspark(scheduler: Any) -> bool:
    algorithm = getattr(scheduler, "spec_algorithm", None)
    return algorithm is not None and algorithm.is_dspark()


# ---------------------------------------------------------------------------------------------- /server_info


def add_admission_summary_to_internal_state(result: Any, controller: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulerInternalStateController.get_internal_state``: add ``dspark_admission`` to its output."""
    if not _is_dspark(controller.scheduler):
        return
    try:
        result.internal_state[SERVER_INFO_KEY] = get_admission_stats().summary()
    except Exception:  # /server_info must keep answering even if our summary breaks
        logger.exception("sglang-dspark: could not add %s to the internal state", SERVER_INFO_KEY)


# ---------------------------------------------------------------------------------------------- /metrics


def attach_metrics_exporter(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.init_metrics_reporter``: create our metrics where SGLang's scheduler metrics are live."""
    reporter = scheduler.metrics_reporter
    setattr(reporter, EXPORTER_ATTR, None)
    collector = getattr(reporter, "metrics_collector", None)
    # current_scheduler_metrics_enabled is False without --enable-metrics and on the ranks SGLang keeps quiet.
    if not (_is_dspark(scheduler) and getattr(reporter, "current_scheduler_metrics_enabled", False) and collector):
        return
    global _process_exporter
    try:
        if _process_exporter is None:  # prometheus_client refuses to register a name twice in one process
            _process_exporter = AdmissionMetricsExporter(labels=dict(collector.labels))
        _process_exporter.update(get_admission_stats().summary())
    except Exception:
        logger.exception("sglang-dspark: admission metrics disabled, could not create them")
        return
    setattr(reporter, EXPORTER_ATTR, _process_exporter)


def export_at_decode_log_tick(result: Any, reporter: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulerMetricsReporter.report_decode_stats``: refresh on the ticks where SGLang logs decode stats."""
    exporter = getattr(reporter, EXPORTER_ATTR, None)
    if exporter is None or reporter.forward_ct_decode % reporter.decode_log_interval != 0:
        return
    try:
        exporter.update(get_admission_stats().summary())
    except Exception:
        logger.exception("sglang-dspark: could not update the admission metrics")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _gauge_value(value: Any) -> float:
    # NaN, not 0, for "nothing measured yet": a 0 ECE or accept length would read as a real measurement.
    return float(value) if _is_number(value) else math.nan


def _scaled(value: Any, factor: float) -> float | None:
    return float(value) * factor if _is_number(value) else None


class _LifetimeCounter:
    """A Prometheus counter fed with the summary's lifetime totals: each refresh adds the delta since the previous one.

    A total that went back (``AdmissionStats.reset()``) adds nothing that time and is logged once per counter; later
    increases count from the new value. A total that is not a number is left out. A new label set is created at 0,
    so that ``rate()`` sees its first increase."""

    # Below this (relative) a decrease is float rounding (a total computed as the difference of two float sums).
    ROUNDING = 1e-9

    def __init__(self, counter: Any, name: str, labels: Mapping[str, str]) -> None:
        self.counter = counter
        self.name = name
        self.labels = labels
        self._exported: dict[tuple[tuple[str, str], ...], float] = {}
        self._warned = False

    def advance(self, total: Any, **extra_labels: str) -> None:
        if not _is_number(total):
            return
        key = tuple(sorted(extra_labels.items()))
        total = float(total)
        previous = self._exported.get(key, 0.0)
        series = self.counter.labels(**self.labels, **extra_labels)
        delta = total - previous
        if delta > 0:
            series.inc(delta)
        elif delta < 0 and -delta <= self.ROUNDING * max(1.0, abs(previous)):
            return  # rounding: keep the higher baseline, so nothing is counted twice
        elif delta < 0 and not self._warned:
            self._warned = True
            logger.warning(
                "sglang-dspark: the lifetime total behind %s%s went back from %s to %s (stats reset?); that delta is "
                "skipped and later increases count again (logged once per counter)",
                self.name, dict(extra_labels) or "", previous, total,
            )
        self._exported[key] = total

    def advance_each(self, totals: Any, label: str) -> None:
        """Totals per value of ``label``: a dict, or a list indexed by the value. A value exported before but absent
        now reads 0 (a histogram bucket or a reason gone after a reset). Neither a dict nor a list: nothing."""
        if isinstance(totals, Mapping):
            values = {str(k): v for k, v in totals.items()}
        elif isinstance(totals, (list, tuple)):
            values = {str(i): v for i, v in enumerate(totals)}
        else:
            return
        for key in self._exported:
            if len(key) == 1 and key[0][0] == label and key[0][1] not in values:
                values[key[0][1]] = 0
        for value, total in values.items():
            self.advance(total, **{label: value})

    def advance_split(self, total: Any, drafted: Any) -> None:
        """A total and its drafted part, as ``drafted="true"`` and ``drafted="false"`` (the two sum to the total)."""
        if _is_number(total) and _is_number(drafted):
            self.advance(drafted, drafted="true")
            self.advance(total - drafted, drafted="false")


class AdmissionMetricsExporter:
    """Prometheus view of ``AdmissionStats.summary()``; ``labels`` are SGLang's scheduler labels (model, ranks)."""

    def __init__(self, labels: Mapping[str, Any], registry: Any = None) -> None:
        # Imported here: prometheus_client must see PROMETHEUS_MULTIPROC_DIR, set by the launcher, at import time.
        from prometheus_client import REGISTRY, Counter, Gauge

        registry = REGISTRY if registry is None else registry
        self.labels = {str(k): str(v) for k, v in labels.items()}
        names = list(self.labels)

        def gauge(name: str, documentation: str, extra_labels: tuple[str, ...] = ()) -> Any:
            # "mostrecent": with several processes, /metrics shows the latest value written, like SGLang's gauges.
            return Gauge(
                METRIC_PREFIX + name, documentation, labelnames=names + list(extra_labels),
                multiprocess_mode="mostrecent", registry=registry,
            )

        def counter(name: str, documentation: str, extra_labels: tuple[str, ...] = ()) -> _LifetimeCounter:
            assert name.endswith("_total")  # SGLang's convention; prometheus_client exposes it once either way
            full_name = METRIC_PREFIX + name
            prometheus_counter = Counter(
                full_name, documentation, labelnames=names + list(extra_labels), registry=registry,
            )
            return _LifetimeCounter(prometheus_counter, full_name, self.labels)

        # ------------------------------------------------------------------------------------------ gauges: states
        self.mean_admitted_draft_length = gauge(
            "mean_admitted_draft_length", "Mean number of draft tokens admitted to verification per request-step."
        )
        self.mean_accept_length = gauge(
            "mean_accept_length", "Mean accept length per request-step (accepted drafts + bonus token)."
        )
        self.confidence_ece = gauge(
            "confidence_ece",
            "Expected calibration error (10 bins) of the predicted draft survival over the recent window.",
        )
        self.confidence_ece_window = gauge(
            "confidence_ece_window", "Number of (prediction, outcome) pairs in the window behind confidence_ece."
        )
        self.mean_predicted_survival = gauge(
            "mean_predicted_survival", "Mean predicted survival of verified draft positions (window)."
        )
        self.mean_observed_survival = gauge(
            "mean_observed_survival", "Share of verified draft positions that were accepted (window)."
        )
        self.mean_step_seconds = gauge("mean_step_seconds", "Mean decode step time in seconds since start.")
        self.drafted_step_share = gauge(
            "drafted_step_share",
            "Share of decode steps that ran the draft block (the draft gate skips it where a plain step pays more).",
        )
        self.sps_table_age_seconds = gauge("sps_table_age_seconds", "Age of the SPS table in use, at the last refresh.")
        self.admitted_length_share = gauge(
            "admitted_draft_length_share", "Share of request-steps that admitted draft_len draft tokens.",
            ("draft_len",),
        )
        self.policy_info = gauge(
            "admission_policy_info", "1 for the admission policy in use, 0 for earlier ones.", ("policy",)
        )
        self.draft_gate_paused = gauge("draft_gate_paused", "1 while the draft gate pauses drafting, else 0.")

        # ------------------------------------------------------------------------------ counters: lifetime totals
        self.decode_steps = counter(
            "decode_steps_total", "Decode steps recorded, by whether they ran the draft block.", ("drafted",)
        )
        self.timed_decode_steps = counter(
            "timed_decode_steps_total", "Decode steps with a measured time (behind decode_step_seconds).", ("drafted",)
        )
        self.decode_step_seconds = counter(
            "decode_step_seconds_total",
            "Time of the timed decode steps in seconds; rate() over timed_decode_steps_total gives the mean.",
            ("drafted",),
        )
        # A counter per bucket, not a Histogram: a Histogram takes one observe() per request, these take one inc()
        # per bucket and refresh; rate() over them gives the distribution.
        self.admitted_length_requests = counter(
            "admitted_draft_length_requests_total", "Request-steps that admitted draft_len draft tokens.",
            ("draft_len",),
        )
        self.accepted_length_requests = counter(
            "accepted_draft_length_requests_total", "Request-steps that accepted draft_len draft tokens.",
            ("draft_len",),
        )
        # The lifetime calibration bins: the ECE of any window is
        # sum(abs(increase(observed) - increase(predicted))) / sum(increase(pairs)).
        self.calibration_pairs = counter(
            "calibration_pairs_total",
            "Verified draft positions whose predicted survival fell in bin (bin b: [b/10, (b+1)/10)).",
            ("bin",),
        )
        self.calibration_predicted = counter(
            "calibration_predicted_survival_total", "Sum of the predicted survival of the bin's positions.", ("bin",)
        )
        self.calibration_observed = counter(
            "calibration_observed_survival_total", "Accepted positions of the bin (sum of the outcomes).", ("bin",)
        )
        self.draft_gate_decisions = counter(
            "draft_gate_decisions_total", "Draft gate decisions by outcome (drafted or skipped).", ("outcome",)
        )
        self.draft_gate_reasons = counter(
            "draft_gate_decision_reasons_total", "Draft gate decisions by reason.", ("reason",)
        )
        self.draft_gate_pauses = counter("draft_gate_pauses_total", "Times the draft gate paused drafting.")
        self.draft_gate_resumes = counter("draft_gate_resumes_total", "Times the draft gate resumed drafting.")

        # Prompt lookup beside the draft (summary()["lookup"], engine/lookup_source.py).
        self.lookup_steps = counter(
            "lookup_steps_total",
            "Decode steps by kind: plain (no draft, no lookup), drafted (draft only), lookup (lookup chains, no draft "
            "forward), mixed (drafted step where some rows verified a lookup chain).",
            ("kind",),
        )
        self.lookup_proposals = counter(
            "lookup_proposals_total", "Request-steps for which the prompt lookup found a proposal."
        )
        self.lookup_source_rows = counter(
            "lookup_source_rows_total", "Request-steps that verified the source's proposal (lookup, draft; shared: the "
            "lookup rows whose chain came from the shared suffix cache).",
            ("source",),
        )
        self.lookup_source_verified_tokens = counter(
            "lookup_source_verified_tokens_total", "Proposed tokens of the source verified by the target.", ("source",)
        )
        self.lookup_source_accepted_tokens = counter(
            "lookup_source_accepted_tokens_total", "Proposed tokens of the source the target accepted.", ("source",)
        )
        self.lookup_overlap_given_up_steps = counter(
            "lookup_overlap_given_up_steps_total",
            "Decode batches that gave up the overlap scheduler's head start to wait for their current tokens.",
        )
        self.lookup_source_accept_length = gauge(
            "lookup_source_accept_length",
            "Mean accept length of the request-steps that verified the source (1 + accepted / rows) since start.",
            ("source",),
        )
        self.lookup_chain_rows = counter(
            "lookup_chain_rows_total", "Lookup rows by chain tokens verified (verified) and accepted (accepted): the "
            "chain-length histogram.", ("length", "of"),
        )
        self.lookup_shared_tokens = gauge(
            "lookup_shared_tokens", "Tokens held by the shared suffix cache (finished requests' prompts + outputs)."
        )
        self.lookup_shared_entries = gauge("lookup_shared_entries", "n-grams mapped by the shared suffix cache.")
        self.lookup_ece = gauge("lookup_ece", "Expected calibration error of the prompt lookup's acceptance estimates.")
        self.lookup_plan_seconds_per_step = gauge(
            "lookup_plan_seconds_per_step", "Mean host time in seconds the prompt lookup spends planning a decode step."
        )
        self._exported_share_buckets = 0
        self._exported_policy: str | None = None

    def update(self, summary: Mapping[str, Any]) -> None:
        labels = self.labels
        for gauge, value in (
            (self.mean_admitted_draft_length, summary.get("mean_admitted_draft_len")),
            (self.mean_accept_length, summary.get("mean_accept_len")),
            (self.confidence_ece, summary.get("ece")),
            (self.confidence_ece_window, summary.get("ece_window")),
            (self.mean_predicted_survival, summary.get("mean_predicted_survival")),
            (self.mean_observed_survival, summary.get("mean_observed_survival")),
            (self.mean_step_seconds, _scaled(summary.get("mean_step_ms"), 1e-3)),
            (self.drafted_step_share, summary.get("drafted_step_share")),
        ):
            gauge.labels(**labels).set(_gauge_value(value))
        sps = summary.get("sps") or {}
        self.sps_table_age_seconds.labels(**labels).set(_gauge_value(sps.get("age_seconds")))

        policy = summary.get("policy") or UNSET_POLICY
        if policy != self._exported_policy:
            if self._exported_policy is not None:
                self.policy_info.labels(**labels, policy=self._exported_policy).set(0)
            self.policy_info.labels(**labels, policy=policy).set(1)
            self._exported_policy = policy

        self.decode_steps.advance_split(summary.get("steps"), summary.get("drafted_steps"))
        self.timed_decode_steps.advance_split(summary.get("timed_steps"), summary.get("timed_drafted_steps"))
        self.decode_step_seconds.advance_split(summary.get("step_seconds_sum"), summary.get("drafted_step_seconds_sum"))

        counts = list(summary.get("admitted_len_histogram") or [])
        self.admitted_length_requests.advance_each(counts, "draft_len")
        self.accepted_length_requests.advance_each(summary.get("accepted_len_histogram"), "draft_len")
        total = sum(counts)
        for draft_len, count in enumerate(counts):
            self.admitted_length_share.labels(**labels, draft_len=str(draft_len)).set(count / total if total else 0.0)
        for draft_len in range(len(counts), self._exported_share_buckets):  # buckets gone after a reset
            self.admitted_length_share.labels(**labels, draft_len=str(draft_len)).set(0.0)
        self._exported_share_buckets = max(self._exported_share_buckets, len(counts))

        bins = summary.get("calibration_bins")
        if isinstance(bins, Mapping):
            self.calibration_pairs.advance_each(bins.get("count"), "bin")
            self.calibration_predicted.advance_each(bins.get("prediction_sum"), "bin")
            self.calibration_observed.advance_each(bins.get("label_sum"), "bin")

        self._update_draft_gate(summary.get("draft_gate"))
        self._update_lookup(summary.get("lookup"))

    def _update_draft_gate(self, gate: Any) -> None:
        """The ``draft_gate`` section of the summary; nothing without a gate (None)."""
        if not isinstance(gate, Mapping):
            return
        self.draft_gate_decisions.advance(gate.get("drafted"), outcome="drafted")
        self.draft_gate_decisions.advance(gate.get("skipped"), outcome="skipped")
        self.draft_gate_reasons.advance_each(gate.get("reasons"), "reason")
        self.draft_gate_pauses.advance(gate.get("pauses"))
        self.draft_gate_resumes.advance(gate.get("resumes"))
        if isinstance(gate.get("paused"), bool):  # forced gates have no pause state
            self.draft_gate_paused.labels(**self.labels).set(float(gate["paused"]))

    def _update_lookup(self, lookup: Any) -> None:
        """The ``lookup`` section of the summary; nothing while the lookup is off (None)."""
        if not isinstance(lookup, Mapping):
            return
        labels = self.labels
        self.lookup_steps.advance_each(lookup.get("steps"), "kind")
        for source in LOOKUP_SOURCES:
            counts = lookup.get(source) if isinstance(lookup.get(source), Mapping) else {}
            self.lookup_source_rows.advance(counts.get("rows"), source=source)
            self.lookup_source_verified_tokens.advance(counts.get("verified"), source=source)
            self.lookup_source_accepted_tokens.advance(counts.get("accepted"), source=source)
            self.lookup_source_accept_length.labels(**labels, source=source).set(
                _gauge_value(counts.get("accept_length"))
            )
        own = lookup.get("lookup") if isinstance(lookup.get("lookup"), Mapping) else {}
        for of in ("verified", "accepted"):
            lengths = own.get(f"{of}_lengths")
            for length, rows in (lengths.items() if isinstance(lengths, Mapping) else ()):
                self.lookup_chain_rows.advance(rows, length=str(length), of=of)
        shared = lookup.get("shared") if isinstance(lookup.get("shared"), Mapping) else {}
        self.lookup_shared_tokens.labels(**labels).set(_gauge_value(shared.get("tokens")))
        self.lookup_shared_entries.labels(**labels).set(_gauge_value(shared.get("entries")))
        self.lookup_proposals.advance(own.get("proposals"))
        self.lookup_overlap_given_up_steps.advance(lookup.get("overlap_given_up_steps"))
        self.lookup_ece.labels(**labels).set(_gauge_value(own.get("ece")))
        self.lookup_plan_seconds_per_step.labels(**labels).set(
            _gauge_value(_scaled(lookup.get("plan_us_per_step"), 1e-6))
        )
