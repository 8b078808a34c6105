"""Training text -> (token ids, loss mask), with the target's tokenizer and chat template.

Accepted JSONL records (one per line; the first matching shape wins):

* ``{"input_ids": [...], "loss_mask": [...]}`` pre-tokenized (``loss_mask`` optional: all ones);
* ``{"messages": [{"role": ..., "content": ...}, ...]}`` (also ``"conversations"`` with ``from``/``value``):
  rendered with the tokenizer's chat template; the loss mask covers the assistant turns (their content and
  the template's end-of-turn tokens), like DeepSpec's ``prepare_target_cache``;
* ``{"prompt": str, "completion"|"response"|"output": str}``: loss on the completion only;
* ``{"text": str}``: loss on every token.

The loss mask says where a draft is trained to predict: an anchor ``p`` is used when ``mask[p]`` and
``mask[p+1]`` hold, and block slots stop at the first unmasked label.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence


@dataclass(frozen=True)
class TokenizedSequence:
    input_ids: List[int]
    loss_mask: List[int]


_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


def _norm_messages(rec: dict) -> Optional[list]:
    msgs = rec.get("messages")
    if msgs is None and isinstance(rec.get("conversations"), list):
        msgs = [
            {"role": _ROLE_ALIASES.get(m.get("from", m.get("role")), m.get("from", m.get("role"))),
             "content": m.get("value", m.get("content", ""))}
            for m in rec["conversations"]
        ]
    if msgs is None:
        return None
    return [{"role": _ROLE_ALIASES.get(m["role"], m["role"]), "content": m["content"]} for m in msgs]


def _char_spans_to_mask(offsets: Sequence[Sequence[int]], spans: Sequence[tuple]) -> List[int]:
    mask = []
    for start, end in offsets:
        inside = end > start and any(s <= start and end <= e for s, e in spans)
        mask.append(1 if inside else 0)
    return mask


def tokenize_record(rec: dict, tokenizer, max_length: int) -> Optional[TokenizedSequence]:
    if "input_ids" in rec:
        ids = [int(t) for t in rec["input_ids"]]
        mask = [int(bool(m)) for m in rec.get("loss_mask", [1] * len(ids))]
        if len(mask) != len(ids):
            raise ValueError("input_ids and loss_mask lengths differ")
    else:
        msgs = _norm_messages(rec)
        if msgs is not None:
            text = tokenizer.apply_chat_template(msgs, tokenize=False)
            spans = []
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                # The assistant turn is what the full render adds between "prefix + generation prompt" and
                # "prefix + this message": template-agnostic, no role-marker parsing.
                start = len(tokenizer.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
                end = len(tokenizer.apply_chat_template(msgs[: i + 1], tokenize=False))
                spans.append((start, end))
        elif "prompt" in rec:
            completion = next((rec[k] for k in ("completion", "response", "output") if k in rec), None)
            if completion is None:
                raise ValueError("a prompt record needs completion/response/output")
            text = rec["prompt"] + completion
            spans = [(len(rec["prompt"]), len(text))]
        elif "text" in rec:
            text = rec["text"]
            spans = [(0, len(text))]
        else:
            raise ValueError(f"unrecognised record keys {sorted(rec)}")
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = _char_spans_to_mask(enc["offset_mapping"], spans)
    ids, mask = ids[:max_length], mask[:max_length]
    return TokenizedSequence(ids, mask)


def iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def load_sequences(
    path: Path,
    tokenizer=None,
    *,
    max_length: int = 2048,
    min_loss_tokens: int = 2,
    limit: Optional[int] = None,
) -> List[TokenizedSequence]:
    """Tokenize a JSONL file; drops sequences with fewer than ``min_loss_tokens`` trainable tokens."""
    out: List[TokenizedSequence] = []
    for rec in iter_jsonl(Path(path)):
        if tokenizer is None and "input_ids" not in rec:
            raise ValueError("text records need the target tokenizer")
        seq = tokenize_record(rec, tokenizer, max_length)
        if seq is None or sum(seq.loss_mask) < min_loss_tokens or len(seq.input_ids) < 2:
            continue
        out.append(seq)
        if limit is not None and len(out) >= limit:
            break
    return out


def sequences_fingerprint(seqs: Iterable[TokenizedSequence]) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(json.dumps([s.input_ids, s.loss_mask], separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def write_jsonl(path: Path, seqs: Iterable[TokenizedSequence]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for s in seqs:
            f.write(json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n")
