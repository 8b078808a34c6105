"""Rank-identical verify budgets under TP (issue #38, item 2; ``engine/rank_learning.py``), over real gloo groups.

Three spawned ranks (gloo, ``init_method=file://``, as tests/unit/profiler/test_tp_consensus.py) each build our real planner
(``AdmissionVerifyPlanner`` on upstream's ``DSparkVerifyPlanner``, stand-ins for SGLang's runtime context) with the
same SPS table, then serve the same decode-step sequence: rank 0 draws each step (requests arriving and leaving, the
lagged confidences the relay resolves, what the step commits) and broadcasts it, as upstream broadcasts the draft.
What differs per rank is what differs on a GPU: each rank's step records reach its host through the real
``StepRecorder`` after a rank-specific delay (fake device events: rank 0 one step later, rank 1 two, rank 2 one to
six, past ``max_pending`` dropped), and each rank's step times differ (speed and noise). At every step the ranks
all-gather the budget K, the tier token count it gives (``local_verify_tier_num_tokens``) and the CUDA-graph tier
(``round_up_grid`` over the captured tiers).

* guarded (the plugin as shipped, ``tp_size = 3``): identical at every step;
* control, learning on (the guard bypassed): the same harness diverges;
* control, the plugin before this fix (overhead off under TP, survival prior still attached and fed): diverges too,
  through the survival prior alone, which is the chain the GPU audit described.

Starting the processes (importing torch and SGLang's planner) is most of the ~60 s on two cores.
"""

from __future__ import annotations

import datetime
import os
import random
import types

import pytest

from sglang_dspark.testing.gloo_world import rank_report, spawn_ranks
from sglang_dspark.testing.tp_planner_stand_ins import graph_tiers, install_planner_stand_ins

GAMMA = 7
TIERS = graph_tiers(GAMMA)
POOL = 64
STEPS = 160
WORLD = 3
WAIT_SECONDS = 240
SCENARIOS = ("guarded", "learning-on", "before-the-fix")


def table_seconds(r: int, b: int) -> float:
    """The profiled verify forward: every verified token costs, so K depends on survivals and on the overhead."""
    return 0.006 + 0.00025 * b + 0.0001 * r


def true_overhead(r: int) -> float:
    return 0.004 + 0.0004 * r


