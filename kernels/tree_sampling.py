"""Pure-torch target-only tree speculative sampling: SGLang's CUDA ``tree_speculative_sampling_target_only`` on a CPU.

SGLang 0.5.23 verifies sampled NGRAM and EAGLE drafts (a tree of proposals chosen without sampling) with a CUDA
kernel only; on the CPU ``sglang.kernels.ops.speculative.verify_sampling`` resolves the name to ``None`` and
``eagle_utils.eagle_sample`` commits the target's argmax at every temperature instead. This function has the same
signature and in-place output contract, so ``patches/cpu_tree_sampling.py`` can hand it to ``eagle_sample``.

This module must stay free of sglang imports (kernels/ holds torch code only).
"""

from __future__ import annotations

import torch

from sglang_dspark.kernels.rejection_sampling import inverse_cdf_draw

__all__ = ["tree_speculative_sampling_target_only_torch"]


def tree_speculative_sampling_target_only_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Walk each request's draft tree with the target's probabilities; write ``predicts``, ``accept_index``,
    ``accept_token_num`` in place (returns ``None``), as SGLang 0.5.23's CUDA kernel does.

    With ``B`` requests, ``N`` tree nodes per request (node 0 is the root, the last committed token), ``D`` the
    width of ``accept_index`` (the tree's depth + 1) and vocabulary ``V``:

    Inputs (read only):
      * ``candidates`` ``(B, N)``: node ``n``'s token (node 0 is not read). ``retrive_next_token[b, n]``: node ``n``'s
        first child (``-1``: none); ``retrive_next_sibling[b, n]``: its next sibling (``-1``: none);
        ``retrive_index[b, n]``: node ``n``'s flat position in ``predicts``.
      * ``target_probs`` ``(B, N, V)``: row ``n`` is the target distribution after node ``n``'s path.
        ``draft_probs`` ``(B, N, V)``: subtracted from the final row (callers pass zeros: the proposals were not
        sampled, so a rejected child's whole target mass is removed instead, see below).
      * ``uniform_samples`` ``(B, N)``: the coin used at node ``n`` when choosing among its children;
        ``uniform_samples_for_final_sampling`` ``(B,)``: the coin of the resampled / bonus token.
      * ``threshold_single``, ``threshold_acc`` (SGLang's ``--speculative-accept-threshold-*``; 1.0, the default,
        is exact): a child is also accepted when its probability is at least ``threshold_single``, and the coin is
        compared with the accumulated probability divided by ``threshold_acc``. ``deterministic`` is ignored (it
        only fixes the CUDA reduction order).

    The walk, from the root, at most ``D - 1`` levels: at node ``c`` with coin ``u`` and target row ``p``, try its
    children in sibling order, accumulating ``s += p[token]``; the first child with ``p[token] > 0`` and
    ``u < s / threshold_acc`` (or ``p[token] >= threshold_single``) is accepted and becomes ``c``. So, with the
    default thresholds, child ``i`` is taken with probability ``p[token_i]``: the coin is an inverse-CDF draw from
    ``p`` that lands on a child. When no child is taken (or ``c`` has none), the last token is drawn by inverse CDF
    from ``max(p - q', 0)``, where ``q'`` is ``draft_probs[b, c]`` with each tried child's entry replaced by its
    target probability, i.e. ``p`` without the tried children; after ``D - 1`` accepted levels, from ``p`` itself.
    Every emitted token then follows the target's law.

    Outputs: ``accept_token_num[b]`` = the accepted node count ``n_b``; ``accept_index[b, 0..n_b]`` = the
    ``retrive_index`` of the root and of each accepted node; ``predicts[accept_index[b, k]]`` = the token that follows
    that node (the next accepted node's token, and the last token at ``k = n_b``). Other elements are untouched.
    """
    del deterministic
    if candidates.dim() != 2:
        raise ValueError(f"candidates must be (batch, nodes), got {tuple(candidates.shape)}")
    bs = candidates.shape[0]
    if bs == 0:
        return
    max_accept = accept_index.shape[1] - 1
    vocab = target_probs.shape[-1]
    tokens = candidates.tolist()
    first_child = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    flat_index = retrive_index.tolist()
    coins = uniform_samples.tolist()
    child_probs = _child_probabilities(candidates, first_child, next_sibling, target_probs)

    # Host-side walk; the tensors are written once at the end.
    written_at, written = [], []  # predicts positions and the accepted tokens that go there
    final_nodes, last_positions, tried_children, bonus = [], [], [], []
    for b in range(bs):
        current, path = 0, [flat_index[b][0]]
        tried: list[int] = []
        for _ in range(max_accept):
            child, accumulated, tried = first_child[b][current], 0.0, []
            while child != -1:
                prob = child_probs[b][child]
                accumulated += prob
                if prob > 0 and (coins[b][current] < accumulated / threshold_acc or prob >= threshold_single):
                    break
                tried.append(child)
                child = next_sibling[b][child]
            if child == -1:
                break
            written_at.append(path[-1])
            written.append(tokens[b][child])
            current = child
            path.append(flat_index[b][child])
            tried = []
        accept_token_num.view(-1)[b] = len(path) - 1
        accept_index[b, : len(path)] = torch.tensor(path, dtype=accept_index.dtype)
        final_nodes.append(current)
        last_positions.append(path[-1])
        tried_children.append(tried)
        bonus.append(len(path) - 1 == max_accept)

    rows = torch.arange(bs)
    nodes = torch.tensor(final_nodes)
    work_dtype = torch.promote_types(target_probs.dtype, torch.float32)
    weights = target_probs[rows, nodes].to(work_dtype)
    removed = draft_probs[rows, nodes].to(work_dtype)
    removed[torch.tensor(bonus)] = 0.0
    for b, tried in enumerate(tried_children):
        ids = [tokens[b][child] for child in tried if 0 <= tokens[b][child] < vocab]
        if ids:
            removed[b, ids] = weights[b, ids]
    residual = (weights - removed).clamp_min(0.0)
    last = inverse_cdf_draw(residual, uniform_samples_for_final_sampling.reshape(-1)[:bs])
    flat_predicts = predicts.view(-1)
    flat_predicts[torch.tensor(written_at + last_positions, dtype=torch.long)] = torch.cat(
        [torch.tensor(written, dtype=torch.long), last]).to(predicts.dtype)

def _child_probabilities(candidates, first_child, next_sibling, target_probs) -> list[list[float]]:
    """``[b][n]``: the target probability of node ``n``'s token in its parent's row (0.0 for the root and for a
    token outside the vocabulary, which is then never accepted)."""
    bs, num_nodes = candidates.shape
    vocab = target_probs.shape[-1]
    parent = [[0] * num_nodes for _ in range(bs)]
    for b in range(bs):
        for node in range(num_nodes):
            child = first_child[b][node]
            while child != -1:
                parent[b][child] = node
                child = next_sibling[b][child]
    parents = torch.tensor(parent, dtype=torch.long)
    ids = candidates.to(torch.long)
    in_vocab = (ids >= 0) & (ids < vocab)
    rows = torch.arange(bs).unsqueeze(1).expand(bs, num_nodes)
    probs = target_probs[rows, parents, ids.clamp(0, vocab - 1)].to(torch.float64)
    probs = torch.where(in_vocab, probs, torch.zeros_like(probs))
    probs[:, 0] = 0.0
    return probs.tolist()

