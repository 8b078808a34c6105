"""The lookup indices of the running requests, and one step's proposals for a batch (pure Python/torch).

A request's index (``index.ContextIndex``) is built from its prompt, starting at its first decode step, and extended
by the tokens committed since on every later one; a finished request's index is dropped when a batch no longer lists it
(:meth:`LookupBook.retain`), so memory is bounded by the running requests' contexts, each cut to the window of
``config.IndexLimits``. A request whose token list is shorter than what was indexed (a retraction that dropped
outputs) is re-indexed from scratch.

Indexing is budgeted per call (:meth:`LookupBook.propose`, :meth:`LookupBook.any_match`; a decode step makes at most
one of each). A request with at most ``keep_up_tokens`` pending (a step's commits, and the tokens they pushed out of
the window) is always brought up to date, as before; the others (a long new prompt) share ``tokens_per_call`` tokens
per call, fewest pending first, so a long prompt is indexed over several steps and no step pays for all of it. A
request that has not caught up gets no proposal and counts as no match.

With a shared suffix cache (``shared_index.SharedIndices``), a request whose index the book drops hands its tokens
to the cache under its scope key, and a row whose own context has no recurring tail gets the cache's proposal,
tagged :data:`~sglang_dspark.lookup.calibration.SHARED` (its own calibration bucket). A row with a proposal of its
own keeps it, even where the cache matches a longer tail: another request's text predicts a row's continuation worse
than the row's own context does (another user's sampled answer above all), and a weaker chain in its place is one
the chooser declines, so the row loses the chain it had.

Proposals are read from the tokens the scheduler holds on the host: they are current on a step that runs after the
previous result was processed (``patches/lookup_current_tokens.py``); where they are not, a proposal may be off by a
step and is rejected by the verify, never accepted wrongly (the verify checks every proposed token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Iterator, Optional, Sequence

import torch

from sglang_dspark.lookup.calibration import OWN, SHARED
from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.lookup.index import ContextIndex, LookupProposal
from sglang_dspark.lookup.shared_index import SharedIndices

# A request as the book reads it: (rid, prompt, output), optionally with its shared-cache scope key fourth.
Request = tuple


@dataclass(frozen=True)
class BatchProposals:
    """One step's lookup proposals for R requests, on the host: ``tokens [R, γ]`` (rows without a proposal, and
    positions past one, hold the fill token 0, never verified), ``lengths [R]`` tokens proposed (0: none),
    ``match_lens [R]`` tail tokens matched (0: none), ``sources [R]`` where each came from (``OWN`` / ``SHARED``)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    match_lens: torch.Tensor
    sources: torch.Tensor

    @property
    def any(self) -> bool:
        return bool(self.lengths.any())

    def capped(self, limits: torch.Tensor) -> "BatchProposals":
        """At most ``limits[r]`` tokens for row r (a row capped to 0 has no proposal)."""
        lengths = torch.minimum(self.lengths, limits.to(self.lengths.dtype))
        tokens = self.tokens.masked_fill(torch.arange(self.tokens.shape[1]) >= lengths[:, None], 0)
        return BatchProposals(tokens=tokens, lengths=lengths, match_lens=torch.where(lengths > 0, self.match_lens, 0),
                              sources=torch.where(lengths > 0, self.sources, OWN))


def key_scope(req) -> tuple:
    """A SGLang request's shared-cache scope under the ``key`` scope: the cache namespace its radix cache isolates
    prefixes by (``extra_key``, which holds the LoRA id, and ``cache_salt``)."""
    return getattr(req, "extra_key", None), getattr(req, "cache_salt", None)


def server_scope(req) -> None:
    """Every request's scope under the ``server`` scope: one."""
    return None


