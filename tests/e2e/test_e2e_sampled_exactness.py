"""End-to-end exactness of DSPARK's (and, on the CPU, NGRAM's) sampled output, logprobs and constrained output.

Four servers on 127.0.0.1, one after the other, tiny fp32 pair: no-spec, DSPARK (our worker), NGRAM, and a
deliberately biased DSPARK (the positive control: ``sglang_dspark/testing/biased_accept.py`` makes our CPU chain
sampler accept every draft token without the ``min(1, p/q)`` ratio test, loaded through a ``sitecustomize`` in a
temporary folder).

**Sampled output.** For each configuration below (one fixed code-like prompt each), ``N = 2000`` completions of
``max_new_tokens = 3`` (``ignore_eos``) from no-spec and from DSPARK. The first token comes from the prefill (the
ordinary sampler on both servers, a check of the test itself); tokens 2 and 3 come from DSPARK's first verify step
(accepted draft, resampled or bonus token). Compared statistics: first token, first two tokens (joint), first three
tokens (joint), each with Pearson's chi-square test of homogeneity on the 2 x K table, rare categories pooled
(combined count < 10; ``sglang_dspark/testing/exactness.py``). Threshold: family-wise alpha = 1e-3, Bonferroni over
every (server, configuration, statistic) triple: one passes when p > 1e-3 / (3 x #compared configurations). The
control server's T = 1 sample (same N, same prompt) must FAIL the same test on the joint statistics (p below the
same threshold). Penalty configurations run only when the penalties patch is registered by
``sglang_dspark/plugin.py``.

**NGRAM on the CPU** (``patches/cpu_tree_sampling.py``: SGLang verifies it by argmax at every temperature there; we
sample with ``kernels/tree_sampling.py``). A fourth server, SGLang's NGRAM with 4 draft tokens, draws the same
``N = 2000`` completions for the configurations in ``NGRAM_CONFIGS`` (temperature only, joint top-k + top-p, min_p)
and is compared with the same no-spec sample, statistics and per-test threshold. Its verify steps must have
accepted drafts (SGLang's NGRAM proposes from every request's tokens, so repeated prompts match).

**Logprobs.** Greedy (T = 0), ``return_logprob`` with ``top_logprobs_num = 3``, fp32: DSPARK returns the same
tokens as no-spec and every output-token logprob and top-3 logprob within 1e-4 absolute of no-spec's.

**Grammar.** T = 0 with a bounded regex and a small JSON schema: the output is valid and identical to no-spec's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglang_dspark.testing.biased_accept import control_env
from sglang_dspark.testing.exactness import STATISTICS, compare, sample_completions
from sglang_dspark.testing.helpers import PROMPTS, dspark_args

pytestmark = pytest.mark.server

N = 2000
MAX_NEW_TOKENS = 3
ALPHA_FAMILY = 1e-3
SERVER_ARGS = ["--constrained-json-disable-any-whitespace"]
MAX_TOTAL_TOKENS = 8192
START_TIMEOUT = 900  # start-up is slow when other servers share the 2 cores; never a timing assertion
# The law under test is the acceptance rule's, so every step drafts: with hundreds of requests in a batch the draft
# gate rightly pauses drafting on this CPU (a skipped step is a plain decode step, exact by construction), which
# would leave nothing speculative to compare.
GATE_OFF = {"SGLANG_DSPARK_DRAFT_GATE": "off"}


def _penalties_registered() -> bool:
    import sglang_dspark.plugin as plugin

    return "spec_penalties" in Path(plugin.__file__).read_text()


def _configs() -> dict[str, tuple[str, dict]]:
    base = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "temperature": 1.0}
    configs = {
        "T=1": (PROMPTS[0], base),
        "T=0.8,top_p=0.8": (PROMPTS[3], {**base, "temperature": 0.8, "top_p": 0.8}),
        "top_k=8": (PROMPTS[9], {**base, "top_k": 8}),
        "min_p=0.1": (PROMPTS[0], {**base, "min_p": 0.1}),
        "top_k=6,top_p=0.7": (PROMPTS[15], {**base, "top_k": 6, "top_p": 0.7}),
    }
    if _penalties_registered():
        configs["repetition_penalty=1.5"] = (PROMPTS[2], {**base, "repetition_penalty": 1.5})
        configs["frequency_penalty=1,presence_penalty=0.5"] = (
            PROMPTS[1], {**base, "frequency_penalty": 1.0, "presence_penalty": 0.5})
    return configs


CONFIGS = _configs()
NGRAM_CONFIGS = ["T=1", "top_k=6,top_p=0.7", "min_p=0.1"]
ALPHA = ALPHA_FAMILY / ((len(CONFIGS) + len(NGRAM_CONFIGS)) * len(STATISTICS))
CONTROL_CONFIG = "T=1"
NGRAM_ARGS = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]

LOGPROB_PROMPTS = PROMPTS[:4]
LOGPROB_PARAMS = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
LOGPROB_TOL = 1e-4
REGEX = r"[a-z]{1,8}\([a-z]{1,4}(, [a-z]{1,4}){0,2}\)"
JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "size": {"type": "integer", "maximum": 99}},
    "required": ["name", "size"],
    "additionalProperties": False,
}
GRAMMAR_PROMPTS = [PROMPTS[0], PROMPTS[5], PROMPTS[11]]
GRAMMAR_PARAMS = {"max_new_tokens": 64, "temperature": 0}


def _collect(server, sampled_configs) -> dict:
    results = {"samples": {}, "logprobs": [], "regex": [], "json": []}
    for name in sampled_configs:
        prompt, params = CONFIGS[name]
        results["samples"][name] = sample_completions(server.url, prompt, params, N)
    for prompt in LOGPROB_PROMPTS:
        results["logprobs"].append(
            server.generate(prompt, LOGPROB_PARAMS, return_logprob=True, top_logprobs_num=3)
        )
    for prompt in GRAMMAR_PROMPTS:
        results["regex"].append(server.generate(prompt, {**GRAMMAR_PARAMS, "regex": REGEX}))
        results["json"].append(
            server.generate(prompt, {**GRAMMAR_PARAMS, "json_schema": json.dumps(JSON_SCHEMA)})
        )
    return results


@pytest.fixture(scope="module")
def nospec(tiny_pair, launch):
    with launch(tiny_pair.target_dir, SERVER_ARGS, max_total_tokens=MAX_TOTAL_TOKENS, timeout=START_TIMEOUT) as server:
        return _collect(server, CONFIGS)


@pytest.fixture(scope="module")
def dspark(tiny_pair, launch, nospec):
    args = [*dspark_args(tiny_pair.draft_dir), *SERVER_ARGS]
    with launch(tiny_pair.target_dir, args, env=GATE_OFF, max_total_tokens=MAX_TOTAL_TOKENS,
                timeout=START_TIMEOUT) as server:
        results = _collect(server, CONFIGS)
        results["log"] = server.log_text()
        return results


@pytest.fixture(scope="module")
def biased(tiny_pair, launch, dspark, tmp_path_factory):
    env = {**control_env(tmp_path_factory.mktemp("biased-accept")), **GATE_OFF}
    args = [*dspark_args(tiny_pair.draft_dir), *SERVER_ARGS]
    with launch(tiny_pair.target_dir, args, env=env, max_total_tokens=MAX_TOTAL_TOKENS,
                timeout=START_TIMEOUT) as server:
        prompt, params = CONFIGS[CONTROL_CONFIG]
        return sample_completions(server.url, prompt, params, N)


@pytest.fixture(scope="module")
def ngram(tiny_pair, launch):
    with launch(tiny_pair.target_dir, [*NGRAM_ARGS, *SERVER_ARGS], max_total_tokens=MAX_TOTAL_TOKENS,
                timeout=START_TIMEOUT) as server:
        samples = {}
        for name in NGRAM_CONFIGS:
            prompt, params = CONFIGS[name]
            samples[name] = sample_completions(server.url, prompt, params, N)
        return {"samples": samples, "log": server.log_text()}


def _report(label, results) -> str:
    return f"{label}: " + "; ".join(f"{stat}: {result}" for stat, result in results.items())


def _assert_follows_nospec(server: str, config: str, ours, reference) -> None:
    # The comparison must really cover speculation: verify steps ran and drafts were accepted.
    assert ours.verify_steps >= N and ours.accepted_drafts > 0, (ours.verify_steps, ours.accepted_drafts)
    results = compare(ours.ids, reference.ids)
    print(_report(f"[{config}] {server} vs no-spec (alpha per test {ALPHA:.2g})", results))
    failed = {stat: result for stat, result in results.items() if not result.p_value > ALPHA}
    assert not failed, _report(f"{config}: {server} differs from no-spec", failed)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampled_output_follows_nospec_distribution(config, nospec, dspark):
    _assert_follows_nospec("DSPARK", config, dspark["samples"][config], nospec["samples"][config])


@pytest.mark.parametrize("config", NGRAM_CONFIGS)
def test_ngram_sampled_output_follows_nospec_distribution(config, nospec, ngram):
    _assert_follows_nospec("NGRAM", config, ngram["samples"][config], nospec["samples"][config])
    assert "NGRAM / EAGLE verify samples on the CPU" in ngram["log"]


def test_biased_control_is_rejected(nospec, biased):
    """The same test must catch an acceptance without the ratio test (a positive control of its power)."""
    results = compare(biased.ids, nospec["samples"][CONTROL_CONFIG].ids)
    print(_report(f"[control {CONTROL_CONFIG}] biased DSPARK vs no-spec", results))
    assert biased.accepted_drafts > 0
    assert results["first two tokens"].p_value < ALPHA, _report("control not rejected", results)
    assert results["first three tokens"].p_value < ALPHA, _report("control not rejected", results)


def test_min_p_patch_was_used(dspark):
    assert "sampled verify applies min_p" in dspark["log"]


def _logprob_rows(result, key="output_token_logprobs"):
    return result["meta_info"][key]


def test_greedy_logprobs_equal_nospec(nospec, dspark):
    for ours, reference in zip(dspark["logprobs"], nospec["logprobs"]):
        assert ours["output_ids"] == reference["output_ids"]
        ours_rows, reference_rows = _logprob_rows(ours), _logprob_rows(reference)
        assert len(ours_rows) == len(reference_rows) == LOGPROB_PARAMS["max_new_tokens"]
        for (lp, tok, _), (ref_lp, ref_tok, _) in zip(ours_rows, reference_rows):
            assert tok == ref_tok
            assert abs(lp - ref_lp) <= LOGPROB_TOL, (tok, lp, ref_lp)
        ours_top = _logprob_rows(ours, "output_top_logprobs")
        reference_top = _logprob_rows(reference, "output_top_logprobs")
        assert len(ours_top) == len(reference_top)
        for ours_step, reference_step in zip(ours_top, reference_top):
            assert [t for _, t, _ in ours_step] == [t for _, t, _ in reference_step]
            for (lp, _, _), (ref_lp, _, _) in zip(ours_step, reference_step):
                assert abs(lp - ref_lp) <= LOGPROB_TOL


def test_regex_output_valid_and_equal_to_nospec(nospec, dspark):
    for ours, reference in zip(dspark["regex"], nospec["regex"]):
        assert re.fullmatch(REGEX, reference["text"]), reference["text"]
        assert ours["text"] == reference["text"]
        assert ours["output_ids"] == reference["output_ids"]


def test_json_schema_output_valid_and_equal_to_nospec(nospec, dspark):
    for ours, reference in zip(dspark["json"], nospec["json"]):
        value = json.loads(reference["text"])
        assert set(value) == {"name", "size"}
        assert isinstance(value["name"], str) and len(value["name"]) <= 6
        assert isinstance(value["size"], int) and value["size"] <= 99
        assert ours["text"] == reference["text"]
        assert ours["output_ids"] == reference["output_ids"]
