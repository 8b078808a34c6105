"""Which admission policy runs, and the verify mode it needs (pure; read by the plugin and the planner).

``SGLANG_DSPARK_ADMISSION`` picks the policy (default ``async``):

* ``async``      — the paper's production scheduler (§5.2): capacity K from confidences two steps back by a global
                   search over Θ = τ·SPS, then the top-K current candidates. No host sync. Lossless.
* ``exact``      — Algorithm 1 on the current confidences, with its first-non-improvement stop. Lossless; syncs the
                   host each step.
* ``verify-all`` — verify every draft token (upstream's default ``static`` mode).
* ``off``        — verify only the anchor (speculation without draft tokens; for comparisons).

Confidence scheduling runs in SGLang's ragged ("compact") verify mode; we select it unless the user set
``SGLANG_RAGGED_VERIFY_MODE`` themselves or the draft has no confidence head (then verify-all, with one warning).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from sglang_dspark import envs

VERIFY_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"


def read_admission_policy() -> str:
    return envs.ADMISSION.get()


def draft_has_confidence_head(draft_path: Optional[str]) -> bool:
    """DeepSpec writes ``enable_confidence_head``; upstream only checks its presence, we read its value."""
    if not draft_path:
        return False
    config_file = Path(draft_path) / "config.json"
    if not config_file.is_file():
        return True  # a hub id or bundled draft: let SGLang's own loader decide (it errors clearly if absent)
    config = json.loads(config_file.read_text())
    return bool(config.get("enable_confidence_head", False))


def verify_mode_for(policy: str, user_mode: Optional[str], has_confidence_head: bool) -> tuple[str, Optional[str]]:
    """(verify mode, warning or None) for SGLang's SGLANG_RAGGED_VERIFY_MODE."""
    if user_mode:
        return user_mode, None
    if policy == "verify-all":
        return "static", None
    if not has_confidence_head:
        return "static", (
            f"the DSpark draft has no confidence head, so admission policy {policy!r} cannot schedule per request: "
            "verifying every draft token (verify-all). Use a draft trained with a confidence head to enable it."
        )
    return "compact", None
