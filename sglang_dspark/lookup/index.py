"""The longest recent match of a request's tail in its own context (prompt + output), kept incrementally.

A request's tokens only grow (prompt, then one or more committed tokens per step). :class:`ContextIndex` keeps, for
every n-gram of ``min_ngram``..``max_ngram`` tokens, the latest place it ended *with a token after it*; a proposal
looks up the request's last n tokens for n from ``max_ngram`` down and copies what followed them there, up to
``max_tokens`` tokens. Cost per committed token: one dict write per n; per proposal: at most one dict read per n.

The proposal is deterministic (a point mass), so verifying it is exact under the standard acceptance rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence


@dataclass(frozen=True)
class LookupProposal:
    tokens: tuple[int, ...]  # what followed the match, in order (at least one token)
    match_len: int  # how many tail tokens matched (min_ngram..max_ngram)


class ContextIndex:
    """One request's index (module docstring). ``extend`` appends tokens; ``propose`` reads the current tail."""

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 6) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        # n-gram -> the index just past its latest occurrence that has a token after it.
        self._latest_end: dict[tuple[int, ...], int] = {}
        self._indexed_ends = 0  # ends 1.._indexed_ends - 1 are in the map (an end needs a following token)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)
        # An occurrence ending at ``end`` becomes usable once the token at ``end`` exists.
        last_usable_end = len(self.tokens) - 1
        for end in range(max(self._indexed_ends, self.min_ngram), last_usable_end + 1):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._latest_end[tuple(self.tokens[end - n:end])] = end
        self._indexed_ends = max(self._indexed_ends, last_usable_end + 1)

    def propose(self, max_tokens: int) -> Optional[LookupProposal]:
        """The continuation of the longest matching tail (latest occurrence), or None when no tail n-gram recurs."""
        length = len(self.tokens)
        if max_tokens < 1:
            return None
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            end = self._latest_end.get(tuple(self.tokens[length - n:length]))
            if end is not None and end < length:
                return LookupProposal(tuple(self.tokens[end:end + max_tokens]), n)
        return None


def brute_force_proposal(tokens: Sequence[int], max_tokens: int, *, min_ngram: int = 2,
                         max_ngram: int = 6) -> Optional[LookupProposal]:
    """The same answer by scanning (the reference the index is tested against)."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(tokens[length - n:])
        for end in range(length - 1, n - 1, -1):  # latest occurrence first; it must have a token after it
            if list(tokens[end - n:end]) == tail:
                return LookupProposal(tuple(tokens[end:end + max_tokens]), n)
    return None


__all__ = ["ContextIndex", "LookupProposal", "brute_force_proposal"]
