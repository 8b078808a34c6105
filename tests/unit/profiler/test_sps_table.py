"""Tests for the SPS cost model (``sglang_dspark.profiler``): table, upstream formats, cache, refinement, probe plan.

Fast and pure: no server, no model. Upstream's ``dspark_sps.py`` is loaded from the installed sglang by file path
(not through ``import sglang``, which takes ~10 s) to cross-check the two upstream JSON formats.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dspark.profiler.probe_plan import ProbePlan, build_table, make_probe_plan, split_verify_tokens
from sglang_dspark.profiler.sps_cache import (
    SpsCacheKey,
    SpsTableCache,
    default_cache_dir,
    make_cache_key,
    model_config_fingerprint,
)
from sglang_dspark.profiler.sps_table import SpsTable, SpsTableError
from sglang_dspark.profiler.upstream_sps import load_sps_table_file, table_from_upstream

GAMMA = 7


def linear_seconds(r: int, b: int) -> float:
    return 0.040 + 0.002 * r + 0.0005 * b


def table_from(fn, plan: ProbePlan, **kwargs) -> SpsTable:
    return SpsTable({r: {b: fn(r, b) for b in bs} for r, bs in plan.rows}, **kwargs)


def assert_sps_non_increasing_in_b(table: SpsTable, max_r: int, gamma: int = GAMMA) -> None:
    for r in range(1, max_r + 1):
        b = torch.arange(r, r * (gamma + 1) + 4)
        sps = table.steps_per_second(r, b)
        assert torch.all(sps[1:] <= sps[:-1] * (1 + 1e-12)), f"R={r}: SPS rises with B: {sps.tolist()}"


@pytest.fixture
def plan() -> ProbePlan:
    return make_probe_plan(48, GAMMA, 65536)


# ---------------------------------------------------------------------------------------------------- SpsTable


def test_linear_cost_is_reproduced_everywhere(plan):
    """Interpolation in time at fixed B/R and both extrapolations are exact for c + a·R + b·B."""
    table = table_from(linear_seconds, plan)
    for r in [1, 2, 3, 5, 7, 16, 20, 33, 47, 48, 49, 64, 100]:
        for b in [r, r + 1, r + 3, 2 * r + 1, r * (GAMMA + 1), r * (GAMMA + 1) + 10, 3 * r * (GAMMA + 1)]:
            assert table.step_seconds(r, b) == pytest.approx(linear_seconds(r, b), rel=1e-12), (r, b)


def test_interpolates_time_not_sps():
    table = SpsTable({1: {1: 0.010, 3: 0.030}})
    assert table.steps_per_second(1, 2) == pytest.approx(50.0)  # 1 / 0.020, not the mean of 100 and 33.3
    assert table.steps_per_second(1, 3) == pytest.approx(1 / 0.030)


def test_probe_points_are_returned_exactly(plan):
    rng = random.Random(0)
    times = {r: {b: 0.05 + 0.001 * b + 0.003 * r for b in bs} for r, bs in plan.rows}
    table = SpsTable(times)
    for r, bs in plan.rows:
        b = rng.choice(bs)
        assert table.step_seconds(r, b) == times[r][b]


def test_noisy_measurements_become_monotone():
    noisy = {
        1: {1: 0.050, 2: 0.047, 3: 0.052, 5: 0.049, 8: 0.060},  # dips at B=2 and B=5 would be "free" tokens
        2: {2: 0.045, 3: 0.058, 4: 0.055, 8: 0.066, 16: 0.070},  # R=2 anchor-only cheaper than R=1: impossible
    }
    table = SpsTable(noisy)
    cells = table.probe_seconds()
    assert list(cells[1].values()) == [0.050, 0.050, 0.052, 0.052, 0.060]
    assert cells[2][2] == 0.050  # raised to R=1's time at the same B/R = 1
    assert cells[2][4] == 0.058  # running max within the row
    for r, row in cells.items():
        for b, t in row.items():
            assert t >= noisy[r][b]  # enforcement only ever raises
    assert table.raw_probe_seconds() == noisy
    assert_sps_non_increasing_in_b(table, 4)


def test_past_the_last_probe_time_keeps_growing():
    table = SpsTable({1: {1: 0.010, 2: 0.012, 4: 0.020, 8: 0.020}})  # last segment flat (e.g. noise clipped)
    mean_slope = (0.020 - 0.010) / 7
    assert table.step_seconds(1, 12) == pytest.approx(0.020 + 4 * mean_slope)
    sps = [table.steps_per_second(1, b) for b in range(8, 30)]
    assert all(later < earlier for earlier, later in zip(sps, sps[1:]))


def test_a_single_probe_row_borrows_the_slope_below():
    table = SpsTable({1: {1: 0.010, 4: 0.013}, 4: {4: 0.020}})
    assert table.step_seconds(4, 8) == pytest.approx(0.020 + 4 * 0.001)


def test_request_count_outside_the_grid():
    table = SpsTable({2: {2: 0.020, 4: 0.024}, 4: {4: 0.030, 8: 0.040}})
    assert table.step_seconds(1, 1) == table.step_seconds(2, 2)  # below the grid: the smallest row bounds it
    assert table.step_seconds(1, 3) == pytest.approx(0.022)
    # Past the last row each extra request costs what an anchor-only request costs: (0.030-0.020)/(4-2).
    assert table.step_seconds(6, 6) == pytest.approx(0.030 + 2 * 0.005)
    assert table.step_seconds(6, 10) == pytest.approx(table.step_seconds(4, 8) + 2 * 0.005)


def test_invalid_arguments_and_tables():
    table = SpsTable({1: {1: 0.01, 2: 0.02}})
    with pytest.raises(ValueError):
        table.step_seconds(3, 2)
    with pytest.raises(ValueError):
        table.steps_per_second(2, torch.tensor([2, 1]))
    with pytest.raises(ValueError):
        table.step_seconds(0, 1)
    with pytest.raises(TypeError):
        table.step_seconds(1, 1.5)
    for bad in ({}, {1: {}}, {2: {1: 0.01}}, {1: {1: 0.0}}, {1: {1: -1.0}}, {1: {1: float("nan")}}):
        with pytest.raises(SpsTableError):
            SpsTable(bad)
    with pytest.raises(SpsTableError):
        SpsTable({1: {1: 0.01}}, source="guess")


def test_vectorised_equals_scalar(plan):
    rng = random.Random(1)
    times = {r: {b: rng.uniform(0.01, 0.2) for b in bs} for r, bs in plan.rows}
    table = SpsTable(times)
    for r in [1, 2, 3, 6, 11, 32, 40, 48, 50, 77]:
        b = torch.arange(r, r * (GAMMA + 1) + 9)
        vector = table.steps_per_second(r, b)
        assert vector.dtype == torch.float64 and vector.shape == b.shape
        scalar = torch.tensor([table.steps_per_second(r, int(x)) for x in b], dtype=torch.float64)
        torch.testing.assert_close(vector, scalar, rtol=1e-12, atol=0)
        batched = table.steps_per_second(r, b.flip(0).reshape(1, -1).expand(2, -1))
        torch.testing.assert_close(batched[1], scalar.flip(0), rtol=1e-12, atol=0)
    assert table.steps_per_second(5, torch.empty(0, dtype=torch.long)).numel() == 0
    assert isinstance(table.steps_per_second(5, 9), float)


def test_satisfies_the_admission_cost_protocol(plan):
    from sglang_dspark.scheduling.cost_model import StepCostModel

    assert isinstance(table_from(linear_seconds, plan), StepCostModel)


def test_json_round_trip(plan):
    rng = random.Random(2)
    seconds = {r: {b: rng.uniform(0.01, 0.2) for b in bs} for r, bs in plan.rows}
    seconds[4][4] = 0.5  # a raw cell the monotone enforcement lifts its neighbours to
    table = SpsTable(seconds, created_at=1_700_000_000.5, metadata={"gamma": GAMMA, "note": "x"})
    text = table.to_json()
    again = SpsTable.from_json(text)
    assert again.probe_seconds() == table.probe_seconds()
    assert (again.created_at, again.metadata, again.source) == (1_700_000_000.5, {"gamma": GAMMA, "note": "x"}, "profiled")
    b = torch.arange(9, 9 * (GAMMA + 1) + 1)
    assert torch.equal(again.steps_per_second(9, b), table.steps_per_second(9, b))
    assert again.to_json() == text
    assert SpsTable.from_json(text, source="cache").source == "cache"


def test_json_rejects_foreign_versions_and_damage(plan):
    data = table_from(linear_seconds, plan).to_dict()
    for mutate in (
        lambda d: d.update(schema_version=99),
        lambda d: d.update(kind="something-else"),
        lambda d: d["rows"][1]["step_seconds"].reverse(),  # not monotone any more
        lambda d: d["rows"][0]["step_seconds"].__setitem__(0, -1.0),
        lambda d: d["rows"][0]["verify_tokens"].pop(),
        lambda d: d.pop("created_at"),
    ):
        damaged = json.loads(json.dumps(data))
        mutate(damaged)
        with pytest.raises(SpsTableError):
            SpsTable.from_dict(damaged)
    with pytest.raises(SpsTableError):
        SpsTable.from_json("{not json")
    relaxed = json.loads(json.dumps(data))
    relaxed["rows"][1]["step_seconds"].reverse()
    assert SpsTable.from_dict(relaxed, strict=False).num_probes == plan.num_probes


def test_summary(plan):
    table = table_from(linear_seconds, plan, created_at=1000.0)
    summary = table.summary(now=1060.0)
    json.dumps(summary)
    assert summary["source"] == "profiled"
    assert summary["age_seconds"] == 60.0
    assert summary["num_probes"] == plan.num_probes
    assert summary["probe_grid"]["num_requests"] == [r for r, _ in plan.rows]
    assert summary["probe_grid"]["verify_tokens"]["1"] == list(plan.rows[0][1])
    assert summary["max_steps_per_second"] == pytest.approx(1 / linear_seconds(1, 1))
    assert summary["min_steps_per_second"] == pytest.approx(1 / linear_seconds(48, 48 * (GAMMA + 1)))


# ---------------------------------------------------------------------------------------------------- upstream


@pytest.fixture(scope="module")
def upstream_sps():
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    path = Path(spec.submodule_search_locations[0]) / "srt/speculative/dspark_components/dspark_sps.py"
    assert path.exists(), f"{path} not found"
    module_spec = importlib.util.spec_from_file_location("_upstream_dspark_sps", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_upstream_cost_table_loads(upstream_sps, tmp_path):
    upstream = upstream_sps.SpsCostTable(
        sample_batch_tokens=[8, 16, 24, 32, 48],
        sample_steps_per_sec=[100.0, 90.0, 70.0, 65.0, 40.0],
        max_batch_tokens=48,
    )
    path = tmp_path / "sps.json"
    path.write_text(upstream.to_json())
    table = load_sps_table_file(path)
    assert table.source == "upstream-json"
    assert table.num_requests_probes == tuple(range(1, 49))
    for b in upstream.sample_batch_tokens:
        for r in range(1, b + 1):  # R-independent, exactly upstream's value at every probe
            assert table.steps_per_second(r, b) == pytest.approx(upstream.lookup(b), rel=1e-12)
    for r in range(1, 8):  # below the first probe upstream clamps to it
        assert table.steps_per_second(r, r) == pytest.approx(upstream.lookup(r), rel=1e-12)
    # Between probes we interpolate time instead of upstream's optimistic floor step.
    assert 1 / table.step_seconds(2, 20) == pytest.approx(1 / (0.5 / 90 + 0.5 / 70))
    assert table.steps_per_second(2, 20) < upstream.lookup(20)
    # Past the last probe tokens are not free (upstream keeps 40 steps/s forever).
    assert table.steps_per_second(6, 60) < upstream.lookup(60)
    assert table.steps_per_second(48, 96) < table.steps_per_second(48, 48)  # rows past the samples have a slope
    assert_sps_non_increasing_in_b(table, 6)
    # The same through a dict, JSON text and the struct itself.
    for obj in (json.loads(upstream.to_json()), upstream.to_json(), upstream):
        assert table_from_upstream(obj).probe_seconds() == table.probe_seconds()


def test_upstream_additive_table_loads(upstream_sps, tmp_path):
    upstream = upstream_sps.SpsAdditiveCostTable(
        bias_seconds=0.010,
        bs_probes=[1, 4, 16],
        alpha_seconds=[0.001, 0.004, 0.020],
        m_probes=[1, 8, 32, 128],
        theta_seconds=[0.002, 0.003, 0.010, 0.040],
    )
    path = tmp_path / "sps_additive.json"
    path.write_text(upstream.to_json())
    table = load_sps_table_file(path, max_requests=20)
    assert table.num_requests_probes == tuple(range(1, 21))
    for r in [1, 2, 3, 4, 7, 10, 16, 20]:
        for b in sorted({r, r + 1, 8, 20, 32, 64, 100, 128} - set(range(r))):
            budget = b - r  # upstream's step_time takes the admitted draft tokens
            assert table.step_seconds(r, b) == pytest.approx(upstream.step_time(num_reqs=r, budget=budget), rel=1e-12)
    assert table.step_seconds(4, 200) > upstream.step_time(num_reqs=4, budget=196)  # θ past 128 is not clamped
    assert table.metadata["upstream_format"] == "SpsAdditiveCostTable"
    assert table_from_upstream(upstream, max_requests=20).probe_seconds() == table.probe_seconds()


def test_bad_upstream_tables_are_refused():
    for bad in (
        {"sample_batch_tokens": [8, 4], "sample_steps_per_sec": [1.0, 2.0], "max_batch_tokens": 8},
        {"sample_batch_tokens": [8], "sample_steps_per_sec": [0.0], "max_batch_tokens": 8},
        {"sample_batch_tokens": [8, 16], "sample_steps_per_sec": [1.0], "max_batch_tokens": 16},
        {"sample_batch_tokens": [8], "sample_steps_per_sec": [1.0], "max_batch_tokens": 4},
        {"bias_seconds": 0.0, "bs_probes": [1], "alpha_seconds": [0.0], "m_probes": [1], "theta_seconds": [0.0]},
        {"bias_seconds": 0.01, "bs_probes": [1], "alpha_seconds": [0.0]},
        "[1, 2",
    ):
        with pytest.raises(SpsTableError):
            table_from_upstream(bad)


def test_our_own_format_loads_from_a_table_path(plan, tmp_path):
    table = table_from(linear_seconds, plan)
    path = tmp_path / "ours.json"
    path.write_text(table.to_json())
    assert load_sps_table_file(path).probe_seconds() == table.probe_seconds()


# ---------------------------------------------------------------------------------------------------- cache


def make_key(plan: ProbePlan, model_dir: Path, **overrides) -> SpsCacheKey:
    settings_ = dict(
        model_path=model_dir,
        dtype=torch.bfloat16,
        device="cpu",
        tp_size=1,
        attention_backend="torch_native",
        max_total_tokens=8192,
        probe_grid=plan,
    )
    settings_.update(overrides)
    return make_cache_key(**settings_)


@pytest.fixture
def model_dir(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    return folder


def test_cache_hit_on_the_same_key(plan, model_dir, tmp_path):
    cache = SpsTableCache(tmp_path / "cache")
    key = make_key(plan, model_dir)
    assert cache.load(key) is None
    table = table_from(linear_seconds, plan, metadata={"gamma": GAMMA})
    path = cache.store(key, table)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    loaded = cache.load(make_key(plan, model_dir))
    assert loaded is not None and loaded.source == "cache"
    assert loaded.probe_seconds() == table.probe_seconds() and loaded.metadata == {"gamma": GAMMA}
    assert key.dtype == "bfloat16" and "threads" in key.device_name and key.sglang_dspark_version == "0.1.0"


def test_cache_misses_when_any_key_field_changes(plan, model_dir, tmp_path):
    cache = SpsTableCache(tmp_path / "cache")
    key = make_key(plan, model_dir)
    cache.store(key, table_from(linear_seconds, plan))
    other_plan = make_probe_plan(32, GAMMA, 65536)
    changed = {
        "model_path": "/elsewhere/model",
        "model_config_fingerprint": "0" * 64,
        "dtype": "float32",
        "device_name": "NVIDIA H200",
        "tp_size": 2,
        "attention_backend": "fa3",
        "max_total_tokens": 4096,
        "sglang_version": "0.5.24",
        "sglang_dspark_version": "9.9.9",
        "probe_grid": json.dumps(other_plan.to_dict(), sort_keys=True, separators=(",", ":")),
        "extra": (("cuda_graph", "off"),),
    }
    assert set(changed) == {f.name for f in dataclasses.fields(SpsCacheKey)}
    for name, value in changed.items():
        other = dataclasses.replace(key, **{name: value})
        assert other.digest() != key.digest(), name
        assert cache.load(other) is None, name
    assert cache.load(key) is not None


def test_model_config_fingerprint(model_dir, tmp_path):
    before = model_config_fingerprint(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}, indent=4))
    assert model_config_fingerprint(model_dir) == before  # same content, other key order and layout
    (model_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "hidden_size": 64}))
    assert model_config_fingerprint(model_dir) != before
    assert model_config_fingerprint(tmp_path / "missing") == "no-config"


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not-json", "schema", "kind", "negative", "non-monotone", "foreign-key", "table-missing"],
)
def test_cache_ignores_corrupt_or_foreign_files(plan, model_dir, tmp_path, caplog, damage):
    cache = SpsTableCache(tmp_path / "cache")
    key = make_key(plan, model_dir)
    path = cache.store(key, table_from(linear_seconds, plan))
    entry = json.loads(path.read_text())
    if damage == "truncated":
        text = path.read_text()[: len(path.read_text()) // 2]
    elif damage == "not-json":
        text = "\x00\x01garbage"
    else:
        if damage == "schema":
            entry["schema_version"] = 2
        elif damage == "kind":
            entry["kind"] = "something-else"
        elif damage == "negative":
            entry["table"]["rows"][0]["step_seconds"][0] = -0.01
        elif damage == "non-monotone":
            entry["table"]["rows"][2]["step_seconds"].reverse()
        elif damage == "foreign-key":  # a valid entry of another configuration, copied to this key's file name
            entry["key"] = make_key(plan, model_dir, tp_size=8).to_dict()
        elif damage == "table-missing":
            del entry["table"]
        text = json.dumps(entry)
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="sglang_dspark.profiler.sps_cache"):
        assert cache.load(key) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Ignoring cached SPS table" in warnings[0].getMessage()
    # Re-profiling overwrites the bad file, and the next load hits.
    cache.store(key, table_from(linear_seconds, plan))
    assert cache.load(key) is not None


def test_default_cache_dir_follows_the_project_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_DSPARK_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "sps"
    assert SpsTableCache().directory == tmp_path / "sps"
    monkeypatch.delenv("SGLANG_DSPARK_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "sglang-dspark" / "sps"


# ------------------------------------------------------------------------------------- online step overhead


def test_step_overhead_learns_the_non_verify_part_of_a_step():
    from sglang_dspark.profiler.step_overhead import StepOverhead

    overhead = StepOverhead(rate=0.5)
    assert overhead.seconds(4) == 0.0  # nothing learned yet: the profiled verify cost alone
    for _ in range(40):
        overhead.observe(4, measured_seconds=0.030, verify_seconds=0.010)
    assert abs(overhead.seconds(4) - 0.020) < 1e-4
    assert overhead.seconds(3) == overhead.seconds(4)  # same power-of-two bucket
    assert not overhead.observe(4, float("nan"), 0.01) and not overhead.observe(0, 0.01, 0.0)
    overhead.observe(4, measured_seconds=0.005, verify_seconds=0.010)  # verify slower than the step: clamp at 0
    assert overhead.seconds(4) >= 0.0


def test_step_overhead_update_is_bounded_per_step():
    from sglang_dspark.profiler.step_overhead import StepOverhead

    overhead = StepOverhead(rate=1.0, max_step_fraction=0.25)
    overhead.observe(1, 0.010, 0.005)
    overhead.observe(1, 10.0, 0.005)  # one stalled step
    assert overhead.seconds(1) <= 0.005 + 0.25 * 10.0
    overhead.observe(1, 0.010, 0.005)
    assert overhead.seconds(1) <= 0.005 + 0.25 * 10.0


def test_overhead_adjusted_cost_admits_more_when_the_step_has_a_fixed_cost():
    """A large B-independent cost makes extra verify tokens relatively cheap: the capacity must grow."""
    from sglang_dspark.profiler.sps_table import SpsTable
    from sglang_dspark.profiler.step_overhead import OverheadAdjustedCost, StepOverhead
    from sglang_dspark.scheduling import capacity_from_survival

    table = SpsTable({1: {1: 0.010, 8: 0.017}})  # 1 ms per verify token beyond the anchor
    survival = torch.tensor([[0.9, 0.7, 0.5, 0.35, 0.2, 0.1, 0.05]], dtype=torch.float64)
    overhead = StepOverhead()
    cost = OverheadAdjustedCost(table, overhead)
    k_without = int(capacity_from_survival(survival, cost))
    for _ in range(50):
        overhead.observe(1, measured_seconds=0.110, verify_seconds=0.010)  # 100 ms of draft + bookkeeping
    k_with = int(capacity_from_survival(survival, cost))
    assert k_with > k_without
    scalar = cost.steps_per_second(1, 3)
    vector = cost.steps_per_second(1, torch.tensor([3]))
    assert abs(float(vector[0]) - scalar) < 1e-9




# ---------------------------------------------------------------------------------------------------- probe plan


@pytest.mark.parametrize(
    "max_requests,gamma,max_total_tokens",
    [(1, 1, 64), (1, 15, 4096), (4, 3, 4096), (48, 7, 8192), (48, 7, 65536), (256, 15, 1 << 20), (4096, 7, 1 << 22)],
)
def test_probe_plan_shape_and_size(max_requests, gamma, max_total_tokens):
    plan = make_probe_plan(max_requests, gamma, max_total_tokens)
    assert plan.num_probes <= 40
    requests = [r for r, _ in plan.rows]
    assert requests[0] == 1 and requests[-1] == plan.max_requests <= max_requests
    assert requests == sorted(set(requests))
    for r, bs in plan.rows:
        assert bs[0] == r and bs[-1] == r * (gamma + 1) and list(bs) == sorted(set(bs))
        assert len(bs) >= min(3, r * gamma + 1)
    assert plan.max_requests * (plan.context_tokens + gamma + 1) <= max_total_tokens
    assert ProbePlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_probe_plan_for_a_typical_server_is_35_probes():
    plan = make_probe_plan(48, 7, 65536)
    assert [r for r, _ in plan.rows] == [1, 2, 4, 8, 16, 32, 48]
    assert plan.num_probes == 35 and plan.context_tokens == 256
    assert make_probe_plan(48, 7, 8192).context_tokens == 8192 // 48 - 8  # shortened to fit the pool


def test_probe_plan_lowers_requests_only_when_the_pool_is_tiny(caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_dspark.profiler.probe_plan"):
        plan = make_probe_plan(64, 7, 200)
    assert plan.max_requests == 200 // 9 and plan.context_tokens == 1
    assert any("probing R <=" in r.getMessage() for r in caplog.records)


def test_split_verify_tokens():
    for r in range(1, 20):
        for b in range(r, r * (GAMMA + 1) + 1):
            lengths = split_verify_tokens(r, b, GAMMA + 1)
            assert len(lengths) == r and sum(lengths) == b
            assert 1 <= min(lengths) and max(lengths) <= GAMMA + 1 and max(lengths) - min(lengths) <= 1
    assert split_verify_tokens(3, 7) == [3, 2, 2]
    with pytest.raises(ValueError):
        split_verify_tokens(3, 2)
    with pytest.raises(ValueError):
        split_verify_tokens(2, 17, GAMMA + 1)


def test_build_table_takes_the_median_after_warmup():
    plan = make_probe_plan(8, 3, 4096)
    calls: dict[tuple[int, int], int] = {}

    def measure(r: int, b: int) -> float:
        n = calls[(r, b)] = calls.get((r, b), 0) + 1
        if n == 1:
            return 5.0  # warm-up: allocation, capture; must be discarded
        return linear_seconds(r, b) * (10.0 if n == 3 else 1.0)  # one stall among three repeats

    table = build_table(measure, plan, progress=False, repeats=3, warmup=1)
    assert set(calls.values()) == {4} and len(calls) == plan.num_probes
    for r, bs in plan.rows:
        for b in bs:
            assert table.step_seconds(r, b) == pytest.approx(linear_seconds(r, b))
    assert table.source == "profiled" and table.metadata["probe_plan"] == plan.to_dict()
    with pytest.raises(ValueError):
        build_table(lambda r, b: 0.0, plan, progress=False)


def test_build_table_with_a_progress_bar(capsys):
    plan = make_probe_plan(2, 1, 4096)
    table = build_table(linear_seconds, plan, progress=True, repeats=1, warmup=0)
    assert table.num_probes == plan.num_probes
    assert "Profiling SPS" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- property


@st.composite
def random_tables(draw):
    gamma = draw(st.integers(1, 8))
    max_requests = draw(st.integers(1, 24))
    plan = make_probe_plan(max_requests, gamma, 1 << 20, max_probes=draw(st.integers(6, 40)))
    seconds = st.floats(1e-4, 1.0, allow_nan=False, allow_infinity=False)
    times = {r: {b: draw(seconds) for b in bs} for r, bs in plan.rows}
    return gamma, plan, times


@settings(max_examples=60, deadline=None)
@given(random_tables())
def test_property_sps_never_rises_with_verify_tokens(case):
    gamma, plan, times = case
    table = SpsTable(times)
    for r in range(1, plan.max_requests + 4):
        b = torch.arange(r, r * (gamma + 1) + 4)
        sps = table.steps_per_second(r, b)
        assert torch.all(sps > 0)
        assert torch.all(sps[1:] <= sps[:-1] * (1 + 1e-12)), (r, sps.tolist())
    for r, cells in table.probe_seconds().items():  # enforcement only raises, and cells are monotone in B
        assert all(cells[b] >= times[r][b] for b in cells)
        values = list(cells.values())
        assert values == sorted(values)


def test_signed_overhead_corrects_a_table_that_reads_too_slow():
    """A table profiled while start-up work shared the cores reads every verify too slow. The signed overhead
    learns the (negative) correction from the steps served, so the cost of a step is what was measured, and the
    cost never drops below a tenth of the table's verify (a floor against a wild table slope)."""
    from sglang_dspark.profiler.sps_table import SpsTable
    from sglang_dspark.profiler.step_overhead import OverheadAdjustedCost, StepOverhead

    table = SpsTable({1: {1: 0.187, 8: 0.195}})  # measured on a busy machine
    overhead = StepOverhead(signed=True)
    for _ in range(60):
        overhead.observe(1, measured_seconds=0.111, verify_seconds=table.step_seconds(1, 1))  # real plain steps
    assert abs(overhead.seconds(1) - (0.111 - 0.187)) < 1e-3
    cost = OverheadAdjustedCost(table, overhead)
    assert abs(1.0 / cost.steps_per_second(1, 1) - 0.111) < 1e-3
    clamped = StepOverhead(signed=True)
    clamped.observe(1, measured_seconds=0.001, verify_seconds=0.187)
    floor = OverheadAdjustedCost(table, clamped)
    assert abs(1.0 / floor.steps_per_second(1, 1) - 0.1 * 0.187) < 1e-9
    assert abs(1.0 / float(floor.steps_per_second(1, torch.tensor([1]))[0]) - 0.1 * 0.187) < 1e-9
    unsigned = StepOverhead()
    unsigned.observe(1, measured_seconds=0.111, verify_seconds=0.187)
    assert unsigned.seconds(1) == 0.0  # the admission default keeps its clamp


