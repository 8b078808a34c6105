"""The draft-KV injection of plain decode steps, held back and written in one batch before anything reads draft KV.

A step the draft gate skipped still has to put its committed token's target hidden states into the draft KV (the
next drafted step drafts from the full context). Written on every skipped step, that is one small projection per
step through every draft layer's K/V weights, paid on every step of a pause, which is most steps under load
(docs/scheduling.md, "Why each rule exists"). Nothing reads draft KV during a pause, so the rows wait here and are
written together where a forward may read or write draft KV next (a drafted step, a prefill, a step through
upstream's verify): one projection for the whole pause, at the cost of one step's.

Why the written state is the same as writing every step: the rows are kept in step order and a batch writes each
slot's newest row only. A slot can come back within a pause (a request finishes, the allocator hands its slot to
another request's next token): the newer row is the one a step-by-step injection would have left. Writes that do
not go through here (a prefill's injection, upstream's ``commit_hidden``) run only after :meth:`flush`, so no held
row can land on top of them. Rows of a request that finished while held are written too: its tokens may stay in the
radix cache and be the prefix of a later request, whose draft reads them.

Plain torch: the injection itself is handed in (``write``), so this holds no SGLang import.
"""

from __future__ import annotations

from typing import Callable

import torch

# Held rows beyond this many bytes of hidden states are written at once (a long pause under heavy load).
DEFAULT_MAX_BYTES = 32 << 20

WriteRows = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (hidden [N, H], cache_loc [N], positions [N])


def newest_row_per_slot(cache_loc: torch.Tensor) -> torch.Tensor | None:
    """Indices (ascending) of the last row written to each slot; None when no slot repeats."""
    unique, inverse = torch.unique(cache_loc, return_inverse=True)
    if unique.numel() == cache_loc.numel():
        return None
    order = torch.arange(cache_loc.numel(), device=cache_loc.device)
    last = torch.full((unique.numel(),), -1, dtype=order.dtype, device=cache_loc.device)
    last.scatter_reduce_(0, inverse, order, reduce="amax")
    return torch.sort(last).values


class PendingContextKv:
    """Target hidden states of skipped steps' tokens, waiting for one batched draft-KV write (module docstring).

    The rows are copied into buffers of its own, grown by doubling: holding on to each step's output tensors instead
    kept a heap of small blocks alive between the step's temporaries, and made every plain step slower than the
    injection it saves."""

    def __init__(self, write: WriteRows, *, max_bytes: int = DEFAULT_MAX_BYTES, initial_rows: int = 256) -> None:
        self._write = write
        self.max_bytes = int(max_bytes)
        self._initial_rows = int(initial_rows)
        self._hidden: torch.Tensor | None = None
        self._cache_loc: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self.pending_tokens = 0
        self.deferred_tokens = 0  # counters for /server_info
        self.flushes = 0

    def _holds_rows_like(self, hidden: torch.Tensor) -> bool:
        held = self._hidden
        return (held is not None and held.shape[1:] == hidden.shape[1:] and held.dtype == hidden.dtype
                and held.device == hidden.device)

    def _capacity_for(self, hidden: torch.Tensor, rows: int) -> int:
        """Rows the buffers must hold to take ``rows`` more (0: write what is held first)."""
        same_kind = self._holds_rows_like(hidden)
        if not same_kind and self.pending_tokens:
            return 0
        capacity = self._hidden.shape[0] if same_kind else 0
        needed = self.pending_tokens + rows
        if needed <= capacity:
            return capacity
        row_bytes = max(1, hidden[0].numel() * hidden.element_size())
        limit = max(rows, self.max_bytes // row_bytes)
        if needed > limit:
            return 0
        return min(limit, max(needed, 2 * capacity, self._initial_rows))

    def _grow(self, capacity: int, like: torch.Tensor) -> None:
        hidden = like.new_empty((capacity, *like.shape[1:]))
        cache_loc = torch.empty(capacity, dtype=torch.int64, device=like.device)
        positions = torch.empty(capacity, dtype=torch.int64, device=like.device)
        if self.pending_tokens:
            hidden[: self.pending_tokens].copy_(self._hidden[: self.pending_tokens])
            cache_loc[: self.pending_tokens].copy_(self._cache_loc[: self.pending_tokens])
            positions[: self.pending_tokens].copy_(self._positions[: self.pending_tokens])
        self._hidden, self._cache_loc, self._positions = hidden, cache_loc, positions

    def add(self, hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Hold one step's rows: ``hidden`` [bs, H], the draft-KV slots they go to and their positions."""
        rows = int(hidden.shape[0])
        if rows != cache_loc.shape[0] or rows != positions.shape[0]:
            raise ValueError(f"PendingContextKv.add: {rows} hidden rows, {cache_loc.shape[0]} slots, "
                             f"{positions.shape[0]} positions")
        capacity = self._capacity_for(hidden, rows)
        if capacity == 0:  # full, or rows of another shape: write what is held, then start again
            self.flush()
            capacity = self._capacity_for(hidden, rows)
        if not self._holds_rows_like(hidden) or capacity > self._hidden.shape[0]:
            self._grow(capacity, hidden)
        end = self.pending_tokens + rows
        self._hidden[self.pending_tokens:end].copy_(hidden)
        self._cache_loc[self.pending_tokens:end].copy_(cache_loc)
        self._positions[self.pending_tokens:end].copy_(positions)
        self.pending_tokens = end
        self.deferred_tokens += rows

    def flush(self) -> int:
        """Write every held row (each slot's newest only), in one call; returns the rows written."""
        count, self.pending_tokens = self.pending_tokens, 0
        if count == 0:
            return 0
        hidden, cache_loc, positions = self._hidden[:count], self._cache_loc[:count], self._positions[:count]
        keep = newest_row_per_slot(cache_loc)
        if keep is not None:
            hidden, cache_loc, positions = hidden[keep], cache_loc[keep], positions[keep]
        self.flushes += 1
        self._write(hidden, cache_loc, positions)
        return int(cache_loc.numel())

    def summary(self) -> dict:
        return {"deferred_tokens": self.deferred_tokens, "flushes": self.flushes, "pending_tokens": self.pending_tokens}
