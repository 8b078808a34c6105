"""What a decode step tells the planner afterwards (lengths, confidences, step time), without a host sync.

On a GPU the overlap scheduler launches step i+1 while step i still runs on the device; a ``.tolist()`` on step i's
results would make the host wait for the whole step and serialise the two. So the step's small tensors are copied
into pinned host buffers with ``non_blocking=True`` and an event is recorded after them; the record is read on a
later step, once ``event.query()`` says the copies landed (never ``synchronize``). Step time on a GPU comes from two
device events around the step, read the same way. On the CPU the device is the host: tensors are read at once and
the host wall time is the step time.

A record whose copies are not done after ``max_pending`` later steps is dropped (counted): observability and the
learned overhead may skip a step; the decode step never waits for them.

Events come from the device's own module (``torch.cuda.Event``, ``torch.xpu.Event``, torch_npu's ``torch.npu.Event``;
upstream DSPARK runs on CUDA, NPU and XPU: ``arg_groups/speculative_hook.py:669``), else from PyTorch's
device-generic ``torch.Event``. A device with neither is read synchronously (one blocking copy per step, logged once):
slower, never a crash at the first decode step.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# scheduling/step_plan.StepPlan, named only: this module imports torch and the standard library alone (the GPU
# device check runs it by path).
StepPlan = object

logger = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One decode step, on the host: what was planned (``plan``, scheduling/step_plan.StepPlan; None: a drafted step
    nothing chose, as upstream's) and what happened: per-request verify lengths (anchor included), committed lengths,
    the draft confidences the planner scheduled from ([R, γ], or None), the step's seconds (or None)."""

    verify_lens: list[int]
    commit_lens: list[int]
    confidence: Optional[torch.Tensor]
    seconds: Optional[float]
    plan: Optional[StepPlan] = None
    # The device's idle time between the previous decode step's end and this one's start (None: not timed, e.g. the
    # first step, or a prefill ran in between); what giving up the overlap costs shows here (profiler/overlap_gap.py).
    gap_seconds: Optional[float] = None

    @functools.cached_property
    def survival(self) -> Optional[torch.Tensor]:
        """``[R, γ]`` survivals of the scheduled confidences (their running products; None without confidences),
        computed once for every learner that reads them."""
        return self.confidence.cumprod(dim=1) if self.confidence is not None else None

    @property
    def kind(self) -> str:
        """The plan's step kind (``drafted``, ``plain``, ``lookup``, ``mixed``)."""
        return "drafted" if self.plan is None else self.plan.kind

    @property
    def drafted(self) -> bool:
        """The step ran the draft block (False: a step the chooser planned without it)."""
        return self.plan is None or self.plan.draft

    @property
    def gate_choice(self):
        """The draft gate's DraftChoice the step was decided with (None: no gate, or a decision without one)."""
        return None if self.plan is None else self.plan.choice

    @property
    def lookup(self):
        """The plan's lookup rows (None: no row verified a lookup chain)."""
        return None if self.plan is None else self.plan.lookup

    @property
    def overlap_given_up(self) -> bool:
        """The scheduler ran the previous result before launching this step (patches/lookup_current_tokens.py)."""
        return self.plan is not None and self.plan.overlap_given_up


def pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """Enqueue a device→host copy into pinned memory (the host allocator caches pinned blocks); returns at once."""
    buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    buffer.copy_(tensor, non_blocking=True)
    return buffer


def recorded_device_event(timing: bool = False):
    """A recorded CUDA event (kept for callers that name CUDA; the recorder picks per device: :func:`event_maker`)."""
    event = torch.cuda.Event(enable_timing=timing)
    event.record()
    return event


def _device(device):
    """``torch.device(device)``, or the string itself where this torch does not know the type (``npu`` before
    torch_npu renames the private-use backend)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        return str(device)


def _device_type(device) -> str:
    device = _device(device)
    return device.type if isinstance(device, torch.device) else device.split(":", 1)[0]


def _event_factories(device, device_module_of: Callable) -> list:
    """``timing -> event`` factories to try, best first: ``torch.<device>.Event`` where the device module has one
    (cuda, xpu, npu through torch_npu, mps, ...), then PyTorch's device-generic ``torch.Event`` (2.4+)."""
    factories = []
    try:
        event_class = getattr(device_module_of(_device_type(device)), "Event", None)
    except (AttributeError, RuntimeError, ValueError):  # no module registered for this device type
        event_class = None
    if event_class is not None:
        factories.append(lambda timing: event_class(enable_timing=timing))
    generic = getattr(torch, "Event", None)
    if generic is not None:
        factories.append(lambda timing: generic(device=device, enable_timing=timing))
    return factories


def event_maker(device, device_module_of: Callable = torch.get_device_module) -> Optional[Callable[[bool], object]]:
    """``make_event(timing)`` that records an event on ``device``'s current stream, or None where this device has no
    usable event (the recorder then reads each step synchronously).

    Each candidate makes and records one timing event here, so an event type that exists but does not work on this
    device is found at start-up (and the next candidate tried), not at the first decode step."""
    device = _device(device)
    for factory in _event_factories(device, device_module_of):
        def make_event(timing: bool = False, factory=factory):
            event = factory(timing)
            event.record()
            return event

        try:
            make_event(True)
        except (RuntimeError, TypeError, ValueError, NotImplementedError, AttributeError) as exc:
            logger.debug("sglang-dspark: device event refused on %s (%s)", device, exc)
            continue
        return make_event
    return None


