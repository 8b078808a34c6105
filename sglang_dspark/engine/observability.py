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
  (``--decode-log-interval``), the cadence of SGLang's own ``sglang:spec_accept_length``. With prompt lookup beside
  the draft (``SGLANG_DSPARK_LOOKUP``, ``engine/lookup_source.py``) the summary's ``lookup`` section adds the
  ``sglang_dspark:lookup_*`` gauges: decode steps per kind, rows / verified / accepted tokens per proposal source,
  the lookup's calibration ECE and its planning cost; they are absent while the lookup is off.
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
# Proposal sources of a decode step with prompt lookup beside the draft (engine/lookup_source.py summary()).
LOOKUP_SOURCES = ("lookup", "draft")

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


def _gauge_value(value: Any) -> float:
    # NaN, not 0, for "nothing measured yet": a 0 ECE or accept length would read as a real measurement.
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


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
                name, documentation, labelnames=names + list(extra_labels), multiprocess_mode="mostrecent",
                registry=registry,
            )

        self.mean_admitted_draft_len = gauge(
            "sglang_dspark:mean_admitted_draft_len", "Mean number of draft tokens admitted to verification per request."
        )
        self.mean_accept_len = gauge(
            "sglang_dspark:mean_accept_len", "Mean accept length per request and step (accepted drafts + bonus token)."
        )
        self.confidence_ece = gauge(
            "sglang_dspark:confidence_ece",
            "Expected calibration error (10 bins) of the predicted draft survival over the recent window.",
        )
        self.confidence_ece_window = gauge(
            "sglang_dspark:confidence_ece_window", "Number of (prediction, outcome) pairs behind confidence_ece."
        )
        self.mean_predicted_survival = gauge(
            "sglang_dspark:mean_predicted_survival", "Mean predicted survival of verified draft positions (window)."
        )
        self.mean_observed_survival = gauge(
            "sglang_dspark:mean_observed_survival", "Share of verified draft positions that were accepted (window)."
        )
        self.mean_step_ms = gauge("sglang_dspark:mean_step_ms", "Mean decode step time in milliseconds.")
        self.drafted_step_share = gauge(
            "sglang_dspark:drafted_step_share",
            "Share of decode steps that ran the draft block (the draft gate skips it where a plain step pays more).",
        )
        self.sps_table_age_seconds = gauge(
            "sglang_dspark:sps_table_age_seconds", "Age of the SPS table in use, at the last refresh."
        )
        self.admitted_len_share = gauge(
            "sglang_dspark:admitted_draft_len_share",
            "Share of request-steps that admitted draft_len draft tokens.",
            ("draft_len",),
        )
        self.policy_info = gauge(
            "sglang_dspark:admission_policy_info", "1 for the admission policy in use, 0 for earlier ones.", ("policy",)
        )
        # Prompt lookup beside the draft (summary()["lookup"], engine/lookup_source.py). The counts are lifetime
        # totals of the scheduler process, exported as they are: delta() over a window gives that window's traffic.
        self.lookup_steps = gauge(
            "sglang_dspark:lookup_steps",
            "Decode steps by kind since start: plain (no draft, no lookup), drafted (draft only), lookup (lookup "
            "chains, no draft forward), mixed (drafted step where some rows verified a lookup chain).",
            ("kind",),
        )
        self.lookup_source_rows = gauge(
            "sglang_dspark:lookup_source_rows",
            "Request-steps that verified the source's proposal (lookup or draft) since start.",
            ("source",),
        )
        self.lookup_source_verified_tokens = gauge(
            "sglang_dspark:lookup_source_verified_tokens",
            "Proposed tokens of the source (lookup or draft) verified by the target since start.",
            ("source",),
        )
        self.lookup_source_accepted_tokens = gauge(
            "sglang_dspark:lookup_source_accepted_tokens",
            "Proposed tokens of the source (lookup or draft) the target accepted since start.",
            ("source",),
        )
        self.lookup_source_accept_len = gauge(
            "sglang_dspark:lookup_source_accept_len",
            "Mean accept length of the request-steps that verified the source (1 + accepted / rows) since start.",
            ("source",),
        )
        self.lookup_ece = gauge(
            "sglang_dspark:lookup_ece", "Expected calibration error of the prompt lookup's acceptance estimates."
        )
        self.lookup_plan_us_per_step = gauge(
            "sglang_dspark:lookup_plan_us_per_step",
            "Mean host time in microseconds the prompt lookup spends planning a decode step.",
        )
        # A counter per bucket, not a Histogram: a Histogram takes one observe() per request, these take one inc()
        # per bucket and refresh; rate() over them gives the distribution.
        self.admitted_len_requests = Counter(
            "sglang_dspark:admitted_draft_len_requests",
            "Request-steps that admitted draft_len draft tokens.",
            labelnames=names + ["draft_len"],
            registry=registry,
        )
        self._exported_counts: list[int] = []
        self._exported_policy: str | None = None

    def update(self, summary: Mapping[str, Any]) -> None:
        labels = self.labels
        for gauge, key in (
            (self.mean_admitted_draft_len, "mean_admitted_draft_len"),
            (self.mean_accept_len, "mean_accept_len"),
            (self.confidence_ece, "ece"),
            (self.confidence_ece_window, "ece_window"),
            (self.mean_predicted_survival, "mean_predicted_survival"),
            (self.mean_observed_survival, "mean_observed_survival"),
            (self.mean_step_ms, "mean_step_ms"),
            (self.drafted_step_share, "drafted_step_share"),
        ):
            gauge.labels(**labels).set(_gauge_value(summary.get(key)))
        sps = summary.get("sps") or {}
        self.sps_table_age_seconds.labels(**labels).set(_gauge_value(sps.get("age_seconds")))

        policy = summary.get("policy") or UNSET_POLICY
        if policy != self._exported_policy:
            if self._exported_policy is not None:
                self.policy_info.labels(**labels, policy=self._exported_policy).set(0)
            self.policy_info.labels(**labels, policy=policy).set(1)
            self._exported_policy = policy

        counts = list(summary.get("admitted_len_histogram") or [])
        previous = self._exported_counts + [0] * max(0, len(counts) - len(self._exported_counts))
        if any(now < before for now, before in zip(counts, previous)):
            previous = [0] * len(counts)  # the stats were reset: count again from zero
        total = sum(counts)
        for draft_len, count in enumerate(counts):
            if count > previous[draft_len]:
                self.admitted_len_requests.labels(**labels, draft_len=str(draft_len)).inc(count - previous[draft_len])
            self.admitted_len_share.labels(**labels, draft_len=str(draft_len)).set(count / total if total else 0.0)
        for draft_len in range(len(counts), len(self._exported_counts)):  # buckets gone after a reset
            self.admitted_len_share.labels(**labels, draft_len=str(draft_len)).set(0.0)
        self._exported_counts = counts

        self._update_lookup(summary.get("lookup"))

    def _update_lookup(self, lookup: Any) -> None:
        """The ``lookup`` section of the summary; nothing while the lookup is off (None)."""
        if not isinstance(lookup, Mapping):
            return
        labels = self.labels
        steps = lookup.get("steps")
        for kind, count in (steps.items() if isinstance(steps, Mapping) else ()):
            self.lookup_steps.labels(**labels, kind=str(kind)).set(_gauge_value(count))
        for source in LOOKUP_SOURCES:
            counts = lookup.get(source) if isinstance(lookup.get(source), Mapping) else {}
            for gauge, key in (
                (self.lookup_source_rows, "rows"),
                (self.lookup_source_verified_tokens, "verified"),
                (self.lookup_source_accepted_tokens, "accepted"),
                (self.lookup_source_accept_len, "accept_length"),
            ):
                gauge.labels(**labels, source=source).set(_gauge_value(counts.get(key)))
        own = lookup.get("lookup") if isinstance(lookup.get("lookup"), Mapping) else {}
        self.lookup_ece.labels(**labels).set(_gauge_value(own.get("ece")))
        self.lookup_plan_us_per_step.labels(**labels).set(_gauge_value(lookup.get("plan_us_per_step")))
