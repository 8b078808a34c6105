"""Prompts of the load test: a built-in chat set, the built-in grounded set (``grounded_prompts``: a passage and a
task that copies from it), the code-edit set (``code_edit_prompts``: real standard-library code and an edit task),
a JSONL file or a ShareGPT file, split so that no prompt is ever sent at two load levels.

Every level of a sweep gets its own slice of the prompt pool: a prompt seen at concurrency 4 is never sent again at
concurrency 16, so the radix (prefix) cache and NGRAM's n-gram cache never see a repeated prompt and cannot flatter
a later level. Each configuration (server) of a run gets the same slices, so levels compare like for like.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from .code_edit_prompts import code_edit_prompts  # noqa: F401  (re-exported: the third built-in set)
from .grounded_prompts import grounded_prompts, grounded_recurring_prompts  # noqa: F401  (re-exported)

# 120 subjects x 16 tasks = 1920 distinct chat prompts (the default sweep 1..64 with 4 prompts per slot needs 512).
SUBJECTS = [
    "binary search", "photosynthesis", "the French Revolution", "compound interest", "black holes", "recursion",
    "the water cycle", "public-key cryptography", "the Roman Empire", "plate tectonics", "vaccines",
    "the stock market", "machine translation", "volcanoes", "the printing press", "supply and demand",
    "garbage collection", "the immune system", "jazz improvisation", "climate feedback loops", "hash tables",
    "the Silk Road", "electric cars", "sourdough bread", "the Pythagorean theorem", "coral reefs",
    "database indexes", "the Renaissance", "solar panels", "chess openings", "DNA replication", "inflation",
    "the TCP handshake", "honeybees", "the Industrial Revolution", "quantum entanglement", "container shipping",
    "the human heart", "version control", "the Moon landing", "wind turbines", "probability", "ancient Egypt",
    "sleep", "regular expressions", "the Great Barrier Reef", "bicycles", "neural networks", "the Cold War",
    "composting", "unit testing", "glaciers", "the Olympic Games", "opera", "load balancers", "tides",
    "the periodic table", "microfinance", "origami", "the Amazon rainforest", "lighthouses", "sorting algorithms",
    "the printing of money", "earthquakes", "the violin", "caching", "migratory birds", "the Magna Carta",
    "3D printing", "fermentation", "the speed of light", "public libraries", "spreadsheets", "the Sahara desert",
    "electric guitars", "mountain climbing", "the Byzantine Empire", "satellites", "tea ceremonies", "compilers",
    "the Gulf Stream", "antibiotics", "marathon training", "the metric system", "impressionist painting",
    "operating system schedulers", "deep-sea creatures", "the Panama Canal", "rainbows", "minimalism",
    "the Fibonacci sequence", "beekeeping", "airline pricing", "the Hubble telescope", "urban gardens",
    "lossless compression", "the Maya civilisation", "hurricanes", "typography", "the gold standard",
    "renewable energy storage", "the octopus", "fountain pens", "the blockchain", "nuclear fusion", "haiku",
    "traffic lights", "the Vikings", "vitamin D", "semiconductors", "the Northern Lights", "board game design",
    "cloud computing", "the Eiffel Tower", "memory in the brain", "desert plants", "the QWERTY keyboard",
    "pandemics", "recycling plastics", "the harmonica",
]
TASKS = [
    "Explain {s} to a ten-year-old.",
    "Write a short poem about {s}.",
    "What are three common misconceptions about {s}?",
    "Give me a step-by-step overview of how {s} works.",
    "Summarise the history of {s} in one paragraph.",
    "Why does {s} matter in everyday life?",
    "Write a dialogue between a teacher and a student about {s}.",
    "List the pros and cons of {s}.",
    "Describe {s} as if you were a tour guide.",
    "If you had to teach {s} in five minutes, what would you say?",
    "Compare {s} with something from the kitchen.",
    "Draft a short quiz with answers about {s}.",
    "Tell a short story in which {s} plays a key role.",
    "What questions do experts still ask about {s}?",
    "Write a product description inspired by {s}.",
    "How would you explain {s} to someone from the year 1500?",
]

WARMUP_PROMPT = "Say hello in one short sentence."  # sent once per server before measuring; never in the pool


def builtin_prompts(seed: int = 0) -> list[str]:
    """The built-in chat set: every (subject, task) pair once, in a fixed shuffled order."""
    pairs = [(s, t) for s in SUBJECTS for t in TASKS]
    random.Random(seed).shuffle(pairs)
    return [t.format(s=s) for s, t in pairs]


def _first_user_turn(record) -> str | None:
    """The first user message of one JSONL record or ShareGPT conversation, as text."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return None
    for key in ("prompt", "text", "question", "instruction"):
        if isinstance(record.get(key), str):
            return record[key]
    turns = record.get("messages") or record.get("conversations") or record.get("conversation")
    if isinstance(turns, list):
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            role = turn.get("role", turn.get("from"))
            if role in ("user", "human"):
                content = turn.get("content", turn.get("value"))
                return content if isinstance(content, str) else None
    return None


