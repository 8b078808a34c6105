"""Ground truth for penalised greedy decoding: the target alone in transformers, SGLang's penalty semantics.

SGLang 0.5.23's penalizers (``sglang/srt/sampling/penaltylib``) count **output** tokens only: frequency subtracts
``f × count``, presence subtracts ``p`` once a token appeared, both added to the logits, then repetition scales
the logits of every token that appeared (``logit / r`` where positive, ``logit × r`` where negative), the order of
``kernels/verify_penalties.py``. Used by ``tests/e2e/test_e2e_penalties.py`` to tell which server is right when
DSPARK and no-spec disagree (no-spec has been seen to return, once in a while, a token this chain does not).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def penalise(logits: torch.Tensor, generated: Sequence[int], *, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0, repetition_penalty: float = 1.0) -> torch.Tensor:
    """The next-token logits ``[V]`` after SGLang's penalties for the ``generated`` output tokens so far."""
    counts = torch.zeros_like(logits)
    if generated:
        counts.index_add_(0, torch.tensor(list(generated)), torch.ones(len(generated), dtype=logits.dtype))
    seen = counts > 0
    out = logits - frequency_penalty * counts - presence_penalty * seen.to(logits.dtype)
    factor = torch.where(seen, torch.full_like(out, repetition_penalty), torch.ones_like(out))
    return torch.where(out < 0, out * factor, out / factor)


class PenalisedGreedy:
    """Greedy continuations of the target in fp32, one prompt at a time (no batching: nothing to perturb it)."""

    def __init__(self, model_dir: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def ids(self, prompt: str, max_new_tokens: int, penalties: Optional[dict] = None) -> list[int]:
        penalties = penalties or {}
        context = list(self.tokenizer(prompt)["input_ids"])
        generated: list[int] = []
        for _ in range(max_new_tokens):
            logits = self.model(torch.tensor([context + generated])).logits[0, -1].float()
            generated.append(int(penalise(logits, generated, **penalties).argmax()))
        return generated
