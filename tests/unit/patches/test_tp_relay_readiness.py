"""Under TP every rank reads the DSPARK confidence relay on the same steps (issue #46, item 3;
``patches/tp_relay_readiness.py``), over real gloo groups.

Two spawned ranks (gloo, ``init_method=file://``, as tests/unit/engine/test_tp_learning.py) each build our real planner
(``AdmissionVerifyPlanner`` on upstream's ``DSparkVerifyPlanner``; stand-ins for SGLang's runtime context, the same SPS
table on both) and upstream's real ``FutureMap`` with its ``ConfidenceRelay``, its ring set up as ``_lazy_init`` sets it
up on CUDA. Rank 0 draws each decode step (requests arriving and leaving, the draft's confidences) and broadcasts it.
Each step runs the scheduler's order: the planner's ``prepare_verify_budget`` (upstream's: under TP the draft gate is
off) reads the relay through ``FutureMap.resolve_confidence_cpu`` → ``ConfidenceRelay.resolve``, then the step's
``FutureMap.publish`` scatters its confidences and issues the ring copy (``issue_ring_copy``), whose ``copy_done`` event
is the one fake: on rank 0 every copy has landed when read; on rank 1 every third copy is slow, ``query()`` False until
someone ``synchronize()``\\ s it (which always works, as a CUDA event's does). The ranks all-gather, per step, the
budget K, the tier token count (``batch.spec_verify_tier_num_tokens``) and the CUDA-graph tier (``round_up_grid``).

* upstream's relay (no patch): the ranks disagree on some steps (the control: this harness can fail);
* with the patch installed through SGLang's ``HookRegistry`` (``install`` + ``apply_hooks``, as the plugin does): the
  same steps agree everywhere, and rank 1 did read slow copies (the patch waited on them).

The synchronous read (the CPU, no copy stream) is tested in one process below: a row whose confidences were never
published reads each process's uninitialised memory upstream, and reads unknown on every rank with the patch.

Starting the processes (importing torch and SGLang's planner) is most of this file's time.
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
STEPS = 60
WORLD = 2
WAIT_SECONDS = 240
SLOW_EVERY = 3  # rank 1: every third ring copy has not landed when upstream queries it


def table_seconds(r: int, b: int) -> float:
    """The profiled verify forward: every verified token costs, so K follows the confidences."""
    return 0.006 + 0.00025 * b + 0.0001 * r


class CopyEvent:
    """A ``copy_done`` event: ``record()`` enqueues the copy; ``query()`` says whether it landed (a slow one not until
    ``synchronize()``); ``synchronize()`` waits for it."""

    def __init__(self, rank_events: "RankEvents"):
        self.rank_events = rank_events
        self.landed = True

    def record(self):
        self.rank_events.recorded += 1
        self.landed = not self.rank_events.slow(self.rank_events.recorded)

    def query(self):
        return self.landed

    def synchronize(self):
        if not self.landed:
            self.rank_events.waited_on_slow += 1
        self.landed = True


class RankEvents:
    def __init__(self, rank: int):
        self.rank = rank
        self.recorded = 0
        self.waited_on_slow = 0

    def slow(self, n: int) -> bool:
        return self.rank == 1 and n % SLOW_EVERY == 0


class CopyStream:
    """The relay's private D2H stream: ``wait_event`` orders nothing here (the copies run on the host)."""

    def wait_event(self, event):
        pass


def install_stand_ins(world_size: int, patch=setattr) -> None:
    install_planner_stand_ins(world_size, gamma=GAMMA, table_seconds=table_seconds, token_tiers=TIERS, patch=patch)


