"""End to end: prompt lookup beside the draft (``SGLANG_DSPARK_LOOKUP``, issue #39) keeps DSPARK's output exact.

Real CPU servers on 127.0.0.1 (stock launcher), tiny fp32 pair, started one after the other: no-spec (shared);
DSPARK with the lookup forced and the draft paused (``SGLANG_DSPARK_LOOKUP=forced``, ``SGLANG_DSPARK_DRAFT_GATE=pause``:
every lookup proposal is verified in full and nothing is ever drafted, so every decode step with a match is a pure
lookup step: the lookup chain, a point mass, through the ordinary DSPARK verify); DSPARK with the lookup forced and
the gate alternating (``alternate``: on a drafted step the lookup rows take the lookup chain and the others the
draft's, one verify: "mixed" steps, ``worker.with_lookup_rows``); DSPARK with the default environment (lookup on,
gate auto; shared); and a deliberately biased forced + paused server (the positive control, below).

**Prompts that make the lookup fire.** The tiny random model does not copy text, but its next token depends mostly
on the current one, so an "echo" prompt, ``ids(P) + greedy(P)[:16] + ids(P)`` (token ids, built at run time from the
no-spec server), tends to continue the way it continued after the first ``P``: the request's tail then recurs in its
own context and the lookup proposes the rest of the earlier continuation. Plus a few text prompts with repeated
n-grams. Every test checks from ``/server_info`` (``dspark_admission.lookup``, counter deltas around its own traffic)
that the lookup really proposed, was verified and had tokens accepted (and rejected); otherwise it would prove nothing.

**Greedy identity.** T = 0, 48 tokens (``ignore_eos``), 16 prompts, one at a time and 4 concurrent: the forced,
alternate and default servers' output ids equal no-spec's on every prompt. A failure names the prompt and the first
diverging position.

**Sampled output** (Appendix A style, like ``test_e2e_sampled_exactness.py``). For each case below (server,
configuration; one echo prompt per configuration), ``N = 2000`` completions of ``max_new_tokens = 3``
(``ignore_eos``) from no-spec and from the DSPARK server. The first token comes from the prefill; tokens 2 and 3 from
the first verify step, which on these prompts verifies a lookup chain whenever the first token continues the earlier
occurrence: the configuration's "lookup share" (measured on the no-spec sample with the lookup's own matcher) must be
>= 0.3, and the server's lookup rows >= 0.3 N, with proposed tokens both accepted and rejected. Statistics: first
token, first two tokens (joint), first three tokens (joint), Pearson chi-square homogeneity on the 2 x K table, rare
categories pooled (``sglang_dspark/testing/exactness.py``). Threshold: family-wise alpha = 1e-3, Bonferroni over
every (case, statistic) pair: a pair passes when p > 1e-3 / (3 x 6 cases) = 5.6e-5.

**Chains past the draft's block** (``engine/long_chain_step.py``; the CPU runs them): the forced servers verify every
proposal in full, up to 31 tokens, so the greedy runs check long chains too (asserted: some row verified more than
the block). Sampled: ``LONG_CONFIG``, the T = 1 echo prompt with 16 tokens, N = 2000: at least 0.2 N first verifies
check more chain tokens than the block (0.15 N; 0.24 N seen); statistics deep in the completion, each against no-spec's: the token at
positions 8 and 14, and the "copied run" (how many tokens after the first copy the prompt's own lookup proposal),
in the same Bonferroni family. The biased control, sampled on it too, must fail the copied run.

**Why the test has power.** The control is the forced + paused server with ``sglang_dspark/testing/biased_accept.py``
installed: our CPU chain sampler (B7) gets all-zero acceptance coins, i.e. accepts every proposed token the target
gives any probability instead of with probability ``min(1, p/q) = p(x)``. The lookup's verify reaches that sampler:
a lookup step's ``DraftBlockResult`` has ``greedy_draft=True``, so upstream's ``accept_draft_tokens`` builds a one-hot
``q`` (``_draft_probs``) and, on the CPU (no block-wise rejection noise), ``AcceptSampling`` ends in the chain sampler;
the control's counters show every verified lookup token accepted. Its T = 1 sample (same N, same prompt) must FAIL
the same test on the joint statistics, and also on the lookup rows alone (completions whose first token triggers the
lookup: their second and third tokens then follow the lookup chain instead of the target). Observed: p ~ 1e-222 and
p ~ 0 (all completions), p ~ 1e-147 and p ~ 0 (lookup rows only), against 5.6e-5. Side effect worth knowing: the
biased sampler also accepts the fill token (id 0) of rows without a proposal (the verify checks every slot and trims
to the row's verify length afterwards, which is exact only with honest coins: a trimmed slot's token is then still a
draw from the target), so the control's non-lookup rows emit token 0; the lookup-rows-only check shows that the
failure does not rest on that.
"""

