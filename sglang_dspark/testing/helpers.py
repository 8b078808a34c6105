"""Shared helpers of the end-to-end tests and benchmarks: prompts for the tiny pair, greedy/sampled request fan-out,
DSPARK flags, greedy-identity assertion, a steep SPS table (SGLang's own precedent: ``sglang/test/``)."""

from __future__ import annotations

import concurrent.futures
import json

from sglang_dspark.local_server import SGLangServer

# Twenty prompts, code-like (the tiny tokenizer is trained on Python source).
PROMPTS = [
    "def main():",
    "import os\nimport sys\n",
    "class Parser(object):\n    def __init__(self",
    "for i in range(10):",
    "    return self.",
    "if __name__ == '__main__':",
    "try:\n    import",
    "def __repr__(self):\n        return",
    "# Copyright",
    "raise ValueError(",
    "with open(path) as f:",
    "lambda x:",
    "while True:\n    line =",
    "\"\"\"Return the",
    "self.assertEqual(",
    "except KeyError:",
    "@property\ndef name(self):",
    "from collections import",
    "async def fetch(",
    "print(f\"{",
]
MAX_NEW_TOKENS = 64
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}


def greedy_ids(server: SGLangServer, prompts=PROMPTS, concurrency: int = 1, params=GREEDY) -> list[list[int]]:
    """Output token ids per prompt, sent one at a time or `concurrency` at once."""

    def one(prompt):
        return server.generate(prompt, dict(params))

    if concurrency == 1:
        results = [one(p) for p in prompts]
    else:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, prompts))
    return [r["output_ids"] for r in results]


def generate_all(server: SGLangServer, prompts, params, concurrency: int = 1) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: server.generate(p, dict(params)), prompts))


def dspark_args(draft_dir):
    return ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(draft_dir)]


def assert_same_ids(got, want, label):
    mismatched = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert len(got) == len(want) == len(PROMPTS)
    assert all(len(ids) == GREEDY["max_new_tokens"] for ids in got), f"{label}: short outputs"
    assert not mismatched, f"{label}: greedy ids differ from no-spec on prompts {mismatched}"


def steep_sps_table(path):
    """A hand-made SPS table whose cost rises steeply with verify tokens: forces small, ragged verify windows
    (upstream's compact mode without a table verifies everything and never takes the ragged path)."""
    tokens = list(range(1, 513))
    path.write_text(
        json.dumps(
            {
                "sample_batch_tokens": tokens,
                "sample_steps_per_sec": [1000.0 / t**0.9 for t in tokens],
                "max_batch_tokens": tokens[-1],
            }
        )
    )
    return path
