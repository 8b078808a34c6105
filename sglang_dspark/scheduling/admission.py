"""Admission: how many of each request's γ draft tokens the target verifies this step.

Notation (DSpark paper, Algorithm 1 and §5.2). A step holds ``R`` requests; request ``r`` drafted ``γ`` tokens with
conditional survival probabilities ``c[r, k]`` (the confidence head's estimate that draft ``k`` is accepted given that
drafts ``1..k-1`` were). A policy returns lengths ``ℓ[r] ∈ [0, γ]``: request ``r`` verifies its anchor plus drafts
``1..ℓ[r]``. With survival ``a[r, j] = Π_{i≤j} c[r, i]``::

    B(ℓ) = Σ_r (1 + ℓ[r])                       verify tokens, anchors included (B ≥ R)
    τ(ℓ) = Σ_r (1 + Σ_{j≤ℓ[r]} a[r, j])          expected tokens committed by the step (the anchor always counts)
    Θ(ℓ) = τ(ℓ) · SPS(R, B(ℓ))                   expected throughput, tokens per second

Every policy is built on one global order of the candidates ``(r, j)``: by ``a`` descending, ties broken by the
shallower position, then by the lower request index. Because ``a`` is non-increasing in ``j`` (enforced below), any
leading run of this order is a union of per-request prefixes, so taking the first ``K`` candidates is a valid length
vector, and among all length vectors with ``Σ ℓ = K`` it has the largest ``τ``. Hence ``max_ℓ Θ(ℓ) = max_K Θ_K``
where ``Θ_K = (R + Σ_{i<K} a_(i)) · SPS(R, R + K)`` is the throughput along this "greedy path".

Policies (names as accepted by :func:`admit`):

* ``"exact"`` — Algorithm 1: walk the greedy path, stop at the first ``K`` that does not improve ``Θ``.
* ``"async"`` — §5.2, the production variant: a capacity ``K`` from lagged confidences by an unconstrained
  ``argmax_K Θ_K``, then the top-``K`` candidates by the current survival.
* ``"verify-all"`` — every request verifies all ``γ`` drafts (static multi-token verification).
* ``"off"`` — no draft token is verified (only the anchor: plain decoding speed).

Why both policies are lossless (the output distribution equals the target's): rejection sampling stays exact as long
as the decision "verify draft ``k`` of request ``r``" depends only on what was known before ``x[r, k]`` was sampled,
i.e. on ``x[r, <k]`` (a stopping time). ``c[r, k]`` depends on ``x[r, k-1]``, so ``a[r, j]`` is a function of
``x[r, <j]``. In the global order, the candidates ranked before ``(r, j)`` are ``r``'s shallower positions and other
requests' candidates, never ``r``'s deeper ones; so the rank of ``(r, j)`` and everything on the path up to it are
fine. What must not happen is that a deeper candidate ``(r, j+1)``, whose survival depends on ``x[r, j]``, decides
whether ``(r, j)`` is admitted. A retrospective global maximum over the current path does exactly that (paper,
Appendix A); Algorithm 1's early stop and the production variant's lagged capacity are the two ways to prevent it.
The argument is per request: given the other requests' drafts, each request's admission is a stopping time of its
own drafts, so each request's output follows the target whatever the rest of the batch does.

All functions take ``c`` of shape ``[..., R, γ]``: leading dimensions are independent steps (simulations batch many
steps in one call), and return ``[..., R]`` lengths (``torch.long``). They never synchronise with the device, except
the cost model's own lookups. This module is pure torch: no SGLang imports.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from sglang_dspark.scheduling.cost_model import StepCostModel

__all__ = [
    "ADMISSION_POLICIES",
    "DEFAULT_ADMISSION_POLICY",
    "admit",
    "admit_async",
    "admit_exact",
    "admit_off",
    "admit_topk",
    "admit_verify_all",
    "capacity_global_search",
    "candidate_ranks",
    "expected_throughput",
    "greedy_path_throughput",
    "survival_probabilities",
    "topk_admitted_mask",
]

ADMISSION_POLICIES = ("exact", "async", "verify-all", "off")
DEFAULT_ADMISSION_POLICY = "async"

# Probabilities and throughputs are accumulated in float64: Θ comparisons decide admissions, and a float32 cumsum
# over thousands of candidates drifts enough to flip near-ties.
_DTYPE = torch.float64


def survival_probabilities(c: torch.Tensor) -> torch.Tensor:
    """``a[..., r, j] = Π_{i≤j} c[..., r, i]`` in float64, guaranteed non-increasing in ``j``.

    Confidences are clamped to ``[0, 1]`` and NaN is read as 0 (a confidence head emits a sigmoid; this only guards
    garbage). The running minimum makes monotonicity exact even if a parallel scan rounds a product upwards by an ulp:
    the prefix property of every policy below rests on it.
    """
    probs = torch.nan_to_num(c.to(_DTYPE), nan=0.0).clamp_(0.0, 1.0)
    if probs.shape[-1] == 0:
        return probs
    return torch.cummin(torch.cumprod(probs, dim=-1), dim=-1).values


def _position_major(x: torch.Tensor) -> torch.Tensor:
    """``[..., R, γ] -> [..., γ·R]``, flat index ``j·R + r``.

    Position-major, so a stable sort breaks ties by the shallower position first, then by the lower request index.
    """
    return x.transpose(-1, -2).reshape(*x.shape[:-2], -1)


def _request_major(flat: torch.Tensor, num_requests: int) -> torch.Tensor:
    """Inverse of :func:`_position_major`."""
    return flat.reshape(*flat.shape[:-1], -1, num_requests).transpose(-1, -2)


def _valid(survival: torch.Tensor, min_survival: float) -> torch.Tensor:
    # A candidate that cannot survive (a = 0) never enters the order (Algorithm 1: E = {(r, j) : a > 0}).
    return (survival > 0) & (survival >= min_survival)


def _greedy_order(survival: torch.Tensor, min_survival: float):
    """Sort the candidates once. Returns ``(sorted_a, ranks, num_valid)``.

    ``sorted_a[..., i]``: the survival of the ``i``-th candidate of the global order (0 past the valid ones);
    ``ranks[..., r, j]``: the position of ``(r, j)`` in that order (invalid candidates rank after all valid ones);
    ``num_valid[...]``: how many candidates are valid.
    """
    num_requests = survival.shape[-2]
    flat = _position_major(survival)
    valid = _valid(flat, min_survival)
    keys = torch.where(valid, flat, torch.full_like(flat, -1.0))  # invalid ones sort last, in flat order
    sorted_keys, order = torch.sort(keys, dim=-1, descending=True, stable=True)
    sorted_a = sorted_keys.clamp(min=0.0)
    flat_ranks = torch.empty_like(order)
    flat_ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return sorted_a, _request_major(flat_ranks, num_requests), valid.sum(dim=-1)


def _steps_per_second(cost: StepCostModel, num_requests: int, verify_tokens: torch.Tensor) -> torch.Tensor:
    sps = cost.steps_per_second(num_requests, verify_tokens)
    return torch.as_tensor(sps, dtype=_DTYPE, device=verify_tokens.device)


def _throughput_along_path(sorted_a: torch.Tensor, num_requests: int, cost: StepCostModel) -> torch.Tensor:
    """``Θ_K = (R + Σ_{i<K} sorted_a[i]) · SPS(R, R + K)`` for ``K = 0..N``: shape ``[..., N + 1]``."""
    zero = torch.zeros(*sorted_a.shape[:-1], 1, dtype=_DTYPE, device=sorted_a.device)
    tau = num_requests + torch.cat([zero, torch.cumsum(sorted_a, dim=-1)], dim=-1)
    verify_tokens = num_requests + torch.arange(tau.shape[-1], device=sorted_a.device)
    return tau * _steps_per_second(cost, num_requests, verify_tokens)


def _lengths_from_ranks(ranks: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Admit the first ``count`` candidates of the order: per-request lengths ``[..., R]``."""
    admitted = ranks < count.unsqueeze(-1).unsqueeze(-1)
    return admitted.sum(dim=-1)