class _PendingCopy:
    """Non-blocking device→pinned-host copies of one step plus the events that say when they (and the step) ended."""

    def __init__(self, tensors: dict, started_event, ended_event, default_verify_len: int, copy_to_host,
                 make_event, plan: Optional[StepPlan] = None, previous_ended_event=None) -> None:
        self.host = {name: (copy_to_host(t) if t is not None else None) for name, t in tensors.items()}
        self.host["plan"] = plan
        self.copied = make_event(False)
        self.started_event = started_event
        self.ended_event = ended_event
        self.previous_ended_event = previous_ended_event
        self.default_verify_len = default_verify_len

    def ready(self) -> bool:
        return self.copied.query()

    def to_record(self) -> StepRecord:
        seconds = gap = None
        if self.started_event is not None and self.ended_event.query():
            seconds = _elapsed(self.started_event, self.ended_event)
            if self.previous_ended_event is not None:
                gap = _elapsed(self.previous_ended_event, self.started_event)
        return _record_from_host(self.host, seconds, self.default_verify_len, gap)


def _elapsed(start, end) -> Optional[float]:
    try:
        return start.elapsed_time(end) / 1e3
    except RuntimeError:  # an event type without timing on this device: the step's lengths still count
        return None


def _record_from_host(host: dict, seconds: Optional[float], default_verify_len: int,
                      gap_seconds: Optional[float] = None) -> StepRecord:
    commit_lens = host["accept_lens"].tolist()
    cap_lens = host.get("cap_lens")
    verify_lens = cap_lens.tolist() if cap_lens is not None else [default_verify_len] * len(commit_lens)
    confidence = host.get("confidence")
    if confidence is not None:
        confidence = confidence.float()
    return StepRecord(verify_lens=verify_lens, commit_lens=commit_lens, confidence=confidence, seconds=seconds,
                      plan=host.get("plan"), gap_seconds=gap_seconds)


class StepRecorder:
    """``start()`` before a decode step, ``finish(...)`` after it; returns the records that are ready now."""

    def __init__(self, device, *, max_pending: int = 4, clock: Callable[[], float] = time.perf_counter,
                 copy_to_host=pinned_copy, make_event=None, device_module_of: Callable = torch.get_device_module
                 ) -> None:
        """``make_event(timing)`` defaults to :func:`event_maker` for ``device`` (not used on the CPU)."""
        device_type = _device_type(device)
        self.on_host = device_type == "cpu"
        # No usable device event: read each step's tensors with a blocking copy (correct, one host sync per step).
        self.synchronous = False
        if not self.on_host and make_event is None:
            make_event = event_maker(device, device_module_of)
            if make_event is None:
                self.synchronous = True
                logger.warning("sglang-dspark: %s has no usable device events: each decode step's lengths are read "
                               "with a blocking copy (one host sync per step)", device_type)
        self._copy_to_host = copy_to_host
        self._make_event = make_event
        self.max_pending = max_pending
        self.dropped = 0
        self._clock = clock
        self._pending: collections.deque[_PendingCopy] = collections.deque()
        self._started: object = None
        self._previous_ended: object = None  # the last decode step's end (clock or event); None after another step

    def start(self) -> None:
        if self.on_host or self.synchronous:
            self._started = self._clock()
        else:
            self._started = self._make_event(True)

    def interrupt(self) -> None:
        """A step that is not a recorded decode step ran (a prefill): the next decode step's gap is not timed."""
        self._previous_ended = None

    def finish(self, *, accept_lens, cap_lens, confidence, default_verify_len: int,
               plan: Optional[StepPlan] = None) -> list[StepRecord]:
        tensors = {"accept_lens": accept_lens, "cap_lens": cap_lens, "confidence": confidence}
        if confidence is not None and confidence.shape[0] != accept_lens.shape[0]:
            tensors["confidence"] = None  # scheduled for another batch (composition changed): not this step's
        if self.on_host or self.synchronous:
            # Blocking reads first, then the clock: without device events the step ends when its results landed.
            host = {k: (v.detach().to("cpu") if v is not None else None) for k, v in tensors.items()}
            ended = self._clock()
            gap = self._started - self._previous_ended if self._previous_ended is not None else None
            self._previous_ended = ended
            host["plan"] = plan
            return [_record_from_host(host, ended - self._started, default_verify_len, gap)]
        ended = self._make_event(True)
        self._pending.append(
            _PendingCopy({k: (v.detach() if v is not None else None) for k, v in tensors.items()},
                         self._started, ended, default_verify_len, self._copy_to_host, self._make_event, plan,
                         self._previous_ended)
        )
        self._previous_ended = ended
        ready = []
        while self._pending and self._pending[0].ready():
            ready.append(self._pending.popleft().to_record())
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            self.dropped += 1
        return ready
