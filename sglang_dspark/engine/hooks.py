"""Which SGLang internals our engine classes replace or wrap (HookRegistry), registered by the plugin."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register_engine_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dspark.engine.arg_resolution import DSPARK_ARG_HANDLER, handle_dspark
    from sglang_dspark.engine.worker import UPSTREAM_WORKER_TARGET, DSparkWorker, use_upstream_worker

    # CPU device guard, shipped draft/STS defaults and, with our worker, the verify mode.
    HookRegistry.register(DSPARK_ARG_HANDLER, handle_dspark, HookType.AROUND)
    if use_upstream_worker():
        logger.info("SGLANG_DSPARK_WORKER=upstream: keeping SGLang's own DSparkWorkerV2 and planner")
        return
    from sglang_dspark.engine.observability import register_observability_hooks
    from sglang_dspark.engine.plan_digest import register_plan_digest_hooks
    from sglang_dspark.engine.planner import UPSTREAM_PLANNER_TARGET, AdmissionVerifyPlanner

    HookRegistry.register(UPSTREAM_WORKER_TARGET, DSparkWorker, HookType.REPLACE)
    HookRegistry.register(UPSTREAM_PLANNER_TARGET, AdmissionVerifyPlanner, HookType.REPLACE)
    register_observability_hooks()
    register_plan_digest_hooks()  # under TP: each rank's digest of its verify layouts, at idle