def build_planner(rank: int):
    """Our planner (upstream's DSparkVerifyPlanner underneath) and upstream's FutureMap on the CPU."""
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_dspark.engine import planner as planner_module

    pool = types.SimpleNamespace(req_generation=torch.zeros(POOL + 1, dtype=torch.int64),
                                 req_to_token=torch.zeros(POOL + 1, 16, dtype=torch.int32))
    model_runner = types.SimpleNamespace(device="cuda:0", req_to_token_pool=pool)
    planner = planner_module.AdmissionVerifyPlanner(
        draft_model=types.SimpleNamespace(confidence_head=object()), gamma=GAMMA, model_runner=model_runner,
        device="cpu", tp_rank=rank, verify_num_draft_tokens=GAMMA + 1,
        tp_sync=types.SimpleNamespace(sync=lambda site, values: values))
    planner.install_sps_table()
    future_map = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.DSPARK, pool, needs_confidence_relay=True)
    return planner, future_map


def decode_batch(rows: list[int]):
    import torch

    rows = torch.tensor(rows, dtype=torch.int64)
    return types.SimpleNamespace(
        spec_info=types.SimpleNamespace(verify_token_budget=None, future_indices=rows), is_extend_in_batch=False,
        has_grammar=False, forward_mode=types.SimpleNamespace(is_extend=lambda: False),
        req_pool_indices=rows, req_pool_indices_cpu=rows, batch_size=lambda: len(rows),
        spec_verify_tier_num_tokens=None)


def build(rank: int):
    """Our planner and upstream's FutureMap (its relay ring as on CUDA, with this rank's copy events)."""
    import torch
    from sglang.srt.managers.overlap_utils import CONFIDENCE_RELAY_RING_DEPTH

    planner, future_map = build_planner(rank)
    events = RankEvents(rank)
    relay = future_map.confidence_relay
    relay.initialized = True  # what _lazy_init builds on CUDA: device buffer, pinned ring, one copy event per slot
    relay.confidence_buf = torch.zeros(POOL + 1, GAMMA)
    relay.conf_ring = torch.zeros(CONFIDENCE_RELAY_RING_DEPTH, POOL + 1, GAMMA)
    relay.gen_ring = torch.zeros(CONFIDENCE_RELAY_RING_DEPTH, POOL + 1, dtype=torch.int64)
    relay.copy_done = [CopyEvent(events) for _ in range(CONFIDENCE_RELAY_RING_DEPTH)]
    future_map.fwd_prepare_d2h_stream = CopyStream()
    future_map.publish_ready = CopyEvent(RankEvents(0))
    return planner, future_map, events


def draw_steps(seed: int) -> list[dict]:
    """Rank 0's decode steps: requests (pool row, generation, draft quality) arrive and leave."""
    rng = random.Random(seed)
    generation = [0] * (POOL + 1)
    active: list[dict] = []
    steps = []
    for _ in range(STEPS):
        active = [a for a in active if rng.random() > 0.08]
        free = sorted(set(range(1, POOL + 1)) - {a["row"] for a in active})
        for _ in range(min(rng.choice([0, 0, 1, 2, 5]), 32 - len(active), len(free))):
            row = free.pop(rng.randrange(len(free)))
            generation[row] += 1
            active.append({"row": row, "gen": generation[row], "quality": rng.choice((0.2, 0.5, 0.8, 0.95))})
        if not active:
            row = free.pop(0)
            generation[row] += 1
            active.append({"row": row, "gen": generation[row], "quality": 0.8})
        steps.append({"rows": [a["row"] for a in active], "gens": [a["gen"] for a in active],
                      "confidence": [[min(0.999, max(0.01, a["quality"] + rng.uniform(-0.2, 0.2)))
                                      for _ in range(GAMMA)] for a in active]})
    return steps


