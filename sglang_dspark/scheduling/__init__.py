"""DSpark admission scheduling: which draft tokens the target verifies each step (pure torch, no SGLang imports)."""

from sglang_dspark.scheduling.admission import (
    ADMISSION_POLICIES,
    DEFAULT_ADMISSION_POLICY,
    admit,
    admit_async,
    admit_exact,
    admit_off,
    admit_topk,
    admit_verify_all,
    capacity_from_survival,
    capacity_global_search,
    candidate_ranks,
    expected_throughput,
    greedy_path_throughput,
    survival_probabilities,
    topk_admitted_mask,
)
from sglang_dspark.scheduling.cost_model import StepCostModel, TabulatedSps1D

__all__ = [
    "ADMISSION_POLICIES",
    "DEFAULT_ADMISSION_POLICY",
    "StepCostModel",
    "TabulatedSps1D",
    "admit",
    "admit_async",
    "admit_exact",
    "admit_off",
    "admit_topk",
    "admit_verify_all",
    "capacity_from_survival",
    "capacity_global_search",
    "candidate_ranks",
    "expected_throughput",
    "greedy_path_throughput",
    "survival_probabilities",
    "topk_admitted_mask",
]
