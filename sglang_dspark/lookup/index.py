"""The longest recent match of a request's tail in its own context (prompt + output), kept incrementally.

A request's tokens only grow (prompt, then one or more committed tokens per step). :class:`ContextIndex` keeps, for
every n-gram of ``min_ngram``..``max_ngram`` tokens, the latest place it ended *with a token after it*; a proposal
looks up the request's last n tokens for n from ``max_ngram`` down and copies what followed them there, up to
``max_tokens`` tokens. Cost per committed token: one dict write per n; per proposal: at most one dict read per n.

Long contexts (issue #46). Appending tokens (:meth:`ContextIndex.append`) only stores them; indexing them
(:meth:`ContextIndex.catch_up`) takes a budget of tokens, so a long prompt is indexed over several calls, oldest
first, and the index proposes nothing until it has caught up (then exactly what a scan proposes). With a ``window``
the index covers the request's last ``window`` tokens only: an occurrence that starts before them is dropped from
the map (one token's n-grams per token that leaves, also budgeted), so its memory is bounded by the window, not the
context. ``config.IndexLimits`` holds both numbers; ``benchmarks/lookup_index_cost.py`` measures what they buy.

The proposal is deterministic (a point mass), so verifying it is exact under the standard acceptance rule.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from sglang_dspark.lookup.config import DEFAULT


_SHORT_RUN = 32  # runs of fewer tokens are (un)indexed by plain loops; longer ones by zip (C-speed n-grams): speed only


@dataclass(frozen=True)
class LookupProposal:
    tokens: tuple[int, ...]  # what followed the match, in order (at least one token)
    match_len: int  # how many tail tokens matched (min_ngram..max_ngram)


class ContextIndex:
    """One request's index (module docstring). ``append`` stores tokens, ``catch_up`` indexes them (``extend``:
    both, whole); ``propose`` reads the current tail once caught up."""

    def __init__(self, *, min_ngram: int = DEFAULT.min_ngram, max_ngram: int = DEFAULT.max_ngram,
                 window: Optional[int] = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if window is not None and window <= max_ngram:
            raise ValueError(f"need window > max_ngram, got {window}, {max_ngram}")
        self.min_ngram, self.max_ngram, self.window = min_ngram, max_ngram, window
        self._length = 0  # tokens appended (positions are absolute: 0 is the prompt's first token)
        self._tokens: list[int] = []  # the tokens at positions _base.. (older ones are no longer read)
        self._base = 0
        # n-gram -> the position just past its latest occurrence (inside the window) that has a token after it.
        self._latest_end: dict[tuple[int, ...], int] = {}
        self._indexed_ends = 0  # ends below it are in the map, or skipped as outside the window
        self._dropped = 0  # occurrences starting below it are out of the map (it never passes the window's start)

    def __len__(self) -> int:
        return self._length

    @property
    def entries(self) -> int:
        """n-grams in the map (the index's memory: about 110 B each with its key, besides the token list)."""
        return len(self._latest_end)

    @property
    def caught_up(self) -> bool:
        """Whether every appended token is indexed (before that, :meth:`propose` answers None)."""
        return self._index_pending(self._window_start()) == 0

    @property
    def pending(self) -> int:
        """Tokens :meth:`catch_up` has left to do: to index, and to drop as they left the window."""
        start = self._window_start()
        return self._drop_pending(start) + self._index_pending(start)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append and index ``tokens`` at once (no budget)."""
        self.append(tokens)
        self.catch_up()

    def append(self, tokens: Iterable[int]) -> None:
        """Store ``tokens`` (no indexing: :meth:`catch_up`). Tokens that land before the window and left nothing in
        the map are not kept."""
        if not isinstance(tokens, (list, tuple, range)) and not isinstance(tokens, SequenceABC):
            tokens = list(tokens)
        first = self._length
        self._length += len(tokens)
        self._skip_unindexed(self._window_start())
        if self._dropped > first:  # the window passed every stored token: restart the list at _dropped
            self._tokens, self._base = [], self._dropped
        self._tokens.extend(map(int, tokens[max(0, self._dropped - first):]))

    def catch_up(self, budget: Optional[int] = None) -> int:
        """Drop what left the window, then index the pending tokens oldest first: at most ``budget`` tokens of both
        (None: all). Returns how many it did (each is up to ``max_ngram - min_ngram + 1`` dict operations)."""
        start = self._window_start()
        to_drop = self._drop_pending(start)
        left = to_drop + self._index_pending(start) if budget is None else max(0, budget)
        count = min(left, to_drop)
        if count:
            self._drop(self._dropped, self._dropped + count)
            self._dropped += count
        self._skip_unindexed(start)
        first = max(self._indexed_ends, start + self.min_ngram)
        last = min(self._length - 1, first + (left - count) - 1)
        if last >= first:
            self._index(first, last, start)
            self._indexed_ends = last + 1
        self._trim()
        return count + max(0, last - first + 1)

    def propose(self, max_tokens: int) -> Optional[LookupProposal]:
        """The continuation of the longest matching tail (latest occurrence), or None when no tail n-gram recurs (in
        the window) or the index has not caught up."""
        length, start = self._length, self._window_start()
        if max_tokens < 1 or self._index_pending(start):
            return None
        tokens, base = self._tokens, self._base
        for n in range(min(self.max_ngram, length - 1 - start), self.min_ngram - 1, -1):
            end = self._latest_end.get(tuple(tokens[length - n - base:length - base]))
            if end is not None and end < length and end - n >= start:  # an entry not yet dropped may lie before it
                return LookupProposal(tuple(tokens[end - base:end - base + max_tokens]), n)
        return None

    def continuation(self, tail: Sequence[int], max_tokens: int, *, stop: Optional[int] = None
                     ) -> Optional[LookupProposal]:
        """What followed, here, the longest suffix of ``tail`` (another sequence's last tokens) that occurs in this
        index (latest occurrence, inside the window; what is indexed so far), cut before the first ``stop`` token;
        None when no suffix of ``min_ngram``.. tokens occurs with a token after it."""
        if max_tokens < 1:
            return None
        start, tokens, base = self._window_start(), self._tokens, self._base
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            end = self._latest_end.get(tuple(tail[len(tail) - n:]))
            if end is None or end - n < start:
                continue
            following = tokens[end - base:end - base + max_tokens]
            if stop is not None and stop in following:
                following = following[:following.index(stop)]
            if following:
                return LookupProposal(tuple(following), n)
        return None

    def recent(self, limit: int) -> list[int]:
        """The last ``limit`` tokens appended that are still stored (a window drops older ones)."""
        return self._tokens[max(0, len(self._tokens) - max(0, limit)):]

    # ------------------------------------------------------------------ internals

    def _window_start(self) -> int:
        return 0 if self.window is None else max(0, self._length - self.window)

    def _drop_pending(self, start: int) -> int:
        # The map's occurrences end below _indexed_ends, so they start below _indexed_ends - min_ngram.
        return max(0, min(start, self._indexed_ends - self.min_ngram) - self._dropped)

    def _index_pending(self, start: int) -> int:
        # An occurrence ending at ``end`` becomes usable once the token at ``end`` exists; it must start in the window.
        return max(0, self._length - max(self._indexed_ends, start + self.min_ngram))

    def _skip_unindexed(self, start: int) -> None:
        """Nothing left to drop before the window: move past it for free."""
        if self._dropped < start and self._drop_pending(start) == 0:
            self._dropped = start

    def _index(self, first: int, last: int, start: int) -> None:
        """Map the n-grams ending at first..last (inside the window), in order, so the latest end wins."""
        tokens, base, table = self._tokens, self._base, self._latest_end
        if last - first < _SHORT_RUN:
            for end in range(first, last + 1):
                for n in range(self.min_ngram, min(self.max_ngram, end - start) + 1):
                    table[tuple(tokens[end - n - base:end - base])] = end
            return
        ends = list(range(first, last + 1))  # one int per end, shared by its n-grams
        for n in range(self.min_ngram, self.max_ngram + 1):
            lo = max(first, start + n)
            if lo > last:
                break
            grams = zip(*(tokens[lo - n + i - base:last - n + i + 1 - base] for i in range(n)))
            table.update(zip(grams, ends[lo - first:]))

    def _drop(self, first: int, stop: int) -> None:
        """Remove the occurrences starting at first..stop - 1 where they are still the latest of their n-gram."""
        tokens, base, table = self._tokens, self._base, self._latest_end
        if stop - first < _SHORT_RUN:
            for at in range(first, stop):
                for n in range(self.min_ngram, self.max_ngram + 1):
                    gram = tuple(tokens[at - base:at - base + n])
                    if table.get(gram) == at + n:
                        del table[gram]
            return
        for n in range(self.min_ngram, self.max_ngram + 1):
            grams = zip(*(tokens[first + i - base:stop + i - base] for i in range(n)))
            for gram, end in zip(grams, range(first + n, stop + n)):
                if table.get(gram) == end:
                    del table[gram]

    def _trim(self) -> None:
        """Forget stored tokens before _dropped once they are as many as the rest (amortised O(1) per token)."""
        dead = self._dropped - self._base
        if dead > 0 and 2 * dead >= len(self._tokens):
            del self._tokens[:dead]
            self._base = self._dropped


def brute_force_proposal(tokens: Sequence[int], max_tokens: int, *, min_ngram: int = DEFAULT.min_ngram,
                         max_ngram: int = DEFAULT.max_ngram) -> Optional[LookupProposal]:
    """The same answer by scanning (the reference the index is tested against; with a window: scan its tokens)."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(tokens[length - n:])
        for end in range(length - 1, n - 1, -1):  # latest occurrence first; it must have a token after it
            if list(tokens[end - n:end]) == tail:
                return LookupProposal(tuple(tokens[end:end + max_tokens]), n)
    return None


__all__ = ["ContextIndex", "LookupProposal", "brute_force_proposal"]
