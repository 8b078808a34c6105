"""The ``_handle_dspark`` argument-resolution hook (launcher process), one wrapper for two jobs.

1. On the CPU platform, let upstream's DSPARK resolution run on device "cpu" (sglang_dspark/cpu/dspark_fallbacks.py).
2. With our worker, pick the verify mode our admission policy needs. SGLang builds the draft (and decides whether it has a confidence head) from ``SGLANG_RAGGED_VERIFY_MODE`` in the
scheduler process, which inherits the launcher's environment. So the choice is made here, where the draft path
is known, before any scheduler is spawned.
"""

from __future__ import annotations

import logging
import os

from sglang_dspark.admission_policy import (
    VERIFY_MODE_ENV,
    draft_has_confidence_head,
    read_admission_policy,
    verify_mode_for,
)

logger = logging.getLogger(__name__)
DSPARK_ARG_HANDLER = "sglang.srt.arg_groups.speculative_hook._handle_dspark"


def handle_dspark(original, server_args):
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_dspark._startup import cpu_platform_active
    from sglang_dspark.worker import use_upstream_worker

    if cpu_platform_active():
        from sglang_dspark.cpu.dspark_fallbacks import handle_dspark_allowing_cpu

        result = handle_dspark_allowing_cpu(original, server_args)
    else:
        result = original(server_args)
    if use_upstream_worker():
        return result

    draft_path = resolving_view(server_args).speculative_draft_model_path
    mode, warning = verify_mode_for(
        read_admission_policy(), os.environ.get(VERIFY_MODE_ENV), draft_has_confidence_head(draft_path)
    )
    if warning:
        logger.warning("sglang-dspark: %s", warning)
    os.environ[VERIFY_MODE_ENV] = mode
    return result
