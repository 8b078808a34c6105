"""Sequential temperature scaling (STS) of the confidence head (paper §3.2.1), in SGLang's STS file format.

The confidence head predicts c_k = P(slot k accepted | slots < k accepted); a scheduler ranks slots by the prefix
survival a_k = prod_{i<=k} c_i. STS fits one temperature per slot, left to right: T_k minimises the ECE (15
equal-width bins) of ``prod_{i<k} c~_i * sigmoid(z_k / T_k)`` against the binary "slots 0..k all accepted"
labels, with the earlier slots' temperatures already fixed. Grid T in {0.05, 0.10, ..., 5.00}; ties (ECE within
1e-9 of the best) go to the smallest |log T| (closest to identity); a position with under 10 accepted prefixes
keeps T = 1. Sigmoid(z / T) keeps the order of the logits, so only calibration moves.

Output: the JSON that ``--speculative-dspark-confidence-sts-path`` reads (SGLang's ``DSparkStsCalibration``:
``temperatures`` [gamma], ``dataset``, ``num_samples``, ``ece_before``, ``ece_after``); SGLang applies
``sigmoid(z / T_k)`` per position and requires ``len(temperatures) == gamma``.

Observations come either from SGLang itself (``SGLANG_DSPARK_STS_COLLECT_PATH`` shards: ``{"logits", "prefix_mask"}``
[n, gamma], greedy acceptance) or offline from cached target features (``collect_observations``).
"""

from __future__ import annotations

import glob
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from sglang_dspark.draft.model import DSparkDraft
from .features import FeatureCache
from .trainer import pack, sample_anchors

DEFAULT_GRID = tuple(round(0.05 * i, 2) for i in range(1, 101))
DEFAULT_BINS = 15


