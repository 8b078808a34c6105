"""Fault drill: what a client sees when a DSPARK replica or a server's scheduler dies, measured on 127.0.0.1.

    python -m sglang_dspark.testing.fault_drill                       # both drills, tiny pair, table + JSON
    python -m sglang_dspark.testing.fault_drill --drill replica-kill  # or scheduler-kill
    python -m sglang_dspark.testing.fault_drill --model-path T --draft-model-path D --output drill.json

Drills (every server is the stock ``python -m sglang.launch_server`` with ``--speculative-algorithm DSPARK``,
``--max-total-tokens`` and ``--sleep-on-idle``, on 127.0.0.1 only, stopped by PID):

* ``replica-kill``: two replicas behind SGLang's router (``--policy cache_aware``, a health probe every
  ``--health-interval`` s, 3 failures mark a worker unhealthy). ``--concurrency`` client threads send greedy
  ``/generate`` requests through the router for ``--duration`` s (bounded: at most ``--max-requests``). At
  ``--kill-at`` s one replica's whole process group gets SIGKILL (what a container or node loss does). Once the
  router marks it unhealthy the replica is started again on the same port (what a restart policy does) and the
  drill waits until the router marks it healthy and sends it requests again. Counted: requests that failed at the
  client (status and message), requests the router retried (its ``smg_worker_retries_total``), requests lost (sent
  and never answered with 200), answers that differ from the same prompt's first answer; times from the kill to
  the router's unhealthy mark, to the restarted replica's ``/health``, to the router's healthy mark and to its
  first request served.
* ``scheduler-kill``: one server; its scheduler subprocess gets SIGKILL while requests are in flight. Measured:
  whether and when the server process exits, its exit code, the log line that names the cause, and what the
  in-flight clients got.

The client disconnect fault (KV freed when a streaming client goes away) is measured by the soak test
(``tests/e2e/test_e2e_soak.py``), not here. Numbers: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from sglang_dspark.local_server import CPU_BASE_ARGS, HOST, SGLangServer, _launch, free_port, start_server
from sglang_dspark.testing.helpers import PROMPTS, dspark_args
from sglang_dspark.testing.router import start_router

SCHEDULER_TITLE = "sglang::scheduler"


def scheduler_pids(server_pid: int) -> list[int]:
    """PIDs of the scheduler subprocesses of the SGLang server whose main process is ``server_pid`` (SGLang names
    them ``sglang::scheduler`` with setproctitle)."""
    found = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline()) or child.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if title.startswith(SCHEDULER_TITLE):
            found.append(child.pid)
    return found


def kill_scheduler(server_pid: int) -> int:
    """SIGKILL the (single, TP 1) scheduler subprocess of a server; returns its PID."""
    pids = scheduler_pids(server_pid)
    if len(pids) != 1:
        raise RuntimeError(f"expected one scheduler under pid {server_pid}, found {pids}")
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def launch_on_port(model_path, args, port: int, log_dir: Path, max_total_tokens: int, timeout: float = 400,
                   env: dict | None = None) -> SGLangServer:
    """``local_server.start_server`` on a given port (a restarted replica keeps its URL, as under a restart
    policy)."""
    full = ["--model-path", str(model_path), "--host", HOST, "--port", str(port),
            "--max-total-tokens", str(max_total_tokens), *CPU_BASE_ARGS, *args]
    process_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return _launch(full, port, Path(log_dir), process_env, timeout, sys.executable)


@dataclass
class Outcome:
    prompt: int
    sent: float  # seconds since the drill's start
    done: float
    status: int  # HTTP status, 0 when no response came
    error: str = ""
    output_ids: list = field(default_factory=list)


class LoadClient:
    """``concurrency`` threads sending greedy /generate requests to ``url`` until ``stop`` is set or
    ``max_requests`` were sent."""

    def __init__(self, url: str, concurrency: int, max_new_tokens: int, max_requests: int, timeout: float,
                 stream: bool = False):
        self.url, self.concurrency, self.stream = url, concurrency, stream
        self.params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
        self.max_requests, self.timeout = max_requests, timeout
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        self.t0 = time.monotonic()

    def _take(self) -> int | None:
        with self._lock:
            if self.stop.is_set() or self._next >= self.max_requests:
                return None
            self._next += 1
            return self._next - 1

    def _worker(self) -> None:
        while (index := self._take()) is not None:
            prompt = index % len(PROMPTS)
            sent = time.monotonic() - self.t0
            body = {"text": PROMPTS[prompt], "sampling_params": dict(self.params), "stream": self.stream}
            try:
                response = requests.post(f"{self.url}/generate", timeout=self.timeout, json=body, stream=self.stream)
                if response.status_code != 200:
                    outcome = Outcome(prompt, sent, time.monotonic() - self.t0, response.status_code, response.text[:200])
                elif not self.stream:
                    outcome = Outcome(prompt, sent, time.monotonic() - self.t0, 200, "", response.json()["output_ids"])
                else:  # a stream counts only if it reached [DONE]; cut short, it is a failure the client sees
                    last, done = None, False
                    for line in response.iter_lines(decode_unicode=True):
                        if line and line.startswith("data:"):
                            payload = line[5:].strip()
                            done = done or payload == "[DONE]"
                            last = payload if payload != "[DONE]" else last
                    ids = json.loads(last).get("output_ids", []) if last else []
                    ok = done and len(ids) == self.params["max_new_tokens"]
                    outcome = Outcome(prompt, sent, time.monotonic() - self.t0, 200 if ok else 0,
                                      "" if ok else f"stream cut short after {len(ids)} tokens", ids)
            except (requests.RequestException, ValueError) as error:
                outcome = Outcome(prompt, sent, time.monotonic() - self.t0, 0, f"{type(error).__name__}: {error}"[:200])
            with self._lock:
                self.outcomes.append(outcome)

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.concurrency)]
        for thread in threads:
            thread.start()
        return threads


def _summarise(outcomes: list[Outcome]) -> dict:
    first: dict[int, list] = {}
    differing = 0
    for outcome in sorted(outcomes, key=lambda o: o.sent):
        if outcome.status != 200:
            continue
        if outcome.prompt in first and first[outcome.prompt] != outcome.output_ids:
            differing += 1
        first.setdefault(outcome.prompt, outcome.output_ids)
    failed = [o for o in outcomes if o.status != 200]
    return {
        "requests": len(outcomes),
        "ok": len(outcomes) - len(failed),
        "failed": len(failed),
        "failures": [{"sent_s": round(o.sent, 2), "status": o.status, "error": o.error} for o in failed[:10]],
        "answers_differing_from_first": differing,
    }


def replica_kill_drill(pair, args, log_dir: Path) -> dict:
    ports = [free_port(), free_port()]
    replica_args = ["--dtype", "float32", *dspark_args(pair[1])]
    print(f"[drill] starting two DSPARK replicas on 127.0.0.1:{ports}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        replicas = list(pool.map(lambda p: launch_on_port(pair[0], replica_args, p, log_dir, args.max_total_tokens),
                                 ports))
    router = None
    client = None
    restarted = None
    try:
        router = start_router([r.url for r in replicas], args.policy, health_check_interval=args.health_interval,
                              log_dir=log_dir)
        victim = replicas[1]
        client = LoadClient(router.url, args.concurrency, args.max_new_tokens, args.max_requests, timeout=120,
                            stream=args.stream)
        threads = client.run()
        time.sleep(args.kill_at)
        retries_before = router.metric_total("smg_worker_retries_total")
        in_flight_at_kill = sum(1 for t in threads if t.is_alive())
        killed_at = time.monotonic()
        kill_s = killed_at - client.t0
        os.killpg(victim.process.pid, signal.SIGKILL)
        victim.process.wait(timeout=30)
        print(f"[drill] SIGKILL to replica {victim.url} (process group {victim.process.pid}) at {kill_s:.1f} s",
              flush=True)
        router.wait_until(lambda r: victim.url not in r.healthy_urls(), 120, interval=0.1)
        unhealthy_s = time.monotonic() - killed_at
        print(f"[drill] router marked it unhealthy {unhealthy_s:.1f} s after the kill; restarting it", flush=True)
        restarted = launch_on_port(pair[0], replica_args, victim.port, log_dir, args.max_total_tokens)
        healthy_again_s = time.monotonic() - killed_at
        served_before = router.requests_per_worker().get(victim.url, 0)
        router.wait_until(lambda r: victim.url in r.healthy_urls(), 120)
        rejoined_s = time.monotonic() - killed_at
        try:
            router.wait_until(lambda r: r.requests_per_worker().get(victim.url, 0) > served_before, 60)
            first_served_s = time.monotonic() - killed_at
        except TimeoutError:  # cache_aware keeps prompts it has seen on the replica that holds their prefix
            first_served_s = None
        remaining = args.duration - (time.monotonic() - client.t0)
        if remaining > 0:
            time.sleep(remaining)
        client.stop.set()
        for thread in threads:
            thread.join(timeout=150)
        retries = router.metric_total("smg_worker_retries_total")
        # After the load: prompts no replica has seen (cache_aware sends them to the replica with the smallest prefix
        # tree); counted by the router's per-worker counter, nothing else running.
        fresh_before = router.requests_per_worker().get(victim.url, 0)
        fresh = [f"# fresh prompt {i}\n{PROMPTS[i]}" for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda text: requests.post(
                f"{router.url}/generate", timeout=120,
                json={"text": text, "sampling_params": dict(client.params)}).status_code, fresh))
        fresh_to_restarted = router.requests_per_worker().get(victim.url, 0) - fresh_before
        summary = _summarise(client.outcomes)
        around_kill = [o for o in client.outcomes if o.sent <= kill_s <= o.done]
        return {
            "drill": "replica-kill",
            "policy": args.policy,
            "stream": args.stream,
            "health_check_interval_s": args.health_interval,
            "concurrency": args.concurrency,
            "max_new_tokens": args.max_new_tokens,
            "killed_at_s": round(kill_s, 2),
            "threads_busy_at_kill": in_flight_at_kill,
            "requests_in_flight_at_kill": len(around_kill),
            "in_flight_at_kill_failed": sum(1 for o in around_kill if o.status != 200),
            **summary,
            "router_retries_total": retries,
            "router_retries_after_kill": retries - retries_before,
            "unhealthy_after_s": round(unhealthy_s, 2),
            "restarted_healthy_after_s": round(healthy_again_s, 2),
            "router_healthy_again_after_s": round(rejoined_s, 2),
            "first_request_served_after_s": None if first_served_s is None else round(first_served_s, 2),
            "fresh_prompts_after_rejoin": len(fresh),
            "fresh_prompts_ok": sum(1 for status in statuses if status == 200),
            "fresh_prompts_to_restarted": fresh_to_restarted,
            "requests_per_worker": router.requests_per_worker(),
            "restart_startup_s": round(restarted.startup_seconds, 1),
        }
    finally:
        if client is not None:
            client.stop.set()
        if router is not None:
            router.stop()
        for server in [*replicas, *([restarted] if restarted else [])]:
            server.stop()


def scheduler_kill_drill(pair, args, log_dir: Path) -> dict:
    print("[drill] starting one DSPARK server", flush=True)
    server = start_server(pair[0], ["--dtype", "float32", *dspark_args(pair[1])], log_dir=log_dir,
                          max_total_tokens=args.max_total_tokens, timeout=400)
    try:
        client = LoadClient(server.url, 4, args.max_new_tokens, 16, timeout=120)
        threads = client.run()
        time.sleep(3)
        killed = kill_scheduler(server.process.pid)
        killed_at = time.monotonic()
        print(f"[drill] SIGKILL to scheduler pid {killed}", flush=True)
        try:
            code = server.process.wait(timeout=args.exit_timeout)
            exit_s = time.monotonic() - killed_at
        except Exception:
            code, exit_s = None, None
        client.stop.set()
        for thread in threads:
            thread.join(timeout=150)
        kill_s = killed_at - client.t0
        log = server.log_text()
        cause = [line for line in log.splitlines() if "crashed with exit code" in line or "SIGQUIT received" in line]
        in_flight = [o for o in client.outcomes if o.sent <= kill_s <= o.done]
        after = [o for o in client.outcomes if o.sent > kill_s]
        return {
            "drill": "scheduler-kill",
            "scheduler_pid": killed,
            "server_exit_code": code,
            "server_exit_after_s": None if exit_s is None else round(exit_s, 2),
            "log_lines": cause[:3],
            "hung_half_alive": code is None,
            "in_flight_at_kill": len(in_flight),
            "in_flight_failed": sum(1 for o in in_flight if o.status != 200),
            "in_flight_answered_after_s": round(max((o.done for o in in_flight), default=kill_s) - kill_s, 2),
            "in_flight_errors": sorted({o.error.split(":")[0] + ": " + o.error.split("(")[-1][:60]
                                        for o in in_flight if o.status != 200}),
            "sent_after_kill": len(after),
            "sent_after_kill_failed": sum(1 for o in after if o.status != 200),
        }
    finally:
        server.stop()


def markdown(results: list[dict]) -> str:
    rows = ["| fault | what a client sees | requests lost | recovery |", "| --- | --- | --- | --- |"]
    for r in results:
        if r["drill"] == "replica-kill":
            served = r["first_request_served_after_s"]
            rows.append(
                f"| kill -9 of one of 2 replicas under load ({r['policy']}, c = {r['concurrency']}"
                f"{', streamed' if r['stream'] else ''}) | "
                f"{r['failed']} of {r['requests']} requests failed; {r['requests_in_flight_at_kill']} in flight at "
                f"the kill, {r['router_retries_after_kill']:.0f} retries by the router | {r['failed']} | unhealthy "
                f"after {r['unhealthy_after_s']} s; restarted replica healthy after {r['restarted_healthy_after_s']} "
                f"s, back in the router after {r['router_healthy_again_after_s']} s; "
                f"{'no request of the recurring prompts within 60 s' if served is None else f'serving after {served} s'}"
                f", {r['fresh_prompts_to_restarted']:.0f} of {r['fresh_prompts_after_rejoin']} new prompts |")
        else:
            rows.append(
                f"| SIGKILL of the scheduler subprocess | the {r['in_flight_at_kill']} requests in flight: connection "
                f"closed after {r['in_flight_answered_after_s']} s; later ones: connection refused | "
                f"{r['in_flight_failed']} | the server exited (code {r['server_exit_code']}) after "
                f"{r['server_exit_after_s']} s: a restart policy restarts it |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drill", choices=["replica-kill", "scheduler-kill", "all"], default="all")
    parser.add_argument("--model-path", help="target (default: the tiny test pair, built offline)")
    parser.add_argument("--draft-model-path", help="DSpark draft for --model-path")
    parser.add_argument("--policy", default="cache_aware", choices=["cache_aware", "round_robin"])
    parser.add_argument("--health-interval", type=int, default=2, help="router health probe interval (s)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stream", action="store_true", help="streamed /generate requests (replica-kill)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=150, help="seconds of load (replica-kill)")
    parser.add_argument("--kill-at", type=float, default=10, help="seconds into the load (replica-kill)")
    parser.add_argument("--max-requests", type=int, default=5000, help="bound on requests sent (replica-kill)")
    parser.add_argument("--exit-timeout", type=float, default=60, help="seconds to wait for the server to exit")
    parser.add_argument("--max-total-tokens", type=int, default=4096)
    parser.add_argument("--log-dir")
    parser.add_argument("--output", help="write the results as JSON here")
    args = parser.parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sglang-dspark-drill-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.model_path:
        if not args.draft_model_path:
            parser.error("--model-path needs --draft-model-path")
        pair = (args.model_path, args.draft_model_path)
    else:
        from sglang_dspark.testing.tiny_pair import build_tiny_pair

        tiny = build_tiny_pair(log_dir / "tiny-pair")
        pair = (tiny.target_dir, tiny.draft_dir)
    results = []
    if args.drill in ("scheduler-kill", "all"):
        results.append(scheduler_kill_drill(pair, args, log_dir))
    if args.drill in ("replica-kill", "all"):
        results.append(replica_kill_drill(pair, args, log_dir))
    print(json.dumps(results, indent=1))
    print(markdown(results))
    print(f"[drill] logs in {log_dir}")
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
