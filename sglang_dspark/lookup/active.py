"""The prompt lookup of this process's DSPARK worker, which the scheduler-side patch asks
(``patches/lookup_current_tokens.py``): SGLang's scheduler loop and the worker share a process but no object through
which one could reach the other. The worker's ``LookupSource`` registers itself (None: lookup off)."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence


class CurrentTokensOracle(Protocol):
    def needs_current_tokens(self, reqs: Sequence) -> bool:
        """Whether a decode batch of these SGLang requests should run on current tokens (no overlap)."""


_active: Optional[CurrentTokensOracle] = None


def set_active_lookup(lookup: Optional[CurrentTokensOracle]) -> None:
    global _active
    _active = lookup


def active_lookup() -> Optional[CurrentTokensOracle]:
    return _active


__all__ = ["CurrentTokensOracle", "active_lookup", "set_active_lookup"]
