"""Exact sampling penalties inside a speculative verify window (torch, no SGLang import).

SGLang's non-speculative sampler applies, before temperature/top-k/top-p and before ``logit_bias``
(``SamplingBatchInfo.apply_logits_bias`` -> ``_apply_pre_grammar_logits_transforms``, sampling_batch_info.py;
the forward copy made by ``copy_for_forward`` -> ``update_penalties`` carries them as ``acc_additive_penalties`` /
``acc_scaling_penalties``)::

    additive = zeros(V)
    additive -= cum_frequency            # frequency: f added once per occurrence in the output so far
    additive -= cum_presence             # presence: p on every token present in the output so far
    additive += stop_penalties  if len_output < min_new_tokens   # min_new_tokens: -inf on stop ids
    logits += additive
    logits = where(logits < 0, logits * cum_repetition, logits / cum_repetition)   # repetition: r on output tokens

Only generated tokens count, never prompt tokens (all four penalizers are fed by ``cumulate_output_tokens``, one
output token per decode step; ``penaltylib/*.py``). Frequency accumulates with ``scatter_add_`` (f added once per
occurrence, sequentially), presence and repetition with ``scatter_`` (set to p / r).

A verify window of width W holds ``window_ids[b] = [x0, d1, ..., d_{W-1}]``: ``x0`` is the last committed token
(already in the committed state) and ``d1..`` the draft. Its logits at position j predict the token after ``d_j``;
the non-speculative sampler would see them with ``d1..dj`` already generated, so position j must be penalised with
the committed state plus ``d1..dj`` (and ``len_output + j`` for min_new_tokens). Torch reference (what
:func:`penalize_verify_window` computes, bit for bit, without the loop or the W copies of [bs, V])::

    for j in range(W):
        state_j = copy(state); cumulate(state_j, window_ids[:, 1:j + 1])   # one token per step, as SGLang does
        logits[:, j] = sglang_apply(state_j, logits[:, j])                  # the formula above

(:func:`reference_penalize_verify_window` is that loop, for tests.) The fast version penalises every position with
the committed state (dense, broadcast over the window) and then rewrites, per position, only the <= W-1 columns the
draft tokens touch, computed from the original logits with the same float operations in the same order. Greedy
argmax and the rejection sampler then read the target distribution the non-speculative sampler would have used.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

import torch


@dataclass
class PenaltyState:
    """Penalty parameters and committed-output state of a batch, in SGLang's penalizer layout (None: penalizer off).

    ``frequency``/``presence``/``repetition``: [bs, 1] float32 per-request values (0, 0, 1 = off).
    ``cum_frequency``/``cum_presence``/``cum_repetition``: [bs, V] float32, SGLang's ``cumulated_*_penalties``
    over the committed output (zeros, zeros, ones when nothing was generated).
    ``min_new_tokens``/``len_output``: [bs, 1] int32; ``stop_penalties``: [bs, V] float32 (-inf on stop ids, else 0).
    """

    frequency: Optional[torch.Tensor] = None
    cum_frequency: Optional[torch.Tensor] = None
    presence: Optional[torch.Tensor] = None
    cum_presence: Optional[torch.Tensor] = None
    repetition: Optional[torch.Tensor] = None
    cum_repetition: Optional[torch.Tensor] = None
    min_new_tokens: Optional[torch.Tensor] = None
    len_output: Optional[torch.Tensor] = None
    stop_penalties: Optional[torch.Tensor] = None

    @property
    def active(self) -> bool:
        return (
            self.cum_frequency is not None
            or self.cum_presence is not None
            or self.cum_repetition is not None
            or self.len_output is not None
        )

    def clone(self) -> "PenaltyState":
        return replace(self, **{f.name: _clone(getattr(self, f.name)) for f in fields(self)})


def _clone(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.clone()


def scale(logits: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """SGLang's ``apply_scaling_penalties`` (repetition_penalty.py), out of place."""
    return torch.where(logits < 0, logits * factors, logits / factors)


def cumulate_committed_tokens(state: PenaltyState, tokens: torch.Tensor, num_new: torch.Tensor) -> None:
    """Feed newly committed output tokens, in order, as SGLang's ``cumulate_output_tokens`` would one step at a time.

    ``tokens``: [bs, n] int64, row b's first ``num_new[b]`` entries are its new tokens (the rest is ignored, any
    valid id); ``num_new``: [bs] int. Row b then carries exactly the state SGLang reaches after ``num_new[b]`` calls
    with those tokens; rows with fewer tokens are left bit-for-bit untouched on the extra steps. In place.
    """
    if tokens.dim() != 2 or tokens.shape[0] != num_new.shape[0]:
        raise ValueError(f"tokens must be [bs, n] with bs = len(num_new), got {tuple(tokens.shape)}")
    tokens = tokens.to(torch.int64)
    num_new = num_new.to(tokens.device)
    for i in range(tokens.shape[1]):
        valid = (num_new > i).unsqueeze(1)  # [bs, 1]
        index = tokens[:, i : i + 1]
        if state.cum_frequency is not None:
            # x + 0 leaves x unchanged, so invalid rows add 0 to an arbitrary column.
            state.cum_frequency.scatter_add_(1, index, torch.where(valid, state.frequency, 0.0))
        if state.cum_presence is not None:
            keep = state.cum_presence.gather(1, index)
            state.cum_presence.scatter_(1, index, torch.where(valid, state.presence, keep))
        if state.cum_repetition is not None:
            keep = state.cum_repetition.gather(1, index)
            state.cum_repetition.scatter_(1, index, torch.where(valid, state.repetition, keep))
        if state.len_output is not None:
            state.len_output += valid.to(state.len_output.dtype)


