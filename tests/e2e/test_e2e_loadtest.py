"""End to end: one short load-test sweep against a real tiny-pair DSPARK server (stock launcher, 127.0.0.1).

Streaming /v1/chat/completions through SGLang's bench_serving client, two concurrency levels with fresh prompts,
the admission statistics differenced from /server_info, JSON and PNG written.
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
        "--quiet",
    ])
    seconds = time.monotonic() - started
    log = server.log_text()
    assert rc == 0, log[-3000:]
    # Bounded: two levels of at most --level-timeout each (plus the snapshots), however slow the machine is.
    assert seconds < 2 * 80 + 30, f"the sweep took {seconds:.0f} s"
    result = json.loads((tmp_path / "loadtest.json").read_text())
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
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
        admission = level["admission"]  # this level's traffic only (two snapshots differenced)
        assert admission["policy"] == "async" and admission["steps"] > 0
        assert sum(admission["admitted_len_histogram"]) > 0 and admission["mean_accept_len"] >= 1.0