def test_step_overhead_a_fresh_servers_warm_up_stalls_do_not_stick():
    """A fresh server's first steps (measured: 2.49, 1.77, 1.16, 0.99, 0.65 s, then 75-119 ms drafted steps) start the
    estimate at a typical step, not at the fifth-slowest (the median start read 119 ms, 40 ms too dear, and the gate
    paused a draft that paid until enough probes had corrected it)."""
    from sglang_dspark.profiler.step_overhead import StepOverhead

    overhead = StepOverhead(signed=True)
    for seconds in (2.49, 1.77, 1.16, 0.99, 0.65, 0.075, 0.080, 0.073, 0.087, 0.119):
        overhead.observe(1, seconds, 0.050)
    assert overhead.seconds(1) == pytest.approx(0.080 - 0.050)


def test_step_overhead_a_stalled_first_step_does_not_stick():
    """A bucket's first measured step stalled (600 s against 30 ms steps): the quartile start drops it on the next
    step, where a mean or a bounded moving average from it would read seconds for thousands of steps."""
    from sglang_dspark.profiler.step_overhead import StepOverhead

    overhead = StepOverhead()  # rate 0.1: the lower quartile of the first 10 samples, then the moving average
    overhead.observe(1, 600.0, 0.010)
    assert overhead.seconds(1) > 500  # one sample: all there is
    overhead.observe(1, 0.030, 0.010)
    assert abs(overhead.seconds(1) - 0.020) < 1e-9
    for _ in range(10):
        overhead.observe(1, 0.030, 0.010)
    for i in range(200):  # a stall now and then after the start moves it by a quarter of the expected step
        overhead.observe(1, 600.0 if i % 50 == 49 else 0.030, 0.010)
        assert overhead.seconds(1) < 0.030  # 20 ms + at most a quarter of a ~30 ms step
    for _ in range(40):
        overhead.observe(1, 0.030, 0.010)
    assert abs(overhead.seconds(1) - 0.020) < 0.001
    for _ in range(60):  # a real shift (steps 10x dearer from now on) is followed within tens of steps
        overhead.observe(1, 0.300, 0.010)
    assert abs(overhead.seconds(1) - 0.290) < 0.01