def candidate_ranks(c: torch.Tensor, *, min_survival: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank of every candidate ``(r, j)`` in the global greedy order, and the number of valid candidates.

    Order: survival descending; ties by shallower position, then lower request index. A candidate is valid when its
    survival is ``> 0`` and ``≥ min_survival``; invalid candidates rank after all valid ones. Returns ``(ranks
    [..., R, γ] long, num_valid [...] long)``.
    """
    _, ranks, num_valid = _greedy_order(survival_probabilities(c), min_survival)
    return ranks, num_valid


def greedy_path_throughput(c: torch.Tensor, cost: StepCostModel, *, min_survival: float = 0.0) -> torch.Tensor:
    """``Θ_K`` for ``K = 0..R·γ`` along the greedy order (``[..., R·γ + 1]``, float64).

    Entries past the valid candidates are ``-inf`` (no policy admits those). ``max_K Θ_K`` is the maximum of ``Θ``
    over all length vectors that admit only valid candidates.
    """
    return _reachable_path_throughput(survival_probabilities(c), c.shape[-2], cost, min_survival)


def _reachable_path_throughput(survival, num_requests: int, cost: StepCostModel, min_survival: float):
    sorted_a, _, num_valid = _greedy_order(survival, min_survival)
    theta = _throughput_along_path(sorted_a, num_requests, cost)
    reachable = torch.arange(theta.shape[-1], device=theta.device) <= num_valid.unsqueeze(-1)
    return theta.masked_fill(~reachable, float("-inf"))


def admit_exact(c: torch.Tensor, cost: StepCostModel, *, min_survival: float = 0.0) -> torch.Tensor:
    """Algorithm 1 (hardware-aware prefix scheduler): greedy admission with the first-non-improvement stop.

    Start from ``ℓ = 0`` (``B = R``, ``τ = R``, ``Θ_best = R·SPS(R, R)``) and admit the candidates in the global
    order one at a time; the ``K``-th admission is kept while ``Θ_K > Θ_{K-1}``. At the first ``K`` with
    ``Θ_K ≤ Θ_{K-1}`` admission stops for good. Vectorised: ``Θ_K = (R + cumsum(a_sorted))_K · SPS(R, R + K)``, and
    the number admitted is the length of the leading run of improvements.

    The stop is what makes this lossless, not an optimisation: ``Θ_{K+1}`` and beyond involve deeper candidates whose
    survival depends on the draft token at the candidate being decided. Looking past a non-improving step (keeping the
    best ``Θ`` seen anywhere along the path) lets a sampled token decide its own admission and biases the output
    (Appendix A: 0.85 instead of 0.7). With the stop, whether ``(r, j)`` is admitted depends only on the path up to
    ``(r, j)``, i.e. on ``x[r, <j]`` and other requests. The price: the result is the global optimum only when ``Θ``
    is unimodal along the path.

    ``c``: ``[..., R, γ]`` conditional survival probabilities; ``min_survival``: candidates with a smaller survival
    are never admitted (0 keeps Algorithm 1's ``a > 0``). Returns ``ℓ``: ``[..., R]`` long in ``[0, γ]``.
    """
    num_requests = c.shape[-2]
    if num_requests == 0 or c.shape[-1] == 0:
        return torch.zeros(c.shape[:-1], dtype=torch.long, device=c.device)
    sorted_a, ranks, num_valid = _greedy_order(survival_probabilities(c), min_survival)
    theta = _throughput_along_path(sorted_a, num_requests, cost)
    improves = theta[..., 1:] > theta[..., :-1]
    improves &= torch.arange(improves.shape[-1], device=c.device) < num_valid.unsqueeze(-1)
    # Keep only the LEADING run of improvements: never look past the first non-improving candidate, even if Θ rises
    # again later on the path. That later rise may come from a deeper draft whose survival depends on the very token
    # being decided, so acting on it would bias the output (see the docstring). This is the stop that makes it exact.
    admitted_count = torch.cumprod(improves.to(torch.long), dim=-1).sum(dim=-1)
    return _lengths_from_ranks(ranks, admitted_count)


def _lagged_survival(c_lagged: torch.Tensor, has_lagged: Optional[torch.Tensor]) -> torch.Tensor:
    survival = survival_probabilities(c_lagged)
    if has_lagged is None:
        return survival
    # A request that joined after the lagged step has no confidences yet: count its drafts as sure to survive
    # (upstream does the same). This only sizes the capacity; which drafts get verified is decided by current ones.
    has_lagged = torch.as_tensor(has_lagged, dtype=torch.bool, device=survival.device).unsqueeze(-1)
    return torch.where(has_lagged, survival, torch.ones_like(survival))


def capacity_global_search(
    c_lagged: torch.Tensor,
    cost: StepCostModel,
    num_requests: Optional[int] = None,
    *,
    has_lagged: Optional[torch.Tensor] = None,
    min_survival: float = 0.0,
) -> torch.Tensor:
    """Production capacity (§5.2): ``K = argmax_K Θ_K`` over the lagged survivals, with no early stop.

    ``Θ_K = (R + Σ of the K largest lagged survivals) · SPS(R, R + K)`` for ``K = 0..(number of valid candidates)``;
    ties go to the smallest ``K``. Searching the whole range handles jagged SPS curves (cliffs that a greedy stop
    would never climb past). Doing this without a stop is safe only because the confidences are from an earlier step
    (two in production, so the host can plan step ``t+1`` while the device runs step ``t``): ``K`` is fixed before the
    current drafts exist, so no current token can influence its own admission. Never feed it the current step's
    confidences: that is the biased look-ahead scheduler of Appendix A.

    ``c_lagged``: ``[..., R, γ]``, rows aligned with the CURRENT step's requests. ``has_lagged``: ``[..., R]`` bool,
    False for requests with no lagged confidences (their survivals count as 1). ``num_requests``: the ``R`` used in
    ``Θ``; defaults to the number of rows. Returns ``K``: long tensor of shape ``[...]`` (0-d for one step), the
    number of draft tokens (anchors excluded) to verify in total.
    """
    return capacity_from_survival(_lagged_survival(c_lagged, has_lagged), cost, num_requests, min_survival=min_survival)


def capacity_from_survival(
    lagged_survival: torch.Tensor,
    cost: StepCostModel,
    num_requests: Optional[int] = None,
    *,
    min_survival: float = 0.0,
) -> torch.Tensor:
    """:func:`capacity_global_search` on survivals ``a = cumprod(c)`` already formed (``[..., R, γ]``).

    The engine adapter holds lagged survivals (SGLang's planner keeps them per request slot), not confidences.
    """
    rows = lagged_survival.shape[-2]
    num_requests = rows if num_requests is None else int(num_requests)
    if num_requests == 0 or lagged_survival.shape[-1] == 0:
        return torch.zeros(lagged_survival.shape[:-2], dtype=torch.long, device=lagged_survival.device)
    theta = _reachable_path_throughput(lagged_survival.to(torch.float64), num_requests, cost, min_survival)
    return torch.argmax(theta, dim=-1)  # the first maximum: ties go to the smallest K


def topk_admitted_mask(
    c: torch.Tensor, capacity: Union[torch.Tensor, int], *, min_survival: float = 0.0
) -> torch.Tensor:
    """Which candidates the top-``K`` rule admits: ``[..., R, γ]`` bool.

    The ``K`` first candidates of the global order by current survival (fewer if fewer are valid). Since the order
    ranks ``(r, j)`` before ``(r, j+1)`` always (survival non-increasing, ties to the shallower position), the mask
    of every request is a prefix.
    """
    ranks, num_valid = candidate_ranks(c, min_survival=min_survival)
    capacity = torch.as_tensor(capacity, dtype=torch.long, device=c.device)
    count = torch.minimum(capacity.clamp(min=0), num_valid)
    return ranks < count.unsqueeze(-1).unsqueeze(-1)


def admit_topk(c: torch.Tensor, capacity: Union[torch.Tensor, int], *, min_survival: float = 0.0) -> torch.Tensor:
    """Admit the top-``capacity`` candidates by current survival; returns per-request lengths ``[..., R]``.

    ``capacity`` is an int or a long tensor broadcastable to the leading shape ``[...]``. ``K = 0`` is "off";
    ``K ≥ R·γ`` is "verify-all" (minus candidates with zero survival).
    """
    return topk_admitted_mask(c, capacity, min_survival=min_survival).sum(dim=-1)


def admit_async(
    c_now: torch.Tensor,
    c_lagged: Optional[torch.Tensor],
    cost: Optional[StepCostModel],
    *,
    has_lagged: Optional[torch.Tensor] = None,
    min_survival: float = 0.0,
) -> torch.Tensor:
    """The production policy (§5.2): capacity from lagged confidences, top-``K`` by current ones.

    ``K = capacity_global_search(c_lagged, cost)``, then ``admit_topk(c_now, K)``. With no lagged confidences at all
    (``c_lagged is None``: the first decode steps, or right after a prefill) the step verifies every draft, as
    upstream SGLang does: there is no causal information to size it with, and verify-all is lossless too.
    Per-request gaps are handled by ``has_lagged`` (see :func:`capacity_global_search`).
    """
    if c_lagged is None:
        return admit_verify_all(c_now)
    if cost is None:
        raise ValueError("admit_async needs a cost model when lagged confidences are given")
    capacity = capacity_global_search(
        c_lagged, cost, c_now.shape[-2], has_lagged=has_lagged, min_survival=min_survival
    )
    return admit_topk(c_now, capacity, min_survival=min_survival)


def _lengths_shape(c_or_num_requests: Union[torch.Tensor, int], gamma: Optional[int]):
    if isinstance(c_or_num_requests, torch.Tensor):
        return c_or_num_requests.shape[:-1], c_or_num_requests.shape[-1], c_or_num_requests.device
    if gamma is None:
        raise ValueError("gamma is required when passing a request count instead of confidences")
    return (int(c_or_num_requests),), int(gamma), None


def admit_verify_all(c_or_num_requests: Union[torch.Tensor, int], gamma: Optional[int] = None) -> torch.Tensor:
    """Every request verifies all ``γ`` drafts. Pass confidences ``[..., R, γ]``, or ``R`` and ``gamma``."""
    shape, gamma, device = _lengths_shape(c_or_num_requests, gamma)
    return torch.full(shape, gamma, dtype=torch.long, device=device)


def admit_off(c_or_num_requests: Union[torch.Tensor, int], gamma: Optional[int] = None) -> torch.Tensor:
    """No draft token is verified: each request verifies only its anchor (``ℓ = 0``)."""
    shape, _, device = _lengths_shape(c_or_num_requests, 0 if gamma is None else gamma)
    return torch.zeros(shape, dtype=torch.long, device=device)


def admit(
    policy: str,
    c: torch.Tensor,
    cost: Optional[StepCostModel] = None,
    *,
    c_lagged: Optional[torch.Tensor] = None,
    has_lagged: Optional[torch.Tensor] = None,
    min_survival: float = 0.0,
) -> torch.Tensor:
    """Dispatch by policy name: ``"exact"``, ``"async"`` (the default policy), ``"verify-all"`` or ``"off"``.

    ``c`` is the current step's confidences ``[..., R, γ]``; ``c_lagged`` / ``has_lagged`` are only read by
    ``"async"``; ``cost`` is needed by ``"exact"`` and by ``"async"`` when ``c_lagged`` is given.
    """
    if policy == "exact":
        if cost is None:
            raise ValueError("admission policy 'exact' needs a cost model")
        return admit_exact(c, cost, min_survival=min_survival)
    if policy == "async":
        return admit_async(c, c_lagged, cost, has_lagged=has_lagged, min_survival=min_survival)
    if policy == "verify-all":
        return admit_verify_all(c)
    if policy == "off":
        return admit_off(c)
    raise ValueError(
        f"unknown admission policy {policy!r}; valid choices: {', '.join(repr(p) for p in ADMISSION_POLICIES)}"
    )


def expected_throughput(c: torch.Tensor, lengths: torch.Tensor, cost: StepCostModel) -> torch.Tensor:
    """``Θ(ℓ) = τ(ℓ) · SPS(R, B(ℓ))`` with ``τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j})`` and ``B = Σ_r (1 + ℓ_r)``.

    ``c``: ``[..., R, γ]``; ``lengths``: ``[..., R]``. Returns float64 of shape ``[...]``.
    """
    num_requests, gamma = c.shape[-2], c.shape[-1]
    survival = survival_probabilities(c)
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=c.device)
    verified = torch.arange(gamma, device=c.device) < lengths.unsqueeze(-1)
    tau = num_requests + (survival * verified).sum(dim=(-1, -2))
    verify_tokens = num_requests + lengths.sum(dim=-1)
    return tau * _steps_per_second(cost, num_requests, verify_tokens)
