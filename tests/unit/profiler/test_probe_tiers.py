"""Tier-aligned SPS probing under CUDA graphs (``sglang_dspark.profiler``): plan, rounding, table, cache key.

Under compact ragged verify with CUDA graphs SGLang only replays token tiers ``T = bs·(γ+1)`` with
``S = min(T, max_bs)`` request slots and asserts that a layout names exactly its tier. The plan must probe only such
shapes, and the table must cost ``B`` as its tier. SGLang's own functions are the oracle where they import on a CPU
(capture list, tier buckets, ``round_up_grid``, ``_can_run_ragged_verify_graph``, the load-batch tier check).
"""

from __future__ import annotations

import functools
import json
import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.profiler.probe_plan import (
    ProbePlan,
    ProfilingSchedule,
    build_table,
    fit_schedule_to_budget,
    graph_token_tiers,
    make_probe_plan,
    round_up_to_tier,
)
from sglang_dspark.profiler.sps_cache import SpsTableCache, make_cache_key
from sglang_dspark.profiler.sps_table import SpsTable, SpsTableError

GAMMA = 7


def spec_capture_bs(max_bs: int) -> list[int]:
    """SGLang's speculative capture list (srt/arg_groups/cuda_graph_hook.py:517-532), written out."""
    bs = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, max_bs + 1, 16))
    )
    bs = [b for b in bs if b <= max_bs]
    return bs if max_bs in bs else bs + [max_bs]


def tiers_for(max_bs: int, gamma: int = GAMMA) -> tuple[int, ...]:
    return tuple(sorted({b * (gamma + 1) for b in spec_capture_bs(max_bs)}))


TIERS_48 = tiers_for(48)


def graph_seconds(r: int, t: int) -> float:
    """A graph step: fixed cost, per tier token, and a little per real request (its KV reads)."""
    return 0.010 + 0.0001 * t + 0.00003 * r


# ------------------------------------------------------------------------------------------------ SGLang oracle


@pytest.fixture(scope="module")
def sgl():
    """SGLang's own pieces (importing the graph runner on a CPU takes ~15 s, once per module)."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, round_up_grid

    def capture_bs(max_bs: int) -> list[int]:
        args = SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm="DSPARK")
        return generate_decode_cuda_graph_batch_sizes(args, max_bs)

    def runner(max_bs: int, gamma: int = GAMMA):
        """The attributes of a ragged-mode decode runner that its tier methods read, with SGLang's methods bound."""
        r = SimpleNamespace(
            capture_bs=capture_bs(max_bs),
            captured_req_width=gamma + 1,
            max_bs=max_bs,
            ragged_verify_mode=True,
            attn_backend=SimpleNamespace(supports_ragged_verify_graph=True),
            require_mlp_sync=False,
            is_encoder_decoder=False,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        r.capture_num_tokens = DecodeCudaGraphRunner._build_ragged_verify_token_buckets(r)
        r._ragged_capture_slots = functools.partial(DecodeCudaGraphRunner._ragged_capture_slots, r)
        r._ragged_graph_num_tokens = functools.partial(DecodeCudaGraphRunner._ragged_graph_num_tokens, r)
        return r

    def replays(r, num_requests: int, verify_lens: list[int]) -> int:
        """What SGLang does with a probe: the tier it replays, or an AssertionError like the server's."""
        layout = RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=verify_lens, device=torch.device("cpu"), grid=r.capture_num_tokens
        )
        batch = SimpleNamespace(batch_size=num_requests, capture_hidden_mode=CaptureHiddenMode.FULL)
        assert DecodeCudaGraphRunner._can_run_ragged_verify_graph(r, batch, layout), "would run eager"
        tier = r._ragged_graph_num_tokens(layout.graph_num_tokens)  # decode_cuda_graph_runner.py:1608-1614
        assert tier == layout.graph_num_tokens, f"runner tier {tier} != layout {layout.graph_num_tokens}"
        assert r._ragged_capture_slots(tier) >= num_requests
        return tier

    return SimpleNamespace(capture_bs=capture_bs, runner=runner, replays=replays, round_up_grid=round_up_grid)


def test_simulated_tiers_are_sglangs(sgl):
    for max_bs in (8, 48, 64, 160, 320):
        assert sgl.capture_bs(max_bs) == spec_capture_bs(max_bs)
        assert tuple(sgl.runner(max_bs).capture_num_tokens) == tiers_for(max_bs)
    assert TIERS_48 == tuple(range(8, 65, 8)) + tuple(range(80, 257, 16)) + (320, 352, 384)