class LookupBook:
    def __init__(self, config: LookupConfig = DEFAULT, shared: Optional[SharedIndices] = None,
                 scope_of: Callable[[object], Hashable] = key_scope) -> None:
        """``config``: the n-gram range (``min_ngram``, ``max_ngram``) and ``index_limits`` the indices keep to;
        ``shared``: the shared suffix cache (None: each request proposes from its own context only); ``scope_of``:
        a SGLang request's scope key in it (:func:`key_scope`, :func:`server_scope`)."""
        self.config = config
        self.shared = shared
        self.scope_of = scope_of
        self._indices: dict[str, ContextIndex] = {}
        self._scopes: dict[str, object] = {}  # rid -> its shared-cache scope key
        self.last_call_tokens = 0  # tokens indexed or dropped by the latest propose / any_match / index_for call

    def __len__(self) -> int:
        return len(self._indices)

    @property
    def min_ngram(self) -> int:
        return self.config.min_ngram

    @property
    def max_ngram(self) -> int:
        return self.config.max_ngram

    def index_for(self, rid: str, prompt: Sequence[int], output: Sequence[int],
                  budget: Optional[int] = None) -> ContextIndex:
        """``rid``'s index, brought up to ``prompt + output`` (the request's tokens as the scheduler holds them) within
        ``budget`` tokens of indexing (None: all; see ``ContextIndex.caught_up``)."""
        index = self._appended(rid, prompt, output)
        self.last_call_tokens = index.catch_up(budget)
        return index

    def retain(self, rids: Iterable[str]) -> None:
        """Drop the indices of requests not in ``rids`` (finished or aborted), their tokens into the shared cache."""
        keep = set(rids)
        for rid in [rid for rid in self._indices if rid not in keep]:
            index = self._indices.pop(rid)
            scope = self._scopes.pop(rid, None)
            if self.shared is not None:
                self.shared.add(scope, index.recent(self.shared.capacity - 1))

    def propose(self, requests: Sequence[Optional[Request]], gamma: int) -> BatchProposals:
        """Proposals of up to ``gamma`` tokens for ``(rid, prompt, output[, scope])`` rows, in batch order (None: a
        row that gets no proposal this step; its index is left as it is), indexed within one call's budget (module
        docstring); from the shared cache where the row's own context proposes nothing."""
        rows = len(requests)
        tokens = torch.zeros(rows, gamma, dtype=torch.int64)
        lengths = torch.zeros(rows, dtype=torch.int64)
        match_lens = torch.zeros(rows, dtype=torch.int64)
        sources = torch.full((rows,), OWN, dtype=torch.int64)
        indexed = [(row, self._appended(*request)) for row, request in enumerate(requests) if request is not None]
        shared = self.shared
        if shared is not None:
            shared.catch_up()
        for row, index in self._catch_up(indexed):
            proposal: Optional[LookupProposal] = index.propose(gamma)
            if shared is not None and proposal is None:
                proposal = shared.propose(self._scopes.get(requests[row][0]), index.recent(self.max_ngram), gamma)
                if proposal is not None:
                    sources[row] = SHARED
            if proposal is None:
                continue
            count = len(proposal.tokens)
            tokens[row, :count] = torch.tensor(proposal.tokens, dtype=torch.int64)
            lengths[row] = count
            match_lens[row] = proposal.match_len
        return BatchProposals(tokens=tokens, lengths=lengths, match_lens=match_lens, sources=sources)

    def any_match(self, reqs) -> bool:
        """Whether any of SGLang's requests (``rid``, ``origin_input_ids``, ``output_ids``) has a tail that recurs in
        its context or the shared cache (stops at the first; one call's budget of indexing over the requests it
        looked at)."""
        indexed = [(req.rid, self._appended(req.rid, req.origin_input_ids, req.output_ids, self.scope_of(req)))
                   for req in reqs]
        shared = self.shared
        if shared is not None:
            shared.catch_up()
        return any(index.propose(1) is not None or (
            shared is not None and shared.propose(self._scopes.get(rid), index.recent(self.max_ngram), 1) is not None)
            for rid, index in self._catch_up(indexed))

    # ------------------------------------------------------------------ internals

    def _appended(self, rid: str, prompt: Sequence[int], output: Sequence[int], scope: object = None) -> ContextIndex:
        """``rid``'s index with ``prompt + output`` appended, not yet indexed (``ContextIndex.append``); ``scope``:
        its shared-cache scope key."""
        self._scopes[rid] = scope
        index = self._indices.get(rid)
        known = len(prompt) + len(output)
        if index is None or len(index) > known:
            index = ContextIndex(min_ngram=self.min_ngram, max_ngram=self.max_ngram,
                                 window=self.config.index_limits.window)
            self._indices[rid] = index
        appended = len(index)
        if appended < len(prompt):
            index.append(prompt[appended:])
            index.append(output)
        elif appended < known:
            index.append(output[appended - len(prompt):])
        return index

    def _catch_up(self, indexed: Iterable[tuple[object, ContextIndex]]) -> Iterator[tuple[object, ContextIndex]]:
        """Index the ``(key, index)`` pairs within one call's budget (module docstring), fewest pending tokens first,
        yielding each once it had its turn (a consumer that stops early leaves the rest as they are)."""
        self.last_call_tokens = 0
        limits = self.config.index_limits
        left = limits.tokens_per_call
        for key, index in sorted(indexed, key=lambda pair: pair[1].pending):
            pending = index.pending
            if pending <= limits.keep_up_tokens:  # a step's own commits and drops: never held back
                self.last_call_tokens += index.catch_up()
            else:
                used = index.catch_up(left)
                self.last_call_tokens += used
                left -= used
            yield key, index


__all__ = ["BatchProposals", "LookupBook", "key_scope", "server_scope"]
