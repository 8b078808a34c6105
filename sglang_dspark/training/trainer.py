"""Training loop: AdamW, linear warmup + cosine decay, gradient clipping, resumable checkpoints, fixed seed.

A step takes ``batch_size`` cached sequences (a seeded permutation per epoch), samples up to ``num_anchors`` anchors
in each (positions p with ``loss_mask[p] & loss_mask[p+1]``, uniformly without replacement, then sorted, like
DeepSpec), packs the sequences into micro-batches of about ``micro_tokens`` context tokens and accumulates their
gradients. Every micro-batch's loss is divided by the whole step's weight sum, so the update does not depend on how
the step was split.

Determinism: data order and anchors come from generators derived from ``seed``; checkpoints store the trainable
weights, AdamW and scheduler state, the data position and every RNG state, so ``--resume`` continues bit for bit
(same machine, same thread count).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sglang_dspark.draft.model import DSparkDraft
from .features import CachedSequence, FeatureCache
from .loss import DEFAULT_DECAY, dspark_loss, slot_weights

CKPT_PREFIX = "step_"


@dataclass
class TrainConfig:
    out_dir: str
    steps: int = 1000
    batch_size: int = 8  # sequences per optimizer step
    num_anchors: int = 64  # per sequence (DeepSpec: 512 on GPUs)
    micro_tokens: int = 4096  # context tokens per forward (packed sequences)
    head_chunk: int = 32  # anchors per vocabulary-sized head/loss chunk (0: all at once)
    lr: float = 6e-4
    min_lr_ratio: float = 0.0
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    betas: Tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    loss_decay: float = DEFAULT_DECAY
    alpha_ce: float = 0.1
    alpha_l1: float = 0.9
    alpha_conf: float = 1.0
    seed: int = 42
    save_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    threads: Optional[int] = None
    device: str = "cpu"  # batches are built on the CPU and moved; bitwise resume is only promised on the CPU
    precision: str = "fp32"  # "bf16": the draft's forward under bf16 autocast (weights, optimizer, loss, targets fp32)
    # Train on every token, prompts included (the target's soft labels exist everywhere in the cache): more positions
    # per target-feature token, at the price of anchors in text the draft never drafts at serving time.
    loss_on_prompts: bool = False
    progress: bool = True

    def to_json(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d


# --------------------------------------------------------------------------------------------- batches


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [S]
    aux: torch.Tensor  # [S, n*d]
    last: torch.Tensor  # [S, d]
    position_ids: torch.Tensor  # [S]
    seq_start: torch.Tensor  # [S]
    anchor_index: torch.Tensor  # [A]
    labels: torch.Tensor  # [A, gamma]
    valid: torch.Tensor  # [A, gamma]
    target_rows: torch.Tensor  # [A, gamma] packed index whose target hidden predicts the label
    anchor_end: torch.Tensor  # [A] packed index one past the anchor's sequence
    lse: Optional[torch.Tensor] = None  # [S] target log-normaliser (needed to train over a hot vocabulary)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, gen: torch.Generator) -> torch.Tensor:
    cand = torch.nonzero(loss_mask[:-1] & loss_mask[1:], as_tuple=False).flatten()
    if cand.numel() > num_anchors:
        cand = cand[torch.randperm(cand.numel(), generator=gen)[:num_anchors]]
    return cand.sort().values


def pack(items: Sequence[Tuple[CachedSequence, torch.Tensor]], gamma: int) -> MicroBatch:
    """Concatenate sequences; anchors become packed indices; block labels stop at the first invalid slot."""
    ids, aux, last, lse, pos, start, anchors = [], [], [], [], [], [], []
    seq_end, masks = [], []
    off = 0
    for seq, anc in items:
        s = seq.input_ids.shape[0]
        ids.append(seq.input_ids)
        aux.append(seq.aux)
        last.append(seq.last)
        lse.append(seq.lse)
        masks.append(seq.loss_mask)
        pos.append(torch.arange(s))
        start.append(torch.full((s,), off, dtype=torch.long))
        seq_end.append(torch.full((anc.numel(),), off + s, dtype=torch.long))
        anchors.append(anc + off)
        off += s
    input_ids = torch.cat(ids)
    loss_mask = torch.cat(masks)
    anchor_index = torch.cat(anchors)
    end = torch.cat(seq_end)
    k = torch.arange(gamma)
    label_idx = anchor_index[:, None] + k[None, :] + 1
    in_seq = label_idx < end[:, None]
    safe = label_idx.clamp(max=off - 1)
    valid = torch.cumprod((in_seq & loss_mask[safe]).long(), dim=1).bool()
    return MicroBatch(
        input_ids=input_ids,
        aux=torch.cat(aux),
        last=torch.cat(last),
        position_ids=torch.cat(pos),
        seq_start=torch.cat(start),
        anchor_index=anchor_index,
        labels=input_ids[safe],
        valid=valid,
        target_rows=(label_idx - 1).clamp(max=off - 1),
        anchor_end=end,
        lse=None if any(x is None for x in lse) else torch.cat(lse),
    )


def _to_device(mb: MicroBatch, dev: torch.device) -> MicroBatch:
    if mb.input_ids.device == dev:
        return mb
    return MicroBatch(**{k: None if v is None else v.to(dev, non_blocking=True) for k, v in vars(mb).items()})


def _targets(model: DSparkDraft, mb: MicroBatch, sl: slice, compute_dtype):
    """(target logits, labels, target_lse) for the anchors ``sl``: whole vocabulary, or the hot columns with labels
    as hot indices (-1 outside) and the cached log-normaliser when the model drafts over a hot vocabulary."""
    rows = mb.target_rows[sl]
    last = mb.last[rows].to(compute_dtype)
    if model.hot_ids is None:
        return model.vocab_logits(last), mb.labels[sl], None
    if mb.lse is None:
        raise ValueError("training over a hot vocabulary needs the target's log-normaliser in the feature cache "
                         "(cache version 2): rebuild the cache")
    return model.narrow_base_logits(last), hot_index(model)[mb.labels[sl]], mb.lse[rows]


def hot_index(model: DSparkDraft) -> torch.Tensor:
    """[V] position of each token in the model's hot vocabulary, -1 outside (cached on the model)."""
    cached = getattr(model, "_hot_index", None)
    if cached is None or cached[0] is not model.hot_ids:
        index = torch.full((model.arch.vocab_size,), -1, dtype=torch.long, device=model.hot_ids.device)
        index[model.hot_ids] = torch.arange(model.hot_ids.numel(), device=model.hot_ids.device)
        cached = (model.hot_ids, index)
        model._hot_index = cached
    return cached[1]