from __future__ import annotations

from typing import Optional

import pytest

from sglang_dspark.lookup.index import brute_force_proposal
from sglang_dspark.testing.biased_accept import control_env
from sglang_dspark.testing.exactness import STATISTICS, Sample, compare, homogeneity_test, sample_completions
from sglang_dspark.testing.helpers import PROMPTS, dspark_args

pytestmark = pytest.mark.server

FORCED = {"SGLANG_DSPARK_LOOKUP": "forced", "SGLANG_DSPARK_DRAFT_GATE": "pause"}
# Drafting every other step: on a drafted step the lookup rows replace the draft's chain in the same verify
# ("mixed" steps, worker.with_lookup_rows).
ALTERNATE = {"SGLANG_DSPARK_LOOKUP": "forced", "SGLANG_DSPARK_DRAFT_GATE": "alternate"}
GATE_OF = {"forced": FORCED["SGLANG_DSPARK_DRAFT_GATE"], "alternate": ALTERNATE["SGLANG_DSPARK_DRAFT_GATE"]}
MAX_TOTAL_TOKENS = 8192  # private servers: 500-request chunks of ~45-token prompts
START_TIMEOUT = 900  # start-up is slow when other servers share the 2 cores; never a timing assertion

# Greedy identity.
GREEDY_LOOKUP = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
ECHO_SEED_TOKENS = 16
ECHO_BASES = PROMPTS[:12]
REPEATED_TEXT = [
    "[1, 2, 3, 1, 2, 3, 1, 2,",
    "self.a = a\nself.b = b\nself.a = a\nself.b = b\nself.",
    "a, b, a, b, a, b, a,",
    "import os\nimport sys\nimport os\nimport sys\nimport",
]
CONCURRENCY = (1, 4)

# Sampled output.
N = 2000
MAX_NEW_TOKENS = 3
ALPHA_FAMILY = 1e-3
MIN_LOOKUP_SHARE = 0.3
_BASE = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "temperature": 1.0}
# name -> (base text of the echo prompt, sampling parameters). On the tiny pair (no-spec sample) the lookup shares
# are ~0.82, ~0.84, 1.0, ~0.97, each with enough spread in the second and third tokens (10-40 categories).
CONFIGS = {
    "T=1": ("@property\ndef name(self):", _BASE),
    "top_k=8": ("with open(path) as f:", {**_BASE, "top_k": 8}),
    "min_p=0.1": ("lambda x:", {**_BASE, "min_p": 0.1}),
    "T=0.8,top_p=0.9": ("except KeyError:", {**_BASE, "temperature": 0.8, "top_p": 0.9}),
}
# Chains past the draft's block (engine/long_chain_step.py): 16 tokens, so the first verify can copy 14 of them.
LONG_CONFIG = "T=1, 16 tokens"
LONG_NEW_TOKENS = 16
CONFIGS[LONG_CONFIG] = ("@property\ndef name(self):", {**_BASE, "max_new_tokens": LONG_NEW_TOKENS})
MIN_LONG_ROWS = 0.15  # of N: completions whose first verify checked more chain tokens than the block
# Requests a batch: long chains take free KV slots beyond the batch's next reservation (reserve_chain_kv), which 500
# requests of ~48 tokens in 8192 slots do not leave.
LONG_CHUNK = 100
# The alternate server's share: the drafted steps' lookup rows (point-mass q beside the draft's q).
ALTERNATE_CONFIGS = ("T=1", "top_k=8")
SAMPLED_CASES = [("forced", name) for name in CONFIGS] + [("alternate", name) for name in ALTERNATE_CONFIGS]
CONTROL_CONFIG = "T=1"


