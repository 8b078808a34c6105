"""TP-consistent SPS profiling (``sglang_dspark.profiler.tp_consensus``) over real gloo process groups.

Ranks are spawned processes (``init_method=file://`` in a temporary folder, backend gloo, as SGLang's
``tp_group.cpu_group``) whose fake forwards disagree: rank 1 is 3x slower and noisy. Every rank must still run the
same forwards and end with a byte-identical table; a cache present on one rank only must not split them; a failure
on any rank must raise on every rank instead of hanging. One spawn of 3 processes runs every scenario twice: in the
group of global ranks [0, 1], and in [1, 2], where group rank 0 is global rank 1 (SGLang's TP cpu_group of a later
pipeline stage or DP replica). Starting the processes (importing torch) is most of the ~25 s.
"""

from __future__ import annotations

import datetime
import random

import pytest
import torch.distributed as dist

from sglang_dspark.testing.gloo_world import rank_report, spawn_ranks

from sglang_dspark.profiler.probe_plan import build_table, fit_schedule_to_budget, make_probe_plan
from sglang_dspark.profiler.sps_table import SpsTable
from sglang_dspark.profiler.tp_consensus import ProfilingAborted, profile_consistently

GAMMA = 7
TIERS_48 = tuple(sorted({b * (GAMMA + 1) for b in [*range(1, 9), *range(10, 33, 2), 40, 44, 48]}))
# Rank 0's timings alone fit the full schedule (3 repeats + 1 warm-up, ~3.0 s estimated) in this budget; the
# slowest rank's do not (~9-12 s), and they are the ones that count: every rank must then run 1 repeat, 0 warm-ups.
BUDGET_SECONDS = 4.0
WAIT_SECONDS = 90  # a hung collective fails on its own after the 30 s gloo timeout


def graph_seconds(r: int, b: int) -> float:
    return 0.010 + 0.0001 * b + 0.00003 * r


def make_plan(max_probes: int = 40):
    return make_probe_plan(48, GAMMA, 65536, max_probes=max_probes, token_tiers=TIERS_48, max_slots=48)


def plan_fn(measure):
    return fit_schedule_to_budget(measure, make_plan, BUDGET_SECONDS)


class FakeForwards:
    """``measure(R, B)``: rank 0 exact; other ranks 3x slower with up to 30 % noise; optionally raises at a call."""

    def __init__(self, rank: int, fail_at: int = 0):
        self.rank, self.fail_at, self.calls = rank, fail_at, []
        self._rng = random.Random(1000 + rank)

    def __call__(self, r: int, b: int) -> float:
        self.calls.append((r, b))
        if self.fail_at and len(self.calls) == self.fail_at:
            raise RuntimeError(f"CUDA error on rank {self.rank}")
        seconds = graph_seconds(r, b)
        return seconds if self.rank == 0 else 3.0 * seconds * self._rng.uniform(1.0, 1.3)


def cached_table() -> SpsTable:
    table = build_table(graph_seconds, make_plan(12), progress=False, repeats=1, warmup=0, metadata={"from": "disk"})
    data = table.to_dict() | {"created_at": 1_700_000_000.0}  # the same file on every call
    return SpsTable.from_dict(data, source="cache")


def run_scenario(group, rank: int, *, fail_rank: int = -1, fail_at: int = 0, cache_rank: int = -1,
                 plan_error: bool = False) -> dict:
    measure = FakeForwards(rank, fail_at if rank == fail_rank else 0)
    loads, stores = [], []

    def load_cached():
        loads.append(rank)
        return cached_table() if rank == cache_rank else None

    def store(table):
        stores.append(table.to_json())
        raise OSError("read-only cache folder")  # must only warn

    def failing_plan_fn(m):
        m(1, 8), m(48, 384)
        raise ValueError("planning failed on rank 0")

    result = {"loads": loads, "stores": stores, "calls": measure.calls}
    try:
        table = profile_consistently(
            measure, failing_plan_fn if plan_error else plan_fn, group,
            load_cached=load_cached, store=store, progress=False, metadata={"gamma": GAMMA},
        )
        result["json"] = table.to_json()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


SCENARIOS = {
    "profile": {},
    "cache-on-rank-0-only": {"cache_rank": 0},
    "cache-on-rank-1-only": {"cache_rank": 1},
    "measure-fails-on-rank-1": {"fail_rank": 1, "fail_at": 5},
    "measure-fails-on-rank-0": {"fail_rank": 0, "fail_at": 2},
    "plan-fails-on-rank-0": {"plan_error": True},
    "after-failures": {},
}


GROUPS = {"ranks-0-1": [0, 1], "ranks-1-2": [1, 2]}


def rank_main(rank: int, world_size: int, init_file: str, results) -> None:
    with rank_report(rank, results) as out:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=30),
        )
        # Every rank creates every group, in the same order, as SGLang does.
        groups = {name: dist.new_group(members, backend="gloo") for name, members in GROUPS.items()}
        for name, members in GROUPS.items():
            if rank in members:
                group_rank = members.index(rank)
                out[name] = {s: run_scenario(groups[name], group_rank, **kw) for s, kw in SCENARIOS.items()}
            dist.barrier()  # the non-member waits; the groups run one after the other


def spawn_world(tmp_path, world_size: int) -> dict:
    return spawn_ranks(rank_main, world_size, tmp_path, WAIT_SECONDS)