# The built-in sets by ``--dataset`` name (``builtin`` and ``chat`` are the same set): each a function of the seed.
BUILTIN_SETS = {"builtin": builtin_prompts, "chat": builtin_prompts, "grounded": grounded_prompts,
                "grounded-recurring": grounded_recurring_prompts, "code-edit": code_edit_prompts}
PASSAGE_SETS = ("grounded", "grounded-recurring", "code-edit")  # the built-in sets whose prompts carry a passage


def load_prompts(path: str | Path, fmt: str = "auto") -> list[str]:
    """Prompts of a file: ``jsonl`` (one object a line: ``prompt``/``text``, OpenAI ``messages`` or ShareGPT
    ``conversations``; or a JSON string) or ``sharegpt`` (a JSON list of ``{"conversations": [{"from": "human",
    "value": ...}, ...]}``, the format of ShareGPT_V3_unfiltered_cleaned_split.json). Empty and duplicate prompts are
    dropped (order kept): a duplicate would be a repeat across levels."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if fmt == "auto":
        fmt = "sharegpt" if text.lstrip().startswith("[") else "jsonl"
    if fmt == "sharegpt":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a ShareGPT JSON list ({exc})") from None
        if not isinstance(records, list):
            raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    elif fmt == "jsonl":
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
    else:
        raise ValueError(f"unknown prompt file format {fmt!r} (auto, jsonl, sharegpt)")
    prompts, seen = [], set()
    for record in records:
        prompt = _first_user_turn(record)
        if prompt and prompt.strip() and prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no user prompt found (expected prompt/text, messages or conversations)")
    return prompts


def split_for_levels(pool: list[str], counts: list[int]) -> list[list[str]]:
    """Disjoint consecutive slices of ``pool``, one per level: no prompt is sent at two levels."""
    needed = sum(counts)
    if len(set(pool)) != len(pool):
        raise ValueError("the prompt pool has duplicates: they would repeat across levels")
    if needed > len(pool):
        raise ValueError(
            f"the sweep needs {needed} distinct prompts ({' + '.join(map(str, counts))} over {len(counts)} levels) but "
            f"the prompt set has {len(pool)}: lower --prompts-per-level, drop levels, or give a larger --dataset"
        )
    slices, start = [], 0
    for count in counts:
        slices.append(pool[start : start + count])
        start += count
    return slices


def output_lengths(prompts: list[str], max_tokens: int, range_ratio: float = 1.0, seed: int = 0) -> list[int]:
    """Tokens each prompt's request generates (EOS ignored): ``max_tokens`` for all at ``range_ratio`` 1, else a
    length uniform in ``[max(1, ⌊range_ratio · max_tokens⌋), max_tokens]`` (``sglang.bench_serving``'s
    ``--random-range-ratio``). A prompt's length is a function of its text and ``seed`` only, so every configuration
    of a run generates the same lengths for the same prompts."""
    if not 0.0 < range_ratio <= 1.0 or max_tokens < 1:
        raise ValueError(f"need 0 < range_ratio <= 1 and max_tokens >= 1, got {range_ratio}, {max_tokens}")
    low = max(1, int(range_ratio * max_tokens))
    lengths = []
    for prompt in prompts:
        digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
        lengths.append(low + int.from_bytes(digest[:8], "big") % (max_tokens - low + 1))
    return lengths
