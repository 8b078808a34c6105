"""DeepSpec's DSpark loss (paper eqs. 9-12; DeepSpec ``compute_dspark_loss`` defaults).

    L = 0.1 * CE(draft, data token) + 0.9 * ||softmax(draft) - softmax(target)||_1 + 1.0 * BCE(conf, c*)

each term a position-weighted mean over block slots, ``w_k = exp(-k / 4)`` (k 0-based; DeepSpec's constant 4.0,
not the paper's gamma) times the slot's validity (contiguous valid prefix of the block). The draft logits are the
Markov-corrected, teacher-forced ones; softmaxes are fp32 at temperature 1. The confidence target is the
acceptance probability of slot k under rejection sampling, ``c*_k = 1 - 0.5 * ||p_draft - p_target||_1``,
clamped to [0, 1] and detached (the confidence term must not push the draft distribution).

Over a hot vocabulary H (FR-Spec, the draft's distribution is zero outside H, as it is served), the logits are the
|H| hot columns, ``labels`` index into H (-1: the data token is outside H, so the slot has no CE term), and
``target_lse`` carries the target's whole-vocabulary log-normaliser: ``p_target(h) = exp(z_h - lse)``, and the
target's mass outside H, which no draft over H can cover, is added to the L1 distance. The L1 and the acceptance
probability are then exactly those of the served draft; their gradients are the whole-vocabulary ones restricted to H.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.nn.functional as F

DEFAULT_DECAY = 4.0
DEFAULT_ALPHAS = (0.1, 0.9, 1.0)  # ce, l1, confidence


def position_weights(gamma: int, decay: float = DEFAULT_DECAY, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(gamma, dtype=torch.float32, device=device) / decay)


def slot_weights(valid: torch.Tensor, decay: float = DEFAULT_DECAY) -> torch.Tensor:
    """[A, gamma] bool validity -> [A, gamma] fp32 loss weights."""
    return position_weights(valid.shape[-1], decay, valid.device)[None, :] * valid.float()


@dataclass
class LossParts:
    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor
    weight_sum: torch.Tensor
    # Sums (not means) over this call's slots, so callers can add them up over micro-batches.
    stats: Dict[str, torch.Tensor] = field(default_factory=dict)


def dspark_loss(
    logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    confidence_logits: Optional[torch.Tensor],
    valid: torch.Tensor,
    *,
    decay: float = DEFAULT_DECAY,
    alpha_ce: float = DEFAULT_ALPHAS[0],
    alpha_l1: float = DEFAULT_ALPHAS[1],
    alpha_conf: float = DEFAULT_ALPHAS[2],
    denom: Optional[torch.Tensor | float] = None,
    target_lse: Optional[torch.Tensor] = None,
) -> LossParts:
    """logits/target_logits [A, gamma, V] (or [A, gamma, |H|] with ``target_lse`` [A, gamma]);
    labels/valid/confidence_logits [A, gamma].

    ``denom`` (default: this call's weight sum) lets gradient accumulation divide every micro-batch by the whole
    step's weight sum, which makes the accumulated gradient equal to one big batch's (DeepSpec all-reduces the
    denominators across ranks for the same reason).
    """
    w = slot_weights(valid, decay)
    wsum = w.sum()
    den = wsum.clamp_min(1e-6) if denom is None else torch.as_tensor(denom, dtype=torch.float32).clamp_min(1e-6)
    v = logits.shape[-1]
    has_label = valid & (labels >= 0)
    safe_labels = torch.where(has_label, labels, torch.zeros_like(labels))
    ce = F.cross_entropy(logits.float().reshape(-1, v), safe_labels.reshape(-1), reduction="none").view_as(w)
    ce = ce * has_label.float()
    p_draft = torch.softmax(logits.float(), dim=-1)
    if target_lse is None:
        p_target = torch.softmax(target_logits.float(), dim=-1)
        l1 = (p_draft - p_target).abs().sum(-1)
    else:
        p_target = torch.exp(target_logits.float() - target_lse.float()[..., None])
        outside = (1.0 - p_target.sum(-1)).clamp_min(0.0)
        l1 = (p_draft - p_target).abs().sum(-1) + outside
    accept = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    if confidence_logits is not None:
        conf = F.binary_cross_entropy_with_logits(confidence_logits.float(), accept, reduction="none")
    else:
        conf = torch.zeros_like(w)
    ce_m, l1_m, conf_m = ((w * x).sum() / den for x in (ce, l1, conf))
    total = alpha_ce * ce_m + alpha_l1 * l1_m + alpha_conf * conf_m

    with torch.no_grad():
        vf = valid.float()
        acc_valid = accept * vf
        # tau with the bonus token, from the teacher-forced acceptance probabilities (DeepSpec's
        # tau_probabilistic): 1 + sum_k prod_{i<=k} c*_i over each block's valid prefix.
        tau = 1.0 + torch.cumprod(acc_valid, dim=-1).sum(-1)
        stats = {
            "slots": vf.sum(0),  # [gamma]
            "accept_sum": acc_valid.sum(0),  # [gamma] sum of c*_k
            "top1_sum": ((logits.argmax(-1) == labels).float() * vf).sum(0),
            "tau_sum": tau.sum(),
            "blocks": torch.tensor(float(valid.shape[0])),
        }
        if confidence_logits is not None:
            stats["conf_abs_err_sum"] = ((torch.sigmoid(confidence_logits.float()) - accept).abs() * vf).sum()
    return LossParts(total=total, ce=ce_m, l1=l1_m, conf=conf_m, weight_sum=wsum, stats=stats)
