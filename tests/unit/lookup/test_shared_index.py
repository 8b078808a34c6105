"""The shared suffix cache (lookup/shared_index.py) and its use by the book (lookup/book.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.lookup.book import LookupBook, key_scope, server_scope
from sglang_dspark.lookup.calibration import OWN, SHARED
from sglang_dspark.lookup.config import LookupConfig
from sglang_dspark.lookup.index import LookupProposal
from sglang_dspark.lookup.shared_index import SEPARATOR, SharedIndex, SharedIndices

CONFIG = LookupConfig(shared_capacity_tokens=4096, shared_tokens_per_call=100_000)


def _reference(stored: list[list[int]], tail: list[int], max_tokens: int, config=CONFIG):
    """By scanning: the sequences joined by separators; for n from max_ngram down, the latest occurrence of the tail's
    last n tokens with a token after it; its continuation cut at the separator; an empty one tries a shorter n."""
    joined: list[int] = []
    for tokens in stored:
        joined += [SEPARATOR, *tokens]
    for n in range(min(config.max_ngram, len(tail)), config.min_ngram - 1, -1):
        gram = tail[len(tail) - n:]
        for end in range(len(joined) - 1, n - 1, -1):
            if joined[end - n:end] == gram:
                following = joined[end:end + max_tokens]
                if SEPARATOR in following:
                    following = following[:following.index(SEPARATOR)]
                if following:
                    return LookupProposal(tuple(following), n)
                break
    return None


def test_proposals_equal_a_scan_of_the_stored_requests():
    rng = random.Random(5)
    index = SharedIndex(CONFIG.shared_capacity_tokens, CONFIG)
    stored = []
    for _ in range(12):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(5, 60))]
        index.add(tokens)
        stored.append(tokens)
    index.catch_up()
    checked = 0
    for _ in range(400):
        tail = [rng.randrange(6) for _ in range(rng.randrange(1, 9))]
        got = index.propose(tail, 5)
        assert got == _reference(stored, tail, 5), tail
        checked += got is not None
    assert checked > 100  # most tails match something: the comparison is not vacuous


def test_a_proposal_never_runs_into_the_next_request():
    index = SharedIndex(64, CONFIG)
    index.add([1, 2, 3, 4])
    index.add([9, 9, 9])
    index.catch_up()
    assert index.propose([2, 3], 8) == LookupProposal((4,), 2)
    assert index.propose([3, 4], 8) is None  # the first request ended there: no continuation in the second


def test_the_capacity_bounds_tokens_and_entries_and_the_oldest_leave_first():
    config = LookupConfig(shared_capacity_tokens=64, shared_tokens_per_call=100_000)
    index = SharedIndex(64, config)
    index.add([100, 101, 102, 103, 104])
    index.catch_up()
    assert index.propose([100, 101], 3) == LookupProposal((102, 103, 104), 2)
    rng = random.Random(1)
    for _ in range(30):
        index.add([rng.randrange(50) for _ in range(20)])
        index.catch_up()
        assert len(index) <= 64
        assert index.entries <= 64 * (config.max_ngram - config.min_ngram + 1)
    assert index.propose([100, 101], 3) is None  # pushed out by newer requests


def test_indexing_is_budgeted_per_call():
    config = LookupConfig(shared_capacity_tokens=4096, shared_tokens_per_call=10)
    cache = SharedIndices(config)
    cache.add(None, list(range(200, 260)))
    assert cache.propose(None, [250, 251], 2) is None  # nothing indexed up to there yet
    calls = 0
    while cache.propose(None, [250, 251], 2) is None:
        assert cache.catch_up() <= 10
        calls += 1
    assert calls >= 5 and cache.propose(None, [250, 251], 2) == LookupProposal((252, 253), 2)


def test_scopes_are_apart_and_the_least_recently_used_goes_first():
    config = LookupConfig(shared_capacity_tokens=40, shared_tokens_per_call=100_000)
    cache = SharedIndices(config)
    cache.add("tenant-a", [1, 2, 3, 4, 5])
    cache.add("tenant-b", [1, 2, 7, 8, 9])
    cache.catch_up()
    assert cache.propose("tenant-a", [1, 2], 3) == LookupProposal((3, 4, 5), 2)
    assert cache.propose("tenant-b", [1, 2], 3) == LookupProposal((7, 8, 9), 2)
    assert cache.propose("tenant-c", [1, 2], 3) is None
    assert cache.propose("tenant-a", [1, 2], 3) is not None  # a used last: b is the least recently used
    cache.add("tenant-c", list(range(30, 60)))  # past 40 tokens: b is dropped
    assert cache.scopes == 2 and cache.evicted_scopes == 1 and len(cache) <= 40
    assert cache.propose("tenant-b", [1, 2], 3) is None and cache.propose("tenant-a", [1, 2], 3) is not None


def test_many_tiny_scopes_stay_bounded_in_number():
    config = LookupConfig(shared_capacity_tokens=4096, shared_max_scopes=3)
    cache = SharedIndices(config)
    for tenant in range(10):
        cache.add(tenant, [tenant, 1, 2])
    assert cache.scopes == 3 and cache.evicted_scopes == 7
    cache.catch_up()
    assert cache.propose(9, [9, 1], 1) is not None and cache.propose(0, [0, 1], 1) is None


def test_a_capacity_not_above_the_ngram_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        SharedIndex(6, CONFIG)


def _req(rid, prompt, output=(), extra_key=None, cache_salt=None):
    return SimpleNamespace(rid=rid, origin_input_ids=list(prompt), output_ids=list(output), extra_key=extra_key,
                           cache_salt=cache_salt)


def test_a_finished_request_proposes_for_the_next_one_tagged_shared():
    book = LookupBook(CONFIG, SharedIndices(CONFIG), server_scope)
    answer = [40, 41, 42, 43, 44, 45, 46, 47]
    book.propose([("first", [1, 2, 3], [10, 11, *answer], None)], 4)
    book.retain([])  # finished: its tokens go to the shared cache
    proposals = book.propose([("second", [5, 6, 7], [10, 11], None)], 4)
    assert proposals.lengths.tolist() == [4] and proposals.tokens[0].tolist() == answer[:4]
    assert proposals.sources.tolist() == [SHARED] and proposals.match_lens.tolist() == [2]
    alone = LookupBook(CONFIG).propose([("second", [5, 6, 7], [10, 11], None)], 4)
    assert alone.lengths.tolist() == [0]  # without the cache the request has nothing to copy from


def test_a_row_with_its_own_proposal_keeps_it_and_the_cache_fills_rows_without_one():
    book = LookupBook(CONFIG, SharedIndices(CONFIG), server_scope)
    book.propose([("old", [1, 2, 3, 4, 5, 6, 90], [], None)], 4)
    book.retain([])
    own_tie = book.propose([("a", [2, 3, 77, 2, 3], [], None)], 2)
    assert own_tie.sources.tolist() == [OWN] and own_tie.tokens[0].tolist() == [77, 2]
    longer = book.propose([("b", [5, 6, 50, 4, 5, 6], [], None)], 2)  # own: "5 6" -> 50; shared: "4 5 6" -> 90
    assert longer.sources.tolist() == [OWN] and longer.tokens[0].tolist() == [50, 4]  # the own match stays
    assert longer.match_lens.tolist() == [2] and longer.lengths.tolist() == [2]
    none_own = book.propose([("c", [7, 8], [4, 5, 6], None)], 2)  # no recurring tail of its own
    assert none_own.sources.tolist() == [SHARED] and none_own.tokens[0].tolist() == [90, 0]
    assert none_own.match_lens.tolist() == [3] and none_own.lengths.tolist() == [1]
    nothing = book.propose([("d", [7, 8], [9, 10], None)], 2)  # no match anywhere: no proposal, source left OWN
    assert nothing.lengths.tolist() == [0] and nothing.sources.tolist() == [OWN]
    capped = none_own.capped(torch.tensor([0]))
    assert capped.sources.tolist() == [OWN] and capped.lengths.tolist() == [0]


def test_the_key_scope_keeps_tenants_apart_in_the_book():
    book = LookupBook(CONFIG, SharedIndices(CONFIG), key_scope)
    book.any_match([_req("a", [1, 2, 3], [10, 11, 12, 13], extra_key="tenant-a")])
    book.retain([])
    assert book.any_match([_req("b", [5, 6], [10, 11], extra_key="tenant-a")])
    assert not book.any_match([_req("c", [5, 6], [10, 11], extra_key="tenant-b")])
    assert not book.any_match([_req("d", [5, 6], [10, 11], extra_key="tenant-a", cache_salt="salt")])
    server_wide = LookupBook(CONFIG, SharedIndices(CONFIG), server_scope)
    server_wide.any_match([_req("a", [1, 2, 3], [10, 11, 12, 13], extra_key="tenant-a")])
    server_wide.retain([])
    assert server_wide.any_match([_req("c", [5, 6], [10, 11], extra_key="tenant-b")])
