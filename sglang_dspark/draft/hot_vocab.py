"""A frequency-ranked draft vocabulary (FR-Spec, arXiv 2502.14856): the draft's logits over the most frequent tokens.

Notation: ``V`` the target vocabulary, ``H ⊂ V`` the hot set (``|H|`` ≪ ``|V|``, ids listed most frequent first),
``W`` the LM head ``[|V|, d]``, ``W2`` the Markov head's output projection ``[|V|, r]``.

A DSpark draft step computes base logits ``h·Wᵀ`` over ``V`` for every block slot, adds the Markov bias
``e(prev)·W2ᵀ`` over ``V``, and samples (or takes the argmax of) the result. With a hot set both products run over the
rows of ``H`` only, and every column outside ``H`` is ``-inf``:

    step_logits[v] = h·W[v] + e(prev)·W2[v]     v ∈ H
                   = -inf                       v ∉ H

so the draft proposes only hot tokens, and its distribution ``q = softmax(step_logits / T)`` is exactly zero outside
``H``. Verification is unchanged and stays exact: greedy accepts a draft token only if it is the target's argmax,
and speculative sampling with any ``q`` outputs the target distribution ``p`` (a token outside ``H`` is never
proposed, so it comes out of the residual ``max(p − q, 0)``, which then carries all of ``p``'s mass there). What the
hot set changes is speed (the two products read ``|H|/|V|`` of the weights) and acceptance (lost whenever the
target's token is not hot: the hot set's coverage of the target's outputs bounds it).

The tensors stay ``|V|`` wide (``-inf`` / zero filled), so every consumer downstream (the Markov sampling step, the
kept step logits of a sampled verify, the confidence head reading token ids) sees the shapes and ids it always saw.
The one exception is the serial Markov loop on the CPU (:func:`hot_markov_block`): γ slots × (bias fill, add, argmax or
cumulative sum) over ``|V|`` columns of which ``|V| − |H|`` hold ``-inf`` is wasted work over ``-inf`` columns, so
the loop runs over the ``|H|`` columns in ascending id order and widens its kept logits once at the end. Same tokens,
same kept logits (the test proves it against the wide loop): ``-inf`` columns add nothing to a float64 cumulative sum
nor win an argmax, and ascending order keeps the lowest-id tie-break and the summation order.

The hot set ships beside a draft's ``config.json`` as ``dspark_hot_vocab.json`` (:data:`HOT_VOCAB_FILE`), optional:
a draft without one runs over the whole vocabulary. ``python -m sglang_dspark.draft.hot_vocab build`` makes one from
the target's own answers; ``coverage`` measures a hot set on other answers.

Pure torch (no SGLang imports); ``patches/hot_vocab.py`` wires it into SGLang's draft.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from sglang_dspark.cpu.packed_linear import PackedWeight, fits, packed_linear
from sglang_dspark.kernels.markov_step import cpu_markov_step

__all__ = [
    "HOT_VOCAB_FILE",
    "HotVocab",
    "HotVocabError",
    "build_hot_vocab",
    "hot_coverage",
    "hot_logits",
    "hot_markov_bias",
    "hot_logits_columns",
    "hot_markov_bias_columns",
    "hot_markov_block",
    "widen",
    "load_hot_vocab",
]

HOT_VOCAB_FILE = "dspark_hot_vocab.json"


class HotVocabError(ValueError):
    """A hot-vocabulary file that cannot be used with this draft."""


@dataclass(frozen=True)
class HotVocab:
    """The hot set: ``token_ids`` (int64, most frequent first, distinct, all < ``vocab_size``)."""

    token_ids: torch.Tensor
    vocab_size: int
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = self.token_ids
        if ids.dim() != 1 or ids.numel() == 0:
            raise HotVocabError("the hot set must be a non-empty list of token ids")
        if ids.dtype != torch.int64:
            raise HotVocabError(f"hot token ids must be int64, got {ids.dtype}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise HotVocabError(
                f"hot token ids must lie in [0, {self.vocab_size}) (the target's vocabulary), got "
                f"[{int(ids.min())}, {int(ids.max())}]: this hot set was made for another tokenizer"
            )
        if torch.unique(ids).numel() != ids.numel():
            raise HotVocabError("hot token ids must be distinct")

    @property
    def size(self) -> int:
        return int(self.token_ids.numel())

    def to_json(self) -> dict:
        return {"vocab_size": self.vocab_size, "token_ids": self.token_ids.tolist(), **self.meta}


def load_hot_vocab(draft_dir: str | Path, vocab_size: int) -> Optional[HotVocab]:
    """The hot set shipped beside a draft (``HOT_VOCAB_FILE``), or None when the draft ships none.

    Raises :class:`HotVocabError` naming the file and what is wrong when it exists but does not fit the target."""
    path = Path(draft_dir) / HOT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        ids = torch.tensor(raw["token_ids"], dtype=torch.int64)
        declared = int(raw.get("vocab_size", vocab_size))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HotVocabError(f"{path}: not a hot-vocabulary file ({exc}); remove it or rebuild it with "
                            "`python -m sglang_dspark.draft.hot_vocab build`") from exc
    if declared != vocab_size:
        raise HotVocabError(f"{path}: made for a {declared}-token vocabulary, the target has {vocab_size}; "
                            "rebuild it for this target or remove it")
    meta = {k: v for k, v in raw.items() if k not in ("token_ids", "vocab_size")}
    try:
        return HotVocab(ids, vocab_size, meta)
    except HotVocabError as exc:
        raise HotVocabError(f"{path}: {exc}") from None


def build_hot_vocab(counts: Counter, size: int, vocab_size: int, always: Iterable[int] = (),
                    meta: Optional[dict] = None) -> HotVocab:
    """The ``size`` most frequent ids of ``counts`` (ties: lower id first), ``always`` included first (special tokens
    such as EOS, which end answers but may be rare in counts of truncated ones)."""
    if not 0 < size <= vocab_size:
        raise HotVocabError(f"hot set size must be in [1, {vocab_size}], got {size}")
    chosen: list[int] = []
    seen: set[int] = set()
    for tok in list(always) + [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]:
        tok = int(tok)
        if tok not in seen and 0 <= tok < vocab_size:
            chosen.append(tok)
            seen.add(tok)
        if len(chosen) == size:
            break
    if len(chosen) < size:  # fewer distinct tokens seen than asked for: fill with the lowest unseen ids
        chosen.extend(t for t in range(vocab_size) if t not in seen)
        chosen = chosen[:size]
    return HotVocab(torch.tensor(chosen, dtype=torch.int64), vocab_size, dict(meta or {}))


def hot_coverage(hot: HotVocab, token_ids: Sequence[int]) -> float:
    """The share of ``token_ids`` (e.g. the target's answers) inside the hot set: the ceiling on per-token acceptance
    the hot set leaves."""
    if len(token_ids) == 0:
        return float("nan")
    member = torch.zeros(hot.vocab_size, dtype=torch.bool)
    member[hot.token_ids] = True
    return float(member[torch.as_tensor(token_ids, dtype=torch.int64)].float().mean())


def widen(columns: torch.Tensor, hot_ids: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """``[..., |V|]``: ``columns`` (``[..., |H|]``, one per id of ``hot_ids``) at their ids, ``fill`` elsewhere."""
    out = torch.full((*columns.shape[:-1], vocab_size), fill, dtype=columns.dtype, device=columns.device)
    out.index_copy_(-1, hot_ids, columns)
    return out


def hot_logits_columns(hidden: torch.Tensor, hot_weight: torch.Tensor,
                       packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """``[N, |H|]`` logits ``hidden @ hot_weightᵀ``, one column per hot row, in ``hot_weight``'s dtype (as the full
    product would be). ``packed``: the same rows packed for oneDNN (CPU; sglang_dspark/cpu/packed_linear.py), used
    where the product fits its row limit."""
    hidden = hidden.to(hot_weight.dtype)
    usable = packed is not None and fits(hidden)
    return packed_linear(hidden, packed) if usable else torch.matmul(hidden, hot_weight.T)


def hot_logits(hidden: torch.Tensor, hot_weight: torch.Tensor, hot_ids: torch.Tensor, vocab_size: int,
               packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """``[N, |V|]`` logits: ``hidden @ hot_weightᵀ`` on the hot columns (``hot_weight`` = ``W[hot_ids]``, gathered
    once), ``-inf`` elsewhere."""
    return widen(hot_logits_columns(hidden, hot_weight, packed), hot_ids, vocab_size, float("-inf"))


def hot_markov_bias_columns(latent: torch.Tensor, hot_w2: torch.Tensor,
                            packed: Optional[PackedWeight] = None,
                            hot_w2_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[N, |H|]`` Markov bias ``latent @ hot_w2ᵀ``, one column per hot row. ``packed``: as in
    :func:`hot_logits_columns`. ``hot_w2_t``: ``hot_w2ᵀ`` stored contiguous (``[r, |H|]``), for a single row: with a
    narrow latent (r = 64) a one-row product over that layout streams the weight as a plain GEMV, where oneDNN's
    blocked layout is slower for one row (docs/scheduling.md, FR-Spec; one user's draft block runs one per Markov
    slot); from two rows on the packed weight is the faster one."""
    if hot_w2_t is not None and latent.dim() == 2 and latent.shape[0] == 1 and latent.dtype == hot_w2_t.dtype:
        return torch.mm(latent, hot_w2_t)
    usable = packed is not None and latent.dtype == hot_w2.dtype and fits(latent)
    return packed_linear(latent, packed) if usable else torch.nn.functional.linear(latent, hot_w2)