def _autocast(cfg: TrainConfig, device: torch.device):
    """bf16 autocast of the draft's forward (its backward follows the forward's dtypes), or nothing."""
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    if cfg.precision != "bf16":
        raise ValueError(f"precision must be fp32 or bf16, got {cfg.precision!r}")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def micro_loss(model: DSparkDraft, mb: MicroBatch, cfg: TrainConfig, denom, compute_dtype=torch.float32):
    """The whole micro-batch's loss in one graph (simple; memory grows with anchors x vocab)."""
    mb = _to_device(mb, model.fc.weight.device)
    hidden, prev = model.training_hidden(
        mb.input_ids, mb.aux.to(compute_dtype), mb.position_ids, mb.seq_start, mb.anchor_index
    )
    out = model.heads(hidden, prev, narrow=True)
    with torch.no_grad():
        target_logits, labels, lse = _targets(model, mb, slice(None), compute_dtype)
    return dspark_loss(
        out.logits, target_logits, labels, out.confidence_logits, mb.valid,
        decay=cfg.loss_decay, alpha_ce=cfg.alpha_ce, alpha_l1=cfg.alpha_l1, alpha_conf=cfg.alpha_conf, denom=denom,
        target_lse=lse,
    )


def micro_backward(model: DSparkDraft, mb: MicroBatch, cfg: TrainConfig, denom, compute_dtype=torch.float32):
    """Forward + backward of one micro-batch with the vocabulary-sized heads run ``cfg.head_chunk`` anchors at a
    time: the backbone runs once, each chunk's loss is backpropagated to a detached copy of the hidden states,
    and their summed gradient is then sent through the backbone. Same gradient as ``micro_loss(...).backward()``
    (every chunk divides by the step's weight sum), with memory bounded by chunk x vocab instead of anchors x vocab.
    Returns (loss terms as floats, summed stats)."""
    mb = _to_device(mb, model.fc.weight.device)
    with _autocast(cfg, mb.input_ids.device):
        hidden, prev = model.training_hidden(
            mb.input_ids, mb.aux.to(compute_dtype), mb.position_ids, mb.seq_start, mb.anchor_index
        )
    h = hidden.detach().requires_grad_(True)
    totals = {"loss": 0.0, "ce": 0.0, "l1": 0.0, "conf": 0.0}
    stats: Dict[str, torch.Tensor] = {}
    n = int(mb.anchor_index.shape[0])
    step = max(1, int(cfg.head_chunk)) if cfg.head_chunk else max(1, n)
    for a in range(0, n, step):
        sl = slice(a, a + step)
        with _autocast(cfg, mb.input_ids.device):
            out = model.heads(h[sl], prev[sl], narrow=True)
        with torch.no_grad():
            target_logits, labels, lse = _targets(model, mb, sl, compute_dtype)
        parts = dspark_loss(
            out.logits, target_logits, labels, out.confidence_logits, mb.valid[sl],
            decay=cfg.loss_decay, alpha_ce=cfg.alpha_ce, alpha_l1=cfg.alpha_l1, alpha_conf=cfg.alpha_conf,
            denom=denom, target_lse=lse,
        )
        parts.total.backward()
        for k, v in (("loss", parts.total), ("ce", parts.ce), ("l1", parts.l1), ("conf", parts.conf)):
            totals[k] += float(v.detach())
        for k, v in parts.stats.items():
            v = v.detach().cpu()
            stats[k] = stats[k] + v if k in stats else v
    if n and h.grad is not None:
        hidden.backward(h.grad)
    return totals, stats