def test_round_up_to_tier_is_sglangs_round_up_grid(sgl):
    for tiers in (TIERS_48, tiers_for(320), tiers_for(64, gamma=3), (5,), (3, 4, 100)):
        for total in range(-1, tiers[-1] + 3):
            try:
                expected = sgl.round_up_grid(total, list(tiers))
            except ValueError:
                with pytest.raises(ValueError):
                    round_up_to_tier(total, tiers)
                continue
            assert round_up_to_tier(total, tiers) == expected, (tiers, total)
    with pytest.raises(ValueError):
        sgl.round_up_grid(1, [])
    with pytest.raises(ValueError):
        round_up_to_tier(1, ())


@pytest.mark.parametrize(
    "max_requests,max_bs,gamma,max_probes",
    [(48, 48, 7, 40), (64, 64, 7, 40), (128, 48, 7, 40), (48, 48, 7, 10), (48, 48, 7, 6), (32, 32, 3, 40),
     (160, 160, 7, 40), (5, 8, 7, 40), (1, 1, 7, 40)],
)
def test_graph_plan_probes_only_shapes_sglang_replays(sgl, max_requests, max_bs, gamma, max_probes):
    runner = sgl.runner(max_bs, gamma)
    tiers = tuple(runner.capture_num_tokens)
    plan = make_probe_plan(max_requests, gamma, 1 << 20, max_probes=max_probes, token_tiers=tiers, max_slots=max_bs)
    assert plan.token_tiers == tiers and plan.max_slots == max_bs
    assert plan.num_probes <= max(max_probes, 3 * len(plan.rows))
    assert plan.rows[0][0] == 1 and plan.max_requests == min(max_requests, max_bs)
    for r, bs in plan.rows:
        assert bs and list(bs) == sorted(set(bs))
        assert bs[0] == round_up_to_tier(r, tiers)  # every request at least verifies its anchor
        assert bs[-1] == round_up_to_tier(r * (gamma + 1), tiers)  # ... at most its whole block
        for b in bs:
            assert b in tiers and r <= min(b, max_bs) and b >= r
            lens = plan.probe_verify_lens(r, b)
            assert len(lens) == r and 1 <= min(lens) and max(lens) <= gamma + 1
            assert sum(lens) == min(b, r * (gamma + 1))
            assert sgl.replays(runner, r, lens) == b


def test_typical_graph_plan():
    plan = make_probe_plan(48, GAMMA, 65536, token_tiers=TIERS_48, max_slots=48)
    rows = dict(plan.rows)
    assert list(rows) == [1, 2, 4, 8, 16, 32, 48]
    assert rows[1] == (8,) and rows[2] == (8, 16) and rows[4] == (8, 16, 24, 32)  # small rows: every reachable tier
    assert rows[8][0] == 8 and rows[8][-1] == 64 and rows[48][0] == 48 and rows[48][-1] == 384
    assert plan.num_probes <= 40 and plan.context_tokens == 256
    # Eager (no tiers): today's grid, unchanged.
    eager = make_probe_plan(48, GAMMA, 65536)
    assert eager.token_tiers is None and eager.num_probes == 35 and "token_tiers" not in eager.to_dict()
    assert eager.probe_verify_lens(2, 3) == [2, 1]


def test_default_max_slots_and_request_cap(caplog):
    plan = make_probe_plan(48, GAMMA, 65536, token_tiers=TIERS_48)
    assert plan.max_slots == 48  # largest tier // (γ+1)
    with caplog.at_level(logging.INFO, logger="sglang_dspark.profiler.probe_plan"):
        capped = make_probe_plan(200, GAMMA, 1 << 20, token_tiers=TIERS_48, max_slots=48)
    assert capped.max_requests == 48 and any("run eager" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        make_probe_plan(48, GAMMA, 65536, token_tiers=[])


def test_graph_plan_round_trips():
    plan = make_probe_plan(48, GAMMA, 65536, token_tiers=TIERS_48, max_slots=48)
    again = ProbePlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.token_tiers == TIERS_48
    schedule = ProfilingSchedule(plan, 2, 0)
    assert ProfilingSchedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule


def test_eager_plan_would_crash_under_graphs(sgl):
    """The bug this fixes: today's (R=1, B=1) probe builds a layout of tier 1; the runner's tier is 8."""
    runner = sgl.runner(48)
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=[1], device=torch.device("cpu"), grid=[1])
    assert runner._ragged_graph_num_tokens(layout.graph_num_tokens) == 8 != layout.graph_num_tokens