def check_group(by_rank: list[dict]) -> None:
    """Assertions for one TP group; ``by_rank[i]`` is group rank i's scenario results."""
    first, second = by_rank[0], by_rank[1]

    # Fresh profile: identical bytes, identical forwards, decisions from the slowest rank.
    p0, p1 = first["profile"], second["profile"]
    assert "error" not in p0 and "error" not in p1, (p0.get("error"), p1.get("error"))
    assert p0["json"] == p1["json"]
    assert p0["calls"] == p1["calls"] and len(p0["calls"]) > 0
    table = SpsTable.from_json(p0["json"])
    meta = table.metadata
    assert (meta["repeats"], meta["warmup"]) == (1, 0)  # rank 0 alone would have chosen (3, 1): see below
    solo = fit_schedule_to_budget(graph_seconds, make_plan, BUDGET_SECONDS)
    assert (solo.repeats, solo.warmup) == (3, 1)
    assert len(p0["calls"]) == 3 + table.num_probes * (meta["repeats"] + meta["warmup"])
    assert table.token_tiers == TIERS_48 and table.max_slots == 48 and meta["gamma"] == GAMMA
    for r, b, seconds in table.iter_probes():  # MAX-reduced: the slow rank's time, not rank 0's
        assert seconds >= 3.0 * graph_seconds(r, b)
    assert p0["loads"] and not p1["loads"]  # only rank 0 looks at the cache
    assert len(p0["stores"]) == 1 and not p1["stores"] and p0["stores"][0] == p0["json"]

    # The cache exists on rank 0 only: rank 1 never looks, nobody profiles, same table.
    c0, c1 = first["cache-on-rank-0-only"], second["cache-on-rank-0-only"]
    assert c0["json"] == c1["json"] == cached_table().to_json()
    assert SpsTable.from_json(c1["json"]).source == "cache"
    assert c0["calls"] == c1["calls"] == [] and c0["loads"] and not c1["loads"]
    assert not c0["stores"] and not c1["stores"]

    # The cache exists on rank 1 only: it is never read, both ranks profile the same way.
    d0, d1 = first["cache-on-rank-1-only"], second["cache-on-rank-1-only"]
    assert d0["json"] == d1["json"] and d0["calls"] == d1["calls"] == p0["calls"] and not d1["loads"]

    # Failures on either rank, in a forward or in rank 0's planning: every rank raises at the same forward.
    for name, forwards in (("measure-fails-on-rank-1", 5), ("measure-fails-on-rank-0", 2), ("plan-fails-on-rank-0", 2)):
        e0, e1 = first[name], second[name]
        assert "error" in e0 and "error" in e1, name
        assert len(e0["calls"]) == len(e1["calls"]) == forwards, name
        assert e1["error"].startswith(ProfilingAborted.__name__), e1["error"]
    assert first["plan-fails-on-rank-0"]["error"].startswith("ValueError")
    assert "CUDA error on rank 1" in second["measure-fails-on-rank-1"]["error"]
    assert "failed on rank 1" in first["measure-fails-on-rank-1"]["error"]

    # ... and the group is still usable afterwards.
    a0, a1 = first["after-failures"], second["after-failures"]
    assert a0["json"] == a1["json"] and a0["calls"] == a1["calls"] == p0["calls"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return spawn_world(tmp_path_factory.mktemp("tp-world"), 3)


def test_two_ranks_agree_on_one_table(world):
    check_group([world[0]["ranks-0-1"], world[1]["ranks-0-1"]])


def test_a_subgroup_whose_rank_0_is_not_global_rank_0(world):
    assert set(world[0]) == {"ranks-0-1"} and set(world[2]) == {"ranks-1-2"}
    check_group([world[1]["ranks-1-2"], world[2]["ranks-1-2"]])


# ------------------------------------------------------------------------------------------------ single process


def test_without_a_group_it_is_the_plain_profiler():
    measure = FakeForwards(0)
    loads, stores = [], []
    table = profile_consistently(
        measure, plan_fn, None, load_cached=lambda: loads.append(1), store=stores.append, progress=False,
        metadata={"gamma": GAMMA},
    )
    schedule = fit_schedule_to_budget(graph_seconds, make_plan, BUDGET_SECONDS)
    expected = build_table(graph_seconds, schedule.plan, progress=False, repeats=schedule.repeats,
                           warmup=schedule.warmup, metadata={"gamma": GAMMA})
    assert table.probe_seconds() == expected.probe_seconds() and table.metadata == expected.metadata
    assert stores == [table] and loads == [1]
    assert len(measure.calls) == 3 + table.num_probes * 4
    cached = cached_table()
    assert profile_consistently(FakeForwards(0), plan_fn, None, load_cached=lambda: cached) is cached
    # A bare ProbePlan from plan_fn means the default 3 repeats after 1 warm-up.
    plain = profile_consistently(graph_seconds, lambda m: make_plan(8), None, progress=False)
    assert (plain.metadata["repeats"], plain.metadata["warmup"]) == (3, 1)


def test_a_group_of_one_takes_the_same_path(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        measure = FakeForwards(0)
        table = profile_consistently(measure, plan_fn, dist.group.WORLD, progress=False)
        assert table.metadata["repeats"] == 3 and len(measure.calls) == 3 + table.num_probes * 4
    finally:
        dist.destroy_process_group()
