"""The launcher tests and benchmarks start SGLang servers through: stopping half-started servers, retrying a port
another process took first. A fake ``python`` stands in for SGLang so these run in seconds."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sglang_dspark import local_server as server_module

# Stands in for ``python -m sglang.launch_server``: the first launch logs uvicorn's bind error and then hangs (as
# SGLang does when its port was taken), later launches answer /health on their --port.
FAKE_SGLANG = textwrap.dedent("""\
    #!{python}
    import http.server, pathlib, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    launches = pathlib.Path("{launches}")
    launches.write_text(launches.read_text() + f"{{port}}\\n" if launches.exists() else f"{{port}}\\n")
    if len(launches.read_text().split()) <= {taken_launches}:
        print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {{port}}): "
              "address already in use", flush=True)
        time.sleep(120)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def fake_sglang(tmp_path, taken_launches: int):
    launches = tmp_path / "launches"
    script = tmp_path / "python"
    script.write_text(FAKE_SGLANG.format(python=sys.executable, launches=launches, taken_launches=taken_launches))
    script.chmod(0o755)
    return script, launches


def recording_popen(monkeypatch) -> list[subprocess.Popen]:
    started: list[subprocess.Popen] = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(server_module.subprocess, "Popen", RecordingPopen)
    return started


def test_a_port_taken_before_sglang_binds_it_is_retried_on_a_fresh_port(monkeypatch, tmp_path):
    """SGLang logs the bind error and hangs instead of exiting: the launcher must see it in the log, stop that
    server, and start again on another port well inside the health timeout (it used to wait all of it, then fail)."""
    script, launches = fake_sglang(tmp_path, taken_launches=1)
    started = recording_popen(monkeypatch)
    server = server_module.start_server("model", python=str(script), log_dir=tmp_path, timeout=60)
    try:
        first, second = (int(port) for port in launches.read_text().split())
        assert server.port == second != first
        assert started[0].poll() is not None  # the hung launch was stopped by PID
        assert server.alive() and server.startup_seconds < 30
    finally:
        server.stop()


def test_a_port_taken_at_every_attempt_fails_with_an_error_that_says_so(monkeypatch, tmp_path):
    script, launches = fake_sglang(tmp_path, taken_launches=server_module.START_ATTEMPTS)
    started = recording_popen(monkeypatch)
    with pytest.raises(server_module.ServerStartError, match="could not bind its HTTP port"):
        server_module.start_server("model", python=str(script), log_dir=tmp_path, timeout=60)
    assert len(launches.read_text().split()) == server_module.START_ATTEMPTS
    assert all(process.poll() is not None for process in started)


def test_interrupt_during_server_start_stops_the_half_started_server(monkeypatch, tmp_path):
    """Ctrl-C / SIGTERM while a launched server starts (the load test's longest wait) leaves no server behind."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\nexec sleep 120\n")
    fake_python.chmod(0o755)
    started = recording_popen(monkeypatch)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(server_module.requests, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server_module.start_server("model", python=str(fake_python), log_dir=tmp_path, timeout=30)
    (process,) = started
    assert process.poll() is not None  # stopped by PID, not left running
