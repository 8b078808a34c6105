"""Prompt lookup as a source of our planner (engine/lookup_source.py) and a drafted step's lookup rows
(engine/worker.with_lookup_rows), on fake SGLang batches: nothing here needs a server."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest
import torch

from sglang_dspark.engine.lookup_source import NULL_LOOKUP, LookupSource, current_rows
from sglang_dspark.engine.step_record import StepRecord
from sglang_dspark.scheduling.draft_gate import GateDecision
from sglang_dspark.scheduling.step_choice import choose_chains
from sglang_dspark.scheduling.step_plan import StepPlan
from sglang_dspark.patches.lookup_current_tokens import LAUNCH_ATTRIBUTE, BatchLaunch
from sglang_dspark.scheduling.draft_gate import FlatCost

GAMMA = 4


def _req(rid, prompt, output):
    return SimpleNamespace(rid=rid, origin_input_ids=list(prompt), output_ids=list(output))


def _batch(reqs, seq_lens=None):
    if seq_lens is None:  # current tokens: the anchor (last output token) is not in the KV yet
        seq_lens = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
    return SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor(seq_lens), spec_info=None)


def _plan(source, batch, *, drafted, draft_survival, cost):
    """The source's proposals for ``batch``, the rows the chooser gives a chain (scheduling/step_choice.py), and what
    the source learns from that choice; the chosen chains (None: none)."""
    proposed = source.propose(batch)
    if proposed is None:
        return None
    chains = choose_chains(proposed, drafted=drafted, draft_survival=draft_survival, cost=cost, forced=source.forced)
    source.chosen(StepPlan.decided(GateDecision(drafted, "test"), compact_ok=False, plain_ok=False, lookup=chains),
                  len(proposed.lengths), cost)
    return chains


def _record(*, drafted=True, lookup=None, overlap_given_up=False, **fields):
    """A step record of a step planned with the draft (``drafted``) and these lookup rows."""
    return StepRecord(plan=StepPlan(draft=drafted, lookup=lookup, overlap_given_up=overlap_given_up), **fields)


REPEATING = _req("a", [5, 6, 7, 8, 9, 5, 6], [7])  # tail (5, 6, 7) recurs: propose 8, 9, 5, 6
FRESH = _req("b", [1, 2, 3], [4])  # no recurring tail


def test_a_step_without_the_draft_verifies_what_pays_and_only_current_rows():
    source = LookupSource(GAMMA)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    assert plan is not None and plan.lengths.tolist() == [4, 0] and plan.tokens[0].tolist() == [8, 9, 5, 6]
    assert plan.rows.tolist() == [True, False] and (plan.conditional[1] == 0).all()
    # Tokens one step behind the KV (SGLang's overlap scheduler): no proposal for that row.
    stale = _batch([REPEATING], seq_lens=[len(REPEATING.origin_input_ids) + len(REPEATING.output_ids)])
    assert source.propose(stale) is None
    assert source.planned_steps == 2 and source.plan_seconds > 0


def test_gate_rows_without_a_proposal_keep_their_draft_survival():
    from sglang_dspark.scheduling.step_choice import without_rows

    proposed = LookupSource(GAMMA).propose(_batch([REPEATING, FRESH]))
    survival = torch.full((2, GAMMA), 0.8)
    gated = without_rows(survival, proposed.rows)
    assert gated[0].eq(0).all() and gated[1].eq(0.8).all() and survival.eq(0.8).all()
    assert without_rows(None, proposed.rows) is None and without_rows(survival, None) is survival


def test_a_drafted_step_keeps_the_draft_where_it_expects_more():
    source = LookupSource(GAMMA)
    strong_draft = torch.ones(2, GAMMA)
    assert _plan(source, _batch([REPEATING, FRESH]), drafted=True, draft_survival=strong_draft, cost=None) is None
    weak_draft = torch.full((2, GAMMA), 0.1)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=True, draft_survival=weak_draft, cost=None)
    assert plan.lengths.tolist() == [4, 0]


def test_forced_verifies_every_proposal_even_on_a_drafted_step():
    source = LookupSource(GAMMA, forced=True)
    plan = _plan(source, _batch([REPEATING]), drafted=True, draft_survival=torch.ones(1, GAMMA), cost=FlatCost(1.0))
    assert plan.lengths.tolist() == [4]


def test_records_teach_the_calibration_and_count_each_source():
    source = LookupSource(GAMMA)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    before = source.calibration.conditional(3, 4).clone()
    # Row 0 verified its 4 lookup tokens and 3 were accepted (+ the bonus): committed 4; row 1 its anchor only.
    source.observe(_record(verify_lens=[5, 1], commit_lens=[4, 1], confidence=None, seconds=0.01, drafted=False,
                              lookup=plan))
    after = source.calibration.conditional(3, 4)
    assert (after[:3] > before[:3]).all() and after[3] < before[3]
    source.observe(_record(verify_lens=[3, 2], commit_lens=[1, 3], confidence=None, seconds=0.01, drafted=True))
    summary = source.summary()
    assert summary["steps"] == {"plain": 0, "drafted": 1, "lookup": 1, "mixed": 0}
    assert summary["lookup"]["rows"] == 1 and summary["lookup"]["verified"] == 4 and summary["lookup"]["accepted"] == 3
    assert summary["draft"] == {"rows": 2, "verified": 3, "accepted": 1, "accept_length": 1.5}
    assert summary["lookup"]["ece"] is not None and summary["plan_us_per_step"] > 0


def test_from_env_is_the_null_source_when_off(monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_LOOKUP", "off")
    off = LookupSource.from_env(GAMMA)
    assert off is NULL_LOOKUP and not off.enabled and off.propose(_batch([REPEATING])) is None
    assert not off.needs_current_tokens([REPEATING]) and off.summary() is None
    monkeypatch.setenv("SGLANG_DSPARK_LOOKUP", "forced")
    source = LookupSource.from_env(GAMMA)
    assert source.forced and source.enabled


def test_a_drafted_step_s_lookup_rows_get_their_chain_a_point_mass_and_their_estimates():
    pytest.importorskip("sglang")
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult, DraftProposal

    from sglang_dspark.engine.worker import with_lookup_rows

    source = LookupSource(GAMMA)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=True, draft_survival=torch.zeros(2, GAMMA), cost=None)
    vocab = 12
    block = DraftBlockResult(draft_tokens=torch.full((2, GAMMA), 3), corrected_logits=torch.randn(2, GAMMA, vocab),
                             greedy_mask=torch.zeros(2, dtype=torch.bool), temperatures=torch.ones(2),
                             greedy_draft=False)
    proposal = DraftProposal(draft_block_ids=torch.zeros(2, GAMMA, dtype=torch.long), draft_block=block,
                             confidence=torch.full((2, GAMMA), 0.7), folded=True, verify_ids=torch.zeros(2, 5))
    mixed = with_lookup_rows(proposal, plan, "cpu")
    assert mixed.draft_block.draft_tokens[0].tolist() == [8, 9, 5, 6] and mixed.draft_block.draft_tokens[1].eq(3).all()
    q = torch.softmax(mixed.draft_block.corrected_logits / 0.7, dim=-1)
    assert torch.equal(q[0], torch.nn.functional.one_hot(torch.tensor([8, 9, 5, 6]), vocab).float())
    assert torch.equal(mixed.draft_block.corrected_logits[1], block.corrected_logits[1])
    assert torch.allclose(mixed.confidence[0], plan.conditional[0].float()) and mixed.confidence[1].eq(0.7).all()
    assert not mixed.folded and mixed.verify_ids is None
    assert isinstance(mixed, DraftProposal) and msgspec.structs.asdict(mixed)["draft_block_ids"] is proposal.draft_block_ids


def test_a_proposal_never_exceeds_what_the_request_may_still_commit():
    source = LookupSource(GAMMA)
    almost_done = _req("a", REPEATING.origin_input_ids, REPEATING.output_ids)
    almost_done.sampling_params = SimpleNamespace(max_new_tokens=3)  # 1 output so far: 2 more, the bonus included
    plan = _plan(source, _batch([almost_done]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    assert plan.lengths.tolist() == [1] and plan.tokens[0].tolist() == [8, 0, 0, 0]
    done = _req("b", REPEATING.origin_input_ids, REPEATING.output_ids)
    done.sampling_params = SimpleNamespace(max_new_tokens=2)
    assert source.propose(_batch([done])) is None


class CpuLikeCost:
    """Seconds of a step without the draft, shaped like the 2-core CPU table at 16 requests: 115 ms at one token per
    request, a +16 % cliff at the first extra token, then 3.8 ms per token."""

    def steps_per_second(self, num_requests, verify_tokens):
        b = torch.as_tensor(verify_tokens, dtype=torch.float64)
        extra = (b - num_requests).clamp(min=0)
        seconds = torch.where(extra > 0, 0.1339 + 0.0038 * (extra - 1), torch.full_like(b, 0.1154))
        return 1.0 / seconds if isinstance(verify_tokens, torch.Tensor) else float(1.0 / seconds)


def _verify(source, plan, accepted_per_row: int):
    """A step that verified ``plan`` and accepted ``accepted_per_row`` chain tokens of every row (at most its length)."""
    commits = (1 + torch.clamp(plan.lengths, max=accepted_per_row)).tolist()
    source.observe(_record(verify_lens=(1 + plan.lengths).tolist(), commit_lens=commits, confidence=None,
                              seconds=0.2, drafted=False, lookup=plan))


def test_a_fresh_server_explores_chains_the_prior_mean_would_never_pay_for_and_keeps_those_that_pay():
    """16 requests, each with a 4-token chain, on a CPU-like cost: at the prior's mean (0.5 a position) no chain
    pays, so a planner reading only the mean would never verify one and never learn. The first step with proposals
    explores (the optimistic estimate) and verifies them; the next 15 plan with the mean. Chains that were all
    rejected are not tried again, even by the next exploring step; chains that were all accepted lift the mean
    above the pay line, and the steps after verify them on the mean alone."""
    rows = [_req(f"r{i}", REPEATING.origin_input_ids, REPEATING.output_ids) for i in range(16)]
    choice = dict(drafted=False, draft_survival=None, cost=CpuLikeCost())
    failing = LookupSource(GAMMA)
    plan = _plan(failing, _batch(rows), **choice)
    assert plan is not None and plan.explored and int(plan.lengths.sum()) >= 16
    _verify(failing, plan, accepted_per_row=0)
    assert all(_plan(failing, _batch(rows), **choice) is None for _ in range(15 + 16))  # 15 on the mean, a 2nd explore
    paying = LookupSource(GAMMA)
    plan = _plan(paying, _batch(rows), **choice)
    _verify(paying, plan, accepted_per_row=GAMMA)
    later = _plan(paying, _batch(rows), **choice)
    assert later is not None and not later.explored and int(later.lengths.sum()) >= 16
    expected = torch.cumprod(later.conditional, dim=-1).sum(dim=-1)
    assert torch.equal(later.conditional[0, :2], paying.calibration.conditional(int(later.match_lens[0]), 2))
    assert bool((expected > 1.5).all())


class StepPerToken:
    """Every verified token as dear as a whole plain step: no chain ever pays."""

    def steps_per_second(self, num_requests, verify_tokens):
        return 1.0 / torch.as_tensor(verify_tokens, dtype=torch.float64) if isinstance(verify_tokens, torch.Tensor) \
            else 1.0 / verify_tokens


def test_batches_keep_the_overlap_at_a_load_where_no_chain_was_verified_lately():
    """16 planned steps of 2 requests with a proposal and a verify too costly for any chain: matched batches of that
    load then keep SGLang's overlap (one in 16 still runs on current tokens); a step that verifies a chain gives
    current tokens back to every matched batch. A batch without a match never asks for them."""
    source = LookupSource(GAMMA)
    batch = _batch([REPEATING, FRESH])
    assert source.needs_current_tokens(batch.reqs) and not source.needs_current_tokens([FRESH])
    for _ in range(16):
        assert _plan(source, batch, drafted=False, draft_survival=None, cost=StepPerToken()) is None
    asked = [source.needs_current_tokens(batch.reqs) for _ in range(32)]
    assert asked.count(True) == 2 and source.summary()["overlap_kept_at"] == [2]
    assert _plan(source, batch, drafted=False, draft_survival=None, cost=FlatCost(1.0)) is not None
    assert all(source.needs_current_tokens(batch.reqs) for _ in range(4)) and source.summary()["overlap_kept_at"] == []


def test_the_trace_compares_what_a_lookup_step_expected_with_what_it_got():
    source = LookupSource(GAMMA)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    record = _record(verify_lens=[5, 1], commit_lens=[3, 1], confidence=None, seconds=0.2, drafted=False,
                        lookup=plan)
    fields = source.trace_fields(record, FlatCost(0.25))
    expected = float(torch.cumprod(plan.conditional[0], dim=0).sum())
    assert fields == {"lookup_rows": 1, "lookup_tokens": 4, "lookup_expected": round(expected, 4),
                      "lookup_accepted": 2, "lookup_explored": True, "lookup_predicted_seconds": 0.25}
    assert "lookup_predicted_seconds" not in source.trace_fields(record, None)


def test_greedy_and_sampled_rows_plan_and_learn_with_their_own_class():
    """A greedy and a T = 0.7 request with the same chain: verifies that accepted the greedy row's chain and rejected
    the sampled row's teach each class its own rate, and the next plan reads each row's own."""
    from sglang_dspark.lookup.calibration import GREEDY, sampling_class

    greedy = _req("g", REPEATING.origin_input_ids, REPEATING.output_ids)
    greedy.sampling_params = SimpleNamespace(temperature=1.0, top_k=1, max_new_tokens=64)
    warm = _req("w", REPEATING.origin_input_ids, REPEATING.output_ids)
    warm.sampling_params = SimpleNamespace(temperature=0.7, top_k=1 << 30, max_new_tokens=64)
    source = LookupSource(GAMMA, forced=True)
    for _ in range(20):
        plan = _plan(source, _batch([greedy, warm]), drafted=False, draft_survival=None, cost=None)
        assert plan.kinds.tolist() == [GREEDY, sampling_class(0.7, 1 << 30)]
        source.observe(_record(verify_lens=(1 + plan.lengths).tolist(), commit_lens=[1 + GAMMA, 1],
                                  confidence=None, seconds=0.2, drafted=False, lookup=plan))
    plan = _plan(source, _batch([greedy, warm]), drafted=False, draft_survival=None, cost=None)
    assert bool((plan.conditional[0] > 0.9).all()) and float(plan.conditional[1, 0]) < 0.1


def _overlap_batch(reqs, *, tokens_current=True, overlap_given_up=False, block=8):
    """A decode batch as SGLang builds it on fa3, fa4, trtllm or triton under the overlap scheduler: no host sequence
    lengths (``resolve_seq_lens_cpu`` sets them to None), the spec info's host lengths the KV reservation
    (committed + two blocks), each request's committed KV length on the host (``req.kv``), and the launch facts of
    patches/lookup_current_tokens.py."""
    for req in reqs:
        if not hasattr(req, "kv"):
            req.kv = SimpleNamespace(kv_committed_len=len(req.origin_input_ids) + len(req.output_ids) - 1)
    reservation = [r.kv.kv_committed_len + 2 * block for r in reqs]
    batch = SimpleNamespace(reqs=reqs, seq_lens_cpu=None, spec_info=SimpleNamespace(nxt_kv_lens_cpu=reservation))
    setattr(batch, LAUNCH_ATTRIBUTE, BatchLaunch(tokens_current=tokens_current, overlap_given_up=overlap_given_up))
    return batch


def test_a_batch_built_like_fa3_s_overlap_path_gets_proposals_from_committed_lengths():
    source = LookupSource(GAMMA)
    batch = _overlap_batch([_req("a", REPEATING.origin_input_ids, REPEATING.output_ids), FRESH])
    plan = _plan(source, batch, drafted=False, draft_survival=None, cost=FlatCost(1.0))
    assert plan is not None and plan.lengths.tolist() == [4, 0] and plan.tokens[0].tolist() == [8, 9, 5, 6]
    # The reservation is never an anchor: without the launch facts and host lengths, nothing is current.
    bare = SimpleNamespace(reqs=batch.reqs, seq_lens_cpu=None, spec_info=batch.spec_info)
    assert current_rows(bare, bare.reqs) == [False, False] and source.propose(bare) is None
    # Tokens a step behind: a result was still queued at the launch, or the host holds fewer than committed + 1.
    assert source.propose(_overlap_batch(batch.reqs, tokens_current=False)) is None
    behind = _req("c", REPEATING.origin_input_ids, REPEATING.output_ids)
    behind.kv = SimpleNamespace(kv_committed_len=len(REPEATING.origin_input_ids) + len(REPEATING.output_ids))
    assert current_rows(_overlap_batch([behind]), [behind]) == [False]


def test_waits_that_bring_no_chain_teach_the_policy_to_keep_the_overlap():
    """A fa3-like batch whose tail recurs but proposes nothing current (its request is a step behind the KV) gives up
    the overlap while nothing is known; after ``patience`` such waits matched batches keep it (one in patience
    still waits), although no step ever had a proposal."""
    source = LookupSource(GAMMA)
    behind = _req("c", REPEATING.origin_input_ids, REPEATING.output_ids)
    behind.kv = SimpleNamespace(kv_committed_len=0)  # never equal to the held tokens - 1
    patience = source.current_tokens.patience
    for _ in range(patience):
        assert source.needs_current_tokens([behind])
        assert source.propose(_overlap_batch([behind], overlap_given_up=True)) is None
    asked = [source.needs_current_tokens([behind]) for _ in range(2 * patience)]
    assert asked.count(True) == 2 and source.summary()["overlap_kept_at"] == [1]
    assert source.summary()["overlap_given_up_steps"] == patience


def test_a_gpu_wait_that_costs_more_than_the_chains_save_keeps_the_overlap():
    """On a device (``on_host=False``) the wait costs the gap prior until the step records time it; chains whose
    predicted saving is below it stop the waits. On the host the same chains keep them (a free wait)."""
    rows = [_req(f"r{i}", REPEATING.origin_input_ids, REPEATING.output_ids) for i in range(2)]
    choice = dict(drafted=False, draft_survival=None, cost=FlatCost(0.002))  # a 2 ms step whatever it verifies

    def run(on_host):
        source = LookupSource(GAMMA, on_host=on_host)
        for _ in range(16):
            plan = _plan(source, _overlap_batch(rows, overlap_given_up=True), **choice)
            assert plan is not None
            _verify(source, plan, accepted_per_row=0)  # every chain rejected: the estimate falls, the saving too
        # Still verified every step (a free verify pays for any chain), but saving under 1 ms a step by now.
        assert 0 < source.summary()["chain_saving_ms"][2] < 1.0 and source.summary()["overlap_kept_at"] in ([], [2])
        return source

    assert all(run(True).needs_current_tokens(rows) for _ in range(8))
    gpu = run(False)
    assert gpu.overlap_gap.seconds(2) > 1e-3  # the prior: nothing timed yet
    assert [gpu.needs_current_tokens(rows) for _ in range(16)].count(True) == 1


def test_the_records_teach_the_gap_the_wait_costs():
    source = LookupSource(GAMMA, on_host=False)
    plain = dict(verify_lens=[1, 1], commit_lens=[1, 1], confidence=None, seconds=0.01, drafted=False)
    for _ in range(8):
        source.observe(_record(**plain, gap_seconds=0.004, overlap_given_up=True))
        source.observe(_record(**plain, gap_seconds=0.001))
        source.observe(_record(**plain, gap_seconds=None))  # not timed: not counted
    assert source.overlap_gap.seconds(2) == pytest.approx(0.003)
    assert source.summary()["overlap_gap"][2] == {"ms": 3.0, "learned": True, "samples": [8, 8]}


def test_a_lookup_only_step_s_verify_lengths_reach_the_device_without_a_host_sync(monkeypatch):
    """Issue #46: the lengths of a step without the draft are built on the host; their copy to the device is pinned and
    non-blocking (a pageable ``.to(device)`` is a copy plus a stream synchronize). ``meta`` stands in for the device."""
    pytest.importorskip("sglang")
    from sglang_dspark.engine.planner import AdmissionVerifyPlanner
    from sglang_dspark.engine.current_step import CurrentStep

    copies = []
    real_to = torch.Tensor.to

    def pinned(self):
        pinned_tensor = self.clone()
        pinned_tensor.is_pinned_for_test = True
        return pinned_tensor

    def to(self, *args, **kwargs):
        if args and str(args[0]) == "meta":
            copies.append((getattr(self, "is_pinned_for_test", False), kwargs.get("non_blocking", False)))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pinned)
    monkeypatch.setattr(torch.Tensor, "to", to)
    source = LookupSource(GAMMA)
    lookup = _plan(source, _batch([REPEATING, FRESH]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    planner = SimpleNamespace(step=CurrentStep(), last_confidence=None)
    planner.step.plan = StepPlan(draft=False, lookup=lookup)
    lens = AdmissionVerifyPlanner._schedule_verify_lens(planner, req_pool_indices=torch.zeros(2), prefix_lens=None,
                                                        device="meta", confidence=None, budget=0)
    assert lens.device.type == "meta" and lens.dtype == torch.int32 and lens.shape == (2,)
    assert copies == [(True, True)]


def test_the_summary_carries_the_chain_length_histograms():
    """/server_info's lookup section: how long each verified chain was and how much of it was accepted, per row."""
    source = LookupSource(GAMMA)
    plan = _plan(source, _batch([REPEATING, FRESH]), drafted=False, draft_survival=None, cost=FlatCost(1.0))
    source.observe(_record(verify_lens=[5, 1], commit_lens=[3, 1], confidence=None, seconds=0.2, drafted=False,
                           lookup=plan))
    source.observe(_record(verify_lens=[5, 1], commit_lens=[5, 1], confidence=None, seconds=0.2, drafted=False,
                           lookup=plan))
    lookup = source.summary()["lookup"]
    assert lookup["verified_lengths"] == {"4": 2} and lookup["accepted_lengths"] == {"2": 1, "4": 1}


