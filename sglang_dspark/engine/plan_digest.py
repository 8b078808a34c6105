"""Each TP rank's running digest of the verifies it laid out (issue #46, item 4): ranks that agree on every decode
step log equal digests.

Under TP every rank lays out each decode step's verify on its own host: the verify budget K from the lagged
confidences (``patches/tp_relay_readiness.py``), the CUDA-graph tier it gives, the verify lengths (rank 0's,
through upstream's ``DSPARK_PLAN`` broadcast, wherever a budget was computed). Ranks that disagree replay different
graphs in the same step. The digest makes the agreement visible from outside the server: a running hash, per rank, over
every verify the planner lays out (``AdmissionVerifyPlanner.schedule_layout``) of

* the step's kind (``drafted``, ``plain``, ``lookup``, ``mixed``: ``scheduling/step_plan.py``) and its number of requests;
* the verify budget K (None: upstream's uniform layout at the full tier);
* the layout's graph token count (the tier the verify replays; none for the uniform path);
* the verify lengths where the layout holds them on the host (SGLang builds them there off CUDA graphs, the CPU
  included; under CUDA graphs they stay on the device and are left out rather than read with a host sync).

Where the TP group has more than one rank, each rank logs one line when its scheduler goes fully idle after verifies it
has not logged yet (``Scheduler.on_idle``, BEFORE; a log line, no change to what SGLang does)::

    sglang-dspark plan digest: tp_rank=1 verifies=412 digest=9c1e0f3a2b7d4e55

Two ranks' lines with the same ``verifies`` count carry the same digest when they laid out the same verifies, and (but
for a hash collision) only then; tests/e2e/test_e2e_tp.py reads them. With one rank nothing is hashed or logged.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any, Optional

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

ON_IDLE_TARGET = "sglang.srt.managers.scheduler.Scheduler.on_idle"
LINE_PATTERN = re.compile(r"sglang-dspark plan digest: tp_rank=(\d+) verifies=(\d+) digest=([0-9a-f]+)")


class PlanDigest:
    """A running BLAKE2b (8 bytes) over this rank's verify layouts (module docstring)."""

    def __init__(self, tp_rank: int) -> None:
        self.tp_rank = int(tp_rank)
        self.verifies = 0
        self.logged_verifies = 0
        self._hash = hashlib.blake2b(digest_size=8)

    def fold(self, *, kind: str, num_requests: int, budget: Optional[int], layout: Any) -> None:
        """One verify: ``layout`` is upstream's ``RaggedVerifyLayout`` (or None: the uniform path)."""
        tier = int(layout.graph_num_tokens) if layout is not None else None
        lens = tuple(layout.verify_lens_cpu) if layout is not None and layout.verify_lens_cpu is not None else None
        budget = int(budget) if budget is not None else None
        self._hash.update(repr((kind, int(num_requests), budget, tier, lens)).encode())
        self.verifies += 1

    @property
    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def unlogged(self) -> bool:
        return self.verifies != self.logged_verifies

    def line(self) -> str:
        return f"sglang-dspark plan digest: tp_rank={self.tp_rank} verifies={self.verifies} digest={self.hexdigest}"

    def log(self) -> None:
        self.logged_verifies = self.verifies
        logger.info("%s", self.line())


def plan_digest_for(tp_size: int, tp_rank: int) -> Optional[PlanDigest]:
    """A digest where the TP group has more than one rank (None: one rank decides alone)."""
    return PlanDigest(tp_rank) if int(tp_size) > 1 else None


def parse_digest_lines(text: str) -> dict[int, dict[int, str]]:
    """``{tp_rank: {verifies: digest}}`` from a server log."""
    found: dict[int, dict[int, str]] = {}
    for rank, verifies, digest in LINE_PATTERN.findall(text):
        found.setdefault(int(rank), {})[int(verifies)] = digest
    return found


def log_digest_at_idle(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.on_idle``: the rank's digest line, once per idle period that follows new verifies."""
    planner = None
    try:
        planner = getattr(getattr(scheduler, "draft_worker", None), "_verify_planner", None)
        digest = getattr(planner, "plan_digest", None)
        if digest is not None and digest.unlogged() and scheduler.is_fully_idle():
            digest.log()
    except Exception:  # a log line must never take the scheduler down (nor repeat on every idle pass)
        if planner is not None:
            planner.plan_digest = None
        logger.exception("sglang-dspark: could not log the plan digest; no more digest lines from this rank")


@install_once
def register_plan_digest_hooks() -> None:
    """Called with the engine's hooks in every SGLang process; runs once."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ON_IDLE_TARGET, log_digest_at_idle, HookType.BEFORE)


__all__ = ["LINE_PATTERN", "ON_IDLE_TARGET", "PlanDigest", "log_digest_at_idle", "parse_digest_lines",
           "plan_digest_for", "register_plan_digest_hooks"]
