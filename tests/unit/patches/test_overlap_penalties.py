"""The SGLang wiring of exact no-spec penalties under the overlap scheduler (sglang_dspark.patches.overlap_penalties),
without a server.

Contract: a request's penalizer row counts every generated token before the next token is sampled, exactly as
SGLang's non-overlap loop counts it (``cumulate_penalty_output_tokens`` with the previous result processed), fed from
the forward's resolved ``input_ids``; speculative batches and non-overlap batches keep upstream's code; the schedule
stream is fenced behind the feed.
"""

from __future__ import annotations

import contextlib
import pkgutil
import types

import pytest
import torch

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")
from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from sglang_dspark.patches import overlap_penalties  # noqa: E402
from sglang_dspark.patches import spec_penalties  # noqa: E402
from sglang_dspark.patches.spec_penalties import penalty_state  # noqa: E402

VOCAB = 32
PENALIZERS = {getattr(penaltylib, name) for name in spec_penalties.KNOWN_PENALIZERS}
# The upstream functions the hooks wrap (no unit test applies the HookRegistry's patches).
UPSTREAM_CUMULATE = ScheduleBatch.cumulate_penalty_output_tokens
UPSTREAM_ISOLATION = Scheduler._forward_isolation


def _req(frequency=0.0, presence=0.0, repetition=1.0, min_new_tokens=0, prompt=(7, 8, 9)):
    sampling = types.SimpleNamespace(
        frequency_penalty=frequency, presence_penalty=presence, repetition_penalty=repetition,
        min_new_tokens=min_new_tokens, stop_token_ids={2},
    )
    tokenizer = types.SimpleNamespace(additional_stop_token_ids=None, eos_token_id=1)
    return types.SimpleNamespace(sampling_params=sampling, eos_token_ids=None, tokenizer=tokenizer,
                                 origin_input_ids=list(prompt), output_ids=[])


class _Batch:
    """The ScheduleBatch fields the hooks and upstream's cumulate read."""

    def __init__(self, reqs, *, overlap, spec=SpeculativeAlgorithm.NONE, mode=ForwardMode.DECODE):
        self.reqs = reqs
        self.device = "cpu"
        self.enable_overlap = overlap
        self.spec_algorithm = spec
        self.forward_mode = mode
        self.input_ids = None
        self.extend_lens = None
        orchestrator = penaltylib.BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=self, penalizers=PENALIZERS)
        self.sampling_info = _sampling_info(len(reqs), orchestrator)


def _sampling_info(bs, orchestrator):
    return SamplingBatchInfo(
        temperatures=torch.ones(bs, 1), top_ps=torch.ones(bs), top_ks=torch.ones(bs, dtype=torch.int32),
        min_ps=torch.zeros(bs), is_all_greedy=True, is_any_greedy=True, need_top_p_sampling=False,
        need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=VOCAB, penalizer_orchestrator=orchestrator,
        device="cpu",
    )


def _reqs():
    return [_req(frequency=0.5, repetition=1.3), _req(presence=1.5, min_new_tokens=4), _req(),
            _req(frequency=-1.0, presence=1.0, repetition=0.7)]


def _state_tensors(batch):
    state = penalty_state(batch.sampling_info.penalizer_orchestrator)
    names = ("cum_frequency", "cum_presence", "cum_repetition", "len_output")
    return {name: getattr(state, name).clone() for name in names if getattr(state, name) is not None}


def _assert_same_state(got, want):
    for name in want:
        assert torch.equal(got[name], want[name]), name


def _deferred(batch):
    return overlap_penalties.defer_cumulate_to_forward(UPSTREAM_CUMULATE, batch)


def test_every_hook_target_resolves():
    targets = [value for name, value in vars(overlap_penalties).items() if name.startswith("_")
               and isinstance(value, str) and value.startswith("sglang.srt.")]
    assert len(targets) == 2
    for target in targets:
        owner, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), attr)), target


@pytest.mark.parametrize("overlap,spec,deferred", [
    (True, SpeculativeAlgorithm.NONE, True),
    (False, SpeculativeAlgorithm.NONE, False),  # the non-overlap loop counts the right token already
    (True, SpeculativeAlgorithm.EAGLE, False),  # EAGLE feeds its own tokens through the same function
])
def test_only_overlap_nospec_defers(overlap, spec, deferred):
    batch = _Batch(_reqs(), overlap=overlap, spec=spec)
    calls = []
    overlap_penalties.defer_cumulate_to_forward(lambda self: calls.append(self), batch)
    assert calls == ([] if deferred else [batch])
    assert all(bool(getattr(r, overlap_penalties.PENDING_ATTR, False)) is deferred for r in batch.reqs)


