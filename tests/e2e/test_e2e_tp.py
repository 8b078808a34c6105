"""End to end: a DSPARK server with ``--tp-size 2`` on the CPU (issue #46, item 4): two TP ranks over gloo, one core
each.

SGLang's CPU path runs tensor parallelism over ``torch.distributed``'s gloo backend. It binds each rank's OpenMP threads
to cores and refuses more ranks than NUMA nodes unless told which cores each rank gets:
``SGLANG_CPU_OMP_THREADS_BIND="0|1"`` (rank 0 on core 0, rank 1 on core 1). One server, default switches (no
``SGLANG_DSPARK_*`` set), the tiny fp32 pair (4 query heads, 2 KV heads: each rank holds 2 and 1), stopped by PID.

What TP turns off, and so what this server runs (``engine/rank_learning.py``): every learned input of the verify
budget is frozen at its rank-independent prior (no survival prior, no learned step overhead, no table trust scale) and
the draft gate is not installed, so every decode step drafts; the prompt lookup rides on the gate
(``AdmissionVerifyPlanner.enable_draft_gate``), so it is off too and the current-tokens overlap hook is inert. What
stays on: compact verify with confidence-scheduled verify lengths from the SPS table the ranks profiled together
(``profiler/tp_consensus.py``), from confidences every rank reads alike (``patches/tp_relay_readiness.py``: here, on the
CPU, rows whose confidences were never published read as unknown on every rank, instead of each process's
uninitialised memory, which would split the ranks' budgets).

Checks:

* greedy output ids (20 prompts, 8 concurrent) identical to the no-spec server at TP = 1 on the same target;
* sampled requests complete (finish reason length/stop, speculative verifies counted);
* a streamed request the client abandons mid-stream is aborted (between the idle points around it the ranks laid out
  far fewer verifies than the request would have needed to finish) and leaves no KV behind (``/v1/loads``
  ``num_used_tokens == 0`` with nothing running or waiting; no rank's idle leak check fired), and the server answers
  after it;
* every rank laid out the same verifies: each rank's plan digest (``engine/plan_digest.py``, logged at idle) equals the
  other's at every count both logged, and both logged the final count;
* the log says why learning and the gate are off, and ``/server_info`` shows no gate and no lookup.
"""

from __future__ import annotations

import time

import pytest
import requests

from sglang_dspark.engine.plan_digest import parse_digest_lines
from sglang_dspark.local_server import sse_payloads
from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all
from sglang_dspark.testing.soak import wait_idle

pytestmark = pytest.mark.server

TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
TP_ARGS = ["--tp-size", "2"]
SAMPLED = {"max_new_tokens": 32, "temperature": 0.8, "top_p": 0.9}
ABORT_AFTER_CHUNKS = 3
ABANDONED_MAX_NEW = 2000  # a finished request would need at least 2000 / (γ + 1) = 250 verifies
GAMMA_PLUS_ONE = 8
DIGEST_WAIT_SECONDS = 30


def _admission(server) -> dict:
    return server.get("/server_info").json()["internal_states"][0]["dspark_admission"]


def _abandon_stream(server) -> int:
    """A streamed /generate of ABANDONED_MAX_NEW tokens, closed by the client after a few chunks; returns the chunks."""
    body = {"text": PROMPTS[0], "stream": True,
            "sampling_params": {"max_new_tokens": ABANDONED_MAX_NEW, "temperature": 0, "ignore_eos": True}}
    chunks = 0
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=(10, 120)) as response:
        response.raise_for_status()
        for _ in sse_payloads(response):
            chunks += 1
            if chunks >= ABORT_AFTER_CHUNKS:
                break  # leaving the block closes the connection mid-stream
    return chunks


def _final_verifies(digests: dict) -> int:
    return max(digests[0]) if digests.get(0) else 0


def _settled_digests(server, newer_than: int = 0) -> dict[int, dict[int, str]]:
    """Both ranks' digest lines, once both have logged the same latest count of verifies, above ``newer_than``."""
    deadline = time.monotonic() + DIGEST_WAIT_SECONDS
    while True:
        digests = parse_digest_lines(server.log_text())
        finals = {rank: max(lines) for rank, lines in digests.items()}
        if set(finals) == {0, 1} and len(set(finals.values())) == 1 and finals[0] > newer_than:
            return digests
        if time.monotonic() > deadline:
            return digests
        time.sleep(0.5)


