"""The ``_handle_dspark`` argument-resolution hook (launcher process), one wrapper for four jobs.

1. On the CPU platform, let upstream's DSPARK resolution run on device "cpu" (sglang_dspark/patches/cpu_dspark.py).
2. Serve the embedded SmolLM2 target with the draft we ship for it when no draft path is given (upstream would
   refuse: the target folder bundles no draft).
3. Use the STS calibration shipped beside the draft (``dspark_sts.json``) when none is given: upstream leaves the
   confidence uncalibrated unless ``--speculative-dspark-confidence-sts-path`` is passed, and nothing should need
   tuning by hand. An explicit path always wins.
4. With our worker, pick the verify mode our admission policy needs. SGLang builds the draft (and decides whether it has a confidence head) from ``SGLANG_RAGGED_VERIFY_MODE`` in the
scheduler process, which inherits the launcher's environment. So the choice is made here, where the draft path
is known, before any scheduler is spawned.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sglang_dspark.scheduling.policy import (
    VERIFY_MODE_ENV,
    draft_has_confidence_head,
    read_admission_policy,
    verify_mode_for,
)

logger = logging.getLogger(__name__)
DSPARK_ARG_HANDLER = "sglang.srt.arg_groups.speculative_hook._handle_dspark"
SHIPPED_STS_NAME = "dspark_sts.json"


def shipped_sts_path(draft_path) -> str | None:
    """``<draft>/dspark_sts.json`` for a local draft folder that ships one."""
    if not draft_path:
        return None
    candidate = Path(str(draft_path)) / SHIPPED_STS_NAME
    return str(candidate) if candidate.is_file() else None


def _default_draft_for_embedded_target(server_args, view) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution

    from sglang_dspark.embedded.defaults import is_embedded_target, packaged_draft_dir

    if view.speculative_draft_model_path is None and is_embedded_target(view.model_path):
        try:
            draft = packaged_draft_dir()
        except FileNotFoundError:
            return  # upstream's own error then names the missing --speculative-draft-model-path
        logger.info("sglang-dspark: embedded SmolLM2 target, using the shipped draft %s", draft)
        declare_resolution(server_args, "sglang_dspark.engine.arg_resolution", speculative_draft_model_path=str(draft))


def handle_dspark(original, server_args):
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from sglang_dspark.cpu.startup import cpu_platform_active
    from sglang_dspark.engine.worker import use_upstream_worker

    view = resolving_view(server_args)  # a live view: it sees declarations made after this line too
    _default_draft_for_embedded_target(server_args, view)
    if cpu_platform_active():
        from sglang_dspark.patches.cpu_dspark import handle_dspark_allowing_cpu

        result = handle_dspark_allowing_cpu(original, server_args)
    else:
        result = original(server_args)
    draft_path = view.speculative_draft_model_path
    sts_path = shipped_sts_path(draft_path)
    if view.speculative_dspark_confidence_sts_path is None and sts_path is not None:
        logger.info("sglang-dspark: using the draft's STS calibration %s", sts_path)
        declare_resolution(server_args, "sglang_dspark.engine.arg_resolution",
                           speculative_dspark_confidence_sts_path=sts_path)
    if use_upstream_worker():
        return result

    mode, warning = verify_mode_for(
        read_admission_policy(), os.environ.get(VERIFY_MODE_ENV), draft_has_confidence_head(draft_path)
    )
    if warning:
        logger.warning("sglang-dspark: %s", warning)
    os.environ[VERIFY_MODE_ENV] = mode
    return result
