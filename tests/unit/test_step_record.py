"""The worker's per-step observation never reads a device tensor synchronously (GPU overlap stays intact).

Device tensors are stood in for by ``meta`` tensors: any host read of them (``tolist``, ``item``, ``cpu``, ``bool``)
raises, so a recorder that syncs fails here. Copies and events are fakes that land when the test says so."""

from __future__ import annotations

import pytest
import torch

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


def test_confidence_of_another_batch_is_not_attributed():
    recorder = StepRecorder("cpu")
    recorder.start()
    (record,) = recorder.finish(
        accept_lens=torch.tensor([1]), cap_lens=torch.tensor([2]), confidence=torch.ones(2, 3), default_verify_len=4
    )
    assert record.confidence is None and record.verify_lens == [2]
