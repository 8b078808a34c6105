"""Pure-torch chain speculative (rejection) sampling, a drop-in for SGLang's Triton sampler.

SGLang 0.5.23 verifies sampled DSpark / DFlash / EAGLE-chain drafts with
``sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton``, a Triton kernel with no torch
fallback (B7 in the table of ``patches/cpu_dspark.py``). :func:`chain_speculative_sampling_torch` has the same
signature and the same in-place output contract, so a CPU dispatcher can route CPU tensors here.

This module must stay free of sglang imports: it is imported by the CPU plugin and by tests that run without sglang.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "chain_speculative_sampling_torch",
    "inverse_cdf_draw",
    "single_step_output_distribution",
]


def chain_speculative_sampling_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: Optional[torch.Tensor],
    retrive_next_sibling: Optional[torch.Tensor],
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
    deterministic: bool,
    *,
    block_verification: bool = False,
) -> None:
    """Chain speculative sampling in torch; writes ``predicts``, ``accept_index``, ``accept_token_num`` in place.

    Same argument names, order and output contract as SGLang 0.5.23's ``chain_speculative_sampling_triton``. Returns
    ``None``. With ``B`` requests, ``S`` slots (slot 0 is the root/anchor, slots ``1..S-1`` the ``S-1`` draft tokens)
    and vocabulary ``V``:

    Inputs (read only):
      * ``candidates`` ``(B, S)`` int: ``candidates[b, k]`` is draft token ``k`` (``k >= 1``); column 0 is not read.
      * ``retrive_index`` ``(B, >=S)`` int: flat positions in ``predicts`` of the ``S`` chain nodes (every caller
        passes ``arange(B*S).view(B, S)``). Only columns ``0..n_b`` are read; they must be distinct and in range.
      * ``uniform_samples`` ``(B, >=S-1)`` float: ``uniform_samples[b, k-1]`` is the coin for draft token ``k``
        (DSpark passes width ``gamma = S-1``, EAGLE passes width ``S``; extra columns are ignored).
      * ``uniform_samples_for_final_sampling`` ``(B,)`` float: one coin per request for the resampled/bonus token.
      * ``target_probs`` ``(B, >=S, V)``: row ``k`` is the target distribution after drafts ``1..k`` (row 0 after the
        anchor). ``draft_probs`` ``(B, >=S-1, V)``: row ``k-1`` is the draft distribution draft token ``k`` was
        drawn from. Any strides. The accept test uses torch's type promotion (the same as Triton's: fp32 coin times
        bf16 q is fp32); the residual and the CDF are computed in fp32 (fp64 inputs stay fp64).
      * ``retrive_next_token``, ``retrive_next_sibling`` (may be ``None``), ``threshold_single``, ``threshold_acc``,
        ``deterministic``: accepted and ignored, exactly as the Triton kernel ignores them (the thresholds only
        matter for SGLang's CUDA tree sampler).

    Outputs (written in place; every other element is left untouched, like the kernel):
      * ``accept_token_num[b] = n_b``, the number of accepted draft tokens (``0 <= n_b <= S-1``).
      * ``accept_index[b, j] = retrive_index[b, j]`` for ``j = 0..n_b``.
      * ``predicts[retrive_index[b, j]] = candidates[b, j+1]`` for ``j < n_b`` and
        ``predicts[retrive_index[b, n_b]] =`` the resampled/bonus token. So the emitted tokens of request ``b`` are
        ``predicts[accept_index[b, 0..n_b]]`` and the bonus is ``predicts[accept_index[b, n_b]]``.

    Classic chain (``block_verification=False``): for ``k = 1..S-1`` with ``t = candidates[b, k]``,
    ``p = target_probs[b, k-1, t]``, ``q = draft_probs[b, k-1, t]``, ``u = uniform_samples[b, k-1]``: accept while
    ``0 < q <= 1`` and ``u * q < p`` (probability ``min(1, p/q)``); stop at the first rejection. Then, with
    ``r = n_b`` and ``u_f = uniform_samples_for_final_sampling[b]``, draw by inverse CDF (first ``v`` with
    ``cumsum(w)[v] > u_f * sum(w)``) from ``w = target_probs[b, r]`` if every draft was accepted, else from
    ``w = max(target_probs[b, r] - q', 0)`` where ``q' = draft_probs[b, r]`` with entries outside ``[0, 1]`` (NaN,
    inf, negative) replaced by 0.

    Block verification (``block_verification=True``, Sun et al. 2024, arXiv:2403.10444 Algorithm 2): the kernel's
    variant is reproduced: prefix weights ``h_k = min(h_{k-1} p/q, 1)`` (0 when ``q`` is not in ``(0, 1]``), a
    backward scan for the longest prefix passing ``u_k < h_k`` and ``u_k < m_k / (m_k + 1 - h_k)`` with
    ``m_k = sum(max(h_k * target_probs[b, k] - draft_probs[b, k], 0))`` (``m_k`` is only used for ``k < S-1`` and
    ``0 < h_k < 1``; otherwise the test is ``u_k < h_k``), and the final draw from ``max(h_n * p - q', 0)``.

    Edge cases (same outcome as the kernel):
      * ``q == 0`` (or NaN, or > 1) at the draft token: rejection; the residual then keeps the whole target mass of
        that token. A draft row that is all zeros therefore acts as padding: it is always rejected and the token is
        drawn from the target row itself, which lets one fixed-width batch carry chains of different lengths.
      * Degenerate residual (sum 0, e.g. ``p == q`` on rejection) or NaN weights: token ``V - 1``.
      * ``S == 1`` (no drafts): ``n_b = 0`` and the token is drawn from ``target_probs[b, 0]``; ``draft_probs`` is
        not read.

    Where this differs from the kernel (documented, not bugs of either):
      * The normaliser is the last CDF entry instead of a separately reduced sum. The kernel's two reductions can
        disagree in the last bits and, for a final coin close to 1, leave ``u_f * sum`` above every CDF entry so it
        falls back to ``V - 1``, a token that may have zero probability; here that cannot happen. Otherwise the two
        differ only when ``u_f * sum`` lies within rounding of a CDF step (the GPU kernel's own parallel scan and
        the Triton interpreter already disagree there).
      * A candidate id outside ``[0, V)`` is rejected here; the kernel reads out of bounds. A negative or
        out-of-range ``retrive_index`` entry that would be written raises ``IndexError``; the kernel would write
        out of bounds. (No caller passes either: the chain layouts are dense, with no ``-1`` padding.)
      * Block verification with draft probabilities outside ``[0, 1]`` in a row after the accepted prefix: the kernel
        reuses ``m_k`` (computed from the raw ``q``) as the normaliser of a CDF built from the sanitised ``q'``; here
        the CDF is normalised by itself. NaN inside ``m_k`` counts as 0 here (the GPU ``max`` ignores NaN; the
        Triton interpreter propagates it).
      * bf16/fp16 ``target_probs``: when every draft is accepted the kernel sums and scans the bonus row in the input
        dtype (this Triton keeps bf16 for ``tl.sum``/``tl.cumsum``); here it is fp32. Callers pass fp32.
      * The kernel addresses ``accept_index`` with ``retrive_index``'s strides; here it is indexed logically, which
        is the same thing for the callers' same-shaped contiguous buffers.
    """
    del retrive_next_token, retrive_next_sibling, threshold_single, threshold_acc, deterministic
    if candidates.dim() != 2:
        raise ValueError(f"candidates must be (batch, slots), got {tuple(candidates.shape)}")
    bs, num_slots = candidates.shape
    if num_slots < 1:
        raise ValueError("candidates needs at least the root slot")
    if bs == 0:
        return
    vocab = target_probs.shape[-1]
    num_drafts = num_slots - 1
    device = candidates.device
    rows = torch.arange(bs, device=device)

    cand = candidates.to(torch.long)
    ridx = retrive_index[:, :num_slots].to(torch.long)

    if num_drafts > 0:
        if draft_probs.shape[-1] != vocab:
            raise ValueError("draft_probs and target_probs must share the vocabulary size")
        tokens = cand[:, 1:]
        in_vocab = (tokens >= 0) & (tokens < vocab)
        gather_ids = tokens.clamp(0, vocab - 1).unsqueeze(-1)
        # Probabilities of each draft token in the row it was proposed from (row k-1 for token k).
        p_tok = target_probs[:, :num_drafts].gather(-1, gather_ids).squeeze(-1)
        q_tok = draft_probs[:, :num_drafts].gather(-1, gather_ids).squeeze(-1)
        coins = uniform_samples[:, :num_drafts]
        # A proposal must have positive, finite draft probability; anything else is a rejection.
        q_is_prob = in_vocab & (q_tok > 0) & (q_tok <= 1)
        if block_verification:
            num_accept, residual_scale = _block_accept(
                p_tok, q_tok, q_is_prob, coins, target_probs, draft_probs, num_drafts
            )
        else:
            accepted = q_is_prob & (coins * q_tok < p_tok)
            # Length of the all-True prefix: the chain stops at the first rejection.
            num_accept = accepted.to(torch.int32).cumprod(dim=1).sum(dim=1).to(torch.long)
            residual_scale = None
    else:
        num_accept = torch.zeros(bs, dtype=torch.long, device=device)
        residual_scale = None

    final_tokens = _final_tokens(
        num_accept,
        residual_scale,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
        num_drafts,
        rows,
    )

    # Emitted values per slot: accepted drafts, then the final token at slot n_b.
    values = torch.empty((bs, num_slots), dtype=torch.long, device=device)
    if num_drafts > 0:
        values[:, :num_drafts] = cand[:, 1:]
    values[rows, num_accept] = final_tokens
    written = torch.arange(num_slots, device=device).unsqueeze(0) <= num_accept.unsqueeze(1)

    flat_positions = ridx[written]
    flat_predicts = predicts.view(-1)
    if flat_positions.numel() and (
        int(flat_positions.min()) < 0 or int(flat_positions.max()) >= flat_predicts.numel()
    ):
        raise IndexError("retrive_index points outside predicts (the Triton kernel would write out of bounds)")
    flat_predicts[flat_positions] = values[written].to(predicts.dtype)
    accept_index[:, :num_slots][written] = ridx[written].to(accept_index.dtype)
    accept_token_num.view(-1)[:bs] = num_accept.to(accept_token_num.dtype)


def _block_accept(
    p_tok: torch.Tensor,
    q_tok: torch.Tensor,
    q_is_prob: torch.Tensor,
    coins: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_drafts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification: returns (accepted prefix length, h of that prefix or 1.0 when it is empty)."""
    bs = p_tok.shape[0]
    work_dtype = torch.promote_types(p_tok.dtype, torch.float32)
    prefix = torch.ones(bs, dtype=work_dtype, device=p_tok.device)
    prefix_cols = []
    for k in range(num_drafts):
        ratio = torch.minimum(prefix * p_tok[:, k] / q_tok[:, k], torch.ones_like(prefix))
        prefix = torch.where(q_is_prob[:, k], ratio, torch.zeros_like(prefix))
        prefix_cols.append(prefix)
    prefix_probs = torch.stack(prefix_cols, dim=1)

    accept_prob = prefix_probs.clone()
    for k in range(num_drafts - 1):
        h = prefix_probs[:, k]
        # The mass only matters where 0 < h < 1 and the coin already passed h (it can only lower the bar).
        sel = ((h > 0) & (h < 1) & (coins[:, k] < h)).nonzero().squeeze(1)
        if sel.numel() == 0:
            continue
        h_sel = h[sel]
        # Residual mass of the next position, scaled by the prefix weight; fmax maps NaN to 0 like the GPU max.
        diff = h_sel.unsqueeze(1) * target_probs[sel, k + 1].to(work_dtype) - draft_probs[sel, k + 1].to(work_dtype)
        mass = torch.fmax(diff, torch.zeros_like(diff)).sum(dim=-1)
        accept_prob[sel, k] = mass / (mass + 1.0 - h_sel)

    passes = (coins < prefix_probs) & (coins < accept_prob)
    # The longest passing prefix wins (the kernel scans from the end and stops at the first pass).
    steps = torch.arange(1, num_drafts + 1, device=p_tok.device)
    num_accept = (passes.to(torch.long) * steps).amax(dim=1)
    picked = prefix_probs.gather(1, (num_accept - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    residual_scale = torch.where(num_accept > 0, picked, torch.ones_like(picked))
    return num_accept, residual_scale


def _final_tokens(
    num_accept: torch.Tensor,
    residual_scale: Optional[torch.Tensor],
    final_coins: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_drafts: int,
    rows: torch.Tensor,
) -> torch.Tensor:
    """Inverse-CDF draw of the resampled/bonus token from row n_b (see the contract above)."""
    work_dtype = torch.promote_types(target_probs.dtype, torch.float32)
    # Advanced indexing copies, so the rows below can be overwritten in place.
    weights = target_probs[rows, num_accept].to(work_dtype)
    if num_drafts > 0:
        rejected = (num_accept < num_drafts).nonzero().squeeze(1)
        if rejected.numel():
            # Rejected requests draw from max(h * p - q', 0); requests that accepted every draft keep plain p.
            q_rej = draft_probs[rejected, num_accept[rejected]].to(work_dtype)
            q_rej = q_rej.masked_fill(~((q_rej >= 0) & (q_rej <= 1)), 0.0)
            p_rej = weights[rejected]
            if residual_scale is not None:
                p_rej = residual_scale[rejected].to(work_dtype).unsqueeze(1) * p_rej
            diff = p_rej - q_rej
            weights[rejected] = torch.where(diff > 0, diff, 0.0)

    return inverse_cdf_draw(weights, final_coins.reshape(-1)[: rows.numel()])


def inverse_cdf_draw(weights: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """One token per row of non-negative ``weights`` ``(R, V)``: the first ``v`` with ``cumsum(w)[v] > coin * sum(w)``
    (``coins`` ``(R,)`` in ``[0, 1)``), so token ``v`` is drawn with probability ``w[v] / sum(w)``. A row with no such
    entry (zero or NaN mass) gives ``V - 1``, the kernels' fallback."""
    cdf = weights.cumsum(dim=-1)
    threshold = coins.to(cdf.dtype) * cdf[:, -1]
    above = cdf > threshold.unsqueeze(1)
    first = above.to(torch.int8).argmax(dim=-1)
    found = above.gather(1, first.unsqueeze(1)).squeeze(1)
    return torch.where(found, first, torch.full_like(first, weights.shape[-1] - 1))


def single_step_output_distribution(
    p: torch.Tensor, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact law of the token emitted by a one-draft chain step, as this sampler implements it.

    ``p``/``q``: target and draft distributions over the last dimension; the draft token is assumed drawn from ``q``.
    Returns ``(dist, accept_prob)``: ``dist = min(p, q) + (1 - sum min(p, q)) * normalize(max(p - q, 0))`` and
    ``accept_prob = sum min(p, q)``. For proper distributions ``dist == p`` (losslessness); when the residual has no
    mass but is still reached, the sampler emits ``V - 1``, which this reproduces.
    """
    p = p.to(torch.float64)
    q = q.to(torch.float64)
    accepted_mass = torch.minimum(p, q)
    accept_prob = accepted_mass.sum(dim=-1, keepdim=True)
    residual = (p - q).clamp_min(0)
    residual_sum = residual.sum(dim=-1, keepdim=True)
    fallback = torch.zeros_like(p)
    fallback[..., -1] = 1.0
    residual_law = torch.where(residual_sum > 0, residual / residual_sum.clamp_min(1e-300), fallback)
    dist = accepted_mass + (1.0 - accept_prob) * residual_law
    return dist, accept_prob.squeeze(-1)
