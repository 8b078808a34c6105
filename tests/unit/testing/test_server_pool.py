"""The tests' shared server pool (sglang_dspark/testing/server_pool.py): one server per launch, reused, bounded."""

from __future__ import annotations

import pytest

from sglang_dspark.testing.server_pool import LaunchKey, ServerPool


class FakeServer:
    def __init__(self, key):
        self.key = key
        self.running = True
        self.stops = 0

    def alive(self) -> bool:
        return self.running

    def stop(self) -> None:
        self.running = False
        self.stops += 1


@pytest.fixture
def started():
    return []


@pytest.fixture
def pool(started):
    def start(key, timeout):
        server = FakeServer(key)
        started.append((server, timeout))
        return server

    return ServerPool(start, max_alive=2)


def test_same_launch_is_one_server(pool, started):
    a = pool.server("/m", ["--x", "1"], {"A": "1", "B": "2"})
    b = pool.server("/m/", ("--x", "1"), {"B": "2", "A": "1"}, timeout=999)  # same launch, other spelling
    assert a is b and len(started) == 1 and (pool.starts, pool.reuses) == (1, 1)


@pytest.mark.parametrize("other", [
    dict(model_path="/n"),
    dict(args=["--x", "2"]),
    dict(args=["--x", "1", "--y"]),
    dict(env={"A": "1"}),
    dict(env={"A": "1", "B": "3"}),
    dict(max_total_tokens=2048),
])
def test_any_launch_difference_is_another_server(pool, other):
    base = dict(model_path="/m", args=["--x", "1"], env={"A": "1", "B": "2"}, max_total_tokens=4096)
    assert pool.server(**base) is not pool.server(**{**base, **other})
    assert pool.starts == 2


def test_least_recently_used_server_is_stopped_beyond_the_bound(pool):
    a, b = pool.server("/a"), pool.server("/b")
    assert pool.server("/a") is a  # a is now the most recently used
    c = pool.server("/c")
    assert not b.alive() and a.alive() and c.alive()
    assert pool.alive_keys() == [LaunchKey.of("/a"), LaunchKey.of("/c")]


def test_a_dead_server_is_replaced_and_stopped(pool, started):
    a = pool.server("/a", timeout=30)
    a.running = False  # crashed
    fresh = pool.server("/a", timeout=45)
    assert fresh is not a and fresh.alive() and a.stops == 1
    assert [timeout for _, timeout in started] == [30, 45]


def test_close_stops_every_server(pool):
    servers = [pool.server("/a"), pool.server("/b")]
    pool.close()
    assert not any(s.alive() for s in servers) and pool.alive_keys() == []


def test_bound_must_hold_one_server():
    with pytest.raises(ValueError, match="max_alive"):
        ServerPool(lambda key, timeout: FakeServer(key), max_alive=0)
