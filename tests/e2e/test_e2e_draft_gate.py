"""End to end: the draft gate (``SGLANG_DSPARK_DRAFT_GATE``) skips the draft block on some steps and stays exact.

A skipped step verifies the anchors only (the target's own next token) and still writes the committed tokens' target
hidden states into the draft KV, so drafting after a pause starts from the full context: greedy ids must equal the
non-speculative server's token for token, whatever the pattern of drafted and skipped steps.
Real CPU servers (stock launcher), tiny fp32 pair.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_dspark.loadtest.engine import admission_delta
from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all

# The pause and off servers are shared with the penalties file:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server

SAMPLED_MIX = {**GREEDY, "temperature": 0.8, "top_k": 20, "top_p": 0.9}


# The gate's own paths (plain and drafted steps); steps that verify prompt-lookup chains are tested in
# test_e2e_lookup.py.
NO_LOOKUP = {"SGLANG_DSPARK_LOOKUP": "off"}


def admission_info(server) -> dict:
    return server.get("/server_info").json()["internal_states"][0]["dspark_admission"]


def _delta(after: dict, before: dict, *path: str):
    """A lifetime counter's growth between two snapshots (the server is shared: other tests' traffic came before)."""
    for key in path:
        after, before = after[key], before[key]
    return after - before


@pytest.mark.parametrize("mode", ["pause", "alternate", "off"])
def test_forced_pausing_is_exact(mode, tiny_pair, shared_server, nospec_reference):
    # With the gate off the lookup is off too (it rides on the gate): the same launch as the penalties file's.
    env = {"SGLANG_DSPARK_DRAFT_GATE": mode, **(NO_LOOKUP if mode != "off" else {})}
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=env)
    start = admission_info(server)
    bs1 = generate_all(server, PROMPTS, GREEDY, concurrency=1)
    bs8 = generate_all(server, PROMPTS, GREEDY, concurrency=8)
    info = admission_info(server)
    # Sampled requests (temperature, top-k, top-p; a greedy one in the same batch) take the same paths; their
    # law is checked in tests/unit/engine/test_anchor_only_verify.py, here that they are served.
    jobs = [(prompt, SAMPLED_MIX if i % 4 else GREEDY) for i, prompt in enumerate(PROMPTS[:8])]
    with ThreadPoolExecutor(8) as pool:
        mixed = list(pool.map(lambda job: server.generate(job[0], dict(job[1])), jobs))
    after = admission_info(server)
    log = server.log_text()
    assert all(len(r["output_ids"]) == GREEDY["max_new_tokens"] for r in mixed)
    assert_same_ids([r["output_ids"] for r in bs1], nospec_reference["bs1"], f"draft gate {mode}, bs1")
    assert_same_ids([r["output_ids"] for r in bs8], nospec_reference["bs8"], f"draft gate {mode}, 8 concurrent")
    steps, drafted = _delta(info, start, "steps"), _delta(info, start, "drafted_steps")
    assert steps > 0
    if mode == "off":
        assert drafted == steps and info["draft_gate"] is None
        assert "draft gate: off" in log
        return
    gate = info["draft_gate"]
    assert gate["mode"] == mode and _delta(info, start, "draft_gate", "decisions") == steps
    if mode == "pause":
        # Not one draft block after the prefills: every decode step was a plain anchor-only step.
        assert drafted == 0
        window = admission_delta(start, info)
        assert window["admitted_len_histogram"][0] > 0 and sum(window["admitted_len_histogram"][1:]) == 0
        assert window["mean_accept_len"] == 1.0
    else:
        assert 0.45 <= drafted / steps <= 0.55
        # Both kinds of step were timed: the draft block's cost is known per request-count bucket.
        assert gate["draft_ms"]
    # Nothing reads the strided logits: every skipped step kept its verify at one logits row per request, greedy
    # and sampled alike.
    skipped = steps - drafted
    assert _delta(info, start, "draft_gate", "compact_anchor_steps") == skipped > 0
    skipped_after = _delta(after, start, "steps") - _delta(after, start, "drafted_steps")
    assert _delta(after, start, "draft_gate", "compact_anchor_steps") == skipped_after > skipped
    # On the CPU (eager target) each of them ran as SGLang's own decode step plus the draft-KV injection, held for
    # one batched write (SGLANG_DSPARK_PAUSE_KV=batched, the default): every skipped step's rows, written before the
    # next prefill or drafted step.
    assert _delta(after, start, "draft_gate", "plain_decode_steps") == skipped_after
    assert _delta(after, start, "draft_gate", "pause_kv", "deferred_tokens") >= skipped_after
    assert _delta(after, start, "draft_gate", "pause_kv", "flushes") >= 1


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_drafting_comes_back_after_a_pause(overlap, tiny_pair, launch, nospec_reference):
    # A private server: the comeback cost model counts decode steps from the server's start.
    """``comeback``: a test cost model under which drafting loses for the first 48 decode steps (the gate pauses,
    probing now and then) and then is free. The gate must leave the pause on its own and draft again. Both
    scheduler paths: overlap (the gate decides with the budget, from the confidence relay) and synchronous (from the
    host carry ring, before the draft)."""
    env = {"SGLANG_DSPARK_DRAFT_GATE": "comeback", **NO_LOOKUP}
    args = dspark_args(tiny_pair.draft_dir) + ([] if overlap else ["--disable-overlap-schedule"])
    with launch(tiny_pair.target_dir, args, env=env) as server:
        bs8 = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        info = admission_info(server)
    assert_same_ids([r["output_ids"] for r in bs8], nospec_reference["bs8"], "comeback, 8 concurrent")
    gate = info["draft_gate"]
    assert gate["mode"] == "comeback" and gate["decisions"] > 48
    assert gate["pauses"] >= 1 and gate["probes"] >= 1  # paused during the first phase, probing
    assert gate["resumes"] >= 1 and gate["reasons"].get("pays", 0) > 0  # and came back
    assert gate["paused"] is False
    assert 0.0 < info["drafted_step_share"] < 1.0
    assert info["drafted_steps"] >= gate["decisions"] - 48 - 5  # drafting on (nearly) every step after the pause
