"""End to end: one short load-test sweep against a real tiny-pair DSPARK server (stock launcher, 127.0.0.1).

Streaming /v1/chat/completions through SGLang's bench_serving client, two concurrency levels with fresh prompts
in two rounds each, the admission statistics differenced from /server_info, an SLO's goodput and the max-load search
(an SLO every level meets: the search climbs both levels and has nothing to halve, so it costs no extra level),
JSON and both PNGs written.
"""

from __future__ import annotations

import json
import time

import pytest

from sglang_dspark.loadtest import runner
from sglang_dspark.testing.helpers import dspark_args

# The session's default DSPARK server is shared with the admission, dspark and input-guard files:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server


def test_short_sweep_against_a_tiny_dspark_server(tiny_pair, shared_server, tmp_path):
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir))
    started = time.monotonic()
    rc = runner.main([
        "--url", server.url, "--label", "DSPARK tiny", "--concurrency", "1", "2", "--prompts-per-level", "4",
        "--max-tokens", "16", "--request-timeout", "60", "--level-timeout", "80", "--output-dir", str(tmp_path),
        "--rounds", "2", "--slo", "ttft=60s,tpot=10s,e2e=80s", "--find-max-load", "--quiet",
    ])
    seconds = time.monotonic() - started
    log = server.log_text()
    assert rc == 0, log[-3000:]
    # Bounded: two levels of at most --level-timeout each (plus the snapshots), however slow the machine is.
    assert seconds < 2 * 80 + 30, f"the sweep took {seconds:.0f} s"
    result = json.loads((tmp_path / "loadtest.json").read_text())
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    assert (tmp_path / "goodput.png").stat().st_size > 10_000
    assert result["max_load"] == [{"label": "DSPARK tiny", "temperature": None, "max_load": 2,
                                   "first_failing_load": None, "tested_loads": [1, 2], "unit": "concurrency"}]
    (config,) = result["configs"]
    assert config["speculative_algorithm"] == "DSPARK" and not config.get("error")
    assert [level["concurrency"] for level in config["levels"]] == [1, 2]
    for level in config["levels"]:
        assert (level["completed"], level["errors"], level["timeouts"], level["not_sent"]) == (4, 0, 0, 0)
        assert level["output_tokens"] == 4 * 16  # EOS ignored: every request generates --max-tokens
        assert level["output_tok_s"] > 0 and level["per_user_tok_s"] > 0
        assert 0 < level["ttft_ms"]["p50"] <= level["ttft_ms"]["p99"]
        assert level["itl_unit"] == "token"  # the server's tokenizer was found locally
        assert level["accept_length"] >= 1.0 and level["verify_steps"] > 0
        # Goodput from the real requests' timings: every one met the lenient SLO, in two rounds.
        assert level["slo"]["attainment"] == 1.0 and level["slo"]["passes"]
        assert level["slo"]["goodput_tok_s"] == pytest.approx(level["output_tok_s"])
        assert level["request_timings"]["round"] == [0, 0, 1, 1] and all(level["request_timings"]["ok"])
        assert all(0 < t <= e for t, e in zip(level["request_timings"]["ttft_ms"], level["request_timings"]["e2e_ms"]))
        assert level["intervals"]["output_tok_s_ratio"] == [1.0, 1.0]  # the server against itself
        admission = level["admission"]  # this level's traffic only (two snapshots differenced)
        assert admission["policy"] == "async" and admission["steps"] > 0
        assert sum(admission["admitted_len_histogram"]) > 0 and admission["mean_accept_len"] >= 1.0