@pytest.fixture(scope="module")
def tp2(tiny_pair, launch, nospec_reference):
    """One TP = 2 DSPARK server (private: the only test of this launch) and everything the tests read from it."""
    with launch(tiny_pair.target_dir, [*dspark_args(tiny_pair.draft_dir), *TP_ARGS], env=TP_ENV,
                timeout=600) as server:
        results = {"startup_seconds": server.startup_seconds}
        results["greedy"] = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        results["sampled"] = generate_all(server, PROMPTS[:6], SAMPLED, concurrency=3)
        wait_idle(server.url, 120)
        results["digests_before_abort"] = _settled_digests(server)
        results["abandoned_after_chunks"] = _abandon_stream(server)
        results["loads_after_abort"] = wait_idle(server.url, 120)
        results["digests_after_abort"] = _settled_digests(
            server, newer_than=_final_verifies(results["digests_before_abort"]))
        results["greedy_after_abort"] = server.generate(PROMPTS[1], dict(GREEDY))["output_ids"]
        results["admission"] = _admission(server)
        results["loads_after"] = wait_idle(server.url, 120)
        results["digests"] = _settled_digests(server, newer_than=_final_verifies(results["digests_after_abort"]))
        results["alive"] = server.alive() and server.get("/health").status_code == 200
        results["log"] = server.log_text()
    return results


def test_greedy_identical_to_nospec_at_tp1(tp2, nospec_reference):
    assert_same_ids([r["output_ids"] for r in tp2["greedy"]], nospec_reference["bs8"], "DSPARK TP=2, 8 concurrent")
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in tp2["greedy"])
    assert tp2["greedy_after_abort"] == nospec_reference["bs1"][1]  # alone on the server, after the abort


def test_both_ranks_served_with_learning_and_gate_off(tp2):
    log = tp2["log"]
    assert log.count("sglang-dspark DSPARK worker active") == 2, "one DSPARK worker per TP rank"
    assert "TP1] sglang-dspark DSPARK worker active" in log
    assert "online learning off on this server (--tp-size 2" in log
    assert "draft gate: off on this server (--tp-size 2" in log
    admission = tp2["admission"]
    assert admission["draft_gate"] is None and admission["lookup"] is None
    assert admission["drafted_step_share"] == 1.0  # no gate: every decode step drafted


def test_sampled_requests_complete(tp2):
    for result in tp2["sampled"]:
        meta = result["meta_info"]
        assert meta["finish_reason"]["type"] in ("length", "stop")
        assert meta["completion_tokens"] > 0 and meta["spec_verify_ct"] > 0


def test_abandoned_stream_is_aborted_and_leaves_no_kv(tp2):
    assert tp2["abandoned_after_chunks"] == ABORT_AFTER_CHUNKS  # the client did leave mid-stream
    # The server stopped it: the verifies between the two idle points are far fewer than a finished request needs.
    ran = _final_verifies(tp2["digests_after_abort"]) - _final_verifies(tp2["digests_before_abort"])
    assert 1 <= ran < ABANDONED_MAX_NEW // GAMMA_PLUS_ONE, ran
    for loads in (tp2["loads_after_abort"], tp2["loads_after"]):
        assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0
        assert loads["num_used_tokens"] == 0, loads
    assert "memory leak detected" not in tp2["log"]  # each rank checks its pools when it idles
    assert tp2["alive"]
    assert "Traceback" not in tp2["log"]


def test_every_rank_laid_out_the_same_verifies(tp2):
    digests = tp2["digests"]
    assert set(digests) == {0, 1}, f"digest lines per rank: {digests}"
    final = max(digests[0])
    assert max(digests[1]) == final, f"rank 0 logged {sorted(digests[0])}, rank 1 {sorted(digests[1])}"
    assert final >= 20, "the verifies of the greedy, sampled and aborted requests"
    common = sorted(set(digests[0]) & set(digests[1]))
    assert common and final in common
    diverged = [n for n in common if digests[0][n] != digests[1][n]]
    assert not diverged, f"the ranks' digests differ from verify count {diverged[0]} on: {digests}"
