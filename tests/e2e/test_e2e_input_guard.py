"""No request can take the server down (issue #15): the whole fuzz corpus against real servers.

The session's no-spec server and its default DSPARK server (the tiny pair), each sent every case of
``sglang_dspark.testing.fuzz_corpus`` in turn. After every request the scheduler must not have crashed (its log),
the process must run and answer ``/ping``, with a real ``/health`` generation every 20 cases and at the end; every
answer is a 2xx, or a 4xx with a message; the inputs the input guard owns (the reported crashers among them) get a
400 naming their field. ``scripts/fuzz_inputs.py`` runs the same corpus (plus random cases, with restarts, and with
``--without-dspark-plugin`` against stock SGLang) for a longer hunt.
"""

from __future__ import annotations

import time

import pytest

from sglang_dspark.testing import fuzz_corpus as fc
from sglang_dspark.testing.helpers import dspark_args

# The session's default DSPARK server is shared with the admission, dspark and load-test files:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server


@pytest.fixture(scope="module", params=["nospec", "dspark"])
def fuzzed(request, tiny_pair, shared_server):
    """The session's no-spec or default DSPARK server, the whole corpus sent to it; returns (results, log text,
    seconds, generation after). Shared: a corpus that left a server broken also fails the tests that use it later."""
    args = dspark_args(tiny_pair.draft_dir) if request.param == "dspark" else []
    cases = fc.build_corpus(tiny_pair.vocab_size)
    # A generous start timeout: a loaded CI machine may take minutes to start the DSPARK server after the first one.
    server = shared_server(tiny_pair.target_dir, args, timeout=480)
    started = time.monotonic()
    # /health generates (>= 1 s each on SGLang 0.5.23): after every 20th case and the last; /ping after the others.
    results = fc.run_corpus(server, cases, health_every=20)
    seconds = time.monotonic() - started
    generation_after = fc.generation_works(server.url)
    return {
        "mode": request.param,
        "results": results,
        "cases": cases,
        "log": server.log_text(),
        "seconds": seconds,
        "generation_after": generation_after,
    }


def _report(results) -> str:
    return "\n".join(fc.describe(r) for r in results if r.problems)


def test_the_server_ran_in_its_mode(fuzzed):
    assert ("sglang-dspark DSPARK worker active" in fuzzed["log"]) == (fuzzed["mode"] == "dspark")


def test_no_request_takes_the_server_down(fuzzed):
    results = fuzzed["results"]
    assert len(results) == len(fuzzed["cases"]), "the server died; the run stopped at:\n" + _report(results[-1:])
    assert all(r.alive_after for r in results), _report(results)
    assert "Scheduler hit an exception" not in fuzzed["log"]
    assert fuzzed["generation_after"], "the server no longer generates after the corpus"


def test_every_answer_is_a_success_or_a_refusal_with_a_message(fuzzed):
    bad = [r for r in fuzzed["results"] if r.problems]
    assert not bad, f"{len(bad)} of {len(fuzzed['results'])} cases ({fuzzed['mode']}):\n" + _report(bad)


@pytest.mark.parametrize(
    "endpoint, description, field",
    [
        (fc.GENERATE, "empty text (scheduler: reshape of 0 elements in rotary embedding)", "text"),
        (fc.GENERATE, "input_ids == vocab_size (IndexError in embedding)", "input_ids"),
        (fc.GENERATE, "negative input_ids (IndexError in embedding)", "input_ids"),
        # A streamed /generate: a real 400, not an HTTP 200 carrying an SSE error event.
        (fc.GENERATE, "empty text, streamed", "text"),
        (fc.COMPLETIONS, "prompt list with an empty string", "prompt"),
        (fc.CHAT, "top_logprobs huge", "top_logprobs"),
    ],
)
def test_reported_crashers_get_400_naming_the_field(fuzzed, endpoint, description, field):
    (result,) = [r for r in fuzzed["results"] if r.case.endpoint == endpoint and r.case.description == description]
    assert result.reply.status == 400, fc.describe(result)
    assert f"`{field}`" in result.reply.message
    assert result.alive_after
