"""A patch's install step, run at most once per process.

Every patch module registers hooks (or re-classes something) from ``plugin.register`` and may be asked again (the
launcher decides twice, a test calls it, another plugin entry point runs): the hooks must never stack. Decorate the
module's ``install`` / ``apply``: the first call that returns runs it, every later call returns that first result
without running it; a call that raises leaves it not run (the next call tries again).
"""

from __future__ import annotations

import functools
from typing import Any, Callable


def install_once(install: Callable[[], Any]) -> Callable[[], Any]:
    """``install`` wrapped (module docstring); ``.ran()`` says whether it completed, ``.result()`` what it returned
    (None before), ``.forget()`` lets it run again (tests that install into a fresh state)."""
    state: dict[str, Any] = {}

    @functools.wraps(install)
    def once():
        if "result" not in state:
            state["result"] = install()
        return state["result"]

    once.ran = lambda: "result" in state
    once.result = lambda: state.get("result")
    once.forget = state.clear
    return once


__all__ = ["install_once"]