def serve(group, rank: int) -> dict:
    import torch
    import torch.distributed as dist
    from sglang.srt.speculative.ragged_verify import round_up_grid

    planner, future_map, events = build(rank)
    box = [draw_steps(seed=46) if rank == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    trace = {"steps": [], "read": 0}
    pool_generation = planner.model_runner.req_to_token_pool.req_generation
    for s in box[0]:
        rows = torch.tensor(s["rows"], dtype=torch.int64)
        r = len(s["rows"])
        pool_generation[rows] = torch.tensor(s["gens"], dtype=torch.int64)
        batch = decode_batch(s["rows"])
        planner.prepare_verify_budget(batch, future_map)  # the relay read: upstream's, patched or not
        budget = batch.spec_info.verify_token_budget
        tier_tokens = batch.spec_verify_tier_num_tokens
        graph_tier = round_up_grid(tier_tokens if tier_tokens > 0 else r * (GAMMA + 1), TIERS)
        trace["read"] += int(budget is not None)
        # The step's forward publishes its confidences: upstream's scatter and ring copy (the copy event is the fake).
        future_map.publish(rows, torch.full((r,), 100, dtype=torch.int64), torch.tensor(s["confidence"]))
        mine = (budget, tier_tokens, graph_tier)
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
        trace["steps"].append(everyone)
    trace["waited_on_slow"] = events.waited_on_slow
    return trace


def rank_main(rank: int, world_size: int, init_file: str, results) -> None:
    import torch.distributed as dist

    with rank_report(rank, results) as out:
        os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
        os.environ.pop("SGLANG_DSPARK_ADMISSION", None)
        os.environ.pop("SGLANG_DSPARK_GATE_TRACE", None)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        install_stand_ins(world_size)
        out["upstream"] = serve(dist.group.WORLD, rank)  # the control: upstream's relay as shipped
        dist.barrier()
        from sglang.srt.managers.overlap_utils import ConfidenceRelay
        from sglang.srt.plugins.hook_registry import HookRegistry

        from sglang_dspark.patches import tp_relay_readiness

        tp_relay_readiness.install()
        HookRegistry.apply_hooks()  # as SGLang does after loading the plugin
        out["hooked"] = getattr(ConfidenceRelay.resolve, "__wrapped__", None) is not None
        out["patched"] = serve(dist.group.WORLD, rank)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return spawn_ranks(rank_main, WORLD, tmp_path_factory.mktemp("tp-relay"), WAIT_SECONDS)


def _diverging(trace: dict, field: int) -> list[int]:
    return [i for i, everyone in enumerate(trace["steps"]) if len({mine[field] for mine in everyone}) > 1]


def test_upstream_relay_splits_the_ranks(world):
    """The control: with a rank-local readiness query the ranks compute different budgets and graph tiers."""
    trace = world[0]["upstream"]
    assert _diverging(trace, 0), "a slow copy on rank 1 should have split the budgets"
    assert _diverging(trace, 2), "... and the CUDA-graph tiers"
    assert world[1]["upstream"]["waited_on_slow"] == 0  # upstream never waits: it reads None instead


def test_with_the_patch_both_ranks_take_the_same_budget_and_tier_at_every_step(world):
    assert world[0]["hooked"] and world[1]["hooked"], "HookRegistry did not wrap ConfidenceRelay.resolve"
    trace = world[0]["patched"]
    for i, everyone in enumerate(trace["steps"]):
        assert len(set(everyone)) == 1, f"step {i}: (budget, tier tokens, graph tier) per rank {everyone}"
    assert world[1]["patched"]["steps"] == trace["steps"]
    # The harness did exercise the race: rank 1 read slow copies, and (past the two lag steps) every step had a budget.
    assert world[1]["patched"]["waited_on_slow"] >= 5
    assert world[0]["patched"]["read"] == STEPS - 2
    assert len({everyone[0][0] for everyone in trace["steps"][2:]}) >= 5  # budgets move with the load


# ------------------------------------------------------------------------------------------------ single process


class _Relay:
    def __init__(self, landed: bool):
        from sglang.srt.managers.overlap_utils import CONFIDENCE_RELAY_RING_DEPTH

        self.initialized, self.ring_pos = True, 5
        self.events = RankEvents(1)
        self.copy_done = [CopyEvent(self.events) for _ in range(CONFIDENCE_RELAY_RING_DEPTH)]
        for event in self.copy_done:
            event.landed = landed


def _resolve(relay, stream=CopyStream(), publish_ready=object()):
    from sglang_dspark.patches.tp_relay_readiness import resolve_on_every_rank

    def original(self, batch, *, stream, publish_ready):
        return [event.query() for event in self.copy_done]

    return resolve_on_every_rank(original, relay, None, stream=stream, publish_ready=publish_ready)


@pytest.mark.parametrize("tp_size, waits", [(1, False), (2, True), (8, True)])
def test_waits_only_where_the_tp_group_has_several_ranks(tp_size, waits, monkeypatch):
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setattr(runtime_context, "get_parallel", lambda: types.SimpleNamespace(tp_size=tp_size))
    relay = _Relay(landed=False)
    _resolve(relay)
    assert relay.events.waited_on_slow == int(waits)  # only the lagged slot: (5 - 2) % 3 == 0
    assert relay.copy_done[0].landed is waits and not relay.copy_done[1].landed


def test_no_event_to_wait_on(monkeypatch):
    """Off CUDA (no copy stream), before the ring has a lagged slot, or before the relay's first publish: upstream
    reads without an event, and the hook does not touch one."""
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setattr(runtime_context, "get_parallel", lambda: types.SimpleNamespace(tp_size=2))
    for relay, kwargs in ((_Relay(False), {"stream": None}), (_Relay(False), {"publish_ready": None})):
        _resolve(relay, **kwargs)
        assert relay.events.waited_on_slow == 0
    early = _Relay(False)
    early.ring_pos = 1
    _resolve(early)
    assert early.events.waited_on_slow == 0
    cold = _Relay(False)
    cold.initialized = False
    _resolve(cold)
    assert cold.events.waited_on_slow == 0


def test_an_unreadable_parallel_context_waits(monkeypatch):
    """SGLang's ParallelContext raises for a field it has not published: waiting is always correct."""
    import sglang.srt.runtime_context as runtime_context

    class Unpublished:
        def __getattr__(self, name):
            raise RuntimeError(f"parallel name {name!r} has not been written")

    monkeypatch.setattr(runtime_context, "get_parallel", lambda: Unpublished())
    relay = _Relay(landed=False)
    _resolve(relay)
    assert relay.events.waited_on_slow == 1


def test_the_plugin_installs_the_hooks_once():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_dspark.patches import tp_relay_readiness

    tp_relay_readiness.install()
    tp_relay_readiness.install()
    for target, hook in ((tp_relay_readiness._RESOLVE, tp_relay_readiness.resolve_on_every_rank),
                         (tp_relay_readiness._PUBLISH, tp_relay_readiness.publish_with_generation),
                         (tp_relay_readiness._RESOLVE_CPU, tp_relay_readiness.resolve_with_published_generation)):
        assert [h for _, h, _ in HookRegistry._hooks.get(target, []) if h is hook] == [hook], target


# ---------------------------------------------------------------------- the synchronous read (the CPU): generations


@pytest.fixture
def cpu_ranks(monkeypatch):
    """Two ranks' planners and FutureMaps as a ``--tp-size 2`` server on the CPU has them (in one process: nothing
    here crosses ranks), and a switch that wraps upstream's FutureMap with this patch's hooks."""
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    monkeypatch.delenv("SGLANG_DSPARK_ADMISSION", raising=False)
    monkeypatch.delenv("SGLANG_DSPARK_GATE_TRACE", raising=False)
    from sglang_dspark.engine import planner as planner_module
    from sglang_dspark.scheduling.stats import AdmissionStats

    import inspect

    from sglang.srt.managers.overlap_utils import FutureMap

    install_stand_ins(2, monkeypatch.setattr)
    stats = AdmissionStats()  # not the process-wide one other tests read
    monkeypatch.setattr(planner_module, "get_admission_stats", lambda: stats)
    # Upstream's own methods, whatever another test of this process applied to the class through HookRegistry.
    for name in ("publish", "resolve_confidence_cpu"):
        monkeypatch.setattr(FutureMap, name, inspect.unwrap(getattr(FutureMap, name)))

    def hook():
        from sglang_dspark.patches import tp_relay_readiness as patch

        for name, around in (("publish", patch.publish_with_generation),
                             ("resolve_confidence_cpu", patch.resolve_with_published_generation)):
            original = getattr(FutureMap, name)
            monkeypatch.setattr(FutureMap, name,
                                lambda self, *a, _o=original, _h=around, **k: _h(_o, self, *a, **k))

    return hook


def _serve_a_new_arrival(rank: int, garbage: float) -> tuple:
    """Rows 1 and 2 decode a step and publish; row 3 (a new request: its confidences never published) joins the next
    step, whose budget reads the relay. ``garbage``: what this process's uninitialised relay row 3 holds."""
    import torch

    planner, future_map = build_planner(rank)
    generation = planner.model_runner.req_to_token_pool.req_generation
    generation[[1, 2, 3]] = 1
    first = decode_batch([1, 2])
    planner.prepare_verify_budget(first, future_map)  # nothing published yet: upstream's None
    future_map.publish(first.req_pool_indices, torch.full((2,), 50, dtype=torch.int64),
                       torch.tensor([[0.9, 0.8, 0.6, 0.5, 0.3, 0.2, 0.1], [0.7, 0.4, 0.2, 0.1, 0.1, 0.05, 0.05]]))
    future_map.confidence_relay.confidence_buf[3] = garbage  # torch.empty memory: differs per process
    second = decode_batch([1, 2, 3])
    resolved = future_map.resolve_confidence_cpu(second)
    planner.prepare_verify_budget(second, future_map)
    return (second.spec_info.verify_token_budget, second.spec_verify_tier_num_tokens), resolved.generation.tolist()


def test_without_the_patch_the_ranks_plan_from_their_own_garbage(cpu_ranks):
    """The control (upstream's synchronous read): the never-published row reads as known, with each rank's memory."""
    (plan0, generation0), (plan1, _) = _serve_a_new_arrival(0, 0.99), _serve_a_new_arrival(1, 0.01)
    assert generation0 == [1, 1, 1]
    assert plan0 != plan1, "different garbage should have given the ranks different budgets"


def test_with_the_patch_a_never_published_row_is_unknown_on_every_rank(cpu_ranks):
    cpu_ranks()
    (plan0, generation0), (plan1, generation1) = _serve_a_new_arrival(0, 0.99), _serve_a_new_arrival(1, 0.01)
    assert generation0 == generation1 == [1, 1, 0]  # the published generations; 0: never published (unknown)
    assert plan0 == plan1 and plan0[0] is not None


def test_a_reused_slot_reads_unknown_until_its_new_request_publishes(cpu_ranks):
    import torch

    cpu_ranks()
    planner, future_map = build_planner(0)
    generation = planner.model_runner.req_to_token_pool.req_generation
    generation[5] = 1
    batch = decode_batch([5])
    future_map.publish(batch.req_pool_indices, torch.tensor([20]), torch.full((1, GAMMA), 0.5))
    assert future_map.resolve_confidence_cpu(batch).generation.tolist() == [1]
    generation[5] = 2  # the request finished; a new one took its slot
    assert future_map.resolve_confidence_cpu(batch).generation.tolist() == [1]  # != 2: unknown
    future_map.publish(batch.req_pool_indices, torch.tensor([21]), torch.full((1, GAMMA), 0.5))
    assert future_map.resolve_confidence_cpu(batch).generation.tolist() == [2]
    future_map.publish(batch.req_pool_indices, torch.tensor([22]))  # a publish without confidences changes nothing
    assert future_map.resolve_confidence_cpu(batch).generation.tolist() == [2]
