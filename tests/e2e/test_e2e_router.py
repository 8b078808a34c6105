"""End to end: two DSPARK replicas behind SGLang's router (``sglang-router``, cache-aware), all on 127.0.0.1.

Two tiny-pair DSPARK servers (stock launcher, fp32) and ``python -m sglang_router.launch_router --policy
cache_aware`` in front of them. Checked:

* greedy answers through the router, 20 prompts 8 at a time, equal the no-spec server's token for token, and the
  router passes DSPARK's response unchanged (its ``spec_*`` meta info included) and streams chat;
* both replicas served: the router's per-worker request counter and each replica's own ``/server_info`` (its own
  port, ``speculative_algorithm`` DSPARK, its own ``dspark_admission`` step counter grown by its share of the
  traffic);
* a replica whose scheduler process is killed (SIGKILL) exits non-zero on its own, its log naming the dead
  scheduler (SGLang 0.5.23's subprocess watchdog), the router marks it unhealthy, and the other replica serves
  the next requests, still equal to no-spec.

The fault drill with numbers (kill -9 of a replica under load, restart and rejoin) is
``python -m sglang_dspark.testing.fault_drill`` (docs/reliability.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import pytest
import requests

from sglang_dspark.testing.fault_drill import kill_scheduler
from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args
from sglang_dspark.testing.router import start_router

pytestmark = pytest.mark.server

# SGLang's subprocess watchdog polls every second, then sleeps 5 s before it kills the process tree; 30 s leaves
# room for a loaded 2-core machine and still fails a server that hangs half-alive.
SCHEDULER_DEATH_EXIT_S = 30
# The router probes every worker each second here and marks it unhealthy after 3 failed probes.
UNHEALTHY_WITHIN_S = 20


def admission(url: str) -> dict:
    info = requests.get(f"{url}/server_info", timeout=30).json()
    return {"port": info["port"], "algorithm": info["speculative_algorithm"],
            "state": info["internal_states"][0]["dspark_admission"]}


def through(router_url: str, prompts, concurrency: int = 8) -> list[dict]:
    def one(prompt):
        response = requests.post(f"{router_url}/generate", json={"text": prompt, "sampling_params": dict(GREEDY)},
                                 timeout=300)
        response.raise_for_status()
        return response.json()

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


@pytest.fixture(scope="module")
def cluster(tiny_pair, shared_server, launch, server_logs, nospec_reference):
    """Two DSPARK replicas, started side by side (a start-up is ~1 min here), and the router in front of them.

    Replica 0 is the session's default DSPARK launch through the shared pool (already running if this file runs in
    the test process of test_e2e_dspark.py's group, tests/conftest.py SERVER_SHARING_FILES); replica 1 is private,
    because the last test kills it."""
    started = time.monotonic()
    args = dspark_args(tiny_pair.draft_dir)
    with contextlib.ExitStack() as stack:
        private = launch(tiny_pair.target_dir, args)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            shared_future = pool.submit(shared_server, tiny_pair.target_dir, args)
            private_future = pool.submit(private.__enter__)
            try:
                victim = private_future.result()
                stack.push(private)  # its __exit__ stops the server by PID
            finally:
                replicas = [shared_future.result()]
        replicas.append(victim)
        router = stack.enter_context(start_router([r.url for r in replicas], "cache_aware",
                                                  health_check_interval=1, log_dir=server_logs))
        print(f"\n[router test] replicas and router up in {time.monotonic() - started:.0f} s")
        yield router, replicas


@pytest.fixture(scope="module")
def routed(cluster):
    router, replicas = cluster
    before = [admission(r.url) for r in replicas]
    results = through(router.url, PROMPTS, concurrency=8)
    after = [admission(r.url) for r in replicas]
    chat_stream = requests.post(
        f"{router.url}/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": "class Stack:"}], "stream": True,
              "max_tokens": 16, "temperature": 0},
        timeout=120, stream=True,
    )
    chunks = [line for line in chat_stream.iter_lines(decode_unicode=True) if line.startswith("data:")]
    return {"results": results, "before": before, "after": after, "per_worker": router.requests_per_worker(),
            "chat_status": chat_stream.status_code, "chat_chunks": chunks}


def test_greedy_through_the_router_equals_nospec(routed, nospec_reference):
    assert_same_ids([r["output_ids"] for r in routed["results"]], nospec_reference["bs8"], "router, 8 concurrent")
    for result in routed["results"]:  # DSPARK's own meta info reaches the client unchanged
        assert result["meta_info"]["spec_verify_ct"] > 0
        assert result["meta_info"]["spec_accept_length"] >= 1.0
    assert routed["chat_status"] == 200
    assert len(routed["chat_chunks"]) > 2 and routed["chat_chunks"][-1] == "data: [DONE]"


def test_both_replicas_served_and_show_their_own_dspark_state(cluster, routed):
    router, replicas = cluster
    per_worker = routed["per_worker"]
    assert set(per_worker) == {r.url for r in replicas}
    assert all(count >= 1 for count in per_worker.values()), per_worker
    assert sum(per_worker.values()) >= len(PROMPTS)  # + the streamed chat
    for replica, before, after in zip(replicas, routed["before"], routed["after"]):
        assert after["port"] == replica.port and after["algorithm"] == "DSPARK"
        assert after["state"]["policy"] == "async"
        assert after["state"]["steps"] > before["state"]["steps"], (replica.url, before, after)


def test_a_dead_scheduler_takes_its_replica_out_and_the_other_serves(cluster, routed, nospec_reference):
    router, replicas = cluster
    survivor, victim = replicas  # the private replica dies; the shared one serves on
    killed = kill_scheduler(victim.process.pid)
    started = time.monotonic()
    try:
        code = victim.process.wait(timeout=SCHEDULER_DEATH_EXIT_S)
    except Exception:
        pytest.fail(f"the server lived on {SCHEDULER_DEATH_EXIT_S} s after its scheduler (pid {killed}) was killed")
    exit_s = time.monotonic() - started
    assert code != 0, f"exit code {code}"
    assert f"Subprocess scheduler_0 (pid={killed}) crashed" in victim.log_text()
    unhealthy_s = router.wait_until(lambda r: victim.url not in r.healthy_urls(), UNHEALTHY_WITHIN_S)
    assert survivor.url in router.healthy_urls()
    served_before = router.requests_per_worker()[survivor.url]
    results = through(router.url, PROMPTS[:8], concurrency=4)
    assert [r["output_ids"] for r in results] == nospec_reference["bs8"][:8]
    assert router.requests_per_worker()[survivor.url] >= served_before + 8
    print(f"\nscheduler killed: server exited {code} after {exit_s:.1f} s, router unhealthy after "
          f"{exit_s + unhealthy_s:.1f} s")
