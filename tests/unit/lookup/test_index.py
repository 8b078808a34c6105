"""The per-request lookup index (sglang_dspark/lookup/index.py) answers what a scan of the context answers, however
the tokens arrive."""

from __future__ import annotations

import random

import pytest

from sglang_dspark.lookup.index import ContextIndex, LookupProposal, brute_force_proposal


@pytest.mark.parametrize("min_ngram,max_ngram", [(1, 3), (2, 6), (3, 3)])
def test_incremental_index_equals_a_scan(min_ngram, max_ngram):
    """300 random sequences over 5 tokens (so n-grams recur), arriving in chunks of 1-8 tokens (a prompt, then
    commits); after every chunk the index's proposal equals the brute-force scan's."""
    rng = random.Random(min_ngram * 100 + max_ngram)
    checked = found = 0
    for _ in range(300):
        index = ContextIndex(min_ngram=min_ngram, max_ngram=max_ngram)
        tokens: list[int] = []
        while len(tokens) < 60:
            chunk = [rng.randrange(5) for _ in range(rng.randint(1, 8))]
            tokens += chunk
            index.extend(chunk)
            want = brute_force_proposal(tokens, 4, min_ngram=min_ngram, max_ngram=max_ngram)
            assert index.propose(4) == want
            checked += 1
            found += want is not None
    assert found > 0.15 * checked  # the check saw proposals, not only None


def test_a_repeated_passage_is_proposed_from_where_it_left_off():
    passage = list(range(100, 140))
    index = ContextIndex()
    index.extend([1, 2, 3] + passage + [7, 8])  # the prompt holds the passage
    index.extend(passage[:5])  # the answer starts copying it
    assert index.propose(8) == LookupProposal(tuple(passage[5:13]), 5)
    assert index.propose(0) is None


def test_nothing_recurs_nothing_is_proposed():
    index = ContextIndex(min_ngram=2)
    index.extend(range(50))
    assert index.propose(4) is None
    index.extend([48])  # a 1-gram recurs, below min_ngram
    assert index.propose(4) is None


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_ngram"):
        ContextIndex(min_ngram=3, max_ngram=2)
