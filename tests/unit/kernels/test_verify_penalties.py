"""Per-position verify penalties (sglang_dspark.kernels.verify_penalties) against SGLang's own penalizers.

The reference is SGLang 0.5.23's ``penaltylib`` run on the CPU exactly as a non-speculative decode runs it: one
orchestrator per request, fed one output token per step (``cumulate_output_tokens``), and the forward-path
application (``update_penalties``: additive penalizers into zeros, then the scaling penalizer, then
``apply_scaling_penalties``). Position j of a verify window must equal that reference after the committed history
plus the draft tokens d1..dj, bit for bit.
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from sglang_dspark.kernels.verify_penalties import (
    PenaltyState,
    cumulate_committed_tokens,
    penalize_verify_window,
    reference_penalize_verify_window,
)

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties  # noqa: E402

# The compiled function's own Python body (same maths; compiling it costs tens of seconds per process).
_scale = getattr(apply_scaling_penalties, "_torchdynamo_orig_callable", apply_scaling_penalties)

VOCAB = 64
STOP_ID, EOS_ID = 3, 7  # min_new_tokens masks both
PENALIZERS = {
    penaltylib.BatchedFrequencyPenalizer,
    penaltylib.BatchedPresencePenalizer,
    penaltylib.BatchedRepetitionPenalizer,
    penaltylib.BatchedMinNewTokensPenalizer,
}


class _Batch:  # what the orchestrator reads of a ScheduleBatch (weak-referenceable)
    def __init__(self, reqs):
        self.reqs = reqs
        self.device = "cpu"


def _req(params: dict):
    sampling = types.SimpleNamespace(
        frequency_penalty=params.get("frequency", 0.0),
        presence_penalty=params.get("presence", 0.0),
        repetition_penalty=params.get("repetition", 1.0),
        min_new_tokens=params.get("min_new_tokens", 0),
        stop_token_ids={STOP_ID},
    )
    tokenizer = types.SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS_ID)
    return types.SimpleNamespace(sampling_params=sampling, eos_token_ids=None, tokenizer=tokenizer)


def _orchestrator(reqs):
    batch = _Batch(reqs)
    orch = penaltylib.BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=batch, penalizers=PENALIZERS)
    orch._keep_batch = batch  # the orchestrator holds only a weak reference
    return orch


def _state_of(orch) -> PenaltyState:
    """The tensors our SGLang hook reads from a live orchestrator (patches/spec_penalties.py does the same)."""
    pens = {type(p).__name__: p for p in orch.penalizers.values() if p.is_prepared()}
    state = PenaltyState()
    if "BatchedFrequencyPenalizer" in pens:
        p = pens["BatchedFrequencyPenalizer"]
        state.frequency, state.cum_frequency = p.frequency_penalties, p.cumulated_frequency_penalties
    if "BatchedPresencePenalizer" in pens:
        p = pens["BatchedPresencePenalizer"]
        state.presence, state.cum_presence = p.presence_penalties, p.cumulated_presence_penalties
    if "BatchedRepetitionPenalizer" in pens:
        p = pens["BatchedRepetitionPenalizer"]
        state.repetition, state.cum_repetition = p.repetition_penalties, p.cumulated_repetition_penalties
    if "BatchedMinNewTokensPenalizer" in pens:
        p = pens["BatchedMinNewTokensPenalizer"]
        state.min_new_tokens, state.len_output, state.stop_penalties = (
            p.min_new_tokens, p.len_output_tokens, p.stop_token_penalties
        )
    return state


def _sglang_forward_apply(orch, logits_row: torch.Tensor) -> torch.Tensor:
    """SamplingBatchInfo.update_penalties + _apply_pre_grammar_logits_transforms, on a copy."""
    logits = logits_row.clone()
    additive = torch.zeros((logits.shape[0], VOCAB), dtype=torch.float32)
    orch.accumulate_additive_penalties(additive)
    logits.add_(additive)
    scaling = orch.accumulate_scaling_penalties()
    if scaling is not None:
        _scale(logits, scaling)
    return logits


def _sglang_position(params, history, drafts, logits_row):
    """One request, non-speculative: feed history + drafts one token per step, then penalise one row."""
    orch = _orchestrator([_req(params)])
    for tok in list(history) + list(drafts):
        orch.cumulate_output_tokens(torch.tensor([tok], dtype=torch.int64))
    return _sglang_forward_apply(orch, logits_row.unsqueeze(0))[0]


CONFIGS = [
    {"frequency": 1.5},
    {"presence": 1.5},
    {"repetition": 1.1},
    {"repetition": 1.3},
    {"frequency": -0.7},
    {"repetition": 0.8},
    {"frequency": 0.3, "presence": 0.45, "repetition": 1.2},
    {"frequency": 1.5, "presence": -1.5, "repetition": 1.3, "min_new_tokens": 6},
    {"min_new_tokens": 4},
    {},
]


def _case(seed: int, configs, width: int = 8, small_vocab_ids: int = 6):
    """Random logits (both signs, some exact zeros) and histories/windows drawn from few ids, so tokens repeat."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(configs)
    logits = torch.randn(bs, width, VOCAB, generator=gen) * 4
    logits[logits.abs() < 0.05] = 0.0
    ids = torch.randint(0, small_vocab_ids, (bs, width + 12), generator=gen) * 5 % VOCAB
    hist_lens = torch.randint(0, 12, (bs,), generator=gen).tolist()
    history = [ids[b, :hist_lens[b]].tolist() for b in range(bs)]
    window = ids[:, 12:12 + width].clone()
    if hist_lens[0]:  # the anchor is the last committed token
        window[0, 0] = history[0][-1]
    return logits, history, window


