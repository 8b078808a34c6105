"""DSPARK with frequency/presence/repetition penalties returns no-spec's greedy ids, token for token (issue #15).

Real SGLang 0.5.23 servers on 127.0.0.1 (the session's shared ones), tiny fp32 pair, greedy:

* the reference is no-spec with ``--disable-overlap-schedule``. SGLang's overlap scheduler feeds the penalizers
  before the previous step's token is processed (``ScheduleBatch.cumulate_penalty_output_tokens`` takes
  ``req.output_ids[-1]``, or the last *prompt* token on the first decode; schedule_batch.py 3715-3735), so no-spec
  *with* overlap penalises with a one-token lag; measured on this pair it differs from the non-overlap output
  (repetition 1.3, prompt 4, token 20). Non-overlap is the penalizers' own semantics (every generated token counted
  before the next one is sampled), which DSPARK reproduces (DSPARK on the CPU runs without overlap);
* DSPARK with our worker, drafting every step (``SGLANG_DSPARK_DRAFT_GATE=off``), default admission (ragged
  verify windows, upstream's compact path).

Requests: at concurrency 1 prompt i carries setting i mod 6; at concurrency 8 each setting runs as its own group of
8 prompts (the groups rotate over the 20 prompts). Groups do not share batches: measured on the no-spec server,
batches mixing a newly joined "boost" request with requests of another setting occasionally returned a token that
neither DSPARK nor a transparent transformers re-computation of the penalised greedy chain returns (1 of 20
requests, timing-dependent) -- a no-spec issue outside this test. ``PENALTY_E2E_FULL=1`` runs every prompt with
every setting at both concurrencies (slow on 2 cores).

The "boost" setting (negative frequency, repetition < 1) makes outputs loop, so verify windows hold repeated draft
tokens: the within-window counts matter there most. A control asserts the penalties change no-spec's own output,
so a DSPARK that ignored them fails here.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_dspark.testing.helpers import PROMPTS, dspark_args
from sglang_dspark.testing.penalised_greedy import PenalisedGreedy

# The pause and off servers are shared with the draft-gate file:
# one test process (tests/conftest.py SERVER_SHARING_FILES).
pytestmark = pytest.mark.server

MAX_NEW_TOKENS = 32
SETTINGS = {
    "frequency 1.5": {"frequency_penalty": 1.5},
    "presence 1.5": {"presence_penalty": 1.5},
    "repetition 1.1": {"repetition_penalty": 1.1},
    "repetition 1.3": {"repetition_penalty": 1.3},
    "combination": {"frequency_penalty": 0.7, "presence_penalty": 0.4, "repetition_penalty": 1.2},
    "boost": {"frequency_penalty": -1.0, "presence_penalty": 1.0, "repetition_penalty": 0.7},
}
NAMES = list(SETTINGS)
FULL = os.environ.get("PENALTY_E2E_FULL") == "1"
GROUP = len(PROMPTS) if FULL else 8
# Where DSPARK and no-spec disagree, the target alone in transformers decides (fp32, one prompt at a time): DSPARK
# must never be the one off it. No-spec itself has been seen off it on 1 request in 48 (a batch-composition effect
# in SGLang's own decode, outside this plugin); more than this many such requests fails the test as suspicious.
MAX_NOSPEC_OUTLIERS = 1
START_TIMEOUT = 600  # a loaded 2-core machine can take minutes to import SGLang twice

JOBS_BS1 = (
    [(prompt, name) for name in NAMES for prompt in PROMPTS]
    if FULL
    else [(prompt, NAMES[i % len(NAMES)]) for i, prompt in enumerate(PROMPTS)]
)
# One group per setting; groups run one after the other.
GROUPS_BS8 = {
    name: [PROMPTS[(GROUP * s + k) % len(PROMPTS)] for k in range(GROUP)] for s, name in enumerate(NAMES)
}


def _params(name):
    return {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True, **SETTINGS.get(name, {})}


def _run(server, jobs, concurrency):
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: server.generate(job[0], _params(job[1])), jobs))


def _serve(server, with_plain: bool):
    out = {"bs1": _run(server, JOBS_BS1, 1), "bs8": {}}
    for name, prompts in GROUPS_BS8.items():
        out["bs8"][name] = _run(server, [(p, name) for p in prompts], 8)
    if with_plain:
        plain = _run(server, [(prompt, None) for prompt in PROMPTS], 8)
        out["plain"] = {prompt: r["output_ids"] for prompt, r in zip(PROMPTS, plain)}
    return out


@pytest.fixture(scope="module")
def nospec(tiny_pair, shared_server):
    server = shared_server(tiny_pair.target_dir, ["--disable-overlap-schedule"], timeout=START_TIMEOUT)
    return _serve(server, with_plain=True)


@pytest.fixture(scope="module")
def dspark(tiny_pair, shared_server, nospec):
    env = {"SGLANG_DSPARK_DRAFT_GATE": "off"}
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=env, timeout=START_TIMEOUT)
    return _serve(server, with_plain=False)


@pytest.fixture(scope="module")
def dspark_paused(tiny_pair, shared_server, nospec):
    """The draft gate forced to skip every draft: plain anchor-only steps, which must apply the penalties too (they
    keep upstream's strided verify: the compact anchor-only step is for batches without logits adjustments)."""
    env = {"SGLANG_DSPARK_DRAFT_GATE": "pause"}
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=env, timeout=START_TIMEOUT)
    admission = lambda: server.get("/server_info").json()["internal_states"][0]["dspark_admission"]  # noqa: E731
    before = admission()  # earlier traffic (the launcher's warm-up request, other tests) ran already
    out = {"bs1": _run(server, JOBS_BS1, 1)}
    after = admission()
    out["steps"] = after["steps"] - before["steps"]
    out["drafted_steps"] = after["drafted_steps"] - before["drafted_steps"]
    out["compact_anchor_steps"] = (
        after["draft_gate"]["compact_anchor_steps"] - before["draft_gate"]["compact_anchor_steps"]
    )
    return out