def test_step_overhead_of_a_drafted_step_grows_into_loads_not_seen_yet():
    """A drafted step's overhead (the draft block, over every request) learned at R = 16 reads 4× at R = 64 until
    R = 64 has its own measurement; below and between learned buckets, and for the plain step's overhead, the nearest
    bucket's value stands."""
    from sglang_dspark.profiler.step_overhead import StepOverhead

    drafted = StepOverhead(rate=1.0, signed=True, grows_with_requests=True)
    plain = StepOverhead(rate=1.0, signed=True)
    for overhead in (drafted, plain):
        overhead.observe(16, 0.030, 0.010)  # 20 ms besides the verify
    assert drafted.seconds(64) == pytest.approx(0.080) and drafted.seconds(40) == pytest.approx(0.080)
    assert drafted.seconds(4) == pytest.approx(0.020) and drafted.seconds(16) == pytest.approx(0.020)
    assert plain.seconds(64) == pytest.approx(0.020)
    drafted.observe(64, 0.200, 0.040)  # measured: its own value from now on
    assert drafted.seconds(64) == pytest.approx(0.160)
    negative = StepOverhead(rate=1.0, signed=True, grows_with_requests=True)
    negative.observe(16, 0.005, 0.010)  # a table level correction, not a cost: not scaled
    assert negative.seconds(64) == pytest.approx(-0.005)
