"""The running requests' lookup indices: incremental updates equal a fresh index, batch proposals, memory bound."""

import random

import torch

from sglang_dspark.lookup.book import LookupBook
from sglang_dspark.lookup.index import brute_force_proposal


def test_updates_step_by_step_give_the_scan_s_proposal():
    rng = random.Random(3)
    book = LookupBook()
    prompt = [rng.randrange(6) for _ in range(40)]
    output: list[int] = []
    for _ in range(30):
        output.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))  # 1..3 tokens committed per step
        proposals = book.propose([("a", prompt, output)], gamma=5)
        want = brute_force_proposal(prompt + output, 5, min_ngram=book.min_ngram, max_ngram=book.max_ngram)
        if want is None:
            assert int(proposals.lengths[0]) == 0
        else:
            count = len(want.tokens)
            assert int(proposals.lengths[0]) == count and int(proposals.match_lens[0]) == want.match_len
            assert proposals.tokens[0, :count].tolist() == list(want.tokens)


def test_a_row_without_a_proposal_and_a_skipped_row_leave_zeros():
    book = LookupBook()
    proposals = book.propose([("a", [1, 2, 3, 1, 2], [3]), None, ("c", [5, 6, 7], [8])], gamma=4)
    assert proposals.lengths.tolist() == [3, 0, 0]  # "a": tail (1, 2, 3) recurs, followed by 1, 2, 3
    assert proposals.tokens[0].tolist() == [1, 2, 3, 0] and proposals.tokens[1:].eq(0).all()
    assert proposals.any and len(book) == 2  # the skipped row was never indexed


def test_a_shorter_token_list_rebuilds_the_index():
    book = LookupBook()
    book.propose([("a", [1, 2, 3, 1, 2], [3, 1])], gamma=3)
    proposals = book.propose([("a", [7, 8, 9], [7, 8])], gamma=3)  # retraction: fewer tokens than indexed
    assert proposals.tokens[0].tolist() == [9, 7, 8] and int(proposals.lengths[0]) == 3  # nothing of the old tokens


def test_retain_drops_finished_requests():
    book = LookupBook()
    for rid in "abc":
        book.index_for(rid, [1, 2, 1], [2])
    book.retain(["b"])
    assert len(book) == 1


def test_any_match_reads_sglang_requests():
    class Req:
        def __init__(self, rid, prompt, output):
            self.rid, self.origin_input_ids, self.output_ids = rid, prompt, output

    book = LookupBook()
    assert not book.any_match([Req("x", [1, 2, 3], [4])])
    assert book.any_match([Req("x", [1, 2, 3], [4]), Req("y", [5, 6, 5], [6])])
