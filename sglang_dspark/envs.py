"""Every ``SGLANG_DSPARK_*`` switch, declared once: name, type, default, choices, what it does.

Read a switch with ``envs.NAME.get()``. A value outside the declared choices raises ``ValueError`` naming the switch,
the value and the choices (a typo must not pass silently); an empty value means "not set" for every switch. The
README's switch table is checked against ``SWITCHES`` (tests/unit/test_envs.py).

Stdlib only: the CPU start-up hook reads these in every interpreter before anything heavy is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Switch:
    name: str
    default: Optional[str]
    doc: str
    choices: tuple[str, ...] = ()  # empty: free text (a path)

    def raw(self) -> Optional[str]:
        value = os.environ.get(self.name, "").strip()
        return value or None

    def get(self) -> Optional[str]:
        """The value (lower-cased when the switch has choices), or the default when unset or empty."""
        value = self.raw()
        if value is None:
            return self.default
        if not self.choices:
            return value
        value = value.lower()
        if value not in self.choices:
            raise ValueError(
                f"{self.name}={value!r} is not valid; choose one of {', '.join(self.choices)} "
                f"(default {self.default!r}), or unset it."
            )
        return value

    def is_set(self) -> bool:
        return self.raw() is not None


ADMISSION = Switch(
    "SGLANG_DSPARK_ADMISSION", "async",
    "admission policy: async (default; capacity from lagged confidences, no host sync), exact (Algorithm 1 on "
    "current confidences, host sync), verify-all (upstream's static mode), off (anchor only)",
    ("async", "exact", "verify-all", "off"),
)
WORKER = Switch(
    "SGLANG_DSPARK_WORKER", "sglang-dspark",
    "sglang-dspark (default): our worker and planner; upstream: keep SGLang's own DSparkWorkerV2 (comparisons)",
    ("sglang-dspark", "upstream"),
)
DRAFT_GATE = Switch(
    "SGLANG_DSPARK_DRAFT_GATE", "auto",
    "draft only when it pays: auto (default: skip the draft block on steps where a plain anchor-only step has the "
    "higher expected throughput, learned step costs, periodic probes); off: draft every step; pause: never draft "
    "(test); alternate: draft every other step (test); comeback: pause, then a cost model where drafting pays (test)",
    ("auto", "off", "pause", "alternate", "comeback"),
)
PLAIN_STEP = Switch(
    "SGLANG_DSPARK_PLAIN_STEP", "decode",
    "how a step the draft gate skipped runs: decode (default: SGLang's own decode step plus the draft-KV injection, "
    "where the target runs eager); verify: upstream's verify path with the anchors only (comparisons)",
    ("decode", "verify"),
)
PAUSE_KV = Switch(
    "SGLANG_DSPARK_PAUSE_KV", "batched",
    "how the tokens of steps the draft gate skipped reach the draft KV: batched (default: held during a pause and "
    "written in one batch before anything reads draft KV); per-step: written on every skipped step (comparisons)",
    ("batched", "per-step"),
)
HOT_VOCAB = Switch(
    "SGLANG_DSPARK_HOT_VOCAB", "auto",
    "auto (default): when the draft ships dspark_hot_vocab.json, its logits run over those frequent tokens only "
    "(FR-Spec; exact, faster draft block); off: always the whole vocabulary",
    ("auto", "off"),
)
RAGGED_SELF_CHECK = Switch(
    "SGLANG_DSPARK_RAGGED_SELF_CHECK", "auto",
    "GPU, triton / flashinfer attention: auto (default): open compact verify after our ragged-verify patch passed an "
    "on-device check (run once per GPU and software, kept in the cache folder; a check past its time bound is kept as "
    "static and retried 24 h later); off: static verify there; force: re-run the check at this start",
    ("auto", "off", "force"),
)
OVERLAP_PENALTIES = Switch(
    "SGLANG_DSPARK_OVERLAP_PENALTIES", "exact",
    "no-spec under SGLang's overlap scheduler: exact (default): frequency/presence/repetition/min_new_tokens count "
    "each generated token before the next is sampled, as without overlap (patches/overlap_penalties.py); upstream: "
    "SGLang's count, one token late (the first decode counts the last prompt token; comparisons)",
    ("exact", "upstream"),
)
LOOKUP = Switch(
    "SGLANG_DSPARK_LOOKUP", "on",
    "prompt lookup beside the draft: on (default): each decode step proposes, per request, the continuation of the "
    "longest recent match of its tail in its own prompt + output, and the scheduler verifies the lookup chain, the "
    "draft chain or nothing, by expected tokens x step speed (sglang_dspark/lookup/); off: the draft only; forced: "
    "verify every lookup proposal in full (exactness tests)",
    ("on", "off", "forced"),
)
SHARED_LOOKUP = Switch(
    "SGLANG_DSPARK_SHARED_LOOKUP", "key",
    "the lookup's shared suffix cache (finished requests' prompts + outputs, proposing for later requests; bounded: "
    "sglang_dspark/lookup/shared_index.py): key (default): shared only between requests of the same extra_key and "
    "cache_salt, the namespace SGLang's radix cache isolates prefixes by; server: one cache for every request; off: "
    "each request proposes from its own context only. Exact either way; timing tells (docs/lookup.md)",
    ("key", "server", "off"),
)
LONG_CHAINS = Switch(
    "SGLANG_DSPARK_LONG_CHAINS", "on",
    "lookup chains past the draft's block: on (default): where the target runs eager on the host (the CPU platform), "
    "a step without the draft may verify chains up to 31 tokens (sglang_dspark/engine/long_chain_step.py); off: "
    "every chain stops at the draft's block (to compare)",
    ("on", "off"),
)
CPU_PLATFORM = Switch(
    "SGLANG_DSPARK_CPU_PLATFORM", "1",
    "1 (default): activate the CPU platform when SGLang runs on the CPU; 0: never activate it",
    ("1", "0"),
)
CPU_MARKOV_STEP = Switch(
    "SGLANG_DSPARK_CPU_MARKOV_STEP", "ours",
    "on the CPU, ours (default): no noise for greedy rows, one Gumbel draw per sampled row; upstream: upstream's "
    "torch step (Philox noise on every row)",
    ("ours", "upstream"),
)
CPU_LINEAR = Switch(
    "SGLANG_DSPARK_CPU_LINEAR", "packed",
    "on the CPU, packed (default): unquantized linear layers and the LM head through oneDNN with weights packed once "
    "(a verify row costs far less than with MKL's GEMM; patches/cpu_packed_linear.py); torch: SGLang's F.linear/matmul",
    ("packed", "torch"),
)
CACHE = Switch(
    "SGLANG_DSPARK_CACHE", None,
    "cache folder for converted models and SPS tables (default ~/.cache/sglang-dspark)",
)
GATE_TRACE = Switch(
    "SGLANG_DSPARK_GATE_TRACE", None,
    "a file path: append one JSON line per decode step with what the draft gate predicted and what the step took "
    "(sglang_dspark/engine/gate_trace.py; diagnosis)",
)
STANDIN_TRACE = Switch(
    "SGLANG_DSPARK_STANDIN_TRACE", "0",
    "1: log every call into the CPU sgl_kernel stand-in (debugging)",
    ("0", "1"),
)

SWITCHES: tuple[Switch, ...] = (
    ADMISSION, WORKER, DRAFT_GATE, PLAIN_STEP, PAUSE_KV, HOT_VOCAB, RAGGED_SELF_CHECK, OVERLAP_PENALTIES, LOOKUP,
    SHARED_LOOKUP, LONG_CHAINS, CPU_PLATFORM,
    CPU_MARKOV_STEP, CPU_LINEAR, CACHE, GATE_TRACE, STANDIN_TRACE,
)


def cache_root() -> Path:
    """The project-wide cache folder (``SGLANG_DSPARK_CACHE``, default ``~/.cache/sglang-dspark``)."""
    value = CACHE.get()
    return Path(value) if value else Path.home() / ".cache" / "sglang-dspark"


def validate_all() -> None:
    """Raise on the first switch with a bad value (called once at plugin registration)."""
    for switch in SWITCHES:
        switch.get()