class StepSource:
    """Rank 0's decode-step sequence: requests (pool row, generation, quality) arrive and leave; a request's lagged
    confidence is its own only from its third step on (the relay lags two steps), before that a stale row."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.free = list(range(1, POOL + 1))
        self.generation = [0] * (POOL + 1)
        self.active: list[dict] = []
        self.steps = 0

    def phase_qualities(self) -> tuple[float, ...]:
        """The draft's quality drifts by phase (prompts of another kind arrive): the survival prior moves."""
        return ((0.6, 0.8, 0.92), (0.2, 0.35, 0.5), (0.8, 0.92, 0.97), (0.3, 0.45, 0.6))[(self.steps // 40) % 4]

    def next(self) -> dict:
        rng = self.rng
        self.steps += 1
        self.active = [a for a in self.active if rng.random() > 0.06]
        self.free = sorted(set(range(1, POOL + 1)) - {a["row"] for a in self.active})
        arrivals = rng.choice([0, 0, 0, 1, 2, 6, 12])
        for _ in range(min(arrivals, 40 - len(self.active), len(self.free))):
            row = self.free.pop(rng.randrange(len(self.free)))
            self.generation[row] += 1
            self.active.append({"row": row, "gen": self.generation[row], "age": 0,
                                "quality": rng.choice(self.phase_qualities())})
        if not self.active:
            row = self.free.pop(0)
            self.generation[row] += 1
            self.active.append({"row": row, "gen": self.generation[row], "age": 0, "quality": 0.8})
        lagged, lagged_gen, confidence, accepted = [], [], [], []
        for a in self.active:
            noisy = [min(0.999, max(0.01, a["quality"] + rng.uniform(-0.15, 0.15))) for _ in range(GAMMA)]
            known = a["age"] >= 2
            lagged.append(noisy if known else [rng.random() for _ in range(GAMMA)])  # a stale slot's garbage
            lagged_gen.append(a["gen"] if known else a["gen"] - 1)
            confidence.append(noisy)
            run = 0
            while run < GAMMA and rng.random() < noisy[run]:
                run += 1
            accepted.append(1 + run)
            a["age"] += 1
        return {"rows": [a["row"] for a in self.active], "gens": [a["gen"] for a in self.active],
                "lagged": lagged, "lagged_gen": lagged_gen, "confidence": confidence, "accepted": accepted}


class DeviceClock:
    """What a rank's device events report: copies land ``delay`` host steps after they were enqueued (query), step
    times are the rank's own (elapsed_time)."""

    def __init__(self):
        self.step = 0
        self.now = 0.0
        self.delay = 1

    def make_event(self, timing: bool = False):
        clock = self
        ready_at, stamp = self.step + self.delay, self.now

        class Event:
            def query(self):
                return clock.step >= ready_at

            def elapsed_time(self, end):
                return (end.stamp - stamp) * 1e3

        event = Event()
        event.stamp = stamp
        return event


def _install_runtime_stand_ins(world_size: int, patch=setattr) -> None:
    install_planner_stand_ins(world_size, gamma=GAMMA, table_seconds=table_seconds, token_tiers=TIERS, patch=patch)


def build_planner(scenario: str):
    import torch

    from sglang_dspark.engine import planner as planner_module
    from sglang_dspark.engine.rank_learning import RankLearning

    model_runner = types.SimpleNamespace(
        device="cuda:0",
        req_to_token_pool=types.SimpleNamespace(req_generation=torch.zeros(POOL + 1, dtype=torch.int64),
                                                req_to_token=torch.zeros(POOL + 1, 16, dtype=torch.int32)))
    planner = planner_module.AdmissionVerifyPlanner(
        draft_model=types.SimpleNamespace(confidence_head=object()), gamma=GAMMA, model_runner=model_runner,
        device="cpu", tp_rank=0, verify_num_draft_tokens=GAMMA + 1,
        tp_sync=types.SimpleNamespace(sync=lambda site, values: values))
    decide = planner_module.decide_rank_learning
    if scenario == "learning-on":  # the TP guard bypassed: every learned input on, as with one rank
        planner_module.decide_rank_learning = lambda facts: RankLearning(True, "control: guard bypassed")
    try:
        planner.install_sps_table()
    finally:
        planner_module.decide_rank_learning = decide
    if scenario == "before-the-fix":
        # The plugin before issue #38 item 2: the learned overhead off under TP (it was), but the survival prior still
        # attached to the budget planner and fed by every drafted step record.
        planner._budget_planner.survival_prior = planner.draft.survival_prior
        observe = planner.observe_step

        def observe_step(record):
            observe(record)
            if record.confidence is not None and record.drafted:
                planner.draft.survival_prior.observe(record.confidence.cumprod(dim=1))

        planner.observe_step = observe_step
    return planner


def serve(group, rank: int, scenario: str) -> dict:
    import torch
    import torch.distributed as dist
    from sglang.srt.managers.overlap_utils import ResolvedConfidence
    from sglang.srt.speculative.dspark_components.dspark_planner import local_verify_tier_num_tokens
    from sglang.srt.speculative.ragged_verify import round_up_grid

    from sglang_dspark.engine.step_record import StepRecorder

    planner = build_planner(scenario)
    clock = DeviceClock()
    recorder = StepRecorder("cuda:0", make_event=clock.make_event, copy_to_host=lambda t: t.clone())
    timing = random.Random(500 + rank)
    speed = (1.0, 1.4, 0.75)[rank]
    source = StepSource(seed=7) if rank == 0 else None
    pool_generation = planner.model_runner.req_to_token_pool.req_generation
    trace = {"steps": [], "records": [], "learning": planner.rank_learning.enabled,
             "reason": planner.rank_learning.reason, "prior_attached": planner._budget_planner.survival_prior
             is not None}
    for step in range(STEPS):
        box = [source.next() if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        s = box[0]
        rows = torch.tensor(s["rows"], dtype=torch.int64)
        r = len(s["rows"])
        pool_generation[rows] = torch.tensor(s["gens"], dtype=torch.int64)
        resolved = ResolvedConfidence(confidence=torch.tensor(s["lagged"], dtype=torch.float32),
                                      generation=torch.tensor(s["lagged_gen"], dtype=torch.int64))
        batch = types.SimpleNamespace(
            spec_info=types.SimpleNamespace(verify_token_budget=None), is_extend_in_batch=False, has_grammar=False,
            forward_mode=types.SimpleNamespace(is_extend=lambda: False), req_pool_indices_cpu=rows,
            batch_size=lambda r=r: r, spec_verify_tier_num_tokens=None)
        planner.prepare_verify_budget(batch, types.SimpleNamespace(resolve_confidence_cpu=lambda b: resolved))
        budget = int(batch.spec_info.verify_token_budget)
        tier_tokens = local_verify_tier_num_tokens(bs=r, verify_token_budget=budget,
                                                   verify_num_draft_tokens=GAMMA + 1, min_verify_len=1)
        assert tier_tokens == batch.spec_verify_tier_num_tokens
        graph_tier = round_up_grid(tier_tokens, TIERS)
        gens, lagged_gens = torch.tensor(s["gens"]), torch.tensor(s["lagged_gen"])
        unknown_rows = int((~((gens >= 1) & (lagged_gens == gens))).sum())  # upstream's rule for a known row
        # The step runs: this rank's own time; its records land after this rank's delay.
        clock.step = step
        clock.delay = (1, 2, timing.choice([1, 1, 2, 3, 6]))[rank]
        recorder.start()
        clock.now += speed * (table_seconds(r, r + budget) + true_overhead(r)) * timing.uniform(0.9, 1.3)
        ready = recorder.finish(accept_lens=torch.tensor(s["accepted"]), cap_lens=None,
                                confidence=torch.tensor(s["confidence"]), default_verify_len=GAMMA + 1)
        clock.now += 0.001
        for record in ready:
            planner.observe_step(record)
        mine = (budget, tier_tokens, graph_tier)
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
        trace["steps"].append({"mine": mine, "all": everyone, "unknown_rows": unknown_rows, "requests": r})
        trace["records"].append(len(ready))
    trace["dropped"] = recorder.dropped
    return trace


def rank_main(rank: int, world_size: int, init_file: str, results) -> None:
    import torch.distributed as dist

    with rank_report(rank, results) as out:
        os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
        os.environ.pop("SGLANG_DSPARK_ADMISSION", None)
        os.environ.pop("SGLANG_DSPARK_GATE_TRACE", None)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        _install_runtime_stand_ins(world_size)
        for scenario in SCENARIOS:
            out[scenario] = serve(dist.group.WORLD, rank, scenario)
            dist.barrier()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return spawn_ranks(rank_main, WORLD, tmp_path_factory.mktemp("tp-learning"), WAIT_SECONDS)


def _diverging_steps(world: dict, scenario: str, field: int) -> list[int]:
    steps = world[0][scenario]["steps"]
    return [i for i, s in enumerate(steps) if len({entry[field] for entry in s["all"]}) > 1]


def test_the_harness_delivers_records_late_and_differently_per_rank(world):
    """The guard is tested under the conditions that split ranks: per-rank delays (and drops) and arrivals."""
    guarded = [world[rank]["guarded"] for rank in range(WORLD)]
    assert len({tuple(t["records"]) for t in guarded}) == WORLD  # each rank got its records at other steps
    assert guarded[2]["dropped"] > 0 and guarded[0]["dropped"] == 0
    steps = guarded[0]["steps"]
    assert sum(s["unknown_rows"] > 0 for s in steps) >= 20  # arrivals: rows that would read the survival prior
    assert len({s["mine"][0] for s in steps}) >= 10  # budgets move with the load; not a constant


def test_tp_ranks_take_identical_budgets_and_tiers_at_every_step(world):
    for rank in range(WORLD):
        trace = world[rank]["guarded"]
        assert trace["learning"] is False and not trace["prior_attached"]
        assert "--tp-size 3" in trace["reason"]
    for i, step in enumerate(world[0]["guarded"]["steps"]):
        assert len(set(step["all"])) == 1, f"step {i}: (budget, tier tokens, graph tier) per rank {step['all']}"
    for rank in range(1, WORLD):  # and each rank's own view equals the gathered one
        assert [s["mine"] for s in world[rank]["guarded"]["steps"]] == [s["mine"] for s in world[0]["guarded"]["steps"]]


def test_without_the_guard_the_same_harness_diverges(world):
    """The controls: the harness does split ranks when learned state reaches the budget."""
    assert world[0]["learning-on"]["learning"] is True
    budgets = _diverging_steps(world, "learning-on", 0)
    tiers = _diverging_steps(world, "learning-on", 2)
    assert budgets and tiers, "learning on under TP should have split the ranks' budgets and graph tiers"
    # The plugin before this fix: only the survival prior was left on, and it alone splits the ranks.
    assert world[0]["before-the-fix"]["prior_attached"] is True
    assert _diverging_steps(world, "before-the-fix", 0), "the per-rank survival prior should have split the budgets"


# ------------------------------------------------------------------------------------------------ single process


def test_decision_table():
    from sglang_dspark.engine.rank_learning import LEARNED_INPUTS, ParallelFacts, decide_rank_learning, parallel_facts

    one = decide_rank_learning(ParallelFacts())
    assert one.enabled and one.frozen == () and one.log_line() == ""
    for facts, needle in ((ParallelFacts(tp_size=2), "--tp-size 2"), (ParallelFacts(pp_size=2), "--pp-size 2"),
                          (ParallelFacts(attn_dp_enabled=True), "DP attention")):
        decision = decide_rank_learning(facts)
        assert not decision.enabled and needle in decision.reason
        assert decision.frozen == tuple(name for name, _ in LEARNED_INPUTS)
        line = decision.log_line()
        assert "\n" not in line and all(f"{name} off" in line for name, _ in LEARNED_INPUTS)
        assert "graph tier" in line
    # SGLang's ParallelContext raises (not AttributeError) for a field it has not published.
    class Unpublished:
        tp_size = 4

        def __getattr__(self, name):
            raise RuntimeError(f"parallel name {name!r} has not been written")

    assert parallel_facts(Unpublished()) == ParallelFacts(tp_size=4)
    assert parallel_facts(types.SimpleNamespace(tp_size=None, attn_dp_enabled=True)) == ParallelFacts(
        attn_dp_enabled=True)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_install_sps_table_applies_the_decision_with_one_log_line(tp_size, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    monkeypatch.delenv("SGLANG_DSPARK_ADMISSION", raising=False)
    monkeypatch.delenv("SGLANG_DSPARK_GATE_TRACE", raising=False)
    from sglang_dspark.engine import planner as planner_module
    from sglang_dspark.scheduling.stats import AdmissionStats

    _install_runtime_stand_ins(tp_size, monkeypatch.setattr)
    stats = AdmissionStats()  # not the process-wide one other tests read
    monkeypatch.setattr(planner_module, "get_admission_stats", lambda: stats)
    with caplog.at_level("INFO", logger="sglang_dspark.engine.planner"):
        planner = build_planner("guarded")
    lines = [r.getMessage() for r in caplog.records if "online learning" in r.getMessage()]
    if tp_size == 1:
        assert planner.rank_learning.enabled and planner._learn_online and lines == []
        assert planner._budget_planner.survival_prior is planner.draft.survival_prior
    else:
        assert not planner.rank_learning.enabled and not planner._learn_online
        assert planner._budget_planner.survival_prior is None
        (line,) = lines
        assert "--tp-size 2" in line and all(f"{name} off" in line for name in planner.rank_learning.frozen)


def test_the_draft_gate_reads_the_same_decision():
    """One switch: the gate is not installed where the planner's decision keeps learning off."""
    from sglang_dspark.engine.planner import AdmissionVerifyPlanner
    from sglang_dspark.engine.rank_learning import ParallelFacts, decide_rank_learning

    class CompactPlanner(AdmissionVerifyPlanner):
        is_compact_mode, mode_value = True, "compact"

    off = decide_rank_learning(ParallelFacts(tp_size=2))
    planner = CompactPlanner.__new__(CompactPlanner)
    planner.__dict__.update(_budget_planner=object(), policy=types.SimpleNamespace(name="async"),
                            sps_table=object(), rank_learning=off)
    assert planner.draft_gate_blocker(deferred_commit=False) == off.reason
    planner.rank_learning = decide_rank_learning(ParallelFacts())
    assert planner.draft_gate_blocker(deferred_commit=False) is None