def copied_run(prompt: list[int]):
    """A completion's run of tokens after the first that copy the prompt's own lookup proposal (what followed the
    latest earlier occurrence of its tail): the statistic a chain verify acts on most directly."""
    def statistic(ids: tuple) -> int:
        proposal = brute_force_proposal([*prompt, ids[0]], LONG_NEW_TOKENS)
        tokens = () if proposal is None else proposal.tokens
        return next((i for i, (x, y) in enumerate(zip(ids[1:], tokens)) if x != y), min(len(ids) - 1, len(tokens)))
    return statistic


# Statistics of the long case, deep in the completion (prompt-specific ones take the prompt).
LONG_STATISTICS = {
    "copied run": copied_run,
    "token 8": lambda prompt: (lambda ids: ids[7]),
    "token 14": lambda prompt: (lambda ids: ids[13]),
}
ALPHA = ALPHA_FAMILY / (len(SAMPLED_CASES) * len(STATISTICS) + len(LONG_STATISTICS))


# ---------------------------------------------------------------------------------------------------- helpers


def lookup_info(server) -> dict:
    """The lookup's lifetime counters (``engine/lookup_source.py`` ``summary()``)."""
    return server.get("/server_info").json()["internal_states"][0]["dspark_admission"]["lookup"]


def counter_delta(after: dict, before: dict) -> dict:
    """Growth of the step kinds and of the per-source counters between two snapshots (shared servers)."""
    return {
        "steps": {k: after["steps"][k] - before["steps"].get(k, 0) for k in after["steps"]},
        **{source: {k: after[source][k] - before[source][k] for k in ("rows", "verified", "accepted")}
           for source in ("lookup", "draft", "shared") if "rows" in after[source]},
        "overlap_given_up_steps": after["overlap_given_up_steps"] - before["overlap_given_up_steps"],
        # Lookup rows by chain tokens verified, this traffic only: {length: rows}.
        "verified_lengths": {int(k): v - before["lookup"]["verified_lengths"].get(k, 0)
                             for k, v in after["lookup"]["verified_lengths"].items()
                             if v > before["lookup"]["verified_lengths"].get(k, 0)},
    }


def block_of(results) -> int:
    """The draft's block γ of the server these results came from (its verify width less the anchor)."""
    return int(results["server_args"]["speculative_num_draft_tokens"]) - 1


def generate_ids(server, input_ids: list[int], params: dict) -> list[int]:
    return server.generate(None, dict(params), input_ids=input_ids)["output_ids"]


def greedy_outputs(server, prompts: list[list[int]], concurrency: int) -> list[list[int]]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda ids: generate_ids(server, ids, GREEDY_LOOKUP), prompts))


def echo_prompt(server, tokenizer, text: str) -> list[int]:
    """``ids(text) + greedy(text)[:16] + ids(text)``: a context whose tail the model tends to continue as before."""
    ids = tokenizer.encode(text).ids
    seed = generate_ids(server, ids, {**GREEDY_LOOKUP, "max_new_tokens": ECHO_SEED_TOKENS})
    return ids + seed + ids


def sample_ids(server, input_ids: list[int], params: dict, n: int, chunk: int = 500) -> Sample:
    """``n`` sampled completions of a token-id prompt."""
    return sample_completions(server.url, list(input_ids), params, n, chunk=chunk)


def triggers_lookup(prompt: list[int], first_token: int) -> bool:
    """Whether the lookup proposes at the first decode step (its tail: the prompt plus the prefill's token)."""
    return brute_force_proposal([*prompt, first_token], 1) is not None


def first_divergence(got: list[int], want: list[int]) -> Optional[int]:
    if got == want:
        return None
    return next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))


def assert_same_greedy(got, want, prompts, tokenizer, label):
    """Every prompt's ids equal no-spec's; a failure names the prompt and where the outputs part."""
    assert len(got) == len(want) == len(prompts)
    assert all(len(ids) == GREEDY_LOOKUP["max_new_tokens"] for ids in want), f"{label}: short no-spec outputs"
    problems = []
    for i, (g, w) in enumerate(zip(got, want)):
        at = first_divergence(g, w)
        if at is not None:
            problems.append(f"prompt {i} ({tokenizer.decode(prompts[i])[-40:]!r}, {len(prompts[i])} ids): first "
                            f"diverging output position {at}: got {g[at:at + 4]}, no-spec {w[at:at + 4]}")
    assert not problems, f"{label}: greedy ids differ from no-spec:\n" + "\n".join(problems)


