"""Shared fixtures: the tiny model pair, and real SGLang servers on 127.0.0.1 (one at a time: 2 cores)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from sglang_dspark.testing.helpers import greedy_ids
from sglang_dspark.testing.server import start_server

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


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    from sglang_dspark.testing.tiny_pair import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def tiny_eagle(tiny_pair):
    from sglang_dspark.testing.tiny_eagle import build_tiny_eagle

    return build_tiny_eagle(tiny_pair.target_dir, Path(tiny_pair.target_dir).parent / "eagle")


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    keep = os.environ.get("SGLANG_DSPARK_TEST_LOGS")
    return Path(keep) if keep else tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def launch(server_logs):
    """``with launch(model, args, env=...) as server:`` — starts a server and always stops it by PID."""

    @contextlib.contextmanager
    def _launch(model_path, extra_args=(), env=None, **kwargs):
        # fp32: SGLang's `--dtype auto` would run the fp32 tiny pair in half precision, where logit ties make
        # greedy ids differ between the verify and decode paths.
        args = ["--dtype", "float32", *extra_args]
        server = start_server(model_path, args, env=env, log_dir=server_logs, **kwargs)
        try:
            yield server
        finally:
            server.stop()

    return _launch


@pytest.fixture(scope="session")
def nospec_reference(tiny_pair, launch):
    """Greedy ids of the non-speculative server (with the plugin installed), batch of 1 and 8 concurrent."""
    with launch(tiny_pair.target_dir) as server:
        return {
            "bs1": greedy_ids(server),
            "bs8": greedy_ids(server, concurrency=8),
            "startup_seconds": server.startup_seconds,
        }
