"""An SPS table profiled on a busy machine is not cached; one that disagrees with served steps is scaled online."""

from __future__ import annotations

import logging
import os

import pytest

from sglang_dspark.profiler.sps_table import SpsTable
from sglang_dspark.profiler.step_overhead import OverheadAdjustedCost, StepOverhead
from sglang_dspark.profiler.table_trust import (
    TableAgreement,
    cache_refusal,
    host_busy_reason,
    remeasure_disagreement,
)


def test_busy_host_is_detected_beyond_our_own_threads():
    # 2 cores, our profile runs 2 threads: load 2.5 is us plus half a core: quiet enough; load 8 is not.
    assert host_busy_reason(own_threads=2, load=2.5, cores=2) is None
    reason = host_busy_reason(own_threads=2, load=8.0, cores=2)
    assert reason is not None and "8.0 on 2 cores" in reason


def test_remeasured_probe_must_agree():
    assert remeasure_disagreement(0.010, [0.011, 0.012]) is None
    assert "1.80x" in remeasure_disagreement(0.010, [0.018, 0.018])


def test_cache_refusal_remeasures_the_smallest_probe():
    table = SpsTable({1: {1: 0.010, 8: 0.012}, 4: {4: 0.020}})
    calls = []

    def slow(r, b):
        calls.append((r, b))
        return 0.025

    assert cache_refusal(table, slow, device="cuda", own_threads=1) is not None
    assert calls == [(1, 1), (1, 1)]
    assert cache_refusal(table, lambda r, b: 0.0102, device="cuda", own_threads=1) is None
    assert cache_refusal(table, None, device="cuda", own_threads=1) is None  # under TP: no lone re-measurement


def test_table_too_slow_is_scaled_online_with_one_log_line(caplog):
    table = SpsTable({1: {1: 0.020, 4: 0.024}})
    cost = OverheadAdjustedCost(table, StepOverhead())
    agreement = TableAgreement(window=8, min_steps=8, source="cache")
    changed = []
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            # Steps of 12 ms measured where the table says the verify alone takes 20 ms.
            if agreement.observe(0.012, table.step_seconds(1, 1)):
                cost.verify_scale = agreement.scale
                changed.append(agreement.scale)
    assert changed == [pytest.approx(0.6)]
    assert cost.verify_seconds(1, 1) == pytest.approx(0.012)
    assert sum("disagrees with the decode steps" in r.message for r in caplog.records) == 1
    # Once scaled, the same steps agree: no further correction.
    assert agreement.corrections == 1 and agreement.summary()["verify_scale"] == pytest.approx(0.6)


def test_table_that_agrees_or_is_too_fast_is_left_alone():
    agreement = TableAgreement(window=8, min_steps=8)
    for _ in range(40):
        agreement.observe(0.030, 0.020)  # step = verify + 10 ms of rest: normal
        agreement.observe(0.090, 0.020)  # table too fast: the learned additive overhead absorbs it
    assert agreement.scale == 1.0 and agreement.corrections == 0


def test_contention_window_sees_other_processes_not_ours():
    import subprocess
    import sys
    import time

    from sglang_dspark.profiler.table_trust import ContentionWindow

    window = ContentionWindow()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # our own busy loop is not contention
        pass
    own = window.others_share()
    if own is None:
        pytest.skip("no /proc/stat here")
    # Other processes spinning every core for a while are.
    spinners = [subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.0: pass"])
                for _ in range(os.cpu_count() or 1)]
    busy = ContentionWindow()
    for p in spinners:
        p.wait()
    assert busy.others_share() > 0.5
    assert "while the table was profiled" in busy.busy_reason(own_threads=1)