def test_the_load_test_diffs_the_histograms_per_level():
    from sglang_dspark.loadtest.engine import lookup_delta

    before = {"lookup": {"rows": 1, "verified_lengths": {"4": 1}, "accepted_lengths": {"2": 1}}}
    after = {"lookup": {"rows": 3, "verified_lengths": {"4": 2, "7": 1}, "accepted_lengths": {"2": 1, "7": 2}}}
    delta = lookup_delta(before, after)["lookup"]
    assert delta["verified_lengths"] == {"4": 1, "7": 1} and delta["accepted_lengths"] == {"7": 2}


def test_the_shared_cache_proposes_from_a_finished_request_and_learns_apart(monkeypatch):
    """A finished request's tokens propose for a later one (source SHARED, own calibration bucket, counted and
    summarised); with the switch off, or under the key scope for another tenant, nothing is shared."""
    from sglang_dspark.lookup.calibration import SHARED

    monkeypatch.setenv("SGLANG_DSPARK_LOOKUP", "on")
    monkeypatch.setenv("SGLANG_DSPARK_SHARED_LOOKUP", "key")
    source = LookupSource.from_env(GAMMA)
    first = SimpleNamespace(rid="first", origin_input_ids=[1, 2, 3], output_ids=[10, 11, 40, 41, 42, 43],
                            extra_key=None, cache_salt=None)
    assert source.propose(_batch([first])) is None  # its own context has no recurring tail
    later = SimpleNamespace(rid="later", origin_input_ids=[7, 8], output_ids=[10, 11], extra_key=None,
                            cache_salt=None)
    chains = source.propose(_batch([later]))  # "first" left the batch: its tokens are in the shared cache
    assert chains is not None and chains.tokens[0].tolist() == [40, 41, 42, 43]
    assert chains.sources.tolist() == [SHARED]
    plan = choose_chains(chains, drafted=False, draft_survival=None, cost=None, forced=True)
    source.observe(_record(drafted=False, lookup=plan, verify_lens=[5], commit_lens=[3], confidence=None,
                           seconds=0.01))
    assert source.calibration.tried[0, 4, 0] == 1 and source.calibration.tried[0, :4].sum() == 0  # shared bucket
    summary = source.summary()["shared"]
    assert summary["scope"] == "key" and summary["requests"] == 1 and summary["proposals"] == 1
    assert summary["rows"] == 1 and summary["accepted"] == 2 and summary["hit_rate"] == 1.0
    assert summary["tokens"] <= summary["capacity_tokens"] and summary["entries"] > 0
    other_tenant = SimpleNamespace(rid="other", origin_input_ids=[7, 8], output_ids=[10, 11], extra_key="t2",
                                   cache_salt=None)
    assert source.propose(_batch([other_tenant])) is None

    monkeypatch.setenv("SGLANG_DSPARK_SHARED_LOOKUP", "off")
    alone = LookupSource.from_env(GAMMA)
    alone.propose(_batch([first]))
    assert alone.propose(_batch([later])) is None and alone.summary()["shared"] == {"scope": "off"}


def test_where_long_chains_run_proposals_go_past_the_block():
    """A server that runs chains past the draft's block (engine/long_chain_step.py) proposes up to max_chain_tokens;
    elsewhere proposals stop at γ."""
    text = list(range(100, 140))
    req = _req("long", text + [1, 2] + text[:3], [])
    req.output_ids = [text[3]]  # the anchor: the tail (..., 101, 102, 103) recurs at the start
    long = LookupSource(GAMMA, long_chains=True).propose(_batch([req]))
    assert long.width == 31 and long.lengths.tolist() == [31] and long.tokens[0, :3].tolist() == [104, 105, 106]
    assert (long.conditional[0] > 0).all()
    short = LookupSource(GAMMA).propose(_batch([req]))
    assert short.width == GAMMA and short.lengths.tolist() == [GAMMA]
