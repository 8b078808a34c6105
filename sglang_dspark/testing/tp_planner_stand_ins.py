"""SGLang's runtime context as the scheduler of a ``--tp-size N`` DSPARK server sees it, for planner tests on gloo
ranks (CPU, no server): upstream's planner module reads its spec, schedule, DP and parallel facts from these, and the
SPS table every rank ends with is built from one timing function, as ``profiler/tp_consensus.py`` makes it
byte-identical across ranks."""

from __future__ import annotations

import types
from typing import Callable, Sequence

CAPTURE_BS = (*range(1, 9), *range(10, 33, 2), 40, 44, 48)  # H100's decode capture sizes for DSPARK


def graph_tiers(gamma: int) -> tuple[int, ...]:
    """The verify token tiers of :data:`CAPTURE_BS` graphs at block ``gamma`` (anchor + γ tokens per request)."""
    return tuple(sorted({bs * (gamma + 1) for bs in CAPTURE_BS}))


def install_planner_stand_ins(world_size: int, *, gamma: int, table_seconds: Callable[[int, int], float],
                              token_tiers: Sequence[int], patch=setattr) -> None:
    """Install the stand-ins (``patch``: ``setattr`` in a spawned rank, ``monkeypatch.setattr`` in the test
    process); ``table_seconds(R, B)``: the profiled verify forward every rank's table is built from."""
    import sglang.srt.runtime_context as runtime_context

    import sglang_dspark.profiler.engine_measurer as engine_measurer
    from sglang_dspark.engine import planner as planner_module
    from sglang_dspark.profiler.probe_plan import build_table, make_probe_plan

    dspark_planner = planner_module.dspark_planner
    patch(dspark_planner, "get_spec", lambda: types.SimpleNamespace(
        speculative_dspark_align_verify_tokens_to_graph_tier=False, speculative_dspark_confidence_sts_path=None,
        speculative_dspark_sps_table_path=None))
    patch(dspark_planner, "get_schedule",
          lambda: types.SimpleNamespace(disable_overlap_schedule=False, max_running_requests=48))
    patch(dspark_planner, "is_dp_attention_enabled", lambda: False)
    patch(runtime_context, "get_parallel",
          lambda: types.SimpleNamespace(tp_size=world_size, pp_size=1, attn_dp_enabled=False))
    patch(runtime_context, "get_disagg", lambda: types.SimpleNamespace(disaggregation_mode="null"))
    plan = make_probe_plan(48, gamma, 65536, max_probes=40, token_tiers=tuple(token_tiers), max_slots=48)
    table = build_table(table_seconds, plan, progress=False, repeats=1, warmup=0, metadata={"gamma": gamma})
    patch(engine_measurer, "obtain_sps_table",
          lambda **kwargs: types.SimpleNamespace(table=table, source="agreed", seconds=0.0))


__all__ = ["CAPTURE_BS", "graph_tiers", "install_planner_stand_ins"]
