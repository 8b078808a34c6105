"""Start and stop SGLang's router (the SGLang Model Gateway, PyPI ``sglang-router``) on 127.0.0.1 in front of
running SGLang servers, for tests, the fault drill and measurements.

``start_router(worker_urls, policy=...)`` runs ``python -m sglang_router.launch_router`` (a Rust binary in the
wheel) bound to 127.0.0.1 only, its Prometheus exporter on 127.0.0.1 too (the router's defaults are 0.0.0.0), in
its own process group, and returns once every worker is registered and healthy. ``Router.stop()`` stops it by PID
(SIGTERM to the group, then SIGKILL).

What a caller reads from a running router:

* ``workers()``: ``GET /workers``, the router's view of each worker (``url``, ``is_healthy``, ``load``);
* ``requests_per_worker()``: from the router's Prometheus text, the requests each worker completed successfully
  (``smg_worker_cb_outcomes_total{outcome="success"}``, the circuit breaker's counter: one per proxied request that
  the worker answered) — the router's own count of who served what;
* ``metric_total(name)``: the sum of one Prometheus counter over its labels.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import requests

from sglang_dspark.local_server import HOST, free_port, stop_process_group

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class RouterStartError(RuntimeError):
    pass


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` for every sample line of a Prometheus text exposition (comments skipped)."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


@dataclass
class Router:
    process: subprocess.Popen
    port: int
    metrics_port: int
    log_path: Path
    worker_urls: list[str] = field(default_factory=list)
    policy: str = "cache_aware"
    startup_seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def workers(self, timeout: float = 10) -> list[dict]:
        return requests.get(f"{self.url}/workers", timeout=timeout).json()["workers"]

    def healthy_urls(self, timeout: float = 10) -> set[str]:
        return {w["url"] for w in self.workers(timeout) if w.get("is_healthy")}

    def metrics(self, timeout: float = 10) -> list[tuple[str, dict[str, str], float]]:
        return parse_prometheus(requests.get(self.metrics_url, timeout=timeout).text)

    def metric_total(self, name: str, **labels: str) -> float:
        return sum(v for n, ls, v in self.metrics() if n == name and all(ls.get(k) == x for k, x in labels.items()))

    def requests_per_worker(self) -> dict[str, float]:
        counts = {url: 0.0 for url in self.worker_urls}
        for name, labels, value in self.metrics():
            if name == "smg_worker_cb_outcomes_total" and labels.get("outcome") == "success":
                counts[labels.get("worker", "?")] = counts.get(labels.get("worker", "?"), 0.0) + value
        return counts

    def wait_until(self, predicate, timeout: float, interval: float = 0.25) -> float:
        """Seconds until ``predicate(self)`` held (polled); raises ``TimeoutError`` after ``timeout``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if predicate(self):
                    return time.monotonic() - started
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(interval)
        raise TimeoutError(f"router condition not met in {timeout:.0f} s\n--- router log tail ---\n{self.log_tail()}")

    def stop(self, timeout: float = 15) -> None:
        stop_process_group(self.process, timeout)

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_router(
    worker_urls: Sequence[str],
    policy: str = "cache_aware",
    *,
    health_check_interval: float = 2,
    health_failure_threshold: int = 3,
    log_level: str = "warn",
    extra_args: Sequence[str] = (),
    log_dir: str | Path | None = None,
    timeout: float = 60,
    python: str = sys.executable,
) -> Router:
    """Launch the router on a free loopback port in front of ``worker_urls`` (each must be a loopback URL) and wait
    until ``/workers`` lists all of them healthy. ``health_check_interval`` seconds between the router's ``GET
    /health`` probes of each worker; ``health_failure_threshold`` failed probes in a row mark a worker unhealthy;
    ``log_level`` warn keeps the log to failures (info logs every request).
    Raises ``RouterStartError`` if the router exits or the workers are not all healthy within ``timeout`` s."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    for url in worker_urls:
        if not url.startswith((f"http://{HOST}:", "http://localhost:")):
            raise ValueError(f"only loopback workers are routed to here, got {url!r}")
    try:
        import sglang_router  # noqa: F401
    except ImportError as error:
        raise RouterStartError(
            "sglang-router is not installed: `scripts/install.sh cpu --dev` installs it (requirements/dev.txt)"
        ) from error
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="sglang-dspark-router-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    args = [
        "--host", HOST, "--port", str(port),
        "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--health-check-interval-secs", str(int(health_check_interval)),
        "--health-failure-threshold", str(health_failure_threshold),
        "--shutdown-grace-period-secs", "5",
        "--log-level", log_level,
        *extra_args,
    ]
    log_path = log_dir / f"router-{port}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [python, "-m", "sglang_router.launch_router", *args],
            stdout=log_file, stderr=subprocess.STDOUT, cwd=str(log_dir), start_new_session=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
    router = Router(process=process, port=port, metrics_port=metrics_port, log_path=log_path,
                    worker_urls=list(worker_urls), policy=policy)
    try:
        while time.monotonic() - started < timeout:
            if process.poll() is not None:
                raise RouterStartError(f"router exited with code {process.returncode} during start-up\n"
                                       f"--- log tail ---\n{router.log_tail()}")
            try:
                if router.healthy_urls(timeout=2) >= set(worker_urls):
                    router.startup_seconds = time.monotonic() - started
                    return router
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.25)
    except BaseException:
        router.stop()
        raise
    router.stop()
    raise RouterStartError(f"router's workers not all healthy after {timeout:.0f} s\n--- log tail ---\n"
                           f"{router.log_tail()}")