def ece(probs: torch.Tensor, labels: torch.Tensor, num_bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error with equal-width bins over [0, 1] (a prob of exactly 1 goes to the top bin)."""
    p = probs.reshape(-1).double()
    y = labels.reshape(-1).double()
    if p.numel() == 0:
        return float("nan")
    idx = (p * num_bins).long().clamp(0, num_bins - 1)
    cnt = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, torch.ones_like(p))
    ps = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, p)
    ys = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, y)
    return float((ps - ys).abs().sum() / p.numel())  # sum_b |n_b conf_b - n_b acc_b| / N


@dataclass
class StsFit:
    temperatures: List[float]
    ece_before: List[float]
    ece_after: List[float]
    num_samples: int


def fit_sts(
    logits: torch.Tensor,
    prefix_mask: torch.Tensor,
    valid: Optional[torch.Tensor] = None,
    *,
    grid: Sequence[float] = DEFAULT_GRID,
    num_bins: int = DEFAULT_BINS,
    tie_tolerance: float = 1e-9,
    min_positives: int = 10,
) -> StsFit:
    """logits/prefix_mask [N, gamma]; ``valid`` [N, gamma] drops unobservable labels (per position).

    ECE differences below ``tie_tolerance`` count as ties (float noise). A position with fewer than
    ``min_positives`` accepted prefixes keeps T = 1: with (nearly) all-zero labels any T that shrinks the
    probabilities "wins" by a meaningless margin."""
    z = logits.double()
    y = prefix_mask.double()
    m = torch.ones_like(y, dtype=torch.bool) if valid is None else valid.bool()
    surv_raw = torch.ones(z.shape[0], dtype=torch.float64)
    surv_fit = torch.ones(z.shape[0], dtype=torch.float64)
    temps, before, after = [], [], []
    for k in range(z.shape[1]):
        mk = m[:, k]
        surv_raw = surv_raw * torch.sigmoid(z[:, k])
        before.append(ece(surv_raw[mk], y[mk, k], num_bins))
        if float(y[mk, k].sum()) < min_positives:
            # (almost) no accepted prefix this deep: nothing to calibrate against, keep the identity
            surv_fit = surv_fit * torch.sigmoid(z[:, k])
            temps.append(1.0)
            after.append(ece(surv_fit[mk], y[mk, k], num_bins))
            continue
        scored = []
        for t in grid:
            cand = surv_fit * torch.sigmoid(z[:, k] / t)
            scored.append((ece(cand[mk], y[mk, k], num_bins), t, cand))
        floor = min(e for e, _, _ in scored)
        # among temperatures within tie_tolerance of the best ECE, the one closest to identity (|log T|)
        near = [s for s in scored if s[0] <= floor + tie_tolerance]
        e, t, cand = min(near, key=lambda s: (abs(math.log(s[1])), s[0]))
        temps.append(float(t))
        after.append(float(e))
        surv_fit = cand
    return StsFit(temps, before, after, int(z.shape[0]))


def sts_json(fit: StsFit, dataset: str = "") -> str:
    obj = {
        "temperatures": fit.temperatures,
        "dataset": dataset,
        "num_samples": fit.num_samples,
        "ece_before": fit.ece_before,
        "ece_after": fit.ece_after,
    }
    return json.dumps(obj)


def write_sts(path: Path, fit: StsFit, dataset: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sts_json(fit, dataset), encoding="utf-8")
    return path


def load_sglang_shards(pattern: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Shards SGLang writes with ``SGLANG_DSPARK_STS_COLLECT_PATH`` (``StsDataRecorder``)."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"no STS shards match {pattern!r}")
    zs, ys = [], []
    for p in paths:
        d = torch.load(p, map_location="cpu")
        zs.append(d["logits"].float())
        ys.append(d["prefix_mask"].float())
    return torch.cat(zs), torch.cat(ys)


@torch.no_grad()
def collect_observations(
    model: DSparkDraft,
    cache: FeatureCache,
    indices: Optional[Sequence[int]] = None,
    *,
    anchors_per_seq: int = 64,
    seed: int = 0,
    micro_tokens: int = 4096,
    progress: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy drafting rounds replayed on cached target features -> (confidence logits, prefix labels, valid).

    Each anchor is one serving round: the draft proposes greedily (Markov steps on its own tokens), the target
    verifies greedily. The target's choice after an accepted prefix is cached only while that prefix equals the
    data (the data are target continuations): slot k's label is observable if an earlier slot was already rejected
    (then it is 0) or the data followed the target's greedy choice up to k. Unobservable labels are masked.
    """
    from tqdm.auto import tqdm

    model.eval()
    g = model.gamma
    gen = torch.Generator().manual_seed(seed)
    idx = list(range(len(cache))) if indices is None else list(indices)
    zs, ys, vs = [], [], []
    group, tokens = [], 0

    def flush(items):
        mb = pack(items, g)
        out = model.draft_many(mb.input_ids, mb.aux.float(), mb.position_ids, mb.seq_start, mb.anchor_index)
        s = mb.input_ids.shape[0]
        rows = mb.anchor_index[:, None] + torch.arange(g)[None, :]  # target row that verifies slot k
        end = mb.anchor_end[:, None]
        in_seq = rows < end
        safe = rows.clamp(max=s - 1)
        t_greedy = model.vocab_logits(mb.last[safe].float()).argmax(-1)  # [A, g]
        accept = (out.tokens == t_greedy) & in_seq
        prefix = torch.cumprod(accept.long(), dim=1).bool()
        data_next = mb.input_ids[(rows + 1).clamp(max=s - 1)]
        follows = (data_next == t_greedy) & ((rows + 1) < end)
        # Slot j's verdict is the real one iff the data followed the target's greedy choice through slot j-1
        # (then the drafted prefix equals the data prefix and row p+j is the row verification would use).
        # Slot k's label is known if its own verdict is real, or if a real rejection happened at r < k.
        shifted_follow = torch.cat([torch.ones(len(rows), 1, dtype=torch.bool), follows[:, :-1]], dim=1)
        real = torch.cumprod(shifted_follow.long(), dim=1).bool() & in_seq
        first_reject = prefix.long().sum(1)  # == g when every slot was accepted
        reject_real = real.gather(1, first_reject.clamp(max=g - 1)[:, None])[:, 0] & (first_reject < g)
        k_idx = torch.arange(g)[None, :]
        valid = real | (reject_real[:, None] & (first_reject[:, None] < k_idx))
        zs.append(out.confidence_logits.float())
        ys.append(prefix.float())
        vs.append(valid)

    if model.confidence_head is None:
        raise ValueError("the draft has no confidence head to calibrate")
    for i in tqdm(idx, desc="sts rounds", disable=not progress, dynamic_ncols=True):
        seq = cache[i]
        anc = sample_anchors(seq.loss_mask, anchors_per_seq, gen)
        if anc.numel() == 0:
            continue
        if group and tokens + seq.input_ids.numel() > micro_tokens:
            flush(group)
            group, tokens = [], 0
        group.append((seq, anc))
        tokens += seq.input_ids.numel()
    if group:
        flush(group)
    if not zs:
        raise ValueError("no anchors to calibrate on")
    return torch.cat(zs), torch.cat(ys), torch.cat(vs)


def replay_quality(logits: torch.Tensor, prefix_mask: torch.Tensor, valid: torch.Tensor,
                   temperatures: Optional[Sequence[float]] = None, num_bins: int = DEFAULT_BINS) -> dict:
    """What ``collect_observations`` rounds say of a draft: ``p_accept_ge[k]`` = P(the first k + 1 drafted tokens are
    all accepted) per slot (observable rounds only), the greedy acceptance length ``tau`` = 1 + their sum (the bonus
    token counted), and the ECE of the prefix-survival confidence per slot (with ``temperatures``: after STS)."""
    y, m = prefix_mask.double(), valid.bool()
    temps = list(temperatures) if temperatures is not None else [1.0] * y.shape[1]
    surv = torch.ones(y.shape[0], dtype=torch.float64)
    p_ge, eces = [], []
    for k in range(y.shape[1]):
        mk = m[:, k]
        p_ge.append(float(y[mk, k].mean()) if bool(mk.any()) else 0.0)
        surv = surv * torch.sigmoid(logits[:, k].double() / temps[k])
        eces.append(ece(surv[mk], y[mk, k], num_bins) if bool(mk.any()) else 0.0)
    return {"tau": 1.0 + sum(p_ge), "p_accept_ge": p_ge, "ece": eces, "rounds": int(y.shape[0])}


def format_report(fit: StsFit) -> str:
    lines = ["pos  temperature  ece_before  ece_after"]
    for k, (t, b, a) in enumerate(zip(fit.temperatures, fit.ece_before, fit.ece_after)):
        lines.append(f"{k:>3}  {t:>11.2f}  {b:>10.4f}  {a:>9.4f}")
    return "\n".join(lines)
