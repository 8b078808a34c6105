"""Run the frozen target once over the training sequences and cache what the draft's loss needs.

Per token we keep (DeepSpec's target cache, §4.4):

* ``aux``  [n_layers * d]: the outputs of target decoder layers ``target_layer_ids``, concatenated in id order.
  Layer id ``l`` is the output of decoder layer ``l`` = transformers' ``hidden_states[l + 1]``: SGLang captures
  the residual stream entering layer ``l + 1`` (``set_dflash_layers_to_capture`` stores ``l + 1``), which is the
  same tensor. ``l`` must be in ``[0, L-2]``: SGLang cannot capture the last layer's output (and transformers'
  ``hidden_states[L]`` is post final norm).
* ``last`` [d]: the target's final-normed hidden state; ``lm_head(last[p])`` is the target's distribution of
  token ``p + 1``, recomputed at training time instead of storing V floats per token.
* ``lse`` (fp32): ``logsumexp(lm_head(last[p]))`` over the whole vocabulary, so training over a hot vocabulary
  (FR-Spec) gets the target's exact probabilities of the hot tokens from |H| columns instead of |V|.

Shards are safetensors files (bf16 by default) written atomically; a rebuild with the same inputs reuses them, and
an interrupted build resumes at the first missing shard. The target's embedding and LM head are stored once in
``shared.safetensors`` so training never loads the target again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .data import TokenizedSequence, sequences_fingerprint

CACHE_VERSION = 2  # 2: + lse
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _transformers():
    from sglang_dspark.cpu.startup import import_transformers

    tf = import_transformers()
    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


def target_fingerprint(target_dir: Path) -> str:
    """Config + weight files (name, size, first MiB): cheap, and changes when the weights do."""
    h = hashlib.sha256()
    target_dir = Path(target_dir)
    h.update((target_dir / "config.json").read_bytes())
    for f in sorted(target_dir.glob("*.safetensors")) + sorted(target_dir.glob("*.bin")):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def validate_layer_ids(layer_ids: Sequence[int], num_target_layers: int) -> List[int]:
    ids = [int(i) for i in layer_ids]
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > num_target_layers - 2:
        raise ValueError(
            f"target_layer_ids {ids} must be strictly increasing within [0, {num_target_layers - 2}] "
            "(SGLang captures layer l's output at the input of layer l+1, so the last layer is not capturable)"
        )
    return ids


class TargetRunner:
    """The frozen target (transformers Llama / Qwen3 / any decoder with ``output_hidden_states``)."""

    def __init__(
        self, target_dir: Path, layer_ids: Optional[Sequence[int]], dtype: torch.dtype = torch.float32
    ) -> None:
        tf = _transformers()
        self.target_dir = Path(target_dir)
        self.model = tf.AutoModelForCausalLM.from_pretrained(self.target_dir, dtype=dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.config = json.loads((self.target_dir / "config.json").read_text(encoding="utf-8"))
        self.num_layers = int(self.model.config.num_hidden_layers)
        # None: only the shared weights are wanted (no feature extraction)
        self.layer_ids = None if layer_ids is None else validate_layer_ids(layer_ids, self.num_layers)
        self.base = self.model.get_decoder()

    def shared_weights(self) -> Dict[str, torch.Tensor]:
        return {
            "embed_tokens.weight": self.model.get_input_embeddings().weight.detach().clone(),
            "lm_head.weight": self.model.get_output_embeddings().weight.detach().clone(),
        }

    @torch.no_grad()
    def run(self, batch: Sequence[Sequence[int]]) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Right-padded batch -> per sequence (aux [S, n*d], last [S, d] in the model dtype, lse [S] fp32)."""
        s_max = max(len(s) for s in batch)
        ids = torch.zeros(len(batch), s_max, dtype=torch.long)
        att = torch.zeros(len(batch), s_max, dtype=torch.long)
        for i, s in enumerate(batch):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            att[i, : len(s)] = 1
        out = self.base(input_ids=ids, attention_mask=att, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        if len(hs) != self.num_layers + 1:
            raise RuntimeError(f"expected {self.num_layers + 1} hidden states, got {len(hs)}")
        aux = torch.cat([hs[l + 1] for l in self.layer_ids], dim=-1)
        last = out.last_hidden_state
        return [(aux[i, : len(s)], last[i, : len(s)], self.log_normalizer(last[i, : len(s)]))
                for i, s in enumerate(batch)]

    def log_normalizer(self, last: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """[S, d] final hidden -> [S] fp32 logsumexp of the target's logits (chunked: S x |V| floats at once would
        be gigabytes)."""
        w = self.model.get_output_embeddings().weight
        return torch.cat([torch.logsumexp(torch.nn.functional.linear(last[a : a + chunk], w).float(), dim=-1)
                          for a in range(0, last.shape[0], chunk)])


# --------------------------------------------------------------------------------------------- cache


@dataclass(frozen=True)
class ShardInfo:
    path: Path
    first_seq: int
    num_seqs: int


def _plan_shards(seqs: Sequence[TokenizedSequence], shard_tokens: int) -> List[Tuple[int, int]]:
    plan, start, tokens = [], 0, 0
    for i, s in enumerate(seqs):
        tokens += len(s.input_ids)
        if tokens >= shard_tokens:
            plan.append((start, i + 1))
            start, tokens = i + 1, 0
    if start < len(seqs):
        plan.append((start, len(seqs)))
    return plan


def _atomic_save(tensors: Dict[str, torch.Tensor], path: Path, metadata: Dict[str, str]) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def build_feature_cache(
    target_dir: Path,
    seqs: Sequence[TokenizedSequence],
    cache_dir: Path,
    layer_ids: Sequence[int],
    *,
    store_dtype: torch.dtype = torch.bfloat16,
    target_dtype: torch.dtype = torch.float32,
    shard_tokens: int = 1 << 18,
    batch_tokens: int = 8192,
    progress: bool = True,
) -> "FeatureCache":
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = {
        "version": CACHE_VERSION,
        "target": target_fingerprint(target_dir),
        "target_layer_ids": [int(i) for i in layer_ids],
        "store_dtype": dtype_name(store_dtype),
        "target_dtype": dtype_name(target_dtype),
        "data": sequences_fingerprint(seqs),
        "num_sequences": len(seqs),
        "shard_tokens": int(shard_tokens),
    }
    manifest_path = cache_dir / "manifest.json"
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
        if old.get("key") == key:
            return FeatureCache(cache_dir)
        manifest_path.unlink()  # stale: rebuilt below, shards are re-checked against the new key
    key_hash = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    runner = TargetRunner(target_dir, layer_ids, target_dtype)
    shared_path = cache_dir / "shared.safetensors"
    _atomic_save(runner.shared_weights(), shared_path, {"key": key_hash})

    plan = _plan_shards(seqs, shard_tokens)
    shards = []
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(len(s.input_ids) for s in seqs), unit="tok", desc="target features",
               disable=not progress, dynamic_ncols=True)
    for k, (a, b) in enumerate(plan):
        path = cache_dir / f"shard_{k:05d}.safetensors"
        shards.append({"file": path.name, "first_seq": a, "num_seqs": b - a})
        n_tok = sum(len(seqs[i].input_ids) for i in range(a, b))
        if path.is_file() and _shard_key(path) == key_hash:
            bar.update(n_tok)
            continue
        # Batches of sequences of similar length: the batch is right-padded to its longest, so on answers of mixed
        # length the order of the data set would add much padding. Rows go back to data-set order below.
        by_length = sorted(range(a, b), key=lambda t: len(seqs[t].input_ids))
        results: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        i = 0
        while i < len(by_length):
            j, longest = i, 0
            while j < len(by_length) and (
                    j == i or max(longest, len(seqs[by_length[j]].input_ids)) * (j - i + 1) <= batch_tokens):
                longest = max(longest, len(seqs[by_length[j]].input_ids))
                j += 1
            batch = by_length[i:j]
            for t, (aux, last, lse) in zip(batch, runner.run([seqs[t].input_ids for t in batch])):
                # copies, not views: the padded batch is freed before the next one
                results[t] = (aux.to(store_dtype, copy=True), last.to(store_dtype, copy=True), lse)
                bar.update(len(seqs[t].input_ids))
            i = j
        aux_rows, last_rows, lse_rows, ids, masks, offsets = [], [], [], [], [], [0]
        for t in range(a, b):
            aux, last, lse = results.pop(t)
            s = seqs[t]
            aux_rows.append(aux)
            last_rows.append(last)
            lse_rows.append(lse)
            ids.extend(s.input_ids)
            masks.extend(s.loss_mask)
            offsets.append(offsets[-1] + len(s.input_ids))
        _atomic_save(
            {
                "input_ids": torch.tensor(ids, dtype=torch.int32),
                "loss_mask": torch.tensor(masks, dtype=torch.uint8),
                "offsets": torch.tensor(offsets, dtype=torch.int64),
                "aux": torch.cat(aux_rows),
                "last": torch.cat(last_rows),
                "lse": torch.cat(lse_rows),
            },
            path,
            {"key": key_hash},
        )
    bar.close()
    manifest = {
        "key": key,
        "target_dir": str(Path(target_dir).resolve()),
        "target_config": runner.config,
        "num_target_layers": runner.num_layers,
        "hidden_size": int(runner.model.config.hidden_size),
        "num_tokens": sum(len(s.input_ids) for s in seqs),
        "shards": shards,
    }
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, manifest_path)
    return FeatureCache(cache_dir)


