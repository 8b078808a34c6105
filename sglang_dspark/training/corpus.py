"""Prompt corpus for draft training and held-out evaluation: BIG-bench task inputs from its PyPI sdist.

Source: ``bigbench==1.0.0`` on PyPI (the sdist, ~360 MB, Apache-2.0) holds 1 041 ``task.json`` files; their
``examples[*].input`` strings are varied English questions, puzzles, stories and code, which is what a chat draft
sees. We read the archive directly (no install, no hub). Reproduce with::

    pip download --no-deps bigbench==1.0.0 -d DIR        # DIR/bigbench-1.0.0.tar.gz

The split is by task (a stable hash of the task name), so held-out prompts come from tasks the draft never saw.
"""

from __future__ import annotations

import hashlib
import json
import random
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, List, Tuple

BIGBENCH_SDIST = "bigbench-1.0.0.tar.gz"
BIGBENCH_LICENSE = "Apache-2.0"


@dataclass(frozen=True)
class Prompt:
    task: str
    index: int
    text: str


def _mostly_ascii(text: str, threshold: float = 0.97) -> bool:
    return sum(ch.isascii() for ch in text) >= threshold * len(text)


def iter_bigbench_tasks(sdist: Path) -> Iterator[Tuple[str, dict]]:
    """(task name, parsed task.json) for every top-level task in the sdist, in archive order."""
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            # <root>/bigbench/benchmark_tasks/<task>/task.json (subtask folders are skipped: one level only)
            if member.isfile() and len(parts) == 5 and parts[2] == "benchmark_tasks" and parts[4] == "task.json":
                try:
                    yield parts[3], json.load(tar.extractfile(member))
                except (ValueError, UnicodeDecodeError):
                    continue


def task_is_held_out(task: str, held_out_percent: int) -> bool:
    digest = hashlib.sha256(task.encode()).digest()
    return digest[0] * 100 // 256 < held_out_percent


def bigbench_prompts(
    sdist: Path, *, per_task: int = 24, min_chars: int = 40, max_chars: int = 800, seed: int = 0
) -> List[Prompt]:
    """Up to ``per_task`` mostly-English inputs of ``min_chars``..``max_chars`` from each task, sampled with ``seed``."""
    rng = random.Random(seed)
    prompts: List[Prompt] = []
    for task, spec in iter_bigbench_tasks(Path(sdist)):
        inputs = [
            (i, ex["input"].strip()) for i, ex in enumerate(spec.get("examples") or [])
            if isinstance(ex, dict) and isinstance(ex.get("input"), str)
        ]
        inputs = [(i, s) for i, s in inputs if min_chars <= len(s) <= max_chars and _mostly_ascii(s)]
        if len(inputs) > per_task:
            inputs = rng.sample(inputs, per_task)
        prompts.extend(Prompt(task, i, s) for i, s in inputs)
    return prompts


def split_prompts(prompts: List[Prompt], held_out_percent: int = 15, seed: int = 0) -> Tuple[List[Prompt], List[Prompt]]:
    """(train, held_out), disjoint by task, each shuffled with ``seed``."""
    train = [p for p in prompts if not task_is_held_out(p.task, held_out_percent)]
    held = [p for p in prompts if task_is_held_out(p.task, held_out_percent)]
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def write_prompts(path: Path, prompts: List[Prompt]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")


def read_prompts(path: Path) -> List[Prompt]:
    with open(path, "r", encoding="utf-8") as f:
        return [Prompt(**json.loads(line)) for line in f if line.strip()]
