"""Shared fixtures: the tiny model pair, and real SGLang servers on 127.0.0.1.

Servers: ``shared_server(model, args, env=..., max_total_tokens=...)`` hands out one server per launch configuration
for the whole session (``sglang_dspark/testing/server_pool.py``); ``launch`` starts a private one, for tests that
need a fresh server (start-up behaviour, caches, crashes). A failed test's report carries the log tails of the last
servers its file used (logs are kept in the run's temporary folder, or in $SGLANG_DSPARK_TEST_LOGS).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from sglang_dspark.testing.helpers import greedy_ids
from sglang_dspark.local_server import start_server
from sglang_dspark.testing.server_pool import ServerPool

# Servers handed to the tests of each file (private or shared, module fixtures included): a failed test's report
# carries their log tails.
_SERVERS_OF_FILE: dict[str, list] = {}
# fp32: SGLang's `--dtype auto` would run the fp32 tiny pair in half precision, where logit ties make greedy ids
# differ between the verify and decode paths.
FP32 = ("--dtype", "float32")
# Servers kept running at once by each test process's shared pool (a tiny-pair server holds ~1.5 GB in its three
# processes; idle ones sleep: --sleep-on-idle).
MAX_SHARED_SERVERS = 3
# pytest-xdist runs the suite in parallel test processes (pyproject.toml: -n 2, whole files per process). On a
# 2-core machine each process and every server it starts get one OpenMP thread: two processes that each spin two
# threads over two cores slow each other's every small operator, one thread each do not.
PARALLEL = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
if PARALLEL:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Server start-ups per test file (private and shared), printed at the end of the run.
_STARTS_PER_FILE: dict[str, int] = {}
_current_file = ["?"]


def _count_start() -> None:
    _STARTS_PER_FILE[_current_file[0]] = _STARTS_PER_FILE.get(_current_file[0], 0) + 1


def _used(server) -> None:
    servers = _SERVERS_OF_FILE.setdefault(_current_file[0], [])
    if server not in servers:
        servers.append(server)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current_file[0] = item.nodeid.split("::")[0]


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the counts to the controlling process
        workeroutput["server_starts"] = dict(_STARTS_PER_FILE)


# Files that share servers run in one test process, so each shared server starts once per run. (xdist's own
# `loadgroup` marks do not work with pytest 9.2: xdist 3.8 rewrites `item._nodeid`, which pytest no longer reads.)
SERVER_SHARING_FILES = {
    "tiny-dspark-default": ("tests/e2e/test_e2e_admission.py", "tests/e2e/test_e2e_dspark.py",
                            "tests/e2e/test_e2e_input_guard.py", "tests/e2e/test_e2e_loadtest.py",
                            "tests/e2e/test_e2e_router.py"),
    "tiny-draft-gate": ("tests/e2e/test_e2e_draft_gate.py", "tests/e2e/test_e2e_penalties.py"),
}
_GROUP_OF_FILE = {path: group for group, paths in SERVER_SHARING_FILES.items() for path in paths}


def scheduling_unit(nodeid: str) -> str:
    """What one test process takes whole: a file, or the group of files that share its servers."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF_FILE.get(path, path)


class _XdistHooks:
    """xdist's hooks (registered only where xdist is loaded: pytest refuses unknown hooks)."""

    @staticmethod
    def pytest_testnodedown(node, error):
        for path, count in getattr(node, "workeroutput", {}).get("server_starts", {}).items():
            _STARTS_PER_FILE[path] = _STARTS_PER_FILE.get(path, 0) + count

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class FileGroupScheduling(LoadScopeScheduling):
            """``--dist loadfile`` with the server-sharing files kept together (collection order kept:
            ``--no-loadscope-reorder``)."""

            def _split_scope(self, nodeid: str) -> str:
                return scheduling_unit(nodeid)

        return FileGroupScheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks())


