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

    from sglang_dspark.worker import UPSTREAM_WORKER_TARGET, DSparkWorker, use_upstream_worker

    if use_upstream_worker():
        logger.info("SGLANG_DSPARK_WORKER=upstream: keeping SGLang's own DSparkWorkerV2")
        return
    HookRegistry.register(UPSTREAM_WORKER_TARGET, DSparkWorker, HookType.REPLACE)
