"""Our DSPARK worker: upstream's ``DSparkWorkerV2``, swapped in for it through ``HookRegistry`` (REPLACE).

SGLang reserves the name DSPARK and builds the worker with a call-time import of
``dspark_worker_v2.DSparkWorkerV2`` (spec_info.py, ``create_worker``), so replacing that module attribute in every
scheduler process is how ``--speculative-algorithm DSPARK`` reaches this class. Upstream's pipeline (draft block,
Markov sampling, verify, accept, commit) is correct and reused as is. What we add lives in our planner
(``sglang_dspark/engine/planner.py``: admission policy, SPS table, cost model, admission record); the worker times each
decode step and forwards it to the planner, without a host sync (``engine/step_record.py``).

``SGLANG_DSPARK_WORKER=upstream`` keeps upstream's class (documented; used to compare side by side).
"""

from __future__ import annotations

import logging
import os

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

from sglang_dspark import envs

from sglang_dspark.engine.step_record import StepRecorder

logger = logging.getLogger(__name__)

UPSTREAM_WORKER_TARGET = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"


def use_upstream_worker() -> bool:
    return envs.WORKER.get() == "upstream"


class DSparkWorker(DSparkWorkerV2):
    """sglang-dspark's DSPARK worker (see module docstring)."""

    implementation = "sglang-dspark"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_recorder = StepRecorder(self.device)
        logger.info("sglang-dspark DSPARK worker active (pid %d)", os.getpid())

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        # Last start-up hook the scheduler calls on the worker: KV pools and attention backends exist now, so this is
        # where the SPS table is profiled (or loaded), before the first request.
        if self._hosts_draft:
            self._verify_planner.install_sps_table()

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        is_decode = self._hosts_draft and not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
        if is_decode:
            self._step_recorder.start()
        result = super().forward_batch_generation(
            batch, on_publish, grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
        )
        if is_decode and getattr(result, "accept_lens", None) is not None and result.accept_lens.numel() > 0:
            planner = self._verify_planner
            # Only times and forwards: no host read of a device tensor here (StepRecorder copies without blocking).
            for record in self._step_recorder.finish(
                accept_lens=result.accept_lens,
                cap_lens=result.cap_lens,
                confidence=planner.last_confidence,
                default_verify_len=int(self.verify_num_draft_tokens),
            ):
                planner.observe_step(record)
        return result
