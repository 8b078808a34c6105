"""The router launcher's guards and metric parsing, and the fault drill's scheduler lookup and bookkeeping, without
SGLang (the end-to-end use: tests/e2e/test_e2e_router.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sglang_dspark.testing import fault_drill
from sglang_dspark.testing.fault_drill import Outcome, _summarise, kill_scheduler, scheduler_pids
from sglang_dspark.testing.router import parse_prometheus, start_router

METRICS = """\
# HELP smg_worker_cb_outcomes_total Circuit breaker outcomes
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1001",outcome="success"} 13
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1002",outcome="success"} 8
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1002",outcome="failure"} 2
smg_worker_retries_total{worker="http://127.0.0.1:1002",endpoint="generate"} 3
smg_http_connections_active 0
"""


def test_parse_prometheus_reads_names_labels_and_values():
    samples = parse_prometheus(METRICS)
    assert len(samples) == 5
    assert samples[0] == ("smg_worker_cb_outcomes_total", {"worker": "http://127.0.0.1:1001", "outcome": "success"},
                          13.0)
    assert samples[-1] == ("smg_http_connections_active", {}, 0.0)


def test_requests_per_worker_counts_successes_only(monkeypatch):
    from sglang_dspark.testing.router import Router

    router = Router(process=None, port=1, metrics_port=2, log_path=None,
                    worker_urls=["http://127.0.0.1:1001", "http://127.0.0.1:1002"])
    monkeypatch.setattr(Router, "metrics", lambda self, timeout=10: parse_prometheus(METRICS))
    assert router.requests_per_worker() == {"http://127.0.0.1:1001": 13.0, "http://127.0.0.1:1002": 8.0}
    assert router.metric_total("smg_worker_retries_total") == 3.0


@pytest.mark.parametrize("urls, policy", [(["http://10.0.0.5:30000"], "cache_aware"),
                                          (["http://127.0.0.1:30000"], "fastest")])
def test_start_router_refuses_remote_workers_and_unknown_policies(urls, policy, tmp_path):
    with pytest.raises(ValueError):
        start_router(urls, policy, log_dir=tmp_path)


# A stand-in server: a parent process with two children titled as SGLang titles its subprocesses (setproctitle);
# it prints their PIDs. (Not this test process: in a test run it may be the parent of real servers.)
FAKE_SERVER = """
import subprocess, sys, time
title = "import setproctitle, time; setproctitle.setproctitle({!r}); time.sleep(60)"
children = [subprocess.Popen([sys.executable, "-c", title.format(name)])
            for name in ("sglang::scheduler", "sglang::detokenizer")]
print(" ".join(str(c.pid) for c in children), flush=True)
time.sleep(60)
"""


def test_kill_scheduler_finds_the_child_titled_sglang_scheduler_and_kills_it():
    import psutil

    server = subprocess.Popen([sys.executable, "-c", FAKE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        scheduler, detokenizer = (int(pid) for pid in server.stdout.readline().split())
        deadline = time.monotonic() + 20
        while scheduler not in scheduler_pids(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # the title is set once the child's interpreter has started
        assert scheduler_pids(server.pid) == [scheduler]
        assert kill_scheduler(server.pid) == scheduler
        deadline = time.monotonic() + 10
        while psutil.pid_exists(scheduler) and psutil.Process(scheduler).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the scheduler outlived its SIGKILL"
            time.sleep(0.05)
        assert psutil.Process(detokenizer).is_running()  # only the scheduler
    finally:
        for child in psutil.Process(server.pid).children(recursive=True):
            child.kill()
        server.kill()
        server.wait()


def test_kill_scheduler_refuses_when_there_is_not_exactly_one():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match="expected one scheduler"):
            kill_scheduler(server.pid)
    finally:
        server.kill()
        server.wait()


def test_summary_counts_failures_and_answers_that_change():
    outcomes = [
        Outcome(0, 0.0, 1.0, 200, "", [1, 2]),
        Outcome(0, 2.0, 3.0, 200, "", [1, 2]),
        Outcome(1, 2.5, 3.5, 200, "", [5]),
        Outcome(1, 4.0, 5.0, 200, "", [6]),  # the same prompt answered differently: counted
        Outcome(2, 4.0, 4.1, 0, "ConnectionError: refused"),
    ]
    summary = _summarise(outcomes)
    assert summary["requests"] == 5 and summary["ok"] == 4 and summary["failed"] == 1
    assert summary["answers_differing_from_first"] == 1
    assert summary["failures"][0]["status"] == 0


def test_markdown_rows_name_the_fault_and_the_numbers():
    replica = {"drill": "replica-kill", "policy": "round_robin", "stream": True, "concurrency": 8, "failed": 2,
               "requests": 100, "requests_in_flight_at_kill": 8, "router_retries_after_kill": 3.0,
               "unhealthy_after_s": 4.9, "restarted_healthy_after_s": 70.0, "router_healthy_again_after_s": 72.0,
               "first_request_served_after_s": 72.5, "fresh_prompts_to_restarted": 4.0,
               "fresh_prompts_after_rejoin": 8}
    scheduler = {"drill": "scheduler-kill", "in_flight_at_kill": 4, "in_flight_answered_after_s": 5.7,
                 "in_flight_failed": 4, "server_exit_code": -9, "server_exit_after_s": 5.7}
    table = fault_drill.markdown([scheduler, replica]).splitlines()
    assert len(table) == 4
    assert "SIGKILL of the scheduler" in table[2] and "code -9" in table[2] and "5.7 s" in table[2]
    assert "round_robin, c = 8, streamed" in table[3] and "2 of 100 requests failed" in table[3]
    assert "serving after 72.5 s" in table[3]
