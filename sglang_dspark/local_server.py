"""Start and stop a stock ``python -m sglang.launch_server`` on 127.0.0.1 (demo, tests, benchmarks).

Only loopback is ever used. The server runs in its own process group and is stopped by PID (SIGTERM to the
group, then SIGKILL), so its scheduler and detokenizer go with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

HOST = "127.0.0.1"

# Flags every CPU server gets: SGLang sizes its KV cache from RAM without --max-total-tokens, and an
# idle scheduler spins a core at 100 % without --sleep-on-idle (on 2 cores that slows everything else).
CPU_BASE_ARGS = (
    "--device", "cpu",
    "--attention-backend", "intel_amx",
    "--cuda-graph-backend-decode", "disabled",
    "--sleep-on-idle",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def stop_process_group(process: subprocess.Popen, timeout: float) -> None:
    """Stop a process started in its own group (``start_new_session``) by its PID: SIGTERM to the group, SIGKILL after
    ``timeout`` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)


@dataclass
class SGLangServer:
    """A running SGLang HTTP server started by :func:`start_server`."""

    process: subprocess.Popen
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)
    startup_seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def generate(self, text: str | None = None, sampling_params: dict | None = None, timeout: float = 300, **extra) -> dict:
        body: dict[str, Any] = {"sampling_params": sampling_params or {}}
        if text is not None:
            body["text"] = text
        body.update(extra)
        response = requests.post(f"{self.url}/generate", json=body, timeout=timeout)
        response.raise_for_status()
        return response.json()

    def get(self, path: str, timeout: float = 30) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20) -> None:
        stop_process_group(self.process, timeout)

    def __enter__(self) -> "SGLangServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerStartError(RuntimeError):
    pass


# uvicorn's bind error. The port we picked was free when we picked it, but another server starting beside this one
# (pytest-xdist, the load test's pool) can take it before SGLang binds: SGLang then logs this and hangs in shutdown
# instead of exiting, so the launcher reads the log and retries on a fresh port rather than waiting out the timeout.
PORT_TAKEN_MARK = "address already in use"
START_ATTEMPTS = 3


class _PortTaken(Exception):
    pass


def start_server(
    model_path: str | Path,
    extra_args: list[str] | tuple[str, ...] = (),
    *,
    env: dict[str, str] | None = None,
    max_total_tokens: int = 4096,
    cpu: bool = True,
    timeout: float = 240,
    log_dir: str | Path | None = None,
    python: str = sys.executable,
) -> SGLangServer:
    """Launch ``python -m sglang.launch_server`` (the stock launcher) and wait for ``/health``.

    Runs from a temporary working directory, so a repository checkout never shadows installed packages. A port
    taken between picking it and SGLang binding it is retried on a fresh port, up to ``START_ATTEMPTS`` launches.
    """
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="sglang-dspark-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    process_env = dict(os.environ)
    process_env.update(env or {})
    process_env.setdefault("PYTHONUNBUFFERED", "1")
    taken: list[int] = []
    for _ in range(START_ATTEMPTS):
        port = free_port()
        args = [
            "--model-path", str(model_path),
            "--host", HOST,
            "--port", str(port),
            "--max-total-tokens", str(max_total_tokens),
            *(CPU_BASE_ARGS if cpu else ()),
            *extra_args,
        ]
        try:
            return _launch(args, port, log_dir, process_env, timeout, python)
        except _PortTaken:
            taken.append(port)
    raise ServerStartError(
        f"SGLang could not bind its HTTP port: ports {taken} were each taken before it started (another process on "
        f"this machine is claiming ports quickly). Stop it or run fewer servers at once, then retry."
    )


def _launch(args: list[str], port: int, log_dir: Path, env: dict[str, str], timeout: float,
            python: str) -> SGLangServer:
    log_path = log_dir / f"server-{port}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [python, "-m", "sglang.launch_server", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(log_dir),
            start_new_session=True,
        )
    server = SGLangServer(process=process, port=port, log_path=log_path, args=args)
    deadline = started + timeout
    try:
        while time.monotonic() < deadline:
            if PORT_TAKEN_MARK in server.log_text():  # exited or hung: either way another port is the cure
                server.stop()
                raise _PortTaken()
            if process.poll() is not None:
                raise ServerStartError(
                    f"SGLang server exited with code {process.returncode} during start-up "
                    f"(args: {' '.join(args)}).\n--- log tail ---\n{server.log_tail()}"
                )
            try:
                if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                    server.startup_seconds = time.monotonic() - started
                    return server
            except requests.RequestException:
                pass
            time.sleep(0.5)
    except BaseException:  # Ctrl-C / SIGTERM during start-up: the half-started server goes too
        server.stop()
        raise
    server.stop()
    raise ServerStartError(f"SGLang server not healthy after {timeout:.0f} s.\n--- log tail ---\n{server.log_tail()}")


def chat(server: SGLangServer, messages: list[dict], stream: bool = False, timeout: float = 300, **params) -> Any:
    """POST /v1/chat/completions; with stream=True returns the list of decoded SSE chunks."""
    body = {"model": "default", "messages": messages, "stream": stream, **params}
    response = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout, stream=stream)
    response.raise_for_status()
    if not stream:
        return response.json()
    return [json.loads(payload) for payload in sse_payloads(response)]


def sse_payloads(response: requests.Response):
    """The ``data:`` payloads of a streamed SGLang/OpenAI response, as text, up to ``[DONE]``."""
    for line in response.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        yield payload
