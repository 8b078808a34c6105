"""Long contexts (issue #46): the lookup index is built within a per-call budget, over several calls for a long
prompt, proposing nothing until it has caught up and then what a scan of its window proposes; the window bounds its
memory (sglang_dspark/lookup/index.py, book.py)."""

from __future__ import annotations

import random
import sys

import pytest

from sglang_dspark.lookup.book import LookupBook
from sglang_dspark.lookup.config import IndexLimits, LookupConfig
from sglang_dspark.lookup.index import ContextIndex, brute_force_proposal


@pytest.mark.parametrize("min_ngram,max_ngram,window", [(1, 3, None), (2, 6, 12), (2, 6, 40), (1, 3, 7)])
def test_a_budgeted_windowed_index_answers_a_scan_of_its_window(min_ngram, max_ngram, window):
    """200 random sequences over 5 tokens in chunks of 1-60 tokens, each followed by one catch-up call of a random
    budget (0-80 tokens; runs of 32 and more take the index's other path), so the index often lags: a call never
    does more than its budget; while it lags it proposes nothing, once caught up exactly what a scan of the last
    ``window`` tokens proposes."""
    rng = random.Random(min_ngram * 1000 + max_ngram * 10 + (window or 0))
    checked = lagging = found = 0
    for _ in range(200):
        index = ContextIndex(min_ngram=min_ngram, max_ngram=max_ngram, window=window)
        tokens: list[int] = []
        while len(tokens) < 300:
            chunk = [rng.randrange(5) for _ in range(rng.randint(1, 60))]
            tokens += chunk
            index.append(chunk)
            budget = rng.randint(0, 80)
            assert index.catch_up(budget) <= budget
            seen = tokens[-window:] if window else tokens
            want = brute_force_proposal(seen, 4, min_ngram=min_ngram, max_ngram=max_ngram)
            if index.caught_up:
                assert index.propose(4) == want
                checked += 1
                found += want is not None
            else:
                assert index.propose(4) is None
                lagging += 1
        index.catch_up()  # unbudgeted: whatever was left
        assert index.caught_up and index.pending == 0
        assert index.propose(4) == brute_force_proposal(tokens[-window:] if window else tokens, 4,
                                                        min_ngram=min_ngram, max_ngram=max_ngram)
    assert checked > 200 and lagging > 200 and found > 0.15 * checked  # both paths were exercised


def test_a_window_longer_than_the_context_changes_nothing():
    rng = random.Random(5)
    tokens = [rng.randrange(7) for _ in range(400)]
    whole, windowed = ContextIndex(), ContextIndex(window=1000)
    for start in range(0, 400, 9):
        whole.extend(tokens[start:start + 9])
        windowed.extend(tokens[start:start + 9])
        assert windowed.propose(5) == whole.propose(5)
    assert windowed.entries == whole.entries


def test_a_32k_prompt_is_indexed_over_several_calls_and_a_short_request_beside_it_is_not_held_back():
    """A 32 000-token prompt (a passage the answer copies, amid distinct tokens) and a short request in one batch:
    every call indexes at most ``tokens_per_call`` tokens for the long one (counted, not timed); the short one gets
    the scan's proposal on every step; the long one gets none until caught up, then the scan's."""
    limits = IndexLimits()
    rng = random.Random(7)
    passage = [rng.randrange(1000, 2000) for _ in range(64)]
    long_prompt = list(range(100_000, 100_000 + 20_000)) + passage + list(range(200_000, 200_000 + 11_936))
    assert len(long_prompt) == 32_000
    short_prompt = [rng.randrange(6) for _ in range(50)]
    long_out: list[int] = []
    short_out: list[int] = []
    book = LookupBook(LookupConfig(index_limits=limits))
    calls = 0
    for step in range(40):
        long_out.append(passage[step])  # the answer copies the passage
        short_out.extend(rng.randrange(6) for _ in range(rng.randint(1, 3)))
        rows = [("long", long_prompt, long_out), ("short", short_prompt, short_out)]
        proposals = book.propose(rows, gamma=4)
        calls += 1
        short_cost = len(short_prompt) if step == 0 else 3  # the short request's own tokens (none held back)
        assert book.last_call_tokens <= limits.tokens_per_call + short_cost
        short_want = brute_force_proposal(short_prompt + short_out, 4)
        assert int(proposals.lengths[1]) == (0 if short_want is None else len(short_want.tokens))
        long_index = book.index_for("long", long_prompt, long_out, budget=0)
        if not long_index.caught_up:
            assert int(proposals.lengths[0]) == 0
            continue
        want = brute_force_proposal(long_prompt + long_out, 4)
        assert want is not None and proposals.tokens[0, :4].tolist() == list(want.tokens)
        break
    else:
        pytest.fail("the long prompt never caught up")
    ends = 32_000 + len(long_out) - book.min_ngram  # n-gram ends to index
    assert (calls - 1) * limits.tokens_per_call < ends <= calls * limits.tokens_per_call  # the calls it needs, no more


