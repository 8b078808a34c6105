"""Running statistics about verify admission, one ``AdmissionStats`` per scheduler process.

The DSPARK worker feeds one ``record_step`` per decode step; ``/server_info`` and the Prometheus exporter read
``summary()`` (see ``sglang_dspark/engine/observability.py``). Pure Python + torch, no SGLang import, so it is testable alone.

Conventions (per request r of a step):
  * ``verify_lens[r]`` tokens verified, the anchor included (1..gamma+1), so ``verify_lens[r] - 1`` drafts admitted;
  * ``accepted_drafts[r]`` drafts accepted (0..verify_lens[r]-1); the accept length SGLang reports adds the bonus
    token: ``accepted_drafts[r] + 1``;
  * ``survival[r, j-1] = a_{r,j} = prod_{i<=j} c_{r,i}``, the predicted probability that drafts 1..j are all
    accepted. Each verified draft position j (1..verify_lens[r]-1) yields one calibration pair
    (a_{r,j}, 1 if accepted_drafts[r] >= j else 0). Positions that were not verified have no label and are skipped.

Lifetime totals (since construction or ``reset()``) back the means and the histogram; confidence calibration uses a
rolling window of the latest pairs, so it follows the current traffic.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

DEFAULT_CALIBRATION_WINDOW = 8192
ECE_BINS = 10


def _to_cpu_long(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    # A CUDA tensor here costs a device sync; the worker should hand over host copies it already has.
    return torch.as_tensor(values).detach().to(device="cpu", dtype=torch.long).reshape(-1)


def _json_safe(value: Any) -> Any:
    """Builtins only: /server_info ships the summary through msgpack and then JSON."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, torch.Tensor):
        return _json_safe(value.detach().cpu().tolist())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _json_safe(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def expected_calibration_error(predictions: torch.Tensor, labels: torch.Tensor, num_bins: int = ECE_BINS) -> float:
    """ECE, ``num_bins`` equal-width bins on [0, 1]: sum over bins of (bin share) * |mean label - mean prediction|."""
    if predictions.numel() == 0:
        return float("nan")
    predictions = predictions.to(torch.float64).clamp(0.0, 1.0)
    labels = labels.to(torch.float64)
    # p == 1.0 belongs to the last bin, not to an extra one.
    bins = (predictions * num_bins).floor().to(torch.long).clamp(max=num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins).to(torch.float64)
    prediction_sums = torch.bincount(bins, weights=predictions, minlength=num_bins)
    label_sums = torch.bincount(bins, weights=labels, minlength=num_bins)
    # |sum_b(labels) - sum_b(preds)| / N == (n_b / N) * |mean label_b - mean pred_b|
    return float((label_sums - prediction_sums).abs().sum() / counts.sum())


class AdmissionStats:
    def __init__(
        self,
        calibration_window: int = DEFAULT_CALIBRATION_WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if calibration_window < 1:
            raise ValueError(f"calibration_window must be >= 1, got {calibration_window}")
        self.calibration_window = calibration_window
        self._clock = clock
        self._lock = threading.Lock()
        self._policy: str | None = None
        self._sps_summary: dict[str, Any] | None = None
        self._draft_gate: dict[str, Any] | None = None
        self._lookup: "Callable[[], Mapping[str, Any] | None] | None" = None
        self.reset()

    # ------------------------------------------------------------------ configuration

    def set_policy(self, name: str) -> None:
        with self._lock:
            self._policy = str(name)

    def set_sps_summary(self, summary: Mapping[str, Any] | None) -> None:
        """The SPS table in use, summarised; ``summary["created_at"]`` (epoch seconds) gives its age."""
        with self._lock:
            self._sps_summary = None if summary is None else _json_safe(dict(summary))

    def set_draft_gate(self, summary: "Mapping[str, Any] | Callable[[], Mapping[str, Any] | None] | None") -> None:
        """The draft gate's state (mode, decisions, pauses, probes, learned draft cost); see scheduling/draft_gate.py.

        A callable is read when a summary is asked for (``/server_info``, metrics), not on every decode step."""
        with self._lock:
            self._draft_gate = summary if summary is None or callable(summary) else _json_safe(dict(summary))

    def _draft_gate_summary(self) -> dict[str, Any] | None:
        gate = self._draft_gate() if callable(self._draft_gate) else self._draft_gate
        return None if gate is None else _json_safe(dict(gate))

    def set_lookup(self, summary: "Callable[[], Mapping[str, Any] | None] | None") -> None:
        """The prompt lookup's per-source counts (engine/lookup_source.py), read when a summary is asked for."""
        with self._lock:
            self._lookup = summary

    def _lookup_summary(self) -> dict[str, Any] | None:
        lookup = self._lookup() if self._lookup is not None else None
        return None if lookup is None else _json_safe(dict(lookup))

    def reset(self) -> None:
        """Forget recorded steps (policy, SPS and draft gate summaries are kept)."""
        with self._lock:
            self._steps = 0
            self._drafted_steps = 0  # steps that ran the draft block (the others were plain anchor-only steps)
            self._request_steps = 0  # sum over steps of the batch size
            self._admitted_draft_sum = 0
            self._admitted_len_counts: list[int] = []
            self._accept_request_steps = 0  # request-steps that came with accepted_drafts
            self._accept_len_sum = 0
            self._accepted_len_counts: list[int] = []
            # Lifetime per-bin sums behind the ECE: unlike the window, differences of two snapshots give the
            # calibration of the traffic in between (benchmarks compare workloads on one server).
            self._bin_counts = torch.zeros(ECE_BINS, dtype=torch.float64)
            self._bin_prediction_sums = torch.zeros(ECE_BINS, dtype=torch.float64)
            self._bin_label_sums = torch.zeros(ECE_BINS, dtype=torch.float64)
            self._timed_steps = 0
            self._step_seconds_sum = 0.0
            self._timed_drafted_steps = 0  # of the timed steps, those that ran the draft block
            self._drafted_step_seconds_sum = 0.0
            self._window_predictions = torch.zeros(self.calibration_window, dtype=torch.float32)
            self._window_labels = torch.zeros(self.calibration_window, dtype=torch.float32)
            self._window_next = 0  # ring-buffer write position
            self._window_filled = 0

    # ------------------------------------------------------------------ recording

    _skip_logged = False

    def observe(self, record) -> None:
        """A decode step's record (``engine/step_record.StepRecord``). A record it cannot read is skipped, logged once:
        observability must never take a decode step down."""
        survival = record.survival
        try:
            self.record_step(verify_lens=record.verify_lens, accepted_drafts=[max(0, n - 1) for n in record.commit_lens],
                             survival=survival, step_seconds=record.seconds, drafted=record.drafted)
        except ValueError as exc:
            if not self._skip_logged:
                self._skip_logged = True
                logging.getLogger(__name__).warning("sglang-dspark: admission stats skipped a step (%s)", exc)

    def record_step(
        self,
        *,
        verify_lens: Sequence[int] | torch.Tensor,
        accepted_drafts: Sequence[int] | torch.Tensor | None,
        survival: torch.Tensor | None,
        step_seconds: float | None,
        drafted: bool = True,
    ) -> None:
        if _is_plain_step(verify_lens, accepted_drafts, survival):
            # Most steps under load are plain (the draft gate skipped the draft): count them without torch, whose
            # half-dozen small ops per step cost more than the counting itself.
            num_requests = len(verify_lens)
            self._record(num_requests, 0, [num_requests], None if accepted_drafts is None else [num_requests],
                         num_requests if accepted_drafts is not None else None, step_seconds, drafted, None)
            return
        verify = _to_cpu_long(verify_lens)
        num_requests = verify.numel()
        if num_requests and int(verify.min()) < 1:
            raise ValueError("verify_lens include the anchor, so every entry must be >= 1")
        admitted = verify - 1
        accepted = None
        if accepted_drafts is not None:
            accepted = _to_cpu_long(accepted_drafts)
            if accepted.numel() != num_requests:
                raise ValueError(f"accepted_drafts has {accepted.numel()} entries, verify_lens {num_requests}")
        calibration = None
        if survival is not None and accepted is not None and num_requests:
            calibration = self._calibration_pairs(survival, admitted, accepted)

        admitted_counts = torch.bincount(admitted, minlength=1).tolist() if num_requests else []
        accepted_counts = torch.bincount(accepted, minlength=1).tolist() if accepted is not None and num_requests else []
        self._record(num_requests, int(admitted.sum()), admitted_counts, accepted_counts,
                     None if accepted is None else int(accepted.sum()) + num_requests, step_seconds, drafted, calibration)

    def _record(self, num_requests: int, admitted_sum: int, admitted_counts: list[int],
                accepted_counts: list[int] | None, accept_len_sum: int | None, step_seconds: float | None,
                drafted: bool, calibration) -> None:
        """Add one step's tallies (``accept_len_sum``: committed tokens, the bonus included; None: not known)."""
        with self._lock:
            self._steps += 1
            self._drafted_steps += bool(drafted)
            self._request_steps += num_requests
            self._admitted_draft_sum += admitted_sum
            _add_counts(self._admitted_len_counts, admitted_counts)
            _add_counts(self._accepted_len_counts, accepted_counts or [])
            if accept_len_sum is not None:
                self._accept_request_steps += num_requests
                self._accept_len_sum += accept_len_sum
            if step_seconds is not None:
                self._timed_steps += 1
                self._step_seconds_sum += float(step_seconds)
                if drafted:
                    self._timed_drafted_steps += 1
                    self._drafted_step_seconds_sum += float(step_seconds)
            if calibration is not None:
                self._push_calibration(*calibration)

    def _calibration_pairs(
        self, survival: torch.Tensor, admitted: torch.Tensor, accepted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        survival = survival.detach().to(device="cpu", dtype=torch.float32)
        if survival.dim() != 2 or survival.shape[0] != admitted.numel():
            raise ValueError(f"survival must be [R={admitted.numel()}, gamma], got {tuple(survival.shape)}")
        gamma = survival.shape[1]
        if int(admitted.max()) > gamma:
            raise ValueError(f"a request verified {int(admitted.max())} drafts but survival has only {gamma} columns")
        positions = torch.arange(1, gamma + 1)  # draft position j, 1-based
        verified = positions[None, :] <= admitted[:, None]
        survived = positions[None, :] <= accepted[:, None]
        predictions, labels = survival[verified], survived[verified].to(torch.float32)
        # A NaN confidence (an unwritten draft buffer) has no bin: it would reach bincount as INT64_MIN and raise
        # in the scheduler. Such a pair says nothing about calibration; drop it.
        finite = torch.isfinite(predictions)
        return predictions[finite], labels[finite]

    def _push_calibration(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        bins = (predictions.to(torch.float64).clamp(0.0, 1.0) * ECE_BINS).floor().to(torch.long).clamp(max=ECE_BINS - 1)
        self._bin_counts += torch.bincount(bins, minlength=ECE_BINS).to(torch.float64)
        self._bin_prediction_sums += torch.bincount(bins, weights=predictions.to(torch.float64), minlength=ECE_BINS)
        self._bin_label_sums += torch.bincount(bins, weights=labels.to(torch.float64), minlength=ECE_BINS)
        capacity = self.calibration_window
        if predictions.numel() > capacity:  # only the newest pairs can stay
            predictions, labels = predictions[-capacity:], labels[-capacity:]
        count = predictions.numel()
        first = min(count, capacity - self._window_next)
        self._window_predictions[self._window_next : self._window_next + first] = predictions[:first]
        self._window_labels[self._window_next : self._window_next + first] = labels[:first]
        if first < count:  # wrap around
            self._window_predictions[: count - first] = predictions[first:]
            self._window_labels[: count - first] = labels[first:]
        self._window_next = (self._window_next + count) % capacity
        self._window_filled = min(capacity, self._window_filled + count)

    # ------------------------------------------------------------------ reading

    def admitted_len_counts(self) -> list[int]:
        with self._lock:
            return list(self._admitted_len_counts)

    def summary(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; a mean is None until something fed it."""
        with self._lock:
            now = self._clock()
            filled = self._window_filled
            predictions = self._window_predictions[:filled].clone()
            labels = self._window_labels[:filled].clone()
            sps = None
            if self._sps_summary is not None:
                sps = dict(self._sps_summary)
                created_at = sps.get("created_at")
                sps["age_seconds"] = (now - float(created_at)) if isinstance(created_at, (int, float)) else None
            result = {
                "policy": self._policy,
                "sps": sps,
                "steps": self._steps,
                "drafted_steps": self._drafted_steps,
                # Share of decode steps that ran the draft block (1.0 without the draft gate).
                "drafted_step_share": _ratio(self._drafted_steps, self._steps),
                "draft_gate": self._draft_gate_summary(),
                "lookup": self._lookup_summary(),
                "mean_admitted_draft_len": _ratio(self._admitted_draft_sum, self._request_steps),
                "admitted_len_histogram": list(self._admitted_len_counts),
                "mean_accept_len": _ratio(self._accept_len_sum, self._accept_request_steps),
                "accepted_len_histogram": list(self._accepted_len_counts),
                "calibration_bins": {
                    "count": self._bin_counts.tolist(),
                    "prediction_sum": self._bin_prediction_sums.tolist(),
                    "label_sum": self._bin_label_sums.tolist(),
                },
                "mean_step_ms": _ratio(1000.0 * self._step_seconds_sum, self._timed_steps),
                # Lifetime sums, so that a client can difference two snapshots (the load test's per-level step times).
                "timed_steps": self._timed_steps,
                "step_seconds_sum": self._step_seconds_sum,
                "timed_drafted_steps": self._timed_drafted_steps,
                "drafted_step_seconds_sum": self._drafted_step_seconds_sum,
            }
        # The O(window) part runs outside the lock.
        result["ece"] = expected_calibration_error(predictions, labels) if filled else None
        result["ece_window"] = filled
        result["mean_predicted_survival"] = float(predictions.mean()) if filled else None
        result["mean_observed_survival"] = float(labels.mean()) if filled else None
        return result


def _is_plain_step(verify_lens, accepted_drafts, survival) -> bool:
    """Host lists of a step that verified the anchors only (every verify length 1, nothing accepted), no survival."""
    if survival is not None or not isinstance(verify_lens, (list, tuple)) or not verify_lens:
        return False
    if accepted_drafts is not None and (not isinstance(accepted_drafts, (list, tuple))
                                        or len(accepted_drafts) != len(verify_lens) or any(accepted_drafts)):
        return False
    return all(type(v) is int and v == 1 for v in verify_lens)


def _add_counts(totals: list[int], counts: list[int]) -> None:
    if len(counts) > len(totals):
        totals.extend([0] * (len(counts) - len(totals)))
    for value, count in enumerate(counts):
        totals[value] += count


def ece_from_bins(count: Sequence[float], prediction_sum: Sequence[float], label_sum: Sequence[float]) -> float | None:
    """The ECE of ``summary()["calibration_bins"]`` (or of the difference of two snapshots)."""
    total = sum(count)
    if total <= 0:
        return None
    return sum(abs(l - p) for p, l in zip(prediction_sum, label_sum)) / total


def _ratio(numerator: float, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


_stats: AdmissionStats | None = None
_stats_lock = threading.Lock()


def get_admission_stats() -> AdmissionStats:
    """This process's ``AdmissionStats`` (each scheduler process has its own)."""
    global _stats
    if _stats is None:
        with _stats_lock:
            if _stats is None:
                _stats = AdmissionStats()
    return _stats