def _batched_state(configs, history):
    orch = _orchestrator([_req(c) for c in configs])
    state = _state_of(orch)
    longest = max(1, max(len(h) for h in history))
    tokens = torch.zeros((len(configs), longest), dtype=torch.int64)
    for b, h in enumerate(history):
        tokens[b, : len(h)] = torch.tensor(h, dtype=torch.int64)
    cumulate_committed_tokens(state, tokens, torch.tensor([len(h) for h in history]))
    return orch, state


@pytest.mark.parametrize("seed", range(6))
def test_window_equals_sglang_token_by_token(seed):
    configs = [CONFIGS[(seed + i) % len(CONFIGS)] for i in range(len(CONFIGS))]
    logits, history, window = _case(seed, configs)
    _, state = _batched_state(configs, history)
    got = penalize_verify_window(logits.clone(), window, state)
    for b, params in enumerate(configs):
        for j in range(window.shape[1]):
            want = _sglang_position(params, history[b], window[b, 1 : j + 1].tolist(), logits[b, j])
            assert torch.equal(got[b, j], want), (params, b, j, (got[b, j] - want).abs().max())


@pytest.mark.parametrize("combo", list(itertools.combinations(range(4), 2)) + [(0, 1, 2, 3)])
def test_each_combination_in_one_batch(combo):
    singles = [{"frequency": 1.5}, {"presence": 1.5}, {"repetition": 1.3}, {"min_new_tokens": 5}]
    merged = {}
    for i in combo:
        merged.update(singles[i])
    configs = [merged, {}, merged]
    logits, history, window = _case(100 + len(combo), configs, width=6, small_vocab_ids=3)
    _, state = _batched_state(configs, history)
    got = penalize_verify_window(logits.clone().view(-1, VOCAB), window, state).view_as(logits)
    for b, params in enumerate(configs):
        for j in range(window.shape[1]):
            want = _sglang_position(params, history[b], window[b, 1 : j + 1].tolist(), logits[b, j])
            assert torch.equal(got[b, j], want), (params, b, j)


def test_committed_feed_equals_sglang_cumulation():
    """Variable numbers of accepted tokens per request and step give SGLang's state after one token per step."""
    configs = CONFIGS[:8]
    gen = torch.Generator().manual_seed(7)
    orch = _orchestrator([_req(c) for c in configs])
    state = _state_of(orch)
    singles = [_orchestrator([_req(c)]) for c in configs]
    for _step in range(6):
        num_new = torch.randint(0, 5, (len(configs),), generator=gen)
        tokens = torch.randint(0, 4, (len(configs), 4), generator=gen) * 3
        cumulate_committed_tokens(state, tokens, num_new)
        for b, single in enumerate(singles):
            for tok in tokens[b, : int(num_new[b])].tolist():
                single.cumulate_output_tokens(torch.tensor([tok]))
    for b, single in enumerate(singles):
        want = _state_of(single)
        for name in ("cum_frequency", "cum_presence", "cum_repetition", "len_output"):
            w, g = getattr(want, name), getattr(state, name)
            if w is None:
                continue
            assert torch.equal(g[b], w[0]), (configs[b], name)


def test_reference_loop_equals_fast_version_on_larger_windows():
    configs = CONFIGS
    logits, history, window = _case(11, configs, width=12, small_vocab_ids=2)
    _, state = _batched_state(configs, history)
    want = reference_penalize_verify_window(logits, window, state)
    got = penalize_verify_window(logits.clone(), window, state)
    assert torch.equal(got, want)


def test_width_one_is_the_plain_decode_penalty():
    configs = CONFIGS
    logits, history, window = _case(5, configs, width=1)
    _, state = _batched_state(configs, history)
    got = penalize_verify_window(logits.clone(), window, state)
    for b, params in enumerate(configs):
        assert torch.equal(got[b, 0], _sglang_position(params, history[b], [], logits[b, 0]))


def test_greedy_identity_needs_per_position_penalties():
    """The control: upstream's one-row-for-every-position penalty picks a different token than the exact one."""
    logits = torch.zeros(1, 3, VOCAB)
    logits[0, :, 10] = 5.0
    logits[0, :, 11] = 4.0
    window = torch.tensor([[1, 10, 10]])  # draft d1 = 10: position 1 must see one occurrence of 10
    orch, state = _batched_state([{"frequency": 1.5}], [[1]])
    exact = penalize_verify_window(logits.clone(), window, state)
    assert exact[0, 0].argmax() == 10 and exact[0, 1].argmax() == 11
    uniform = _sglang_forward_apply(orch, logits[0, 1:2])  # committed state only, as upstream does
    assert uniform[0].argmax() == 10