def _report(label, results) -> str:
    return f"{label}: " + "; ".join(f"{stat}: {result}" for stat, result in results.items())


# ---------------------------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def tokenizer(tiny_pair):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_pair.target_dir / "tokenizer.json"))


def _collect(server, prompts: dict, sampled=CONFIGS) -> dict:
    """Greedy outputs (one at a time, 4 concurrent) and the sampled completions, with the lookup's counter deltas
    around each part (a DSPARK server; no-spec has no ``lookup`` counters)."""
    speculative = "--speculative-algorithm" in server.args
    results = {"greedy": {}, "samples": {}, "counters": {}}

    def counted(key, fn):
        before = lookup_info(server) if speculative else None
        value = fn()
        if speculative:
            results["counters"][key] = counter_delta(lookup_info(server), before)
        return value

    for concurrency in CONCURRENCY if prompts["greedy"] else ():
        results["greedy"][concurrency] = counted(
            f"greedy bs{concurrency}", lambda c=concurrency: greedy_outputs(server, prompts["greedy"], c))
    for name in sampled:
        results["samples"][name] = counted(
            name, lambda name=name: sample_ids(server, prompts["sampled"][name], CONFIGS[name][1], N,
                                               chunk=LONG_CHUNK if name == LONG_CONFIG else 500))
    if speculative:
        results["lookup"] = lookup_info(server)
        results["server_args"] = server.get("/server_info").json()
    return results


@pytest.fixture(scope="module")
def nospec(tiny_pair, shared_server, tokenizer):
    server = shared_server(tiny_pair.target_dir)
    prompts = {
        "greedy": [echo_prompt(server, tokenizer, text) for text in ECHO_BASES]
        + [tokenizer.encode(text).ids for text in REPEATED_TEXT],
        "sampled": {name: echo_prompt(server, tokenizer, text) for name, (text, _) in CONFIGS.items()},
    }
    return {"prompts": prompts, **_collect(server, prompts)}


@pytest.fixture(scope="module")
def forced(tiny_pair, launch, nospec):
    with launch(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=FORCED,
                max_total_tokens=MAX_TOTAL_TOKENS, timeout=START_TIMEOUT) as server:
        return _collect(server, nospec["prompts"])


@pytest.fixture(scope="module")
def default(tiny_pair, shared_server, nospec):
    # The default DSPARK launch: the same server as test_e2e_dspark.py's when both run in one process.
    server = shared_server(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), timeout=START_TIMEOUT)
    return _collect(server, nospec["prompts"], sampled=())


@pytest.fixture(scope="module")
def alternate(tiny_pair, launch, nospec):
    with launch(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=ALTERNATE,
                max_total_tokens=MAX_TOTAL_TOKENS, timeout=START_TIMEOUT) as server:
        before = lookup_info(server)
        results = _collect(server, nospec["prompts"], sampled=ALTERNATE_CONFIGS)
        results["counters"]["all"] = counter_delta(results["lookup"], before)
        return results


@pytest.fixture(scope="module")
def biased(tiny_pair, launch, nospec, forced, tmp_path_factory):
    env = {**control_env(tmp_path_factory.mktemp("biased-accept-lookup")), **FORCED}
    with launch(tiny_pair.target_dir, dspark_args(tiny_pair.draft_dir), env=env,
                max_total_tokens=MAX_TOTAL_TOKENS, timeout=START_TIMEOUT) as server:
        prompts = {"greedy": [], "sampled": nospec["prompts"]["sampled"]}
        return _collect(server, prompts, sampled=(CONTROL_CONFIG, LONG_CONFIG))


# ---------------------------------------------------------------------------------------------------- greedy


