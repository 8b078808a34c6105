"""The worker's per-step observation never reads a device tensor synchronously (GPU overlap stays intact).

Device tensors are stood in for by ``meta`` tensors: any host read of them (``tolist``, ``item``, ``cpu``, ``bool``)
raises, so a recorder that syncs fails here. Copies and events are fakes that land when the test says so."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_dspark.scheduling.step_plan import StepPlan
from sglang_dspark.engine.step_record import StepRecorder


class FakeEvent:
    def __init__(self, clock, timing):
        self.clock, self.time, self.done = clock, clock["now"], False
        clock["events"].append(self)

    def query(self):
        return self.done

    def elapsed_time(self, other):
        return (other.time - self.time) * 1e3


def device_recorder(landed_values):
    clock = {"now": 0.0, "events": []}
    copies = []

    def copy_to_host(tensor):
        assert tensor.device.type == "meta", "only device tensors are copied"
        copies.append(tensor.shape)
        return landed_values[len(copies) - 1].clone()

    recorder = StepRecorder("cuda:0", copy_to_host=copy_to_host, make_event=lambda timing: FakeEvent(clock, timing))
    return recorder, clock


def meta(values, dtype=torch.int32):
    return torch.empty(len(values), dtype=dtype, device="meta")


def test_meta_tensors_raise_on_host_reads():
    with pytest.raises(Exception):
        meta([1, 2]).tolist()


def test_device_step_is_read_one_step_later_without_sync():
    landed = [torch.tensor([2, 1]), torch.tensor([3, 1]), torch.tensor([1, 1]), torch.tensor([1, 2])]
    recorder, clock = device_recorder(landed)
    recorder.start()
    clock["now"] = 0.010
    assert recorder.finish(accept_lens=meta([0, 0]), cap_lens=meta([0, 0]), confidence=None, default_verify_len=8) == []
    for event in clock["events"]:
        event.done = True  # the device caught up while the next step was launched
    recorder.start()
    records = recorder.finish(accept_lens=meta([0, 0]), cap_lens=meta([0, 0]), confidence=None, default_verify_len=8)
    assert len(records) == 1
    record = records[0]
    assert record.commit_lens == [2, 1] and record.verify_lens == [3, 1]
    assert record.seconds == pytest.approx(0.010)


def test_pending_copies_are_dropped_not_waited_for():
    landed = [torch.tensor([1])] * 40
    recorder, _ = device_recorder(landed)
    for _ in range(10):
        recorder.start()
        assert recorder.finish(accept_lens=meta([0]), cap_lens=None, confidence=None, default_verify_len=8) == []
    assert recorder.dropped == 10 - recorder.max_pending


def test_cpu_step_is_read_at_once():
    ticks = iter([1.0, 1.25])
    recorder = StepRecorder("cpu", clock=lambda: next(ticks))
    recorder.start()
    confidence = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    (record,) = recorder.finish(
        accept_lens=torch.tensor([1, 3]), cap_lens=None, confidence=confidence, default_verify_len=3
    )
    assert record.verify_lens == [3, 3] and record.commit_lens == [1, 3]
    assert record.seconds == pytest.approx(0.25)
    assert torch.equal(record.confidence, confidence)


def test_the_gap_before_a_step_is_timed_between_consecutive_decode_steps_without_sync():
    """Device: the previous step's end event to this step's start event, read when the record lands (no wait); a
    prefill in between (``interrupt``) leaves the next gap untimed. The overlap flag rides along."""
    landed = [torch.tensor([1])] * 8
    recorder, clock = device_recorder(landed)
    records = []
    for start, end, interrupt, waited in [(0.000, 0.010, False, False), (0.012, 0.020, False, True),
                                          (0.030, 0.040, True, False)]:
        if interrupt:
            recorder.interrupt()
        clock["now"] = start
        recorder.start()
        clock["now"] = end
        records += recorder.finish(accept_lens=meta([0]), cap_lens=None, confidence=None, default_verify_len=8,
                                   plan=StepPlan(overlap_given_up=waited))
        for event in clock["events"]:
            event.done = True
    recorder.start()
    records += recorder.finish(accept_lens=meta([0]), cap_lens=None, confidence=None, default_verify_len=8)
    assert [r.gap_seconds for r in records[:3]] == [None, pytest.approx(0.002), None]
    assert [r.overlap_given_up for r in records[:3]] == [False, True, False]


def test_cpu_gap_is_the_host_time_between_steps():
    ticks = iter([1.0, 1.25, 1.5, 1.75])
    recorder = StepRecorder("cpu", clock=lambda: next(ticks))
    gaps = []
    for _ in range(2):
        recorder.start()
        (record,) = recorder.finish(accept_lens=torch.tensor([1]), cap_lens=None, confidence=None,
                                    default_verify_len=3, plan=StepPlan(overlap_given_up=True))
        gaps.append(record.gap_seconds)
    assert gaps == [None, pytest.approx(0.25)] and record.overlap_given_up


def test_confidence_of_another_batch_is_not_attributed():
    recorder = StepRecorder("cpu")
    recorder.start()
    (record,) = recorder.finish(
        accept_lens=torch.tensor([1]), cap_lens=torch.tensor([2]), confidence=torch.ones(2, 3), default_verify_len=4
    )
    assert record.confidence is None and record.verify_lens == [2]


# ---------------------------------------------------------------------------------------------------------------------
# Device-agnostic events (issue #38, item 6): upstream DSPARK runs on CUDA, NPU and XPU
# ---------------------------------------------------------------------------------------------------------------------


class RecordingEvent:
    """A device module's Event: records how it was made and used; lands when the test says so."""

    made: list = []

    def __init__(self, enable_timing=False, device=None):
        self.timing, self.device, self.recorded, self.done = enable_timing, device, 0, False
        RecordingEvent.made.append(self)

    def record(self, stream=None):
        self.recorded += 1

    def query(self):
        return self.done

    def elapsed_time(self, other):
        return 7.0


