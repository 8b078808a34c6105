"""Shared fixtures: the tiny model pair, and real SGLang servers on 127.0.0.1 (one at a time: 2 cores)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from pathlib import Path

import pytest

from sglang_dspark.server_process import SGLangServer, start_server

# Twenty prompts, code-like (the tiny tokenizer is trained on Python source).
PROMPTS = [
    "def main():",
    "import os\nimport sys\n",
    "class Parser(object):\n    def __init__(self",
    "for i in range(10):",
    "    return self.",
    "if __name__ == '__main__':",
    "try:\n    import",
    "def __repr__(self):\n        return",
    "# Copyright",
    "raise ValueError(",
    "with open(path) as f:",
    "lambda x:",
    "while True:\n    line =",
    "\"\"\"Return the",
    "self.assertEqual(",
    "except KeyError:",
    "@property\ndef name(self):",
    "from collections import",
    "async def fetch(",
    "print(f\"{",
]
MAX_NEW_TOKENS = 64
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}


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
    from sglang_dspark.models.tiny_pair import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def tiny_eagle(tiny_pair):
    from sglang_dspark.models.tiny_eagle import build_tiny_eagle

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


def greedy_ids(server: SGLangServer, prompts=PROMPTS, concurrency: int = 1, params=GREEDY) -> list[list[int]]:
    """Output token ids per prompt, sent one at a time or `concurrency` at once."""

    def one(prompt):
        return server.generate(prompt, dict(params))

    if concurrency == 1:
        results = [one(p) for p in prompts]
    else:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, prompts))
    return [r["output_ids"] for r in results]


def generate_all(server: SGLangServer, prompts, params, concurrency: int = 1) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: server.generate(p, dict(params)), prompts))


@pytest.fixture(scope="session")
def nospec_reference(tiny_pair, launch):
    """Greedy ids of the non-speculative server (with the plugin installed), batch of 1 and 8 concurrent."""
    with launch(tiny_pair.target_dir) as server:
        return {
            "bs1": greedy_ids(server),
            "bs8": greedy_ids(server, concurrency=8),
            "startup_seconds": server.startup_seconds,
        }
