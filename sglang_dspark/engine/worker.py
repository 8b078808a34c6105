"""Our DSPARK worker: upstream's ``DSparkWorkerV2``, swapped in for it through ``HookRegistry`` (REPLACE).

SGLang reserves the name DSPARK and builds the worker with a call-time import of
``dspark_worker_v2.DSparkWorkerV2`` (spec_info.py, ``create_worker``), so replacing that module attribute in every
scheduler process is how ``--speculative-algorithm DSPARK`` reaches this class. Upstream's pipeline (draft block,
Markov sampling, verify, accept, commit) is correct and reused as is. What we add lives in our planner
(``sglang_dspark/engine/planner.py``: admission policy, SPS table) and here: per decode step we feed the measured step time
to the learned step overhead (the cost model's online part) and the admission/acceptance record to observability.

``SGLANG_DSPARK_WORKER=upstream`` keeps upstream's class (documented; used to compare side by side).
"""

from __future__ import annotations

import logging
import os
import time

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

from sglang_dspark import envs

from sglang_dspark.scheduling.stats import get_admission_stats

logger = logging.getLogger(__name__)

UPSTREAM_WORKER_TARGET = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"


def use_upstream_worker() -> bool:
    return envs.WORKER.get() == "upstream"


class DSparkWorker(DSparkWorkerV2):
    """sglang-dspark's DSPARK worker (see module docstring)."""

    implementation = "sglang-dspark"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Host wall time is the step time only when the device runs synchronously (the CPU); on a GPU the overlap
        # scheduler returns before the device finishes, so learning the overhead there needs device timers (to do).
        self._host_time_is_step_time = str(self.device).startswith("cpu")
        logger.info("sglang-dspark DSPARK worker active (pid %d)", os.getpid())

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        # Last start-up hook the scheduler calls on the worker: KV pools and attention backends exist now, so this is
        # where the SPS table is profiled (or loaded), before the first request.
        if self._hosts_draft:
            self._verify_planner.install_sps_table()

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        is_decode = self._hosts_draft and not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
        started = time.perf_counter()
        result = super().forward_batch_generation(
            batch, on_publish, grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
        )
        if is_decode and getattr(result, "accept_lens", None) is not None and result.accept_lens.numel() > 0:
            self._observe_decode_step(result, time.perf_counter() - started)
        return result

    def _observe_decode_step(self, result, seconds: float) -> None:
        planner = self._verify_planner
        commit_lens = result.accept_lens.tolist()
        num_requests = len(commit_lens)
        if result.cap_lens is not None:
            verify_lens = result.cap_lens.tolist()
        else:
            verify_lens = [int(self.verify_num_draft_tokens)] * num_requests
        table = getattr(planner, "sps_table", None)
        if table is not None and self._host_time_is_step_time:
            planner.step_overhead.observe(num_requests, seconds, table.step_seconds(num_requests, sum(verify_lens)))
        confidence = getattr(planner, "last_confidence", None)
        survival = None
        if confidence is not None and confidence.shape[0] == num_requests:
            survival = confidence.detach().float().cpu().cumprod(dim=1)
        try:
            get_admission_stats().record_step(
                verify_lens=verify_lens,
                accepted_drafts=[max(0, n - 1) for n in commit_lens],
                survival=survival,
                step_seconds=seconds,
            )
        except ValueError as exc:  # observability must never take a decode step down
            if not getattr(self, "_stats_error_logged", False):
                self._stats_error_logged = True
                logger.warning("sglang-dspark: admission stats skipped a step (%s)", exc)
