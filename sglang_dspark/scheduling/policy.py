"""Which admission policy runs, and the verify mode it needs (pure; read by the plugin and the planner).

``SGLANG_DSPARK_ADMISSION`` picks the policy (default ``async``):

* ``async``      — the paper's production scheduler (§5.2): capacity K from confidences two steps back by a global
                   search over Θ = τ·SPS, then the top-K current candidates. No host sync. Lossless.
* ``exact``      — Algorithm 1 on the current confidences, with its first-non-improvement stop. Lossless; syncs the
                   host each step.
* ``verify-all`` — verify every draft token (upstream's default ``static`` mode).
* ``off``        — verify only the anchor (speculation without draft tokens; for comparisons).

Confidence scheduling runs in SGLang's ragged ("compact") verify mode; we select it unless the user set
``SGLANG_RAGGED_VERIFY_MODE`` themselves or the draft has no confidence head, wherever it comes from (then verify-all,
with one warning; ``engine/draft_head.py`` reads it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from sglang_dspark import envs
from sglang_dspark.scheduling.admission import ADMISSION_POLICIES, admit_exact, capacity_from_survival
from sglang_dspark.scheduling.cost_model import StepCostModel

def read_admission_policy() -> str:
    return envs.ADMISSION.get()


class AdmissionPolicy:
    """The one place a policy name turns into decisions; built once per planner (and by the tests).

    A step decides in two stages (SGLang's planner calls both): ``capacity`` before the draft, on the host, from
    survivals two steps back (the budget K); then ``verify_lengths`` after the draft, from this step's confidences.
    ``None`` from ``verify_lengths`` means "upstream's device top-K of the current confidences", which is exactly
    :func:`~sglang_dspark.scheduling.admit_topk` (pinned by tests/unit/scheduling/test_topk_contract.py).
    """

    def __init__(self, name: str) -> None:
        if name not in ADMISSION_POLICIES:
            raise ValueError(f"unknown admission policy {name!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
        self.name = name

    @classmethod
    def from_env(cls) -> "AdmissionPolicy":
        return cls(read_admission_policy())

    @property
    def schedules_per_request(self) -> bool:
        """False for verify-all: it runs upstream's static mode, no per-request scheduling at all."""
        return self.name != "verify-all"

    def capacity(self, lagged_survival: torch.Tensor, cost: StepCostModel, num_requests: int) -> int:
        """The budget K (draft tokens verified this step, all requests together)."""
        gamma = lagged_survival.shape[-1]
        if self.name == "off":
            return 0
        if self.name in ("exact", "verify-all"):
            return num_requests * gamma  # exact: an upper bound only, it admits from the current confidences
        return int(capacity_from_survival(lagged_survival, cost, num_requests))

    def verify_lengths(self, confidence: Optional[torch.Tensor], num_requests: int, cost: StepCostModel,
                       device) -> Optional[torch.Tensor]:
        """Per-request verify lengths (anchor included, int32 on ``device``), or None for upstream's top-K."""
        if self.name == "off":
            # Anchor only, also on steps where upstream would verify everything (no lagged budget yet).
            return torch.ones(num_requests, dtype=torch.int32, device=device)
        if self.name == "exact" and confidence is not None:
            # Algorithm 1 with its stop on this step's confidences: they must reach the host, so this syncs.
            lengths = admit_exact(confidence.detach().to("cpu", torch.float64), cost)
            return (lengths + 1).to(device=device, dtype=torch.int32)
        return None


def confidence_head_enabled(draft_config: dict) -> bool:
    """DeepSpec writes ``enable_confidence_head``; upstream builds a head in its ragged modes whatever the value (and
    without the key), then needs its weights; we read the value, and no key means no head."""
    return bool(draft_config.get("enable_confidence_head", False))


def draft_has_confidence_head(draft_path: Optional[str]) -> Optional[bool]:
    """A local draft folder's answer; None where there is no local ``config.json`` to read (a hub id: the engine
    looks it up in the local Hugging Face cache, ``engine/draft_head.py``). None is falsy: no head, verify-all."""
    if not draft_path:
        return None
    config_file = Path(draft_path) / "config.json"
    if not config_file.is_file():
        return None
    return confidence_head_enabled(json.loads(config_file.read_text()))
