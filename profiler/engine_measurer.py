"""SPS profiling at engine start-up (SGLang adapter): time real target verify forwards, cache the table.

Upstream SGLang only loads an SPS table profiled offline by an HTTP client against a running server, then needs a
restart. We time the engine's own target forward in TARGET_VERIFY mode, at the (requests R, verify tokens B) shapes
the scheduler will choose between, while the worker starts, and cache the result on disk keyed by everything that
changes it. On restart the cached table is reused; while serving, the rest of the step (draft, sampling,
bookkeeping) is learned on top of it from measured step times (profiler/step_overhead.py).

The synthetic verify batches use request-pool rows and KV slots that are free at start-up (nothing is allocated
through the allocators, so nothing can leak); the rows are reset afterwards. Their KV contents are garbage, which
does not change the cost of attention.

Under CUDA graphs in compact mode the engine only runs verify batches padded to a captured token tier T with
S = min(T, max_bs) request slots (the graph runner asserts it), so probes are taken only at those shapes and the
table rounds lookups up to the tier the same way. Under TP every rank runs the same forwards and ends with the same
table (``profiler/tp_consensus.py``): ranks that planned or cached differently would replay different graph tiers and
hang in their collectives.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_dspark.profiler.probe_plan import ProbePlan, fit_schedule_to_budget, graph_token_tiers, make_probe_plan
from sglang_dspark.profiler.sps_cache import SpsTableCache, make_cache_key
from sglang_dspark.profiler.sps_table import SpsTable
from sglang_dspark.profiler.table_trust import ContentionWindow, cache_refusal
from sglang_dspark.profiler.tp_consensus import profile_consistently
from sglang_dspark.profiler.upstream_sps import load_sps_table_file

logger = logging.getLogger(__name__)


@dataclass
class ObtainedSpsTable:
    table: SpsTable
    source: str  # "profiled" | "cache" | "upstream-json"
    seconds: float


# Start-up time given to SPS profiling (calibration forwards and grid; the trust check's two forwards come on top).
PROFILING_BUDGET_SECONDS = 2.0


def make_verify_forward_measurer(model_runner, plan: ProbePlan) -> Callable[[int, int], float]:
    """``measure(R, B) -> seconds`` of one TARGET_VERIFY forward of probe (R, B) of ``plan``.

    Per-token tensors are ``B`` long: ``plan.probe_verify_lens(R, B)`` real tokens first, then zeros (position 0,
    KV slot 0 = SGLang's padding slot, token 0), exactly how upstream pads a compact window to its tier
    (kernels/ops/speculative/dspark/dspark_verify_window.py:96-129); the graph runner copies ``graph_num_tokens``
    tokens (decode_cuda_graph_runner.py:1641-1648). Eager plans have no padding (B real tokens, grid [B]).
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    device = model_runner.device
    req_to_token = model_runner.req_to_token_pool.req_to_token
    context = plan.context_tokens
    grid = list(plan.token_tiers) if plan.token_tiers is not None else None
    dev = torch.device(device)
    sync = (lambda: torch.get_device_module(dev).synchronize()) if dev.type != "cpu" else (lambda: None)

    def measure(num_requests: int, verify_tokens: int) -> float:
        lens = plan.probe_verify_lens(num_requests, verify_tokens)
        real = sum(lens)
        width = context + max(lens)
        req_to_token[:num_requests, :width] = torch.arange(1, width + 1, dtype=req_to_token.dtype, device=device)
        seq_lens = torch.full((num_requests,), context, dtype=torch.int64, device=device)
        positions = torch.zeros(verify_tokens, dtype=torch.int64, device=device)
        positions[:real] = torch.cat([torch.arange(context, context + n) for n in lens]).to(device)
        out_cache_loc = torch.zeros(verify_tokens, dtype=torch.int64, device=device)
        out_cache_loc[:real] = positions[:real] + 1
        input_ids = torch.zeros(verify_tokens, dtype=torch.int64, device=device)
        layout = RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=lens, device=device, grid=grid if grid is not None else [verify_tokens]
        )
        assert layout.graph_num_tokens == verify_tokens, (num_requests, verify_tokens, layout.graph_num_tokens)
        spec_info = DFlashVerifyInput(
            draft_token=input_ids,
            positions=positions,
            draft_token_num=plan.gamma + 1,
            ragged_verify_layout=layout,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=num_requests,
            input_ids=input_ids,
            req_pool_indices=torch.arange(num_requests, dtype=torch.int64, device=device),
            seq_lens=seq_lens,
            out_cache_loc=out_cache_loc,
            seq_lens_sum=int(context * num_requests),
            seq_lens_cpu=seq_lens.cpu() + torch.tensor(lens),
            positions=positions,
            spec_info=spec_info,
            spec_algorithm=model_runner.spec_algorithm,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        sync()
        started = time.perf_counter()
        with torch.no_grad():  # not inference_mode: SGLang avoids it at init (scheduler.py:1119-1120)
            model_runner.forward(batch)
        sync()
        return time.perf_counter() - started

    def measure_and_reset(num_requests: int, verify_tokens: int) -> float:
        try:
            return measure(num_requests, verify_tokens)
        finally:
            req_to_token[:num_requests].zero_()

    return measure_and_reset


def _tp_cpu_group():
    """SGLang's TP gloo group when TP > 1, else None (single-process path)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if int(getattr(parallel, "tp_size", 1) or 1) <= 1:
        return None, 1
    return parallel.tp_group.cpu_group, int(parallel.tp_size)


def _linear_backend_entry(device: str) -> dict:
    """On the CPU, which product the linear layers use (patches/cpu_packed_linear.py): the verify cost's growth with
    the token count differs several-fold between the two, so a table timed with one must not serve the other."""
    if not device.startswith("cpu"):
        return {}
    from sglang_dspark.patches import cpu_packed_linear

    return {"cpu_linear": "onednn-packed" if cpu_packed_linear.installed() else "torch"}


def obtain_sps_table(
    *,
    model_runner,
    gamma: int,
    max_requests: int,
    upstream_table_path: Optional[str],
    time_budget_seconds: float = PROFILING_BUDGET_SECONDS,
) -> ObtainedSpsTable:
    """The SPS table for this engine: upstream's JSON if given, else the on-disk cache, else profile now.
    Under TP every rank returns the same table (rank 0 reads the cache, plans, and broadcasts)."""
    started = time.monotonic()
    token_tiers, max_slots = graph_token_tiers(model_runner)
    if upstream_table_path:
        table = load_sps_table_file(upstream_table_path, max_requests=max_requests)
        if token_tiers is not None:
            table = table.with_graph_tiers(token_tiers, max_slots)  # its curve, read at the graph tiers
        return ObtainedSpsTable(table, "upstream-json", time.monotonic() - started)

    from sglang.srt.speculative.ragged_verify import read_ragged_verify_mode

    pool_tokens = int(model_runner.token_to_kv_pool.size)

    def make_plan(max_probes: int = 40) -> ProbePlan:
        return make_probe_plan(
            max_requests, gamma, pool_tokens, max_probes=max_probes, token_tiers=token_tiers, max_slots=max_slots
        )

    plan = make_plan()
    group, tp_size = _tp_cpu_group()
    model_config = model_runner.model_config
    key = make_cache_key(
        model_path=model_config.model_path,
        dtype=str(model_config.dtype),
        device=str(model_runner.device),
        tp_size=tp_size,  # ModelRunner has no tp_size attribute: getattr(model_runner, "tp_size", 1) was always 1
        attention_backend=type(model_runner.attn_backend).__name__,
        max_total_tokens=pool_tokens,
        probe_grid=plan,  # carries token_tiers / max_slots
        cuda_graph=model_runner.decode_cuda_graph_runner is not None,
        verify_mode=read_ragged_verify_mode().value,
        extra=_linear_backend_entry(str(model_runner.device)),
    )
    cache = SpsTableCache()
    measure = make_verify_forward_measurer(model_runner, plan)  # context_tokens and tiers do not change on thinning

    def store_if_trusted(table: SpsTable):
        # A table profiled while the machine was busy serves this run but is not cached (profiler/table_trust.py).
        # Under TP a lone re-measurement would be a collective forward on one rank: only the host check runs there.
        try:
            refusal = cache_refusal(
                table, measure if group is None else None, device=str(model_runner.device),
                own_threads=torch.get_num_threads(), window=window,
            )
        except Exception as exc:  # noqa: BLE001 - a failed check must not cache, and must not fail the start-up
            refusal = f"the trust check failed ({exc})"
        if refusal is not None:
            logger.warning("sglang-dspark: SPS table not cached: profiled while the machine was busy (%s); "
                           "it serves this run, the next start profiles again", refusal)
            return None
        return cache.store(key, table)

    window = ContentionWindow()  # what other processes ran on the CPU while we profile
    table = profile_consistently(
        measure,
        lambda collective_measure: fit_schedule_to_budget(collective_measure, make_plan, time_budget_seconds),
        group,
        load_cached=lambda: cache.load(key),
        store=store_if_trusted,
        progress=True,
    )
    source = "cache" if table.source == "cache" else "profiled"
    return ObtainedSpsTable(table, source, time.monotonic() - started)