def test_nospec_greedy_is_batch_invariant(nospec, tokenizer):
    """The reference itself: no-spec's ids do not depend on the batch (fp32), so one reference serves both."""
    assert_same_greedy(nospec["greedy"][4], nospec["greedy"][1], nospec["prompts"]["greedy"], tokenizer,
                       "no-spec 4 concurrent vs one at a time")


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"bs{c}")
@pytest.mark.parametrize("mode", ["forced", "alternate"])
def test_forced_lookup_greedy_equals_nospec(mode, concurrency, nospec, request, tokenizer):
    ours, gate = request.getfixturevalue(mode), GATE_OF[mode]
    counters = ours["counters"][f"greedy bs{concurrency}"]
    print(f"[lookup forced, gate {gate}, greedy bs{concurrency}] {counters}")
    assert_same_greedy(ours["greedy"][concurrency], nospec["greedy"][concurrency], nospec["prompts"]["greedy"],
                       tokenizer, f"lookup forced, gate {gate}, bs{concurrency}")
    # The lookup really ran: chains verified, tokens accepted (and some rejected).
    lookup, steps = counters["lookup"], counters["steps"]
    assert lookup["rows"] > 0 and lookup["accepted"] > 0, counters
    assert lookup["accepted"] < lookup["verified"], counters
    assert steps["lookup"] + steps["mixed"] > 0, counters
    if concurrency > 1:
        # Rows were anchored by the scheduler's launch facts and committed lengths (the path fa3's overlap scheduler
        # takes, engine/lookup_source.current_rows): batches waited for current tokens, and those are what proposed.
        assert counters["overlap_given_up_steps"] > 0, counters
    if mode == "forced":  # and no draft at all; chains past the draft's block verified too (the CPU runs them)
        assert steps["drafted"] == steps["mixed"] == 0 and counters["draft"]["rows"] == 0, counters
        assert max(counters["verified_lengths"]) > block_of(ours), counters


def test_alternate_mixes_lookup_rows_into_drafted_steps(alternate):
    """The alternate server's traffic had drafted steps with lookup rows in them (the sampled tests below cover
    their point-mass q on those steps)."""
    counters = alternate["counters"]["all"]
    print(f"[lookup forced, gate alternate, all traffic] {counters}")
    assert counters["steps"]["mixed"] > 0 and counters["steps"]["drafted"] > 0, counters
    assert counters["draft"]["rows"] > 0 and counters["draft"]["accepted"] > 0, counters


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"bs{c}")
def test_default_lookup_greedy_equals_nospec(concurrency, nospec, default, tokenizer):
    counters = default["counters"][f"greedy bs{concurrency}"]
    print(f"[default (lookup on, gate auto), greedy bs{concurrency}] {counters}")
    assert default["lookup"]["mode"] == "on"
    assert_same_greedy(default["greedy"][concurrency], nospec["greedy"][concurrency], nospec["prompts"]["greedy"],
                       tokenizer, f"default environment, bs{concurrency}")
    assert counters["lookup"]["rows"] > 0 and counters["lookup"]["accepted"] > 0, counters


# ---------------------------------------------------------------------------------------------------- sampled


def _lookup_share(prompt: list[int], sample: Sample) -> float:
    return sum(triggers_lookup(prompt, ids[0]) for ids in sample.ids) / len(sample.ids)


@pytest.mark.parametrize("mode,config", SAMPLED_CASES, ids=[f"{mode}-{config}" for mode, config in SAMPLED_CASES])
def test_forced_lookup_sampled_output_follows_nospec(mode, config, nospec, request):
    server = request.getfixturevalue(mode)
    prompt = nospec["prompts"]["sampled"][config]
    ours, reference = server["samples"][config], nospec["samples"][config]
    counters = server["counters"][config]
    share = _lookup_share(prompt, reference)
    print(f"[{mode} (gate {GATE_OF[mode]}) {config}] lookup share {share:.3f}; server: {counters}; verify steps {ours.verify_steps}, "
          f"accepted {ours.accepted_drafts}; {ours.seconds:.1f}s vs no-spec {reference.seconds:.1f}s")
    # The comparison must really cover the lookup: the prompt triggers it on most completions, and the server
    # verified lookup chains on a substantial share of the requests, accepting some proposed tokens, rejecting others.
    assert share >= MIN_LOOKUP_SHARE, share
    lookup = counters["lookup"]
    assert lookup["rows"] >= MIN_LOOKUP_SHARE * N, counters
    assert 0 < lookup["accepted"] < lookup["verified"], counters
    if mode == "forced":
        assert counters["steps"]["drafted"] == counters["steps"]["mixed"] == 0, counters
    results = compare(ours.ids, reference.ids)
    print(_report(f"[{mode} {config}] lookup forced vs no-spec (alpha per test {ALPHA:.2g})", results))
    failed = {stat: result for stat, result in results.items() if not result.p_value > ALPHA}
    assert not failed, _report(f"{config}: DSPARK with the lookup differs from no-spec", failed)