def _shard_key(path: Path) -> Optional[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("key")
    except Exception:
        return None


@dataclass
class CachedSequence:
    input_ids: torch.Tensor  # [S] long
    loss_mask: torch.Tensor  # [S] bool
    aux: torch.Tensor  # [S, n*d] store dtype
    last: torch.Tensor  # [S, d] store dtype
    lse: Optional[torch.Tensor] = None  # [S] fp32 target log-normaliser (None: a synthetic sequence)


class FeatureCache:
    """Read side: random access to cached sequences (safetensors slices, so only the rows asked for are read)."""

    def __init__(self, cache_dir: Path) -> None:
        from safetensors import safe_open

        self.dir = Path(cache_dir)
        self.manifest = json.loads((self.dir / "manifest.json").read_text(encoding="utf-8"))
        self.layer_ids = list(self.manifest["key"]["target_layer_ids"])
        self.hidden_size = int(self.manifest["hidden_size"])
        self.target_config = self.manifest["target_config"]
        self._handles = []
        self._index: List[Tuple[int, int, int]] = []  # (shard, start, end)
        for k, sh in enumerate(self.manifest["shards"]):
            h = safe_open(str(self.dir / sh["file"]), framework="pt")
            offsets = h.get_tensor("offsets")
            self._handles.append(h)
            for t in range(sh["num_seqs"]):
                self._index.append((k, int(offsets[t]), int(offsets[t + 1])))

    def __len__(self) -> int:
        return len(self._index)

    def length(self, i: int) -> int:
        _, a, b = self._index[i]
        return b - a

    def __getitem__(self, i: int) -> CachedSequence:
        k, a, b = self._index[i]
        h = self._handles[k]
        return CachedSequence(
            input_ids=h.get_slice("input_ids")[a:b].long(),
            loss_mask=h.get_slice("loss_mask")[a:b].bool(),
            aux=h.get_slice("aux")[a:b],
            last=h.get_slice("last")[a:b],
            lse=h.get_slice("lse")[a:b],
        )

    def shared_weights(self) -> Dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.dir / "shared.safetensors"))
