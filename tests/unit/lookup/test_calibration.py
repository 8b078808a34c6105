"""The lookup proposals' acceptance estimate (sglang_dspark/lookup/calibration.py) learns the true rates and reports
its calibration error; a miscalibrated estimate reads a large error."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sglang_dspark.lookup.calibration import GREEDY, LookupCalibration, sampling_class
from sglang_dspark.lookup.config import LookupConfig

SAMPLING_CLASSES = LookupConfig().sampling_classes

# True conditional acceptance per position: long matches are copied well, short ones poorly.
TRUE = {2: [0.4, 0.3, 0.3, 0.2], 6: [0.95, 0.9, 0.9, 0.85]}


def _verify(rng, rates):
    accepted = 0
    for rate in rates:
        if rng.random() >= rate:
            break
        accepted += 1
    return accepted


def _serve(calibration, steps=4000, seed=1):
    rng = random.Random(seed)
    for _ in range(steps):
        match_len = rng.choice(list(TRUE))
        calibration.observe(match_len, 4, _verify(rng, TRUE[match_len]))


def test_learns_the_conditional_rates_per_match_length():
    """4 000 verifies of 4 tokens (about 2 000 per match length): every estimate within 0.05 of the truth (the
    deepest position of short matches is tried ~2 000 × 0.4 × 0.3 ≈ 240 times: a standard error ≈ 0.026)."""
    calibration = LookupCalibration()
    _serve(calibration)
    for match_len, rates in TRUE.items():
        assert torch.allclose(calibration.conditional(match_len, 4), torch.tensor(rates, dtype=torch.float64),
                              atol=0.05)
    survival = calibration.survival(6, 6)
    assert survival.shape == (6,) and bool((survival[1:] <= survival[:-1]).all())


def test_calibration_error_is_small_when_learned_and_large_when_wrong():
    """Same 4 000 verifies: the learning estimate's ECE < 0.05; an estimate pinned at ~1 by a strong prior
    (a control that cannot learn in time) reads ECE > 0.2 (expected ≈ 0.26: one minus the mean acceptance of
    the positions tried)."""
    learned = LookupCalibration()
    _serve(learned)
    assert learned.ece() < 0.05
    pinned = LookupCalibration(config=LookupConfig(acceptance_prior=(1e6, 1.0)))
    _serve(pinned)
    assert pinned.ece() > 0.2
    assert math.isnan(LookupCalibration().ece())


def test_a_verify_says_accepted_then_one_rejected_then_nothing():
    calibration = LookupCalibration(config=LookupConfig(match_buckets=(2,)))
    calibration.observe(3, proposed=4, accepted=2)
    assert calibration.tried[GREEDY, 0].tolist()[:4] == [1.0, 1.0, 1.0, 0.0]
    assert calibration.accepted[GREEDY, 0].tolist()[:4] == [1.0, 1.0, 0.0, 0.0]
    calibration.observe(3, proposed=2, accepted=2)  # all accepted: nothing rejected
    assert calibration.tried[GREEDY, 0].tolist()[:3] == [2.0, 2.0, 1.0]
    with pytest.raises(ValueError):
        calibration.observe(3, proposed=2, accepted=3)


def test_the_optimistic_estimate_is_high_while_unsure_and_converges_to_the_mean():
    """The optimistic estimate is the mean plus one posterior deviation: ~0.79 before any verify (Beta(1, 1)), never
    below the mean, and close to it after the 4 000 verifies above: within 0.015 at the first position (≈ 2 000 tries
    per bucket: a deviation ≤ 0.011), within 0.06 at the deepest (short matches: ≈ 2 000 × 0.4 × 0.3 × 0.3 ≈ 70
    tries, a deviation ≈ 0.05); with ``optimism=0`` it is the mean."""
    calibration = LookupCalibration()
    fresh = calibration.optimistic(3, 4)
    assert torch.allclose(fresh, torch.full((4,), 0.5 + (0.25 / 3) ** 0.5, dtype=torch.float64))
    _serve(calibration)
    for match_len in TRUE:
        mean, optimistic = calibration.conditional(match_len, 4), calibration.optimistic(match_len, 4)
        assert bool((optimistic >= mean).all()) and float(optimistic[0] - mean[0]) < 0.015
        assert bool((optimistic - mean < 0.06).all())
    assert torch.equal(LookupCalibration(config=LookupConfig(optimism=0.0)).optimistic(6, 5),
                       LookupCalibration().conditional(6, 5))
    assert LookupCalibration(config=LookupConfig(acceptance_prior=(1e6, 1.0))).optimistic(2, 2).max() <= 1.0
    with pytest.raises(ValueError, match="optimism"):
        LookupConfig(optimism=-1.0)


def test_steps_plan_with_the_mean_and_one_in_explore_every_with_the_optimistic_estimate():
    calibration = LookupCalibration(config=LookupConfig(explore_every=4))
    calibration.observe(6, proposed=3, accepted=1)
    assert [calibration.explores(step) for step in range(9)] == [True, False, False, False] * 2 + [True]
    assert torch.equal(calibration.planning(6, 3, explore=True), calibration.optimistic(6, 3))
    assert torch.equal(calibration.planning(6, 3, explore=False), calibration.conditional(6, 3))
    assert bool((calibration.optimistic(6, 3) > calibration.conditional(6, 3)).all())
    with pytest.raises(ValueError, match="explore_every"):
        LookupConfig(explore_every=0)

def test_sampling_classes_learn_apart():
    """Greedy rows accept every proposed token, rows sampled at T = 0.7 one in two: each class's estimate is its own
    rate, and a class nobody taught keeps the prior."""
    assert sampling_class(1.0, top_k=1) == GREEDY  # SGLang's form of temperature 0
    assert sampling_class(0.3, top_k=50) == 1 and sampling_class(0.7, top_k=-1) == 2
    assert sampling_class(1.5, top_k=-1) == SAMPLING_CLASSES - 1
    calibration = LookupCalibration(config=LookupConfig(match_buckets=(2,)))
    warm = sampling_class(0.7, top_k=-1)
    for step in range(200):
        calibration.observe(4, proposed=1, accepted=1, kind=GREEDY)
        calibration.observe(4, proposed=1, accepted=step % 2, kind=warm)
    assert float(calibration.conditional(4, 1, GREEDY)) > 0.98
    assert abs(float(calibration.conditional(4, 1, warm)) - 0.5) < 0.02
    assert float(calibration.conditional(4, 1, sampling_class(0.3, top_k=-1))) == 0.5  # Beta(1, 1)


def test_positions_past_the_tracked_ones_share_one_pooled_rate():
    """A chain longer than the tracked positions (the draft's block) teaches one tail count per bucket; positions
    past the tracked ones read it over a prior at the last tracked position's mean, and nothing else changes."""
    calibration = LookupCalibration(max_tokens=4)
    before = calibration.conditional(6, 4).clone()
    assert torch.equal(calibration.conditional(6, 7)[4:], torch.full((3,), 0.5, dtype=torch.float64))
    calibration.observe(6, proposed=12, accepted=10)  # positions 0..9 accepted, 10 rejected, 11 untried
    assert calibration.tail_tried[0, 3] == 7 and calibration.tail_accepted[0, 3] == 6  # positions 4..10
    assert torch.equal(calibration.tried[0, 3], torch.ones(4, dtype=torch.float64))
    tail = calibration.conditional(6, 12)[4:]
    # The tail's 6 of 7 over a prior of weight 2 at the last tracked position's mean (1 of 1: 2/3): (6 + 4/3) / 9.
    assert torch.allclose(tail, torch.full((8,), (6 + 4 / 3) / 9, dtype=torch.float64))
    assert not torch.equal(calibration.conditional(6, 4), before)  # the tracked positions learned as before
    assert calibration.tail_tried[0, :3].sum() == 0 and calibration.tail_tried[:, 4:].sum() == 0

