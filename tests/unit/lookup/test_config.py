"""The lookup's tuned constants in one validated place (sglang_dspark/lookup/config.py): the defaults are the values
the lookup served before they moved there, a bad value is refused naming its field, and a non-default config reaches
the book, the calibration, the current-tokens policy and the overlap gap."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_dspark.lookup import config as config_module
from sglang_dspark.lookup.book import LookupBook
from sglang_dspark.lookup.calibration import LookupCalibration, sampling_class
from sglang_dspark.lookup.config import DEFAULT, IndexLimits, LookupConfig
from sglang_dspark.lookup.index import ContextIndex, brute_force_proposal
from sglang_dspark.profiler.overlap_gap import OverlapGap
from sglang_dspark.scheduling.current_tokens import CurrentTokensPolicy

# The values as they stood in book.py, index.py, calibration.py, current_tokens.py, overlap_gap.py and
# lookup_choice.py before the config.
OLD_VALUES = {
    "min_ngram": 2, "max_ngram": 6,
    "index_limits": IndexLimits(tokens_per_call=2048, keep_up_tokens=64, window=32768),
    "match_buckets": (2, 3, 4, 6), "acceptance_prior": (1.0, 1.0), "optimism": 1.0, "explore_every": 16,
    "ece_bins": 10, "temperature_bands": (0.5, 1.0),
    "overlap_patience": 16, "saving_rate": 0.125,
    "gap_prior_seconds": 1e-3, "gap_prior_seconds_per_request": 25e-6, "gap_min_samples": 8, "gap_rate": 0.1,
    "chain_min_gain": 0.05, "shared_capacity_tokens": 65536, "shared_tokens_per_call": 1024, "max_chain_tokens": 31,
    "shared_max_scopes": 1024,
}


def test_the_defaults_are_the_old_constants():
    assert {f.name for f in dataclasses.fields(LookupConfig)} == set(OLD_VALUES)
    assert {name: getattr(DEFAULT, name) for name in OLD_VALUES} == OLD_VALUES
    assert (IndexLimits().tokens_per_call, IndexLimits().keep_up_tokens, IndexLimits().window) == (2048, 64, 32768)
    assert DEFAULT.sampling_classes == 4 and LookupConfig() == DEFAULT


def test_every_part_defaults_to_the_default_config():
    assert LookupBook().config == DEFAULT and (LookupBook().min_ngram, LookupBook().max_ngram) == (2, 6)
    assert LookupCalibration().config == DEFAULT and LookupCalibration().accepted.shape == (4, 8, 16)  # own and shared buckets
    assert CurrentTokensPolicy().config == DEFAULT and CurrentTokensPolicy().patience == 16
    assert OverlapGap(on_host=False).config == DEFAULT
    index = ContextIndex()
    assert (index.min_ngram, index.max_ngram, index.window) == (2, 6, None)


@pytest.mark.parametrize("changes,field", [
    (dict(min_ngram=0), "min_ngram"),
    (dict(min_ngram=4, max_ngram=3), "max_ngram"),
    (dict(max_ngram=8, index_limits=IndexLimits(window=8)), "index_limits.window"),
    (dict(index_limits=(2048, 64, 32768)), "index_limits"),
    (dict(match_buckets=()), "match_buckets"),
    (dict(match_buckets=(2, 4, 3)), "match_buckets"),
    (dict(match_buckets=(0, 2)), "match_buckets"),
    (dict(acceptance_prior=(0.0, 1.0)), "acceptance_prior"),
    (dict(acceptance_prior=(1.0,)), "acceptance_prior"),
    (dict(optimism=-0.5), "optimism"),
    (dict(optimism=float("nan")), "optimism"),
    (dict(explore_every=0), "explore_every"),
    (dict(ece_bins=0), "ece_bins"),
    (dict(temperature_bands=(1.0, 0.5)), "temperature_bands"),
    (dict(temperature_bands=(0.0,)), "temperature_bands"),
    (dict(overlap_patience=0), "overlap_patience"),
    (dict(saving_rate=0.0), "saving_rate"),
    (dict(saving_rate=1.5), "saving_rate"),
    (dict(gap_prior_seconds=-1e-3), "gap_prior_seconds"),
    (dict(gap_prior_seconds_per_request=float("inf")), "gap_prior_seconds_per_request"),
    (dict(gap_min_samples=0), "gap_min_samples"),
    (dict(gap_rate=0.0), "gap_rate"),
    (dict(chain_min_gain=-0.01), "chain_min_gain"),
    (dict(shared_capacity_tokens=6), "shared_capacity_tokens"),
    (dict(shared_tokens_per_call=0), "shared_tokens_per_call"),
    (dict(shared_max_scopes=0), "shared_max_scopes"),
])
def test_a_bad_value_is_refused_naming_its_field(changes, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        LookupConfig(**changes)


@pytest.mark.parametrize("changes,field", [
    (dict(tokens_per_call=0), "tokens_per_call"), (dict(keep_up_tokens=-1), "keep_up_tokens"),
    (dict(window=0), "window"),
])
def test_bad_index_limits_are_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        IndexLimits(**changes)


def test_a_config_is_frozen_and_takes_lists_as_tuples():
    config = LookupConfig(match_buckets=[2, 5], temperature_bands=[0.7], acceptance_prior=[2.0, 1.0])
    assert (config.match_buckets, config.temperature_bands, config.acceptance_prior) == ((2, 5), (0.7,), (2.0, 1.0))
    assert hash(config) == hash(LookupConfig(match_buckets=(2, 5), temperature_bands=(0.7,), acceptance_prior=(2, 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_ngram = 3


def test_max_ngram_changes_what_the_book_matches():
    """The tail (1, 2, 3, 4, 5) recurs at the start (followed by 9); its last three tokens recur later too (followed
    by 7): the default range matches all five and copies the 9, a range capped at 3 matches the latest 3-gram."""
    prompt = [1, 2, 3, 4, 5, 9, 8, 3, 4, 5, 7, 6, 1, 2, 3, 4]
    rows = [("a", prompt, [5])]
    default = LookupBook().propose(rows, gamma=2)
    assert (int(default.match_lens[0]), default.tokens[0].tolist()) == (5, [9, 8])
    short = LookupBook(LookupConfig(max_ngram=3)).propose(rows, gamma=2)
    assert (int(short.match_lens[0]), short.tokens[0].tolist()) == (3, [7, 6])
    assert brute_force_proposal(prompt + [5], 2, max_ngram=3).tokens == (7, 6)
    # min_ngram: a tail that recurs only as a 2-gram proposes nothing once 3 tokens are needed.
    rows = [("b", [4, 5, 6, 1, 4, 5], [])]
    assert int(LookupBook().propose(rows, gamma=1).lengths[0]) == 1
    assert int(LookupBook(LookupConfig(min_ngram=3)).propose(rows, gamma=1).lengths[0]) == 0


def test_index_limits_reach_the_book():
    """A 1 000-token prompt: the default budget indexes it in one call, a budget of 100 tokens per call does not."""
    prompt = list(range(1000)) + [0, 1]
    assert LookupBook().any_match([SimpleNamespace(rid="a", origin_input_ids=prompt, output_ids=[])])
    capped = LookupBook(LookupConfig(index_limits=IndexLimits(tokens_per_call=100)))
    assert not capped.any_match([SimpleNamespace(rid="a", origin_input_ids=prompt, output_ids=[])])
    assert capped.last_call_tokens == 100


def test_overlap_patience_and_saving_rate_reach_the_current_tokens_policy():
    default, short = CurrentTokensPolicy(), CurrentTokensPolicy(LookupConfig(overlap_patience=2))
    for policy in (default, short):
        for _ in range(2):
            policy.observe(8, verified_chains=False)
    assert default.wants(8) and not short.wants(8) and short.wants(8)  # then one batch in 2 waits
    assert short.patience == 2
    default, slow = CurrentTokensPolicy(), CurrentTokensPolicy(LookupConfig(saving_rate=0.5))
    for policy in (default, slow):
        policy.observe(8, verified_chains=True, saved_seconds=0.004)
        policy.observe(8, verified_chains=True, saved_seconds=0.0)
    assert default.summary()["chain_saving_ms"] == {8: 3.5} and slow.summary()["chain_saving_ms"] == {8: 2.0}


def test_the_calibration_reads_its_config():
    config = LookupConfig(match_buckets=(2, 5), temperature_bands=(0.5,), explore_every=3, acceptance_prior=(3.0, 1.0))
    calibration = LookupCalibration(max_tokens=4, config=config)
    assert calibration.accepted.shape == (config.sampling_classes, 2 * 2, 4) == (3, 4, 4)  # own, shared buckets
    assert calibration.sampling_class(0.7, top_k=-1) == 2 and sampling_class(0.7, top_k=-1) == 2
    assert calibration.sampling_class(1.5, top_k=-1) == 2 and sampling_class(1.5, top_k=-1) == 3
    assert [calibration.explores(step) for step in range(4)] == [True, False, False, True]
    assert float(calibration.conditional(6, 1)) == 0.75  # Beta(3, 1)
    calibration.observe(6, proposed=1, accepted=1)
    assert float(calibration.tried[0, 1, 0]) == 1.0  # match length 6 is bucket 5's


def test_the_gap_priors_and_samples_reach_the_overlap_gap():
    config = LookupConfig(gap_prior_seconds=2e-3, gap_prior_seconds_per_request=0.0, gap_min_samples=1, gap_rate=1.0)
    gap = OverlapGap(on_host=False, config=config)
    assert gap.seconds(8) == 2e-3 and OverlapGap(on_host=False).seconds(8) == pytest.approx(1e-3 + 8 * 25e-6)
    assert OverlapGap(on_host=True, config=config).seconds(8) == 0.0
    gap.observe(8, 0.005, overlap_given_up=True)
    gap.observe(8, 0.001, overlap_given_up=False)
    assert gap.seconds(8) == pytest.approx(0.004)  # one sample of each replaces the prior


def test_the_config_module_imports_no_sglang():
    tree = ast.parse(Path(config_module.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "dataclasses", "typing"}
