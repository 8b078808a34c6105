"""SPS profiling at engine start-up (SGLang adapter): time real target verify forwards, cache the table.

Upstream SGLang only loads an SPS table profiled offline by an HTTP client against a running server, then needs a
restart. We time the engine's own target forward in TARGET_VERIFY mode, at the (requests R, verify tokens B) shapes
the scheduler will choose between, while the worker starts, and cache the result on disk keyed by everything that
changes it. On restart the cached table is reused; while serving, the rest of the step (draft, sampling,
bookkeeping) is learned on top of it from measured step times (profiler/step_overhead.py).

The synthetic verify batches use request-pool rows and KV slots that are free at start-up (nothing is allocated
through the allocators, so nothing can leak); the rows are reset afterwards. Their KV contents are garbage, which
does not change the cost of attention.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_dspark.profiler.probe_plan import ProbePlan, build_table, make_probe_plan, split_verify_tokens
from sglang_dspark.profiler.sps_cache import SpsTableCache, make_cache_key
from sglang_dspark.profiler.sps_table import SpsTable
from sglang_dspark.profiler.upstream_sps import load_sps_table_file

logger = logging.getLogger(__name__)


@dataclass
class ObtainedSpsTable:
    table: SpsTable
    source: str  # "profiled" | "cache" | "upstream-json"
    seconds: float  # wall time spent obtaining it


def make_verify_forward_measurer(model_runner, gamma: int, context_tokens: int) -> Callable[[int, int], float]:
    """``measure(R, B) -> seconds`` of one target TARGET_VERIFY forward: R requests, B verify tokens in total
    (anchors included), each request with ``context_tokens`` of committed context."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    device = model_runner.device
    req_to_token = model_runner.req_to_token_pool.req_to_token
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)

    def measure(num_requests: int, verify_tokens: int) -> float:
        lens = split_verify_tokens(num_requests, verify_tokens, gamma + 1)
        width = context_tokens + max(lens)
        # Slot 0 is SGLang's padding slot; every request reads the same context slots 1..context_tokens.
        req_to_token[:num_requests, :width] = torch.arange(1, width + 1, dtype=req_to_token.dtype, device=device)
        seq_lens = torch.full((num_requests,), context_tokens, dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(context_tokens, context_tokens + n) for n in lens]).to(device)
        out_cache_loc = positions + 1
        input_ids = torch.zeros(verify_tokens, dtype=torch.int64, device=device)
        layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=device, grid=[verify_tokens])
        spec_info = DFlashVerifyInput(
            draft_token=input_ids,
            positions=positions,
            draft_token_num=gamma + 1,
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
            seq_lens_sum=int(context_tokens * num_requests),
            seq_lens_cpu=seq_lens.cpu() + torch.tensor(lens),
            positions=positions,
            spec_info=spec_info,
            spec_algorithm=model_runner.spec_algorithm,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        sync()
        started = time.perf_counter()
        with torch.inference_mode():
            model_runner.forward(batch)  # the engine's own path: attention metadata, forward context, logits
        sync()
        return time.perf_counter() - started

    def measure_and_reset(num_requests: int, verify_tokens: int) -> float:
        try:
            return measure(num_requests, verify_tokens)
        finally:
            req_to_token[:num_requests].zero_()

    return measure_and_reset


def obtain_sps_table(
    *,
    model_runner,
    gamma: int,
    max_requests: int,
    upstream_table_path: Optional[str],
    time_budget_seconds: float = 2.0,
) -> ObtainedSpsTable:
    """The SPS table for this engine: upstream's JSON if given, else the on-disk cache, else profile now."""
    started = time.monotonic()
    if upstream_table_path:
        table = load_sps_table_file(upstream_table_path, max_requests=max_requests)
        return ObtainedSpsTable(table, "upstream-json", time.monotonic() - started)

    pool_tokens = int(model_runner.token_to_kv_pool.size)
    plan = make_probe_plan(max_requests, gamma, pool_tokens)
    model_config = model_runner.model_config
    key = make_cache_key(
        model_path=model_config.model_path,
        dtype=str(model_config.dtype),
        device=str(model_runner.device),
        tp_size=int(getattr(model_runner, "tp_size", 1) or 1),
        attention_backend=type(model_runner.attn_backend).__name__,
        max_total_tokens=pool_tokens,
        probe_grid=plan.to_dict(),
    )
    cache = SpsTableCache()
    cached = cache.load(key)
    if cached is not None:
        return ObtainedSpsTable(cached, "cache", time.monotonic() - started)

    measure = make_verify_forward_measurer(model_runner, gamma, plan.context_tokens)
    plan, repeats, warmup = fit_plan_to_budget(measure, plan, time_budget_seconds, max_requests, gamma, pool_tokens)
    table = build_table(measure, plan, progress=True, repeats=repeats, warmup=warmup)
    try:
        cache.store(key, table)
    except OSError as exc:  # a read-only home must not stop the server
        logger.warning("sglang-dspark: could not cache the SPS table (%s); it will be profiled again next start.", exc)
    return ObtainedSpsTable(table, "profiled", time.monotonic() - started)


def fit_plan_to_budget(measure, plan: ProbePlan, budget_seconds: float, max_requests: int, gamma: int, pool_tokens: int):
    """(plan, repeats, warmup) whose estimated profiling time fits ``budget_seconds``.

    Start-up must stay short (target: under 10 % of server start-up). The cost of a probe is estimated from two
    measured ones (smallest and largest verify batch, linear in B between them); then, in order, we drop repeats,
    drop per-probe warm-ups, and finally thin the grid. The table's interpolation covers what a thinner grid skips,
    and online refinement corrects it while serving.
    """
    probes = list(plan.probes())
    smallest = min(probes, key=lambda p: p[1])
    largest = max(probes, key=lambda p: p[1])
    measure(*largest)  # first-call allocations
    t_small, t_large = measure(*smallest), measure(*largest)
    span = max(1, largest[1] - smallest[1])

    def one_pass(candidate: ProbePlan) -> float:
        return sum(t_small + (t_large - t_small) * (b - smallest[1]) / span for _, b in candidate.probes())

    for repeats, warmup in ((3, 1), (2, 0), (1, 0)):
        if one_pass(plan) * (repeats + warmup) <= budget_seconds:
            return plan, repeats, warmup
    max_probes = plan.num_probes
    while max_probes > 8:
        max_probes = max(8, int(max_probes * 0.7))
        thinner = make_probe_plan(max_requests, gamma, pool_tokens, max_probes=max_probes)
        if one_pass(thinner) <= budget_seconds:
            return thinner, 1, 0
    logger.warning(
        "sglang-dspark: SPS profiling needs ~%.1f s even on a minimal grid (budget %.1f s)", one_pass(thinner), budget_seconds
    )
    return thinner, 1, 0
