"""The KV a long lookup chain needs, reserved at plan time (engine/long_chain_step.reserve_chain_kv), on fakes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.engine.long_chain_step import reserve_chain_kv
from sglang_dspark.scheduling.draft_gate import GateDecision
from sglang_dspark.scheduling.step_plan import LookupChains, StepPlan

BLOCK = 4


class _Allocator:
    def __init__(self, free):
        self.free = free

    def available_size(self):
        return self.free


def _batch(committed, allocated, *, free=1000, evictable=0, row_width=200):
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=c, kv_allocated_len=a))
            for c, a in zip(committed, allocated)]
    return SimpleNamespace(
        reqs=reqs, seq_lens=torch.tensor(committed), req_pool_indices=torch.arange(len(reqs)),
        token_to_kv_pool_allocator=_Allocator(free), tree_cache=SimpleNamespace(evictable_size=lambda: evictable),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(len(reqs), row_width, dtype=torch.int64)),
    )


def _plan(lengths, width=10):
    rows = len(lengths)
    conditional = torch.tensor([[0.9] * n + [0.0] * (width - n) for n in lengths], dtype=torch.float64)
    chains = LookupChains(tokens=torch.arange(rows * width).reshape(rows, width), lengths=torch.tensor(lengths),
                          match_lens=torch.tensor([4] * rows), conditional=conditional)
    return StepPlan(draft=False, decision=GateDecision(False, "lookup"), lookup=chains)


@pytest.fixture
def allocations(monkeypatch):
    """SGLang's alloc_for_spec_decode, recorded (and applied to the fakes' allocated lengths)."""
    calls = []

    def fake(tree_cache, req_to_token_pool, *, reqs, req_pool_indices, cur_kv_lens, cur_kv_lens_cpu, nxt_kv_lens,
             nxt_kv_lens_cpu, num_needed_tokens, batch):
        calls.append((req_pool_indices.tolist(), cur_kv_lens_cpu.tolist(), nxt_kv_lens_cpu.tolist(), num_needed_tokens))
        for req, end in zip(reqs, nxt_kv_lens_cpu.tolist()):
            req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, end)

    import sglang.srt.mem_cache.allocation as allocation

    monkeypatch.setattr(allocation, "alloc_for_spec_decode", fake)
    return calls


def test_a_long_row_gets_its_window_and_the_next_steps(allocations):
    """Committed 20, allocated 28 (the usual 2 x (block + 1) past an older commit): a chain of 10 may commit 11
    tokens, and the next step's block + 1 window must still fit: slots up to 20 + 10 + 4 + 2 = 36."""
    batch = _batch([20, 30], [28, 40])
    plan = reserve_chain_kv(batch, _plan([10, 3]), BLOCK)
    assert allocations == [([0], [28], [36], 8)]
    assert batch.reqs[0].kv.kv_allocated_len == 36 and batch.reqs[1].kv.kv_allocated_len == 40
    assert plan.lookup.lengths.tolist() == [10, 3] and plan.verifies_past(BLOCK)


def test_rows_without_room_are_cut_to_the_block(allocations):
    # Free 20 + evictable 10 less the next reservation (2 rows x 2 x 5 = 20): room for 10 slots, row 0 needs 8,
    # row 1 (committed 30, allocated 34, chain 9) would need 30 + 9 + 6 - 34 = 11.
    batch = _batch([20, 30], [28, 34], free=20, evictable=10)
    plan = reserve_chain_kv(batch, _plan([10, 9]), BLOCK)
    assert allocations == [([0], [28], [36], 8)]
    assert plan.lookup.lengths.tolist() == [10, 4] and plan.lookup.width == 10
    assert (plan.lookup.conditional[1, 4:] == 0).all() and plan.lookup.total == 14


def test_a_plan_with_no_long_row_left_is_the_block_wide(allocations):
    batch = _batch([20], [28], free=0)
    plan = reserve_chain_kv(batch, _plan([10]), BLOCK)
    assert allocations == [] and plan.lookup.width == BLOCK and plan.lookup.lengths.tolist() == [4]
    assert not plan.verifies_past(BLOCK) and not plan.draft and plan.decision.reason == "lookup"


def test_the_request_row_bounds_the_chain(allocations):
    batch = _batch([190], [198], row_width=200)  # 190 + 10 + 6 = 206 > 200 slots in the request's row
    plan = reserve_chain_kv(batch, _plan([10]), BLOCK)
    assert allocations == [] and plan.lookup.lengths.tolist() == [4]


def test_slots_already_allocated_need_nothing(allocations):
    batch = _batch([20], [40])
    plan = reserve_chain_kv(batch, _plan([10]), BLOCK)
    assert allocations == [] and plan.lookup.lengths.tolist() == [10]


def _worker(**overrides):
    fields = dict(device="cpu", graphs=None, mamba=False, deferred=None, page_size=1, ring=None, swa_pool=False)
    fields.update(overrides)
    pool = SimpleNamespace(set_swa_key_buffer_radix_fused_norm_rope=None) if fields["swa_pool"] else SimpleNamespace()
    runner = SimpleNamespace(device=fields["device"], decode_cuda_graph_runner=fields["graphs"],
                             token_to_kv_pool_allocator=SimpleNamespace(page_size=fields["page_size"]))
    return SimpleNamespace(
        target_worker=SimpleNamespace(model_runner=runner), _need_mamba_verify_commit=fields["mamba"],
        _deferred_commit=lambda: fields["deferred"],
        _kv_injector=SimpleNamespace(swa_ring_size=fields["ring"],
                                     draft_model_runner=SimpleNamespace(token_to_kv_pool=pool)),
    )


@pytest.mark.parametrize("overrides,reason", [
    (dict(device="cuda:0"), "not on the host"), (dict(graphs=object()), "CUDA graphs"), (dict(mamba=True), "mamba"),
    (dict(deferred=object()), "deferred"), (dict(page_size=16), "paged"), (dict(ring=4096), "sliding-window"),
    (dict(swa_pool=True), "sliding-window"),
])
def test_long_chains_run_only_on_the_eager_host_path(overrides, reason):
    from sglang_dspark.engine.long_chain_step import long_chains_blocker

    assert long_chains_blocker(_worker()) is None
    assert reason in long_chains_blocker(_worker(**overrides))
