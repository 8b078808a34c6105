"""End to end on the CPU: `python -m sglang.launch_server --speculative-algorithm DSPARK` served by our plugin.

Every server is a real SGLang 0.5.23 process on 127.0.0.1 started with the stock launcher; tiny random fp32 pair
(fp32: greedy identity is exact only without bf16 logit ties).
"""

from __future__ import annotations

import re

import pytest

from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all, steep_sps_table
from sglang_dspark.local_server import chat

# The session's default DSPARK server is shared with the admission, input-guard and load-test files:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def our_dspark(tiny_pair, shared_server, nospec_reference):
    """Our DSPARK worker (the session's default DSPARK server): greedy bs1 and 8-concurrent, sampled and chat runs."""
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir))
    results = {
        "bs1": generate_all(server, PROMPTS, GREEDY, concurrency=1),
        "bs8": generate_all(server, PROMPTS, GREEDY, concurrency=8),
        "sampled": generate_all(
            server, PROMPTS[:8], {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.9}, concurrency=4
        ),
        "chat": chat(server, [{"role": "user", "content": "def add(a, b):"}], max_tokens=24, temperature=0),
        "chat_stream": chat(
            server, [{"role": "user", "content": "class Stack:"}], stream=True, max_tokens=24, temperature=0
        ),
    }
    results["log"] = server.log_text()
    return results


def test_greedy_identical_to_nospec_batch_of_one(our_dspark, nospec_reference):
    assert_same_ids([r["output_ids"] for r in our_dspark["bs1"]], nospec_reference["bs1"], "DSPARK bs1")


def test_greedy_identical_to_nospec_eight_concurrent(our_dspark, nospec_reference):
    assert_same_ids([r["output_ids"] for r in our_dspark["bs8"]], nospec_reference["bs8"], "DSPARK 8 concurrent")


def test_speculative_path_really_ran(our_dspark):
    for result in our_dspark["bs1"] + our_dspark["bs8"]:
        meta = result["meta_info"]
        assert meta["spec_verify_ct"] > 0
        assert meta["spec_verify_ct"] < meta["completion_tokens"] or meta["spec_accept_length"] >= 1.0
        assert meta["spec_accept_length"] >= 1.0
    # Our subclass (not upstream's class) served, in the scheduler process.
    assert "sglang-dspark DSPARK worker active" in our_dspark["log"]


def _running_request_limit(log: str) -> int:
    return int(re.search(r"max_running_requests=(\d+)", log).group(1))


def test_cpu_dspark_takes_as_many_users_as_nospec(our_dspark, tiny_pair, launch):
    """Upstream caps speculative servers at 48 running requests (a GPU graph default); on the CPU ours keeps
    SGLang's own limit (patches/cpu_dspark.py B1b), and an explicit --max-running-requests still wins."""
    assert _running_request_limit(our_dspark["log"]) > 48
    assert "keeps SGLang's own max running requests" in our_dspark["log"]
    # A private server: no other test uses this launch (a shared one would only push shared servers out of the pool).
    with launch(tiny_pair.target_dir, [*dspark_args(tiny_pair.draft_dir), "--max-running-requests", "6"]) as server:
        out = generate_all(server, PROMPTS[:8], GREEDY, concurrency=8)
        log = server.log_text()
    assert _running_request_limit(log) == 6 and len(out) == 8


def test_sampled_requests_complete(our_dspark):
    for result in our_dspark["sampled"]:
        assert result["meta_info"]["completion_tokens"] > 0
        assert result["meta_info"]["spec_verify_ct"] > 0
        assert result["meta_info"]["finish_reason"]["type"] in ("length", "stop")


def test_openai_chat_and_streaming(our_dspark):
    reply = our_dspark["chat"]
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0
    chunks = our_dspark["chat_stream"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert len(chunks) > 2 and streamed


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_upstream_worker_serves_on_cpu(mode, tiny_pair, launch, nospec_reference, tmp_path):
    """Upstream's DSparkWorkerV2 (our subclass switched off) serves through our CPU platform, for side-by-side use.

    compact runs with a steep SPS table so that verify windows really are ragged (per-request lengths)."""
    env = {"SGLANG_DSPARK_WORKER": "upstream", "SGLANG_RAGGED_VERIFY_MODE": mode}
    args = dspark_args(tiny_pair.draft_dir)
    if mode == "compact":
        args += ["--speculative-dspark-sps-table-path", str(steep_sps_table(tmp_path / "sps.json"))]
    with launch(tiny_pair.target_dir, args, env=env) as server:  # private: no other test uses this launch
        results = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        concurrent_results = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        log = server.log_text()
    assert_same_ids([r["output_ids"] for r in results], nospec_reference["bs1"], f"upstream {mode}")
    assert_same_ids(
        [r["output_ids"] for r in concurrent_results], nospec_reference["bs8"], f"upstream {mode} 8 concurrent"
    )
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in results)
    assert "sglang-dspark DSPARK worker active" not in log
    if mode == "compact":
        # Ragged: the mean scheduled window (incl. the bonus slot) is below the full γ+1 = 8.
        cap_lengths = [r["meta_info"].get("spec_cap_length") for r in results]
        assert all(c is not None for c in cap_lengths), cap_lengths
        assert min(cap_lengths) < 8.0, cap_lengths


@pytest.mark.parametrize("worker", ["ours", "upstream"])
def test_dtype_auto_with_a_draft_saved_in_another_dtype(worker, tiny_pair, launch, tmp_path):
    """No --dtype: SGLang's "auto" runs the fp32 target in float16 and would load a draft whose config says bfloat16
    in bfloat16; the first prefill then crashed the server in the draft-KV injection. The draft follows the target."""
    import json
    import shutil

    draft = tmp_path / "bf16-draft"
    shutil.copytree(tiny_pair.draft_dir, draft)
    config = json.loads((draft / "config.json").read_text())
    config.update(torch_dtype="bfloat16", dtype="bfloat16")
    (draft / "config.json").write_text(json.dumps(config))
    env = {"SGLANG_DSPARK_WORKER": "upstream"} if worker == "upstream" else None
    with launch(tiny_pair.target_dir, dspark_args(draft), env=env, fp32=False) as server:  # private: its own draft
        results = generate_all(server, PROMPTS[:4], GREEDY, concurrency=2)
        log = server.log_text()
        alive = server.get("/health").status_code == 200
    assert alive
    assert all(len(r["output_ids"]) == GREEDY["max_new_tokens"] for r in results)
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in results)
    assert "the draft runs in float16 too" in log
    assert "expected m1 and m2 to have the same dtype" not in log
