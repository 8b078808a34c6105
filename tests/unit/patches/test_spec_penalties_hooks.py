"""The SGLang wiring of exact DSPARK penalties (sglang_dspark.patches.spec_penalties), without a server.

Hook targets must resolve in the installed SGLang; the scheduler-side feed must leave SGLang's own penalizer
tensors where one-token-per-step cumulation would; the verify hooks must hand upstream no sampling info and then
penalise the window they were given (anchor + drafts), before logit_bias.
"""

from __future__ import annotations

import pkgutil
import types

import pytest
import torch

from sglang_dspark.kernels.verify_penalties import penalize_verify_window

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")
from sglang_dspark.patches import spec_penalties  # noqa: E402

VOCAB = 32
PENALIZERS = {getattr(penaltylib, name) for name in spec_penalties.KNOWN_PENALIZERS}


class _Batch:
    def __init__(self, reqs):
        self.reqs = reqs
        self.device = "cpu"


def _req(frequency=0.0, presence=0.0, repetition=1.0, min_new_tokens=0, output_ids=()):
    sampling = types.SimpleNamespace(
        frequency_penalty=frequency,
        presence_penalty=presence,
        repetition_penalty=repetition,
        min_new_tokens=min_new_tokens,
        stop_token_ids={2},
    )
    tokenizer = types.SimpleNamespace(additional_stop_token_ids=None, eos_token_id=1)
    return types.SimpleNamespace(
        sampling_params=sampling, eos_token_ids=None, tokenizer=tokenizer, output_ids=list(output_ids)
    )


def _orchestrator(batch):
    return penaltylib.BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=batch, penalizers=PENALIZERS)


def test_every_hook_target_resolves():
    targets = [value for name, value in vars(spec_penalties).items() if name.startswith("_") and isinstance(value, str)
               and value.startswith("sglang.srt.")]
    assert len(targets) == 7
    for target in targets:
        owner, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), attr)), target


def test_feed_matches_one_token_per_step():
    reqs = [_req(frequency=0.5, repetition=1.3), _req(presence=1.5, min_new_tokens=4), _req()]
    batch = _Batch(reqs)
    batch.sampling_info = types.SimpleNamespace(penalizer_orchestrator=_orchestrator(batch))
    spec_penalties.remember_prefilled_outputs(None, batch)
    singles = []
    for req in reqs:
        single = _Batch([req])
        singles.append((single, _orchestrator(single)))
    history = [[5, 7, 5, 9], [3], [4, 4, 4, 4, 4, 6]]
    accepted = [[2, 2, 1], [1, 3, 2], [3, 1, 2]]  # tokens committed per DSPARK step, per request
    for step in range(3):
        for b, req in enumerate(reqs):
            start = sum(accepted[b][:step])
            new = history[b][start : start + accepted[b][step]]
            req.output_ids.extend(new)
            for tok in new:  # SGLang's non-speculative decode: one cumulate per generated token
                singles[b][1].cumulate_output_tokens(torch.tensor([tok]))
        spec_penalties.feed_committed_tokens(batch)
    state = spec_penalties.penalty_state(batch.sampling_info.penalizer_orchestrator)
    for b, (_, single) in enumerate(singles):
        want = spec_penalties.penalty_state(single)
        if want is None:  # a request without penalties: its rows stay neutral
            assert not state.cum_frequency[b].any() and not state.cum_presence[b].any()
            assert bool((state.cum_repetition[b] == 1).all())
            continue
        for name in ("cum_frequency", "cum_presence", "cum_repetition", "len_output"):
            if getattr(want, name) is not None:
                assert torch.equal(getattr(state, name)[b], getattr(want, name)[0]), (b, name)


def _executor_result(logits):
    return types.SimpleNamespace(logits_output=types.SimpleNamespace(next_token_logits=logits))


def _penalised_sampling_info(bs, logit_bias=None):
    reqs = [_req(frequency=1.5, repetition=1.2, output_ids=[3, 4]) for _ in range(bs)]
    batch = _Batch(reqs)
    orch = _orchestrator(batch)
    for tok in (3, 4):
        orch.cumulate_output_tokens(torch.full((bs,), tok))
    info = types.SimpleNamespace(logit_bias=logit_bias, has_custom_logit_processor=False)
    object.__setattr__(info, spec_penalties.STATE_ATTR, spec_penalties.penalty_state(orch))
    info._keep = (batch, orch)
    return info


