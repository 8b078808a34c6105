"""Contract: our reference top-K admission (``scheduling.admit_topk``) is exactly upstream's production top-K
(``ScheduleVerifyLensTopk``, the rule the async policy runs in the server) — same lengths on every input, ties
included. If SGLang changes its ordering or tie-break, this fails and the proofs in ``scheduling/admission.py``
(which are about ``admit_topk``) no longer describe what the server does."""

from __future__ import annotations

import pytest
import torch
from sglang.kernels.ops.speculative.dspark.dspark_schedule import ScheduleVerifyLensTopk
from sglang.srt.speculative.dspark_components.dspark_planner import DSparkScheduleConfig

from sglang_dspark.scheduling import admit_topk

EPS = DSparkScheduleConfig(gamma=1).survival_eps


def random_confidences(gen: torch.Generator, requests: int, gamma: int, levels: int) -> torch.Tensor:
    """Confidences on a coarse grid (``levels`` values, zeros included) so that survivals tie often."""
    return torch.randint(0, levels + 1, (requests, gamma), generator=gen).double() / levels


@pytest.mark.parametrize("levels", [2, 4, 1000])
def test_reference_topk_equals_upstream_topk(levels):
    gen = torch.Generator().manual_seed(levels)
    ties_seen = 0
    for trial in range(300):
        requests = int(torch.randint(1, 17, (1,), generator=gen))
        gamma = int(torch.randint(1, 9, (1,), generator=gen))
        confidence = random_confidences(gen, requests, gamma, levels)
        survival = confidence.cumprod(dim=1)
        ties_seen += int(survival.numel() - survival.unique().numel())
        for budget in {0, 1, requests, requests * gamma // 2, requests * gamma, requests * gamma + 3}:
            upstream = ScheduleVerifyLensTopk.torch(
                confidence=confidence.float(), budget=budget, cfg=DSparkScheduleConfig(gamma=gamma)
            )
            ours = admit_topk(confidence.float().double(), budget, min_survival=EPS) + 1
            assert ours.tolist() == upstream.tolist(), (trial, budget, confidence)
    if levels <= 4:
        assert ties_seen > 100  # the coarse grids really exercise the tie-break