def hot_markov_bias(latent: torch.Tensor, hot_w2: torch.Tensor, hot_ids: torch.Tensor, vocab_size: int,
                    packed: Optional[PackedWeight] = None, hot_w2_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[N, |V|]`` Markov bias ``latent @ hot_w2ᵀ`` on the hot columns, zero elsewhere (the base logits are ``-inf``
    there, so any finite value would do; zero keeps ``-inf + bias`` at ``-inf``). ``packed``, ``hot_w2_t``: as in
    :func:`hot_markov_bias_columns`."""
    return widen(hot_markov_bias_columns(latent, hot_w2, packed, hot_w2_t), hot_ids, vocab_size, 0.0)


def hot_markov_block(
    base_hot: torch.Tensor,
    anchor_tokens: torch.Tensor,
    *,
    ascending_ids: torch.Tensor,
    step_bias: Callable[[torch.Tensor], torch.Tensor],
    temperatures: torch.Tensor,
    step_dtype: torch.dtype,
    noise_seed: Callable[[int], Optional[int]],
    vocab_size: int,
    keep_logits: bool,
    after_step: Callable[[torch.Tensor], torch.Tensor] = lambda tokens: tokens,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The draft block's serial Markov loop over the hot columns (CPU; the module docstring says why it is exact).

    ``base_hot`` ``[bs, γ, |H|]``: the base logits of the hot columns, in ``ascending_ids`` order; ``step_bias(prev)``
    the Markov bias of the previous tokens (vocabulary ids ``[bs]``) in the same column order; ``temperatures``
    ``[bs]`` (0: greedy row); ``noise_seed(slot)`` the sampling seed of a slot (None: no sampled row). Each slot is
    ``cpu_markov_step`` on those columns, the slot after it conditioned on the token drafted here (``after_step``
    sees it first: the TP ranks' agreement). Returns the drafted vocabulary ids ``[bs, γ]`` and, with
    ``keep_logits``, the step logits ``[bs, γ, |V|]`` (``step_dtype``, ``-inf`` outside H) that a sampled verify
    reads as the draft distribution."""
    bs, gamma, width = base_hot.shape
    kept = torch.empty((bs, gamma, width), dtype=step_dtype, device=base_hot.device) if keep_logits else None
    prev = anchor_tokens.long()
    tokens = []
    for slot in range(gamma):
        picks = cpu_markov_step(base_hot[:, slot], step_bias(prev), temperatures, step_dtype,
                                None if kept is None else kept[:, slot], noise_seed=noise_seed(slot))
        prev = after_step(ascending_ids[picks])
        tokens.append(prev)
    wide = None if kept is None else widen(kept, ascending_ids, vocab_size, float("-inf"))
    return torch.stack(tokens, dim=1), wide


# ---------------------------------------------------------------------------------------------------------- CLI


def _answer_token_ids(paths: Sequence[str], tokenizer) -> list[list[int]]:
    """Token ids of the assistant turns in answers JSONL files (``training generate``'s format: ``messages``)."""
    answers = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                for message in rec.get("messages", []):
                    if message.get("role") == "assistant" and message.get("content"):
                        answers.append(tokenizer.encode(message["content"], add_special_tokens=False))
    return answers


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sglang_dspark.draft.hot_vocab", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="a hot set from the target's answers (JSONL from `training generate`)")
    b.add_argument("--answers", nargs="+", required=True)
    b.add_argument("--tokenizer", required=True, help="the target's tokenizer (model folder)")
    b.add_argument("--size", type=int, default=8192)
    b.add_argument("--out", required=True, help=f"folder to write {HOT_VOCAB_FILE} into (the draft's folder)")
    c = sub.add_parser("coverage", help="share of other answers' tokens a hot set covers")
    c.add_argument("--draft", required=True, help=f"folder holding {HOT_VOCAB_FILE}")
    c.add_argument("--answers", nargs="+", required=True)
    c.add_argument("--tokenizer", required=True)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = Path(args.tokenizer) / "config.json"  # the LM head's vocabulary (may be padded past the tokenizer's)
    vocab_size = int(json.loads(config.read_text())["vocab_size"]) if config.is_file() else len(tokenizer)
    answers = _answer_token_ids(args.answers, tokenizer)
    flat = [t for a in answers for t in a]
    if args.cmd == "build":
        special = [t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id)
                   if t is not None] + list(tokenizer.all_special_ids)
        hot = build_hot_vocab(Counter(flat), args.size, vocab_size, always=special,
                              meta={"source": [Path(p).name for p in args.answers], "answers": len(answers),
                                    "tokens": len(flat)})
        out = Path(args.out) / HOT_VOCAB_FILE
        out.write_text(json.dumps(hot.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"{out}: {hot.size} hot tokens of {vocab_size}; {len(set(flat))} distinct tokens in {len(flat)} answer "
              f"tokens; coverage of those answers {hot_coverage(hot, flat):.4f}")
    else:
        hot = load_hot_vocab(args.draft, vocab_size)
        if hot is None:
            ap.error(f"{args.draft} has no {HOT_VOCAB_FILE}")
        print(f"{hot.size} hot tokens: coverage {hot_coverage(hot, flat):.4f} of {len(flat)} answer tokens "
              f"({len(answers)} answers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