def test_non_compact_hook_penalises_the_window_before_logit_bias():
    bs, width = 2, 4
    logits = torch.randn(bs * width, VOCAB)
    window = torch.tensor([[4, 3, 3, 9], [4, 8, 4, 8]])
    bias = torch.zeros(bs, VOCAB)
    bias[:, 11] = 2.5
    info = _penalised_sampling_info(bs, logit_bias=bias)
    seen = {}

    def original(self, *, sampling_info, verify_ids_2d, **kwargs):
        seen["sampling_info"] = sampling_info
        return _executor_result(logits.clone())

    result = spec_penalties.run_non_compact_with_penalties(original, None, sampling_info=info, verify_ids_2d=window)
    assert seen["sampling_info"] is None  # upstream's own adjustments are skipped
    want = penalize_verify_window(logits.clone(), window, getattr(info, spec_penalties.STATE_ATTR))
    want.view(bs, width, -1).add_(bias[:, None, :])
    assert torch.equal(result.logits_output.next_token_logits, want)


def test_compact_hook_uses_anchor_plus_drafts():
    bs, gamma = 2, 3
    logits = torch.randn(bs * (gamma + 1), VOCAB)
    draft_block_ids = torch.tensor([[4, 30, 30, 30], [4, 30, 30, 30]])  # anchor, then mask ids
    draft_tokens = torch.tensor([[3, 3, 9], [8, 4, 8]])
    info = _penalised_sampling_info(bs)

    def original(self, *, sampling_info, draft_block_ids, draft_tokens, **kwargs):
        assert sampling_info is None
        return _executor_result(logits.clone()), "hidden"

    target, hidden = spec_penalties.run_compact_with_penalties(
        original, None, sampling_info=info, draft_block_ids=draft_block_ids, draft_tokens=draft_tokens
    )
    window = torch.tensor([[4, 3, 3, 9], [4, 8, 4, 8]])
    want = penalize_verify_window(logits.clone(), window, getattr(info, spec_penalties.STATE_ATTR))
    assert hidden == "hidden"
    assert torch.equal(target.logits_output.next_token_logits, want)


def test_hooks_pass_through_without_penalties():
    plain = types.SimpleNamespace(logit_bias=None)
    calls = []

    def original(self, **kwargs):
        calls.append(kwargs["sampling_info"])
        return "upstream"

    assert spec_penalties.run_non_compact_with_penalties(original, None, sampling_info=plain, verify_ids_2d=None) == "upstream"
    assert calls == [plain]
    assert spec_penalties.adjustments_noop_unless_penalised(lambda info: "upstream", plain) == "upstream"
    assert spec_penalties.adjustments_noop_unless_penalised(lambda info: True, _penalised_sampling_info(1)) is False


def _penalised_dspark_decode_batch():
    algorithm = types.SimpleNamespace(is_dspark=lambda: True, is_none=lambda: False)
    mode = types.SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)
    orchestrator = types.SimpleNamespace(is_required=True)
    return types.SimpleNamespace(spec_algorithm=algorithm, forward_mode=mode, grammar_needs_sync=lambda: False,
                                 sampling_info=types.SimpleNamespace(penalizer_orchestrator=orchestrator))


@pytest.mark.parametrize("queued", [0, 1])
def test_overlap_disabled_for_a_penalised_decode_only_when_a_result_is_queued(queued):
    """SGLang's overlap loop answers True with ``result_queue.popleft()``, unchecked. The queue is empty after an
    iteration that ran no batch (KV pool full while a request finishes in flight): True there raised IndexError in
    the scheduler and killed the server (seen once in the soak). Runs SGLang's own method as the hook's original."""
    from collections import deque

    from sglang.srt.managers.scheduler import Scheduler

    scheduler = types.SimpleNamespace(require_mlp_sync=False, result_queue=deque([("batch", "result")] * queued))
    batch = _penalised_dspark_decode_batch()
    disable = spec_penalties.disable_overlap_for_penalised_dspark(
        Scheduler.is_disable_overlap_for_batch, scheduler, batch, last_batch=None
    )
    assert disable is bool(queued)
    if disable:
        scheduler.result_queue.popleft()  # what the loop does next: it must have something to pop
    plain = types.SimpleNamespace(**{**vars(batch), "sampling_info": types.SimpleNamespace(penalizer_orchestrator=None)})
    assert spec_penalties.disable_overlap_for_penalised_dspark(
        Scheduler.is_disable_overlap_for_batch, scheduler, plain, last_batch=None
    ) is False
