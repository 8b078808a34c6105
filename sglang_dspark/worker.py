"""Our DSPARK worker: upstream's ``DSparkWorkerV2``, swapped in for it through ``HookRegistry`` (REPLACE).

SGLang reserves the name DSPARK and builds the worker with a call-time import of
``dspark_worker_v2.DSparkWorkerV2`` (spec_info.py, ``create_worker``), so replacing that module attribute in every
scheduler process is how ``--speculative-algorithm DSPARK`` reaches this class. Upstream's pipeline (draft block,
Markov sampling, verify, accept, commit) is correct and reused as is; this subclass is where we add what we improve
(verify admission, SPS profiling, observability).

``SGLANG_DSPARK_WORKER=upstream`` keeps upstream's class (documented; used to compare side by side).
"""

from __future__ import annotations

import logging
import os

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

logger = logging.getLogger(__name__)

UPSTREAM_WORKER_TARGET = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"


def use_upstream_worker() -> bool:
    choice = os.environ.get("SGLANG_DSPARK_WORKER", "sglang-dspark").strip().lower()
    if choice not in ("sglang-dspark", "upstream"):
        raise ValueError(
            f"SGLANG_DSPARK_WORKER={choice!r} is not a worker; use 'sglang-dspark' (default) or 'upstream'."
        )
    return choice == "upstream"


class DSparkWorker(DSparkWorkerV2):
    """sglang-dspark's DSPARK worker (see module docstring)."""

    implementation = "sglang-dspark"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        logger.info("sglang-dspark DSPARK worker active (pid %d)", os.getpid())