def _ids(results):
    return [r["output_ids"] for r in results]


@pytest.fixture(scope="module")
def truth(tiny_pair):
    """The target alone in transformers, SGLang's penalty semantics (sglang_dspark/testing/penalised_greedy.py)."""
    chain = PenalisedGreedy(str(tiny_pair.target_dir))
    return lambda prompt, name: chain.ids(prompt, MAX_NEW_TOKENS, SETTINGS[name])


def _compare(jobs, got, want, truth):
    """Requests where DSPARK differs from no-spec, and among them those where DSPARK is the one that is wrong."""
    differ, dspark_wrong = [], []
    for (prompt, name), g, w in zip(jobs, got, want):
        if g != w:
            differ.append(f"{name}: {prompt!r}")
            if g != truth(prompt, name):
                dspark_wrong.append(f"{name}: {prompt!r}")
    return differ, dspark_wrong


def test_penalties_change_nospec_output(nospec):
    """Control. The pair's random target has large top-1/top-2 logit gaps and rarely repeats a token within 32
    tokens, so a positive penalty changes only some prompts (about a quarter); the boost setting changes most."""
    plain = nospec["plain"]
    changed = {name: 0 for name in NAMES}
    for name, results in nospec["bs8"].items():
        changed[name] = sum(r["output_ids"] != plain[p] for p, r in zip(GROUPS_BS8[name], results))
    assert changed["boost"] >= 0.75 * GROUP, changed
    assert sum(changed.values()) - changed["boost"] >= 3, changed


def test_dspark_equals_nospec_concurrency_1(dspark, nospec, truth):
    got, want = _ids(dspark["bs1"]), _ids(nospec["bs1"])
    differ, dspark_wrong = _compare(JOBS_BS1, got, want, truth)
    assert not dspark_wrong, f"DSPARK differs from no-spec and from the ground truth on {dspark_wrong}"
    assert len(differ) <= MAX_NOSPEC_OUTLIERS, f"no-spec off the ground truth too often: {differ}"
    assert all(len(ids) == MAX_NEW_TOKENS for ids in got)


def test_dspark_equals_nospec_concurrency_8(dspark, nospec, truth):
    jobs, got, want = [], [], []
    for name, prompts in GROUPS_BS8.items():
        jobs += [(p, name) for p in prompts]
        got += _ids(dspark["bs8"][name])
        want += _ids(nospec["bs8"][name])
    differ, dspark_wrong = _compare(jobs, got, want, truth)
    assert not dspark_wrong, f"DSPARK differs from no-spec and from the ground truth on {dspark_wrong}"
    assert len(differ) <= MAX_NOSPEC_OUTLIERS, f"no-spec off the ground truth too often: {differ}"


def test_dspark_really_drafted(dspark):
    """The speculative path ran with multi-token windows (else this would only test plain decoding)."""
    metas = [r["meta_info"] for results in dspark["bs8"].values() for r in results] + [
        r["meta_info"] for r in dspark["bs1"]
    ]
    assert all(m["spec_verify_ct"] > 0 for m in metas)
    assert sum(m["completion_tokens"] for m in metas) > 1.2 * sum(m["spec_verify_ct"] for m in metas)


def test_paused_steps_apply_penalties(dspark_paused, nospec, truth):
    got, want = _ids(dspark_paused["bs1"]), _ids(nospec["bs1"])
    differ, dspark_wrong = _compare(JOBS_BS1, got, want, truth)
    assert not dspark_wrong, f"paused DSPARK differs from no-spec and from the ground truth on {dspark_wrong}"
    assert len(differ) <= MAX_NOSPEC_OUTLIERS, f"no-spec off the ground truth too often: {differ}"
    assert dspark_paused["steps"] >= len(JOBS_BS1) * (MAX_NEW_TOKENS - 1) and dspark_paused["drafted_steps"] == 0
    # Every request carries a penalty: not one of their steps may take the compact path (it skips the adjustments).
    assert dspark_paused["compact_anchor_steps"] == 0