@pytest.fixture()
def no_cuda_event(monkeypatch):
    """A recorder that reaches for torch.cuda on a non-CUDA device fails here."""
    RecordingEvent.made = []

    def refuse(*args, **kwargs):
        raise AssertionError("torch.cuda.Event used on a non-CUDA device")

    monkeypatch.setattr(torch.cuda, "Event", refuse)


def host_copy(tensor):
    return tensor.clone()


@pytest.mark.parametrize("device", ["npu:0", "xpu", "cuda:1"])
def test_events_come_from_the_device_module(device, no_cuda_event):
    asked = []
    module = types.SimpleNamespace(Event=RecordingEvent)
    recorder = StepRecorder(device, copy_to_host=host_copy, device_module_of=lambda t: asked.append(t) or module)
    assert asked == [device.split(":")[0]] and not recorder.synchronous
    probe = len(RecordingEvent.made)  # the start-up check made and recorded one
    assert probe == 1 and RecordingEvent.made[0].recorded == 1
    recorder.start()
    assert recorder.finish(accept_lens=torch.tensor([2]), cap_lens=torch.tensor([3]), confidence=None,
                           default_verify_len=8) == []
    made = RecordingEvent.made[probe:]
    assert [e.timing for e in made] == [True, True, False]  # step start, step end, copies landed
    assert all(e.recorded == 1 for e in made)
    for event in made:
        event.done = True
    recorder.start()
    (record,) = recorder.finish(accept_lens=torch.tensor([1]), cap_lens=None, confidence=None, default_verify_len=8)
    assert record.commit_lens == [2] and record.verify_lens == [3] and record.seconds == pytest.approx(0.007)


def test_a_module_without_event_falls_back_to_torch_event(monkeypatch, no_cuda_event):
    monkeypatch.setattr(torch, "Event", RecordingEvent)
    recorder = StepRecorder("xpu:0", copy_to_host=host_copy, device_module_of=lambda t: types.SimpleNamespace())
    assert not recorder.synchronous
    recorder.start()
    recorder.finish(accept_lens=torch.tensor([1]), cap_lens=None, confidence=None, default_verify_len=8)
    assert RecordingEvent.made and all(e.device == torch.device("xpu:0") for e in RecordingEvent.made)


def test_no_usable_event_reads_the_step_at_once(monkeypatch, no_cuda_event, caplog):
    class Refused:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("event not supported on this device")

    monkeypatch.setattr(torch, "Event", Refused)
    ticks = iter([2.0, 2.5])
    with caplog.at_level("WARNING", logger="sglang_dspark.engine.step_record"):
        recorder = StepRecorder("npu:0", clock=lambda: next(ticks),
                                device_module_of=lambda t: types.SimpleNamespace(Event=Refused))
    assert recorder.synchronous
    assert sum("no usable device events" in r.getMessage() for r in caplog.records) == 1
    recorder.start()
    (record,) = recorder.finish(accept_lens=torch.tensor([2, 1]), cap_lens=torch.tensor([3, 2]), confidence=None,
                                default_verify_len=8)
    assert record.commit_lens == [2, 1] and record.verify_lens == [3, 2] and record.seconds == pytest.approx(0.5)


def test_an_event_without_timing_still_gives_the_lengths(no_cuda_event):
    class NoTiming(RecordingEvent):
        def elapsed_time(self, other):
            raise RuntimeError("timing not enabled")

    recorder = StepRecorder("npu", copy_to_host=host_copy, device_module_of=lambda t: types.SimpleNamespace(
        Event=NoTiming))
    recorder.start()
    recorder.finish(accept_lens=torch.tensor([4]), cap_lens=None, confidence=None, default_verify_len=8)
    for event in RecordingEvent.made:
        event.done = True
    (record,) = recorder.finish(accept_lens=torch.tensor([1]), cap_lens=None, confidence=None, default_verify_len=8)
    assert record.commit_lens == [4] and record.seconds is None
