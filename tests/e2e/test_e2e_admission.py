"""End to end: confidence-scheduled verification is on by default, and every policy stays lossless.

Real CPU servers (stock launcher), tiny fp32 pair; greedy ids must equal the non-speculative server's, token for
token, for every admission policy.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from sglang_dspark.lookup.config import LookupConfig
from sglang_dspark.profiler.engine_measurer import PROFILING_BUDGET_SECONDS
from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all, steep_sps_table

# The session's default DSPARK server is shared with the dspark, input-guard and load-test files:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server


def admission_info(server) -> dict:
    info = server.get("/server_info").json()
    return info["internal_states"][0]["dspark_admission"]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_default_async_policy_profiles_sps_and_schedules(tiny_pair, shared_server, nospec_reference):
    """No flags beyond DSPARK: SPS profiled at start-up, per-request ragged admission, observability filled."""
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir))
    results = generate_all(server, PROMPTS, GREEDY, concurrency=8)
    info = admission_info(server)
    log = server.log_text()
    startup = server.startup_seconds
    assert_same_ids([r["output_ids"] for r in results], nospec_reference["bs8"], "async, 8 concurrent")
    assert info["policy"] == "async"
    assert info["sps"]["source"] in ("profiled", "cache")
    assert info["sps"]["age_seconds"] >= 0
    assert info["steps"] > 0 and info["mean_accept_len"] >= 1.0
    histogram = info["admitted_len_histogram"]
    # One bin per verified length: 0..γ for drafted steps (γ = 7 here), and up to the longest lookup chain where steps
    # without the draft verify chains past the block (engine/long_chain_step.py; how many do depends on timing).
    assert 8 <= len(histogram) <= LookupConfig().max_chain_tokens + 1 and sum(histogram) > 0, histogram
    assert info["ece"] is not None and 0.0 <= info["ece"] <= 1.0
    profiled = [line for line in log.splitlines() if "sglang-dspark admission: policy=async" in line]
    assert profiled, "the SPS table line is missing from the log"
    seconds = float(profiled[0].split(" in ")[1].split(" s ")[0])
    # The profiler fits its grid to a fixed budget (calibration forwards included); the factor 2 leaves room for a
    # noisy machine and the trust check's forwards, and still fails if the budget is ignored (the full grid with
    # repeats takes several times longer on this pair) or profiling dominates the start-up.
    assert seconds <= 2 * PROFILING_BUDGET_SECONDS, f"SPS took {seconds:.2f} s, budget {PROFILING_BUDGET_SECONDS} s"
    assert seconds < 0.25 * startup, f"SPS took {seconds:.2f} s of a {startup:.1f} s start-up"


@pytest.mark.parametrize("policy", ["exact", "verify-all", "off"])
def test_every_policy_is_lossless(policy, tiny_pair, launch, nospec_reference, private_cache):
    # A private server: the "exact" case checks which SPS tables its own start-up found in the cache.
    env = {"SGLANG_DSPARK_ADMISSION": policy}
    # A table profiled while the machine was busy is not cached (profiler/table_trust.py), and earlier servers of this
    # session may have cached tables for other engine settings: which tables exist decides what the log must say.
    cached_before = {str(path) for path in (private_cache / "sps").glob("*")}
    with launch(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=env) as server:
        bs1 = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        bs8 = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        info = admission_info(server)
        log = server.log_text()
    assert_same_ids([r["output_ids"] for r in bs1], nospec_reference["bs1"], f"{policy} bs1")
    assert_same_ids([r["output_ids"] for r in bs8], nospec_reference["bs8"], f"{policy} 8 concurrent")
    assert info["policy"] == policy
    histogram = info["admitted_len_histogram"]
    if policy == "off":
        assert histogram[0] > 0 and sum(histogram[1:]) == 0  # only anchors verified
    if policy == "verify-all":
        assert histogram[-1] > 0 and sum(histogram[:-1]) == 0
    if policy == "exact":
        # A table cached for these engine settings (by the default server, unless it profiled on a busy machine) must
        # be used; a table profiled now must be one that was not on disk before.
        used = re.findall(r"Using cached SPS table (\S+)", log)
        stored = re.findall(r"Stored SPS table in (\S+)", log)
        assert used or stored or "SPS table not cached" in log, "the log says nothing of where the SPS table came from"
        assert all(path in cached_before for path in used), (used, cached_before)
        assert not any(path in cached_before for path in stored), f"{stored} was cached but profiled again"


def test_upstream_sps_table_json_still_loads(tiny_pair, launch, nospec_reference, tmp_path):
    args = dspark_args(tiny_pair.draft_dir) + [
        "--speculative-dspark-sps-table-path", str(steep_sps_table(tmp_path / "sps.json")),
        "--enable-metrics", "--decode-log-interval", "5",
    ]
    with launch(tiny_pair.target_dir, args) as server:
        results = generate_all(server, PROMPTS[:8], GREEDY, concurrency=4)
        info = admission_info(server)
        metrics = server.get("/metrics").text
    assert_same_ids([r["output_ids"] for r in results] + nospec_reference["bs1"][8:], nospec_reference["bs1"], "json")
    assert info["sps"]["source"] == "upstream-json"
    # Prometheus (--enable-metrics): our series, exported from the scheduler process.
    for name in ("sglang:dspark_mean_admitted_draft_length", "sglang:dspark_confidence_ece",
                 "sglang:dspark_admission_policy_info", "sglang:dspark_decode_steps_total"):
        assert name in metrics, name
    # Lifetime totals are counters, named ..._total once (the multiprocess collector's TYPE line keeps the suffix).
    assert re.search(r"^# TYPE sglang:dspark_decode_steps(_total)? counter$", metrics, re.M)
    assert "# TYPE sglang:dspark_mean_accept_length gauge" in metrics and "_total_total" not in metrics
    # The steep table makes extra verify tokens expensive: short windows on average.
    assert info["mean_admitted_draft_len"] < 7


def test_draft_without_confidence_head_falls_back_to_verify_all(tiny_pair, launch, nospec_reference, tmp_path):
    from sglang_dspark.testing.tiny_pair import build_tiny_pair

    headless = build_tiny_pair(tmp_path / "headless", confidence_head=False)
    assert digest(headless.target_dir / "model.safetensors") == digest(tiny_pair.target_dir / "model.safetensors")
    assert json.loads((headless.draft_dir / "config.json").read_text())["enable_confidence_head"] is False
    with launch(tiny_pair.target_dir, dspark_args(headless.draft_dir)) as server:
        results = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        info = admission_info(server)
        log = server.log_text()
    assert_same_ids([r["output_ids"] for r in results], nospec_reference["bs1"], "no confidence head")
    assert log.count("has no confidence head") == 1
    assert info["policy"] == "verify-all"