def pytest_terminal_summary(terminalreporter):
    if _STARTS_PER_FILE:
        total = sum(_STARTS_PER_FILE.values())
        terminalreporter.write_sep("-", f"SGLang server start-ups: {total}")
        for path, count in sorted(_STARTS_PER_FILE.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:3d}  {path}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in _SERVERS_OF_FILE.get(item.nodeid.split("::")[0], [])[-3:]:
            report.sections.append((f"server log {server.log_path} (last 80 lines)", server.log_tail(80)))


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Servers started by the tests cache SPS tables in a temporary folder, never in the user's home."""
    previous = os.environ.get("SGLANG_DSPARK_CACHE")
    os.environ["SGLANG_DSPARK_CACHE"] = str(tmp_path_factory.mktemp("sglang-dspark-cache"))
    yield Path(os.environ["SGLANG_DSPARK_CACHE"])
    if previous is None:
        os.environ.pop("SGLANG_DSPARK_CACHE", None)
    else:
        os.environ["SGLANG_DSPARK_CACHE"] = previous


def _run_root(tmp_path_factory) -> Path:
    """A folder every test process of this run shares (xdist's workers each have their own base folder below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if PARALLEL else base


@contextlib.contextmanager
def _run_lock(tmp_path_factory, name: str):
    """One test process at a time, across the run's parallel processes."""
    from filelock import FileLock

    with FileLock(str(_run_root(tmp_path_factory) / f"{name}.lock")):
        yield


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Built once per run (the builder reuses a folder whose stamp matches: the second process finds it)."""
    from sglang_dspark.testing.tiny_pair import build_tiny_pair

    with _run_lock(tmp_path_factory, "tiny-pair"):
        return build_tiny_pair(_run_root(tmp_path_factory) / "tiny-pair")


@pytest.fixture(scope="session")
def tiny_eagle(tiny_pair, tmp_path_factory):
    from sglang_dspark.testing.tiny_eagle import build_tiny_eagle

    with _run_lock(tmp_path_factory, "tiny-eagle"):
        return build_tiny_eagle(tiny_pair.target_dir, Path(tiny_pair.target_dir).parent / "eagle")


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    keep = os.environ.get("SGLANG_DSPARK_TEST_LOGS")
    return Path(keep) if keep else tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def launch(server_logs):
    """``with launch(model, args, env=...) as server:`` — starts a private server (fp32 unless ``fp32=False``) and
    always stops it by PID."""

    @contextlib.contextmanager
    def _launch(model_path, extra_args=(), env=None, fp32=True, **kwargs):
        _count_start()
        args = [*FP32, *extra_args] if fp32 else list(extra_args)
        server = start_server(model_path, args, env=env, log_dir=server_logs, **kwargs)
        _used(server)
        try:
            yield server
        finally:
            server.stop()

    return _launch


@pytest.fixture(scope="session")
def shared_server(server_logs):
    """``shared_server(model, args=(), env=None, max_total_tokens=4096, timeout=240)``: the session's running server
    for that launch (fp32, like ``launch``), started on first use."""

    def start(key, timeout):
        _count_start()
        return start_server(key.model_path, [*FP32, *key.args], env=dict(key.env), log_dir=server_logs,
                            max_total_tokens=key.max_total_tokens, timeout=timeout)

    pool = ServerPool(start, max_alive=MAX_SHARED_SERVERS)

    def _server(model_path, args=(), env=None, max_total_tokens=4096, timeout=240):
        server = pool.server(model_path, args, env, max_total_tokens, timeout)
        _used(server)
        return server

    yield _server
    print(f"\n[shared servers] {pool.starts} started, {pool.reuses} reuses")
    pool.close()


@pytest.fixture(scope="session")
def nospec_reference(tiny_pair, shared_server, tmp_path_factory):
    """Greedy ids of the non-speculative server (with the plugin installed), batch of 1 and 8 concurrent. Measured
    once per run: a parallel test process reads the first one's ids (same pair, same launch, same threads)."""
    import json

    with _run_lock(tmp_path_factory, "nospec-reference"):
        saved = _run_root(tmp_path_factory) / "nospec-reference.json"
        if saved.is_file():
            return json.loads(saved.read_text())
        server = shared_server(tiny_pair.target_dir)
        reference = {"bs1": greedy_ids(server), "bs8": greedy_ids(server, concurrency=8)}
        saved.write_text(json.dumps(reference))
        return reference