# --------------------------------------------------------------------------------------------- schedule


def lr_lambda(total_steps: int, warmup_ratio: float, min_ratio: float):
    warmup = int(warmup_ratio * total_steps)

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total_steps - warmup)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    return f


# --------------------------------------------------------------------------------------------- trainer


class Trainer:
    def __init__(self, model: DSparkDraft, cache: FeatureCache, cfg: TrainConfig,
                 indices: Optional[Sequence[int]] = None) -> None:
        self.model = model
        self.cache = cache
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.ckpt_dir = self.out / "checkpoints"
        self.indices = list(range(len(cache))) if indices is None else list(indices)
        if not self.indices:
            raise ValueError("no training sequences")
        model.to(cfg.device)
        if model.hot_ids is not None:  # a plain attribute, not a buffer: follow the weights to their device
            model.set_hot_vocab(model.hot_ids)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lr_lambda(cfg.steps, cfg.warmup_ratio, cfg.min_lr_ratio)
        )
        self.step = 0
        self.epoch = 0
        self.epoch_pos = 0
        self.anchor_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.history: List[dict] = []
        self.train_seconds = 0.0  # wall time of the steps so far, over every resume (the tau-per-hour axis)

    # ----------------------------------------------------------------------------- data order

    def _epoch_order(self, epoch: int) -> List[int]:
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        return [self.indices[i] for i in torch.randperm(len(self.indices), generator=g).tolist()]

    def _next_sequences(self) -> List[int]:
        out = []
        while len(out) < self.cfg.batch_size:
            order = self._epoch_order(self.epoch)
            take = order[self.epoch_pos : self.epoch_pos + self.cfg.batch_size - len(out)]
            out.extend(take)
            self.epoch_pos += len(take)
            if self.epoch_pos >= len(order):
                self.epoch += 1
                self.epoch_pos = 0
        return out

    def _micro_batches(self, seq_ids: Sequence[int]) -> List[MicroBatch]:
        items, groups, tokens = [], [], 0
        for i in seq_ids:
            seq = self.cache[i]
            if self.cfg.loss_on_prompts:
                seq = replace(seq, loss_mask=torch.ones_like(seq.loss_mask))
            anc = sample_anchors(seq.loss_mask, self.cfg.num_anchors, self.anchor_gen)
            if anc.numel() == 0:
                continue
            n = seq.input_ids.shape[0]
            if items and tokens + n > self.cfg.micro_tokens:
                groups.append(items)
                items, tokens = [], 0
            items.append((seq, anc))
            tokens += n
        if items:
            groups.append(items)
        return [pack(g, self.model.gamma) for g in groups]

    # ----------------------------------------------------------------------------- checkpoints

    def _state(self) -> dict:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "epoch_pos": self.epoch_pos,
            "model": self.model.trainable_state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "anchor_gen": self.anchor_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "train_config": self.cfg.to_json(),
            "draft_config": self.model.config,
            "history": self.history,
            "train_seconds": self.train_seconds,
        }

    def save_checkpoint(self) -> Path:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = self.ckpt_dir / f"{CKPT_PREFIX}{self.step:08d}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(self._state(), tmp)
        os.replace(tmp, path)
        for old in sorted(self.ckpt_dir.glob(f"{CKPT_PREFIX}*.pt"))[: -max(1, self.cfg.keep_checkpoints)]:
            old.unlink()
        return path

    def latest_checkpoint(self) -> Optional[Path]:
        found = sorted(self.ckpt_dir.glob(f"{CKPT_PREFIX}*.pt"))
        return found[-1] if found else None

    def load_checkpoint(self, path: Path, extend: bool = False) -> None:
        """Continue a run bit for bit; ``extend``: also allow another ``steps`` total past the checkpoint's step (the
        cosine schedule is recomputed for the new total from that step on, so lr moves to where that total puts it)."""
        st = torch.load(path, map_location=self.cfg.device, weights_only=False)
        if st["draft_config"] != self.model.config:
            raise ValueError(f"{path} was written for a different draft config")
        if extend and self.cfg.steps <= st["step"]:
            raise ValueError(f"{path} is at step {st['step']}: a new --steps total must be larger, got {self.cfg.steps}")
        for key in ("steps", "batch_size", "num_anchors", "lr", "seed", "warmup_ratio"):
            if extend and key == "steps":
                continue
            if st["train_config"].get(key) != self.cfg.to_json().get(key):
                raise ValueError(f"{path}: {key}={st['train_config'].get(key)} differs from this run's "
                                 f"{self.cfg.to_json().get(key)}; resume with the same settings")
        missing, unexpected = self.model.load_state_dict(st["model"], strict=False)
        if unexpected or set(missing) - {"embed_tokens.weight", "lm_head.weight"}:
            raise ValueError(f"{path}: weights do not match the model ({missing}, {unexpected})")
        self.opt.load_state_dict(st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        self.anchor_gen.set_state(st["anchor_gen"].cpu())
        torch.set_rng_state(st["torch_rng"].cpu())
        random.setstate(st["python_rng"])
        self.step, self.epoch, self.epoch_pos = st["step"], st["epoch"], st["epoch_pos"]
        self.history = list(st.get("history", []))
        self.train_seconds = float(st.get("train_seconds", 0.0))
        if extend:  # the loaded optimizer holds the old schedule's lr for the next step: take the new total's
            for group, base, fn in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas):
                group["lr"] = base * fn(self.step)
            self.sched._last_lr = [group["lr"] for group in self.opt.param_groups]

    # ----------------------------------------------------------------------------- loop

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        micro = self._micro_batches(self._next_sequences())
        g = self.model.gamma
        denom = sum(float(slot_weights(mb.valid, self.cfg.loss_decay).sum()) for mb in micro)
        self.opt.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "ce": 0.0, "l1": 0.0, "conf": 0.0}
        stats: Dict[str, torch.Tensor] = {}
        ctx_tokens = slots = 0
        for mb in micro:
            t, st = micro_backward(self.model, mb, self.cfg, denom)
            for k, v in t.items():
                totals[k] += v
            for k, v in st.items():
                stats[k] = stats[k] + v if k in stats else v
            ctx_tokens += int(mb.input_ids.numel())
            slots += int(mb.valid.sum())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.step += 1
        dt = time.perf_counter() - t0
        self.train_seconds += dt
        n_slots = stats["slots"].clamp_min(1) if stats else torch.ones(g)
        rec = {
            "step": self.step,
            "lr": lr,
            **totals,
            "grad_norm": grad_norm,
            "accept": (stats["accept_sum"] / n_slots).tolist() if stats else [],
            "top1": (stats["top1_sum"] / n_slots).tolist() if stats else [],
            "tau": float(stats["tau_sum"] / stats["blocks"].clamp_min(1)) if stats else 0.0,
            "ctx_tokens": ctx_tokens,
            "block_slots": slots,
            "seconds": dt,
            "train_seconds": self.train_seconds,
        }
        if "conf_abs_err_sum" in stats:
            rec["conf_abs_err"] = float(stats["conf_abs_err_sum"] / n_slots.sum())
        return rec

    def train(self, resume: bool = False, stop_after: Optional[int] = None, extend: bool = False,
              stop_after_seconds: Optional[float] = None) -> List[dict]:
        """Run to ``cfg.steps`` (``stop_after``: return early at that step, as an interruption would; ``extend``:
        resume, allowing another ``cfg.steps`` total than the run was started with; ``stop_after_seconds``: stop
        at the first step past this much wall time, with a checkpoint, so a later ``resume`` goes on from there)."""
        started = time.perf_counter()
        from tqdm.auto import tqdm

        if self.cfg.threads:
            torch.set_num_threads(int(self.cfg.threads))
        ck = self.latest_checkpoint()
        if (resume or extend) and ck is not None:
            self.load_checkpoint(ck, extend=extend)
        elif ck is not None and self.step == 0:
            # a fresh run would interleave its checkpoints with the old run's (and prune the wrong ones)
            raise FileExistsError(f"{self.ckpt_dir} already holds {ck.name}: resume it or use another output folder")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "train_config.json").write_text(json.dumps(self.cfg.to_json(), indent=2) + "\n")
        log = open(self.out / "train_log.jsonl", "a", encoding="utf-8")
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step",
                   disable=not self.cfg.progress, dynamic_ncols=True)
        self.model.train()
        try:
            while self.step < self.cfg.steps and (stop_after is None or self.step < stop_after):
                rec = self.train_step()
                self.history.append({k: rec[k] for k in ("step", "loss", "ce", "l1", "conf", "tau", "train_seconds")})
                bar.update(1)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", tau=f"{rec['tau']:.2f}",
                                acc0=f"{rec['accept'][0]:.2f}" if rec["accept"] else "-",
                                tok_s=f"{rec['ctx_tokens'] / max(rec['seconds'], 1e-9):.0f}")
                if self.step % max(1, self.cfg.log_every) == 0 or self.step == self.cfg.steps:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                out_of_time = stop_after_seconds is not None and time.perf_counter() - started >= stop_after_seconds
                if (self.cfg.save_every and (self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps)) \
                        or out_of_time:
                    self.save_checkpoint()
                if out_of_time:
                    break
        finally:
            bar.close()
            log.close()
        return self.history