def test_graph_token_tiers_reads_a_live_runner(sgl):
    runner = sgl.runner(48)
    assert graph_token_tiers(SimpleNamespace(decode_cuda_graph_runner=runner)) == (TIERS_48, 48)
    assert graph_token_tiers(SimpleNamespace(decode_cuda_graph_runner=None)) == (None, None)
    assert graph_token_tiers(SimpleNamespace()) == (None, None)
    static = SimpleNamespace(**vars(runner))
    static.ragged_verify_mode = False
    assert graph_token_tiers(SimpleNamespace(decode_cuda_graph_runner=static)) == (None, None)
    eager_backend = SimpleNamespace(**vars(runner))
    eager_backend.attn_backend = SimpleNamespace(supports_ragged_verify_graph=False)  # triton: replays eager
    assert graph_token_tiers(SimpleNamespace(decode_cuda_graph_runner=eager_backend)) == (None, None)


# ------------------------------------------------------------------------------------------------ table lookup


@pytest.fixture
def graph_table() -> SpsTable:
    plan = make_probe_plan(48, GAMMA, 65536, token_tiers=TIERS_48, max_slots=48)
    return build_table(graph_seconds, plan, progress=False, repeats=1, warmup=0)


def test_table_costs_b_as_its_tier(graph_table, sgl):
    assert graph_table.token_tiers == TIERS_48 and graph_table.max_slots == 48
    probed = graph_table.probe_seconds()
    for r in range(1, 49):
        for b in range(r, r * (GAMMA + 1) + 1):
            tier = sgl.round_up_grid(b, list(TIERS_48))
            assert graph_table.step_seconds(r, b) == graph_table.step_seconds(r, tier), (r, b)
            if tier in probed.get(r, {}):
                assert graph_table.step_seconds(r, b) == pytest.approx(graph_seconds(r, tier))
        b = torch.arange(r, r * (GAMMA + 1) + 20)
        vector = graph_table.step_seconds_tensor(r, b)
        scalar = torch.tensor([graph_table.step_seconds(r, int(x)) for x in b], dtype=torch.float64)
        assert torch.equal(vector, scalar), r
        sps = graph_table.steps_per_second(r, b)
        assert torch.all(sps[1:] <= sps[:-1] * (1 + 1e-12)), r


def test_untiered_steps_are_not_rounded(graph_table):
    plain = SpsTable(graph_table.raw_probe_seconds())
    assert plain.token_tiers is None
    for r, b in [(49, 60), (60, 100), (48, 385), (48, 500), (100, 800)]:  # R > max_bs or B past the largest tier
        assert graph_table.step_seconds(r, b) == plain.step_seconds(r, b)
    # Inside the graphs the tiered table is a step function where the plain one interpolates.
    assert graph_table.step_seconds(8, 17) == graph_table.step_seconds(8, 24) > plain.step_seconds(8, 17)


def test_tiered_table_json_and_cache_round_trip(graph_table, tmp_path):
    text = graph_table.to_json()
    again = SpsTable.from_json(text)
    assert again.to_json() == text and again.token_tiers == TIERS_48 and again.max_slots == 48
    assert again.step_seconds(8, 17) == graph_table.step_seconds(8, 24)
    assert graph_table.summary()["graph_tiers"] == {"token_tiers": list(TIERS_48), "max_slots": 48}
    assert "graph_tiers" not in json.loads(SpsTable({1: {1: 0.1}}).to_json())  # eager JSON is unchanged

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    plan = ProbePlan.from_dict(graph_table.metadata["probe_plan"])
    settings = dict(model_path=model, dtype="bfloat16", device="cpu", tp_size=1, attention_backend="fa3",
                    max_total_tokens=65536, probe_grid=plan)
    key = make_cache_key(**settings, cuda_graph=True, verify_mode="compact")
    assert dict(key.extra)["graph_token_tiers"] == ",".join(map(str, TIERS_48))
    cache = SpsTableCache(tmp_path / "cache")
    cache.store(key, graph_table)
    loaded = cache.load(key)
    assert loaded.to_dict()["rows"] == graph_table.to_dict()["rows"] and loaded.token_tiers == TIERS_48
    assert loaded.step_seconds(8, 17) == graph_table.step_seconds(8, 24)


