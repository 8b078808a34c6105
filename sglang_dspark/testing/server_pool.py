"""Servers shared by the tests: one per launch configuration, started on first use, stopped when the pool closes.

A server start is slow (docs/testing.md), so tests that need the same launch (model, arguments,
environment, KV size) ask the pool instead of starting their own. The key is the whole launch: two tests share a
server only when a user could not tell their launches apart. A test that needs a server of its own (start-up
behaviour, a cache it must find empty, a crash) uses the ``launch`` fixture and says why.

Sharing means a test meets a server that already served other tests: tests that read lifetime counters of
``/server_info`` difference two snapshots (``loadtest.engine.admission_delta``), and every server keeps its whole
log, so a test that reads the log sees the traffic before it too.

At most ``max_alive`` servers run at once (least recently used stopped first: idle servers sleep, but each holds
its memory); a server that died is started again on its next request, and the death stays in its log.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence


class PoolServer(Protocol):
    def alive(self) -> bool: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class LaunchKey:
    """Everything that makes two launches differ (a start timeout does not)."""

    model_path: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    max_total_tokens: int

    @classmethod
    def of(cls, model_path, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
           max_total_tokens: int = 4096) -> "LaunchKey":
        return cls(str(Path(model_path)), tuple(str(a) for a in args), tuple(sorted((env or {}).items())),
                   int(max_total_tokens))


StartFn = Callable[[LaunchKey, float], PoolServer]


class ServerPool:
    def __init__(self, start: StartFn, max_alive: int = 4):
        if max_alive < 1:
            raise ValueError(f"max_alive must be at least 1, got {max_alive}")
        self._start = start
        self._max_alive = max_alive
        self._servers: OrderedDict[LaunchKey, PoolServer] = OrderedDict()
        self.starts = 0
        self.reuses = 0

    def server(self, model_path, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
               max_total_tokens: int = 4096, timeout: float = 240) -> PoolServer:
        key = LaunchKey.of(model_path, args, env, max_total_tokens)
        server = self._servers.get(key)
        if server is not None and server.alive():
            self._servers.move_to_end(key)
            self.reuses += 1
            return server
        if server is not None:  # died: its log holds why; a fresh one serves the next test
            self._servers.pop(key)
            server.stop()
        while len(self._servers) >= self._max_alive:
            _, oldest = self._servers.popitem(last=False)
            oldest.stop()
        server = self._start(key, timeout)
        self.starts += 1
        self._servers[key] = server
        return server

    def alive_keys(self) -> list[LaunchKey]:
        return list(self._servers)

    def close(self) -> None:
        while self._servers:
            _, server = self._servers.popitem(last=False)
            server.stop()