def _lookup_rows_only(prompt: list[int], sample: Sample) -> list[tuple]:
    return [ids for ids in sample.ids if triggers_lookup(prompt, ids[0])]


def test_biased_control_is_rejected(nospec, forced, biased):
    """The same test must catch a lookup verify without the ratio test (a positive control of its power)."""
    prompt = nospec["prompts"]["sampled"][CONTROL_CONFIG]
    control, reference = biased["samples"][CONTROL_CONFIG], nospec["samples"][CONTROL_CONFIG]
    counters = biased["counters"][CONTROL_CONFIG]
    print(f"[control {CONTROL_CONFIG}] biased server: {counters}")
    # The bias reaches the lookup's verify: (nearly) every proposed token accepted, where the honest server rejects
    # most of them on this prompt.
    lookup, honest = counters["lookup"], forced["counters"][CONTROL_CONFIG]["lookup"]
    assert lookup["rows"] >= MIN_LOOKUP_SHARE * N, counters
    assert lookup["accepted"] >= 0.99 * lookup["verified"] > 0, counters
    assert honest["accepted"] < 0.9 * honest["verified"], honest
    results = compare(control.ids, reference.ids)
    print(_report(f"[control {CONTROL_CONFIG}] biased lookup vs no-spec", results))
    assert results["first two tokens"].p_value < ALPHA, _report("control not rejected", results)
    assert results["first three tokens"].p_value < ALPHA, _report("control not rejected", results)
    # On the lookup rows alone (the control's non-lookup rows are off too, see the module docstring).
    rows = compare(_lookup_rows_only(prompt, control), _lookup_rows_only(prompt, reference))
    print(_report(f"[control {CONTROL_CONFIG}] lookup rows only", rows))
    assert rows["first two tokens"].p_value < ALPHA, _report("control not rejected on the lookup rows", rows)
    assert rows["first three tokens"].p_value < ALPHA, _report("control not rejected on the lookup rows", rows)


# ---------------------------------------------------------------------------------------------------- long chains


def _long_compare(prompt, ours: Sample, reference: Sample) -> dict:
    return {name: homogeneity_test([make(prompt)(ids) for ids in ours.ids],
                                   [make(prompt)(ids) for ids in reference.ids])
            for name, make in LONG_STATISTICS.items()}


def test_forced_long_chains_sampled_output_follows_nospec(nospec, forced):
    """Chains past the draft's block, sampled at T = 1: the first verify of most completions checks more chain
    tokens than the block holds (up to 14 here), and the deep tokens and the copied run follow no-spec's law."""
    prompt = nospec["prompts"]["sampled"][LONG_CONFIG]
    ours, reference = forced["samples"][LONG_CONFIG], nospec["samples"][LONG_CONFIG]
    counters = forced["counters"][LONG_CONFIG]
    block = block_of(forced)
    long_rows = sum(rows for length, rows in counters["verified_lengths"].items() if length > block)
    print(f"[forced {LONG_CONFIG}] block {block}, rows verifying more: {long_rows}; server: {counters}")
    assert long_rows >= MIN_LONG_ROWS * N, counters
    lookup = counters["lookup"]
    assert 0 < lookup["accepted"] < lookup["verified"], counters
    results = _long_compare(prompt, ours, reference)
    print(_report(f"[forced {LONG_CONFIG}] long chains vs no-spec (alpha per test {ALPHA:.2g})", results))
    failed = {stat: result for stat, result in results.items() if not result.p_value > ALPHA}
    assert not failed, _report(f"{LONG_CONFIG}: DSPARK with long chains differs from no-spec", failed)


def test_biased_control_is_rejected_on_long_chains(nospec, biased):
    """The long statistics catch a long-chain verify without the ratio test (power of the test above)."""
    prompt = nospec["prompts"]["sampled"][LONG_CONFIG]
    control, reference = biased["samples"][LONG_CONFIG], nospec["samples"][LONG_CONFIG]
    print(f"[control {LONG_CONFIG}] biased server: {biased['counters'][LONG_CONFIG]}")
    results = _long_compare(prompt, control, reference)
    print(_report(f"[control {LONG_CONFIG}] biased long chains vs no-spec", results))
    assert results["copied run"].p_value < ALPHA, _report("control not rejected", results)