def _sglang_apply(state: PenaltyState, logits: torch.Tensor) -> torch.Tensor:
    """SGLang's forward-path penalty on [bs, V] logits (update_penalties + _apply_pre_grammar_logits_transforms)."""
    additive = torch.zeros_like(logits, dtype=torch.float32)
    if state.cum_frequency is not None:
        additive = additive - state.cum_frequency
    if state.len_output is not None:
        active = state.len_output < state.min_new_tokens
        additive = additive + torch.where(active, state.stop_penalties, 0.0)
    if state.cum_presence is not None:
        additive = additive - state.cum_presence
    logits = (logits + additive).to(logits.dtype)
    if state.cum_repetition is not None:
        logits = scale(logits, state.cum_repetition).to(logits.dtype)
    return logits


def reference_penalize_verify_window(logits: torch.Tensor, window_ids: torch.Tensor, state: PenaltyState):
    """The loop of the module docstring: a fresh state per position, fed one token at a time. Out of place."""
    bs, width, _ = logits.shape
    out = torch.empty_like(logits)
    for j in range(width):
        state_j = state.clone()
        if j:
            cumulate_committed_tokens(
                state_j, window_ids[:, 1 : j + 1], torch.full((bs,), j, device=window_ids.device)
            )
        out[:, j] = _sglang_apply(state_j, logits[:, j])
    return out


def penalize_verify_window(logits: torch.Tensor, window_ids: torch.Tensor, state: PenaltyState) -> torch.Tensor:
    """Penalise verify logits per position, exactly as the non-speculative sampler would (module docstring).

    ``logits``: [bs, W, V] (or [bs * W, V], viewed as such), float, modified in place and returned.
    ``window_ids``: [bs, W] int, column 0 the committed anchor, columns 1.. the draft tokens.
    ``state``: the committed state (not modified).
    """
    if not state.active:
        return logits
    bs, width = window_ids.shape
    logits_3d = logits.view(bs, width, -1)
    vocab = logits_3d.shape[-1]
    window_ids = window_ids.to(device=logits.device, dtype=torch.int64)
    k = width - 1

    if k > 0:
        cols = window_ids[:, 1:]  # [bs, K] the columns whose value depends on the position
        cols_3d = cols.unsqueeze(1).expand(bs, width, k)
        raw = logits_3d.gather(2, cols_3d).clone()  # original logits at those columns, every position
        # seen[b, j, c]: draft column c's token is among d1..dj (position j has generated d1..dj).
        same = cols.unsqueeze(2) == cols.unsqueeze(1)  # [bs, K(c), K(i)]: token of column c == d_{i+1}
        freq_cols = None
        if state.cum_frequency is not None:
            # Position j has generated d1..dj: add f once per earlier occurrence, one token at a time (scatter_add_).
            running = state.cum_frequency.gather(1, cols)
            steps = [running]
            for i in range(k):
                running = torch.where(same[:, :, i], running + state.frequency, running)
                steps.append(running)
            freq_cols = torch.stack(steps, dim=1)  # [bs, W, K]
        # seen_at[b, j, c] = any(same[b, c, :j])
        seen = torch.cumsum(same.to(torch.int32), dim=2) > 0  # [bs, K, K]: seen within d1..d_{i+1}
        seen_at = torch.cat([torch.zeros_like(seen[:, :, :1]), seen], dim=2).transpose(1, 2)  # [bs, W, K]
        additive = torch.zeros((bs, width, k), dtype=torch.float32, device=logits.device)
        if freq_cols is not None:
            additive = additive - freq_cols
        if state.cum_presence is not None:
            base = state.cum_presence.gather(1, cols).unsqueeze(1)
            additive = additive - torch.where(seen_at, state.presence.unsqueeze(1), base)
        vals = (raw + additive).to(logits.dtype)  # in-place add_ semantics: promoted, then rounded to the logits
        if state.cum_repetition is not None:
            base = state.cum_repetition.gather(1, cols).unsqueeze(1)
            vals = scale(vals, torch.where(seen_at, state.repetition.unsqueeze(1), base)).to(logits.dtype)

    # Every position with the committed state, as SGLang's forward path computes it (zeros - F - P, add, scale).
    additive = torch.zeros((bs, vocab), dtype=torch.float32, device=logits.device)
    if state.cum_frequency is not None:
        additive = additive - state.cum_frequency
    if state.cum_presence is not None:
        additive = additive - state.cum_presence
    logits_3d.add_(additive.unsqueeze(1))
    if state.cum_repetition is not None:
        logits_3d.copy_(scale(logits_3d, state.cum_repetition.unsqueeze(1)))
    if k > 0:
        # Duplicate columns carry identical values (same token, same history), so the scatter is deterministic.
        logits_3d.scatter_(2, cols_3d, vals)

    if state.len_output is not None:
        # min_new_tokens: stop ids are -inf while fewer than min_new_tokens tokens exist before the position.
        # -inf added before or after the scaling gives the same -inf (and NaN from +inf alike).
        positions = torch.arange(width, device=logits.device, dtype=state.len_output.dtype)
        active = (state.len_output + positions.unsqueeze(0)) < state.min_new_tokens  # [bs, W]
        for j in range(width):
            logits_3d[:, j].add_(torch.where(active[:, j : j + 1], state.stop_penalties, 0.0))
    return logits