def test_overlap_counts_each_token_before_the_next_step_like_non_overlap():
    """Step by step over a generated history: the non-overlap loop (result processed, then upstream's cumulate),
    upstream's overlap loop (result of the previous step not processed yet) and ours (deferred, fed the forward's
    input_ids). Ours equals non-overlap bit for bit at every step; upstream's overlap does not."""
    history = [[5, 7, 5, 9, 5, 3], [3, 3, 4, 2, 6, 6], [4, 4, 4, 4, 4, 6], [11, 12, 11, 11, 13, 12]]
    sync = _Batch(_reqs(), overlap=False)
    lagged = _Batch(_reqs(), overlap=True)
    ours = _Batch(_reqs(), overlap=True)
    upstream_differs = False
    for step in range(len(history[0])):
        new_tokens = [h[step] for h in history]
        # The prefill (step 0) or the previous decode sampled new_tokens; the next decode step is prepared now.
        for req, tok in zip(sync.reqs, new_tokens):
            req.output_ids.append(tok)
        UPSTREAM_CUMULATE(sync)
        UPSTREAM_CUMULATE(lagged)  # under overlap the result is processed after the next batch is prepared
        for req, tok in zip(lagged.reqs, new_tokens):
            req.output_ids.append(tok)
        _deferred(ours)
        ours.input_ids = torch.tensor(new_tokens, dtype=torch.int32)  # resolved from the FutureMap at forward entry
        assert overlap_penalties.feed_pending_input_tokens(ours)
        want = _state_tensors(sync)
        _assert_same_state(_state_tensors(ours), want)
        got_lagged = _state_tensors(lagged)
        upstream_differs |= any(not torch.equal(got_lagged[n], want[n]) for n in want)
    assert upstream_differs
    assert not any(getattr(r, overlap_penalties.PENDING_ATTR) for r in ours.reqs)  # owed tokens are paid once


def test_nothing_owed_feeds_nothing():
    batch = _Batch(_reqs(), overlap=True)
    batch.input_ids = torch.tensor([1, 2, 3, 4])
    before = _state_tensors(batch)
    assert not overlap_penalties.feed_pending_input_tokens(batch)
    _assert_same_state(_state_tensors(batch), before)


def test_mixed_chunk_feeds_only_the_decoding_rows():
    """A mixed chunk: prefill rows first (their extend tokens), then the running rows (one decode token each); only
    the running rows owe a token, and each gets its own."""
    prefill = [_req(frequency=0.7), _req(repetition=1.2)]
    running = [_req(frequency=0.5, repetition=1.3), _req(presence=1.5, min_new_tokens=4)]
    batch = _Batch(prefill + running, overlap=True, mode=ForwardMode.MIXED)
    for req in running:
        setattr(req, overlap_penalties.PENDING_ATTR, True)
    batch.extend_lens = [3, 2, 1, 1]
    batch.input_ids = torch.tensor([20, 21, 22, 23, 24, 9, 6])
    assert overlap_penalties.feed_pending_input_tokens(batch)
    want = _Batch(prefill + running, overlap=False)
    state = penalty_state(want.sampling_info.penalizer_orchestrator)
    from sglang_dspark.kernels.verify_penalties import cumulate_committed_tokens

    cumulate_committed_tokens(state, torch.tensor([[0], [0], [9], [6]]), torch.tensor([0, 0, 1, 1]))
    _assert_same_state(_state_tensors(batch), _state_tensors(want))
    got = _state_tensors(batch)
    assert got["cum_frequency"][2, 9] == 0.5 and got["cum_frequency"][:2].abs().sum() == 0
    assert got["len_output"].flatten().tolist() == [0, 0, 1, 1]


class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


def _scheduler(log):
    return types.SimpleNamespace(
        schedule_stream=_Stream(log, "schedule"), forward_stream=_Stream(log, "forward"),
        record_batch_in_overlap=lambda batch: log.append("pinned"),
    )


def test_forward_isolation_feeds_before_upstream_accumulates_the_penalties():
    """Through upstream's own _forward_isolation: the forward copy's penalties already count the fed token, the
    schedule stream is fenced once, and the scheduler's sampling info comes back afterwards."""
    log = []
    scheduler = _scheduler(log)
    batch = _Batch([_req(frequency=1.5), _req(presence=0.5)], overlap=True)
    _deferred(batch)
    batch.input_ids = torch.tensor([5, 6])
    sched_info = batch.sampling_info
    with overlap_penalties.forward_isolation_feeding_penalties(UPSTREAM_ISOLATION, scheduler, batch,
                                                                overlap=True):
        forward_info = batch.sampling_info
        assert forward_info is not sched_info and forward_info.penalizer_orchestrator is None
        penalties = forward_info.acc_additive_penalties
        assert penalties[0, 5] == -1.5 and penalties[1, 6] == -0.5
        assert penalties.count_nonzero() == 2
    assert batch.sampling_info is sched_info
    assert log == ["pinned", "schedule waits forward"]


@pytest.mark.parametrize("case", ["non-overlap", "speculative", "nothing owed"])
def test_forward_isolation_is_upstream_elsewhere(case):
    log = []
    scheduler = _scheduler(log)
    spec = SpeculativeAlgorithm.DSPARK if case == "speculative" else SpeculativeAlgorithm.NONE
    batch = _Batch([_req(frequency=1.5)], overlap=True, spec=spec)
    if case != "nothing owed":
        setattr(batch.reqs[0], overlap_penalties.PENDING_ATTR, True)
    batch.input_ids = torch.tensor([5])
    seen = []

    def original(self, batch, *, overlap):
        seen.append(overlap)
        return contextlib.nullcontext()

    overlap = case != "non-overlap"
    with overlap_penalties.forward_isolation_feeding_penalties(original, scheduler, batch, overlap=overlap):
        pass
    assert seen == [overlap]
    assert not log  # no fence
    assert _state_tensors(batch)["cum_frequency"].count_nonzero() == 0  # nothing fed
