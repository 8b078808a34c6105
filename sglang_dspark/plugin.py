"""The SGLang plugin (entry point ``dspark`` in group ``sglang.srt.plugins``).

SGLang calls ``register()`` in every process it starts (launcher, scheduler, detokenizer) before it builds the
scheduler, so hooks registered here are live where the worker runs. Heavy imports stay inside ``register``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dspark._startup import cpu_platform_active
    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    if cpu_platform_active():
        from sglang_dspark.cpu import dspark_fallbacks
        from sglang_dspark.patches import cpu_dspark

        cpu_dspark.apply()
        dspark_fallbacks.register_hooks()

    from sglang_dspark.arg_resolution import DSPARK_ARG_HANDLER, handle_dspark
    from sglang_dspark.worker import UPSTREAM_WORKER_TARGET, DSparkWorker, use_upstream_worker

    # CPU device guard and, with our worker, the verify mode of the admission policy.
    HookRegistry.register(DSPARK_ARG_HANDLER, handle_dspark, HookType.AROUND)
    if use_upstream_worker():
        logger.info("SGLANG_DSPARK_WORKER=upstream: keeping SGLang's own DSparkWorkerV2 and planner")
        return
    from sglang_dspark.observability import register_observability_hooks
    from sglang_dspark.planner import UPSTREAM_PLANNER_TARGET, AdmissionVerifyPlanner

    HookRegistry.register(UPSTREAM_WORKER_TARGET, DSparkWorker, HookType.REPLACE)
    HookRegistry.register(UPSTREAM_PLANNER_TARGET, AdmissionVerifyPlanner, HookType.REPLACE)
    register_observability_hooks()
