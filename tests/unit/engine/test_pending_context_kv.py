"""engine/plain_step/pending_context_kv.py: the draft-KV rows of skipped steps, held and written in one batch.

The promise is that the draft KV ends up exactly as if every skipped step had written its rows itself, whatever the
slots do in between (a slot handed to another request within a pause), and that the rows really go in one write. The
harness: a fake draft-KV pool written by a position-dependent projection (as the real injection rotates K by
position), driven step by step both ways over random slot traffic.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_dspark.engine.plain_step.pending_context_kv import PendingContextKv, newest_row_per_slot

HIDDEN = 6
SLOTS = 40


class FakeDraftPool:
    """Draft KV as a [SLOTS, HIDDEN] table; a write projects each row and mixes in its position."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.randn(HIDDEN, HIDDEN, generator=generator)
        self.kv = torch.zeros(SLOTS, HIDDEN)
        self.calls: list[int] = []

    def write(self, hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor) -> None:
        self.calls.append(int(cache_loc.numel()))
        # index assignment with a repeated slot would leave an unspecified row: the holder must never hand one over
        assert torch.unique(cache_loc).numel() == cache_loc.numel(), "a batch named a slot twice"
        self.kv[cache_loc] = hidden @ self.weight + positions[:, None].to(hidden.dtype)


def random_steps(seed: int, steps: int, max_rows: int = 5):
    """Decode steps as (hidden, slots, positions): slots drawn from a small pool, so they come back within a pause."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        rows = rng.randint(1, max_rows)
        slots = torch.tensor(rng.sample(range(SLOTS), rows), dtype=torch.int64)
        out.append((torch.randn(rows, HIDDEN), slots, torch.full((rows,), step, dtype=torch.int64)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_batched_pause_leaves_the_draft_kv_a_step_by_step_injection_leaves(seed):
    """60 steps of 1-5 rows over 40 slots (so slots repeat within a pause), flushed at random points; the pool must
    equal the pool written step by step, to the bit (each slot's row is computed once, from the same inputs)."""
    steps = random_steps(seed, 60)
    every_step, batched = FakeDraftPool(), FakeDraftPool()
    pending = PendingContextKv(batched.write)
    rng = random.Random(100 + seed)
    for hidden, slots, positions in steps:
        every_step.write(hidden, slots, positions)
        pending.add(hidden, slots, positions)
        if rng.random() < 0.1:  # a drafted step or a prefill comes
            pending.flush()
    pending.flush()
    torch.testing.assert_close(batched.kv, every_step.kv, rtol=0, atol=0)
    assert len(batched.calls) < len(every_step.calls) / 4  # and it was batched
    assert pending.deferred_tokens == sum(len(s[1]) for s in steps) and pending.pending_tokens == 0


def test_a_slot_reused_within_a_pause_keeps_the_newer_row():
    pool = FakeDraftPool()
    pending = PendingContextKv(pool.write)
    old, new = torch.ones(1, HIDDEN), 2 * torch.ones(1, HIDDEN)
    pending.add(old, torch.tensor([7]), torch.tensor([3]))  # a request's token, finished since
    pending.add(torch.zeros(1, HIDDEN), torch.tensor([8]), torch.tensor([4]))
    pending.add(new, torch.tensor([7]), torch.tensor([0]))  # another request's token in the freed slot
    assert pending.flush() == 2
    torch.testing.assert_close(pool.kv[7], (new @ pool.weight)[0])
    assert pool.calls == [2]


def test_nothing_held_writes_nothing():
    pool = FakeDraftPool()
    pending = PendingContextKv(pool.write)
    assert pending.flush() == 0 and pool.calls == []


def test_a_full_holder_writes_what_it_holds_and_keeps_going():
    """A byte limit of 8 rows: every 8 or so rows go out on their own, and the pool still ends as step by step."""
    steps = random_steps(7, 40, max_rows=3)
    every_step, batched = FakeDraftPool(), FakeDraftPool()
    row_bytes = HIDDEN * 4
    pending = PendingContextKv(batched.write, max_bytes=8 * row_bytes, initial_rows=2)
    for hidden, slots, positions in steps:
        every_step.write(hidden, slots, positions)
        pending.add(hidden, slots, positions)
        assert pending.pending_tokens <= 8
    pending.flush()
    torch.testing.assert_close(batched.kv, every_step.kv, rtol=0, atol=0)
    rows = sum(len(s[1]) for s in steps)
    assert len(batched.calls) >= rows // 8


def test_rows_of_another_width_write_the_held_ones_first():
    pool = FakeDraftPool()
    written = []
    pending = PendingContextKv(lambda h, loc, pos: written.append(h.shape[1]))
    pending.add(torch.ones(2, HIDDEN), torch.tensor([1, 2]), torch.tensor([0, 0]))
    pending.add(torch.ones(1, HIDDEN + 2), torch.tensor([3]), torch.tensor([0]))
    assert written == [HIDDEN] and pending.pending_tokens == 1
    pending.flush()
    assert written == [HIDDEN, HIDDEN + 2]
    del pool


def test_the_held_rows_are_copies():
    """The step's tensors may be reused buffers: changing them after ``add`` must not change what is written."""
    pool = FakeDraftPool()
    pending = PendingContextKv(pool.write)
    hidden, slots, positions = torch.ones(2, HIDDEN), torch.tensor([4, 5]), torch.tensor([9, 9])
    pending.add(hidden, slots, positions)
    hidden.zero_(), slots.fill_(0), positions.fill_(0)
    pending.flush()
    expected = torch.ones(2, HIDDEN) @ pool.weight + 9
    torch.testing.assert_close(pool.kv[torch.tensor([4, 5])], expected)
    assert pool.kv[0].abs().sum() == 0


def test_mismatched_rows_are_refused_with_the_counts():
    pending = PendingContextKv(lambda *a: None)
    with pytest.raises(ValueError, match="3 hidden rows, 2 slots, 3 positions"):
        pending.add(torch.ones(3, HIDDEN), torch.tensor([1, 2]), torch.tensor([0, 0, 0]))


def test_newest_row_per_slot():
    assert newest_row_per_slot(torch.tensor([3, 1, 2])) is None
    assert newest_row_per_slot(torch.tensor([3, 1, 3, 2, 1])).tolist() == [2, 3, 4]