def test_cache_key_has_graph_mode_verify_mode_and_tiers(tmp_path):
    eager_plan = make_probe_plan(48, GAMMA, 65536)
    graph_plan = make_probe_plan(48, GAMMA, 65536, token_tiers=TIERS_48, max_slots=48)
    base = dict(model_path=tmp_path, dtype="bfloat16", device="cpu", tp_size=1, attention_backend="fa3",
                max_total_tokens=65536)
    keys = {
        "eager": make_cache_key(**base, probe_grid=eager_plan, cuda_graph=False, verify_mode="compact"),
        "graphs-static": make_cache_key(**base, probe_grid=eager_plan, cuda_graph=True, verify_mode="static"),
        "graphs-compact-eager-grid": make_cache_key(**base, probe_grid=eager_plan, cuda_graph=True,
                                                    verify_mode="compact"),
        "graphs-compact": make_cache_key(**base, probe_grid=graph_plan, cuda_graph=True, verify_mode="compact"),
        "other-tiers": make_cache_key(**base, probe_grid=graph_plan.to_dict() | {"token_tiers": [8, 16]},
                                      cuda_graph=True, verify_mode="compact"),
        "unspecified": make_cache_key(**base, probe_grid=eager_plan),
    }
    assert len({k.digest() for k in keys.values()}) == len(keys)
    assert dict(keys["unspecified"].extra) == {"cuda_graph": "unspecified", "ragged_verify_mode": "unspecified",
                                               "graph_token_tiers": "none", "graph_max_slots": "none"}
    assert dict(keys["graphs-compact"].extra)["graph_max_slots"] == "48"
    # Explicit tiers must agree with the grid's; graphs off cannot have tiers; the reserved names are not free-form.
    assert make_cache_key(**base, probe_grid=graph_plan, cuda_graph=True, token_tiers=TIERS_48) == make_cache_key(
        **base, probe_grid=graph_plan, cuda_graph=True
    )
    with pytest.raises(ValueError):
        make_cache_key(**base, probe_grid=graph_plan, cuda_graph=True, token_tiers=[8, 16])
    with pytest.raises(ValueError):
        make_cache_key(**base, probe_grid=graph_plan, cuda_graph=False)
    with pytest.raises(ValueError):
        make_cache_key(**base, probe_grid=eager_plan, extra={"cuda_graph": "on"})


def test_table_tier_validation_and_conversion():
    cells = {1: {8: 0.01}, 4: {8: 0.012, 32: 0.02}}
    with pytest.raises(SpsTableError):
        SpsTable(cells, token_tiers=[8, 32])  # max_slots missing
    with pytest.raises(SpsTableError):
        SpsTable(cells, token_tiers=[32, 8], max_slots=4)
    with pytest.raises(SpsTableError):
        SpsTable(cells, token_tiers=[8, 32], max_slots=0)
    eager = SpsTable(cells)
    tiered = eager.with_graph_tiers([8, 32], 4)
    assert tiered.step_seconds(4, 9) == eager.step_seconds(4, 32) and tiered.source == eager.source
    assert tiered.with_graph_tiers(None, None).step_seconds(4, 9) == eager.step_seconds(4, 9)


# ------------------------------------------------------------------------------------------------ budget fitting


def test_fit_schedule_keeps_thinned_plans_runnable(sgl):
    runner = sgl.runner(48)
    calls = []

    def measure(r, b):
        calls.append((r, b))
        return graph_seconds(r, b)

    def make_plan(max_probes):
        return make_probe_plan(48, GAMMA, 65536, max_probes=max_probes, token_tiers=TIERS_48, max_slots=48)

    full = fit_schedule_to_budget(measure, make_plan, budget_seconds=100.0)
    assert (full.repeats, full.warmup) == (3, 1) and full.plan == make_plan(40) and len(calls) == 3
    tight = fit_schedule_to_budget(measure, make_plan, budget_seconds=0.3)
    assert (tight.repeats, tight.warmup) == (1, 0) and tight.plan.num_probes < full.plan.num_probes
    for r, b in tight.plan.probes():
        assert sgl.replays(runner, r, tight.plan.probe_verify_lens(r, b)) == b
    for r, b in calls:  # calibration forwards are plan probes too
        assert b in TIERS_48 and r <= 48
    # A plan already at the minimum size and an impossible budget: a schedule and a warning, no NameError.
    tiny = fit_schedule_to_budget(measure, lambda n: make_probe_plan(2, 1, 4096, max_probes=8), budget_seconds=1e-9)
    assert tiny.repeats == 1 and tiny.plan.num_probes <= 8
