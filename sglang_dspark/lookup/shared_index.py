"""A bounded, per-server suffix cache: recent finished requests' tokens (prompt + output), shared as lookup material.

A request's own context (``index.ContextIndex``) cannot predict what it has not seen: the opening of an answer, the
phrasing every answer to a task shares, the output another request already produced for the same passage.
:class:`SharedIndex` keeps what finished requests held, each joined to the last by a separator token that no tail
contains (so no n-gram spans two requests and no continuation runs into the next), in one windowed ``ContextIndex``:
the window is the memory bound (the oldest requests' tokens leave first: FIFO by finishing time), indexing is budgeted
per call like a long prompt's, and a proposal is the continuation of the longest suffix of the asking request's tail
that occurs here (latest occurrence).

Scopes (:class:`SharedIndices`): requests share material only with requests of the same scope key (the operator's
switch, ``SGLANG_DSPARK_SHARED_LOOKUP``: ``off``; ``key``: SGLang's own cache namespace, a request's ``extra_key``
(LoRA included) and ``cache_salt``, the fields its radix cache isolates prefixes by; ``server``: one scope). All scopes
together hold at most ``shared_capacity_tokens`` tokens: the least recently used scope is dropped whole when a new
request would pass it.

Exact by construction: a shared proposal is a point-mass proposal like an own-context one, and the verify accepts a
token only under the standard acceptance rule, so another request's text reaches a response only where the target
itself produces it. What the cache does tell is timing: a request that repeats another's text is verified in longer
chains and finishes sooner (docs/lookup.md, "The shared suffix cache").
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Optional, Sequence

from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.lookup.index import ContextIndex, LookupProposal

SEPARATOR = -1  # joins two requests' tokens; never a token id, so never in a tail

__all__ = ["SEPARATOR", "SharedIndex", "SharedIndices"]


class SharedIndex:
    """One scope's cache: at most ``capacity`` tokens (the window), indexed within the budget each call gives."""

    def __init__(self, capacity: int, config: LookupConfig = DEFAULT) -> None:
        if capacity <= config.max_ngram:
            raise ValueError(f"SharedIndex: need capacity > max_ngram, got {capacity}, {config.max_ngram}")
        self.capacity = capacity
        self._index = ContextIndex(min_ngram=config.min_ngram, max_ngram=config.max_ngram, window=capacity)
        self.requests = 0  # requests added

    def __len__(self) -> int:
        """Tokens held (at most the capacity)."""
        return min(len(self._index), self.capacity)

    @property
    def entries(self) -> int:
        return self._index.entries

    @property
    def pending(self) -> int:
        return self._index.pending

    def add(self, tokens: Sequence[int]) -> None:
        """A finished request's tokens (its last ``capacity - 1`` at most), stored; indexed by :meth:`catch_up`."""
        if not tokens:
            return
        self._index.append([SEPARATOR, *tokens[max(0, len(tokens) - self.capacity + 1):]])
        self.requests += 1

    def catch_up(self, budget: Optional[int] = None) -> int:
        return self._index.catch_up(budget)

    def propose(self, tail: Sequence[int], max_tokens: int) -> Optional[LookupProposal]:
        """The continuation of the longest suffix of ``tail`` held here (never across two requests)."""
        return self._index.continuation(tail, max_tokens, stop=SEPARATOR)


class SharedIndices:
    """The scopes' caches (module docstring): one :class:`SharedIndex` per scope key, all within ``capacity`` tokens
    (``config.shared_capacity_tokens``) and ``config.shared_max_scopes`` scopes, least recently used dropped first;
    ``catch_up`` spends one call's budget (``config.shared_tokens_per_call``) over the scopes with pending tokens, most
    recently used first."""

    def __init__(self, config: LookupConfig = DEFAULT) -> None:
        self.config = config
        self.capacity = config.shared_capacity_tokens
        self._scopes: OrderedDict[Hashable, SharedIndex] = OrderedDict()
        self.evicted_scopes = 0

    def __len__(self) -> int:
        """Tokens held over all scopes."""
        return sum(len(index) for index in self._scopes.values())

    @property
    def scopes(self) -> int:
        return len(self._scopes)

    @property
    def entries(self) -> int:
        """n-grams mapped over all scopes (each about 110 B with its key, besides the token lists)."""
        return sum(index.entries for index in self._scopes.values())

    @property
    def requests(self) -> int:
        return sum(index.requests for index in self._scopes.values())

    def add(self, scope: Hashable, tokens: Sequence[int]) -> None:
        """A finished request's tokens into its scope's cache; older scopes dropped whole past the capacity."""
        index = self._scopes.get(scope)
        if index is None:
            index = self._scopes[scope] = SharedIndex(self.capacity, self.config)
        self._scopes.move_to_end(scope)
        index.add(tokens)
        while len(self._scopes) > 1 and (len(self) > self.capacity
                                         or len(self._scopes) > self.config.shared_max_scopes):
            self._scopes.popitem(last=False)
            self.evicted_scopes += 1

    def catch_up(self) -> int:
        """Index pending tokens within one call's budget; returns how many were done."""
        left = self.config.shared_tokens_per_call
        for index in reversed(self._scopes.values()):
            if left <= 0:
                break
            left -= index.catch_up(left)
        return self.config.shared_tokens_per_call - max(0, left)

    def propose(self, scope: Hashable, tail: Sequence[int], max_tokens: int) -> Optional[LookupProposal]:
        index = self._scopes.get(scope)
        if index is None:
            return None
        self._scopes.move_to_end(scope)
        return index.propose(tail, max_tokens)