def test_the_book_indexes_only_the_window_of_a_long_prompt():
    """A 20 000-token prompt under a 1 000-token window: caught up in the calls the window needs, not the prompt; a
    tail that recurs only before the window is not proposed, one that recurs inside it is; the map holds the
    window's n-grams only."""
    limits = IndexLimits(tokens_per_call=300, window=1000)
    book = LookupBook(LookupConfig(index_limits=limits))
    prompt = [5, 6, 7] + list(range(100, 100 + 19_000)) + list(range(10, 10 + 997))  # 20 000 tokens
    answers = [int(book.propose([("a", prompt, [5, 6])], gamma=3).lengths[0]) for _ in range(5)]
    assert answers == [0, 0, 0, 0, 0] and book.index_for("a", prompt, [5, 6], budget=0).caught_up  # (5, 6): outside
    proposals = book.propose([("a", prompt, [5, 6, 20, 21])], gamma=3)  # (20, 21) recurs inside the window
    assert proposals.tokens[0].tolist() == [22, 23, 24]
    assert book.index_for("a", prompt, [5, 6, 20, 21], budget=0).entries <= 1000 * 5


def test_any_match_spends_one_budget_and_counts_a_lagging_request_as_no_match():
    class Req:
        def __init__(self, rid, prompt, output):
            self.rid, self.origin_input_ids, self.output_ids = rid, prompt, output

    book = LookupBook(LookupConfig(index_limits=IndexLimits(tokens_per_call=1000)))
    prompt = list(range(5000)) + [1, 2]  # the tail (1, 2) recurs at the start
    req = Req("a", prompt, [])
    answers = []
    for _ in range(10):
        answers.append(book.any_match([req]))
        assert book.last_call_tokens <= 1000
    assert answers == [False] * 4 + [True] * 6  # 5000 n-gram ends to index (positions 2..5001), 1000 per call


def test_lagging_requests_are_served_fewest_pending_first_and_none_starves():
    limits = IndexLimits(tokens_per_call=100, keep_up_tokens=8, window=None)
    book = LookupBook(LookupConfig(index_limits=limits))
    prompts = {rid: list(range(size)) for rid, size in (("a", 1000), ("b", 300), ("c", 500))}
    outputs = {rid: [] for rid in prompts}
    caught_up_at = {}
    for call in range(40):
        for rid in prompts:
            outputs[rid] += [7, 8]  # two commits per request per step
        book.propose([(rid, prompts[rid], outputs[rid]) for rid in prompts], gamma=2)
        assert book.last_call_tokens <= limits.tokens_per_call + len(prompts) * limits.keep_up_tokens
        for rid in prompts:
            if rid not in caught_up_at and book.index_for(rid, prompts[rid], outputs[rid], budget=0).caught_up:
                caught_up_at[rid] = call
    assert sorted(caught_up_at, key=caught_up_at.get) == ["b", "c", "a"]  # all caught up, shortest first


def held_bytes(index: ContextIndex) -> int:
    """What the index holds (sys.getsizeof of its map, keys, end positions and token list; deterministic, unlike
    tracemalloc, which counts the tuple free lists)."""
    table = index._latest_end
    ends = {id(end): end for end in table.values()}
    return (sys.getsizeof(table) + sum(sys.getsizeof(gram) for gram in table)
            + sum(sys.getsizeof(end) for end in ends.values()) + sys.getsizeof(index._tokens))


def test_the_window_bounds_the_memory_whatever_the_context():
    """An index of 64 windows of distinct tokens holds what one window holds: its n-grams (at most the window's) and
    its bytes within 2x of an index of one window (a dict's table is a power of two, so the same entries may sit in
    a table twice the size), under 1 KB per window token."""
    window = 2048

    def built(total: int) -> ContextIndex:
        index = ContextIndex(window=window)
        for start in range(0, total, 97):
            index.extend(range(start, min(total, start + 97)))
        return index

    one, many = built(window), built(64 * window)
    assert one.entries == many.entries <= window * (many.max_ngram - many.min_ngram + 1)
    assert len(many._tokens) <= 2 * window + 97  # the stored tokens too
    assert held_bytes(many) < 2 * held_bytes(one) and held_bytes(many) < 1024 * window


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="window"):
        ContextIndex(max_ngram=6, window=6)
