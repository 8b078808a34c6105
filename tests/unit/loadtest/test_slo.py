"""The load test's capacity maths (``sglang_dspark.loadtest.slo``) on synthetic request records whose answers are
known: SLO parsing, goodput and attainment, the bootstrap interval of a ratio over rounds, and the max-load search's
decisions. No server, no request engine."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest

from sglang_dspark.loadtest import slo
from sglang_dspark.loadtest.slo import RequestRecord as R

# ------------------------------------------------------------------------------------------------ parsing


def test_parse_slo_units_aliases_and_target():
    spec = slo.parse_slo("ttft=2s,tpot=100ms")
    assert spec.bounds_ms == {"ttft": 2000.0, "tpot": 100.0} and spec.target == slo.DEFAULT_TARGET
    assert spec.describe() == "TTFT ≤ 2 s, TPOT ≤ 100 ms, ≥ 90 % of requests"
    spec = slo.parse_slo(" itl = 50 , E2E=1.5s, p95 ")  # bare number: ms (as vLLM's --goodput); itl is TPOT
    assert spec.bounds_ms == {"tpot": 50.0, "e2e": 1500.0} and spec.target == pytest.approx(0.95)
    assert slo.parse_slo("latency=1m", target=0.5).bounds_ms == {"e2e": 60_000.0}
    assert slo.parse_slo("ttft=2s,p90", target=0.9).target == pytest.approx(0.9)  # both given, agreeing
    assert slo.SloSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("text, message", [
    ("", "no bound"),
    ("p90", "no bound"),
    ("ttft", "metric=bound"),
    ("ttfb=2s", "choose from"),
    ("ttft=2s,ttft=1s", "twice"),
    ("tpot=-5ms", "not a duration"),
    ("tpot=0s", "positive"),
    ("tpot=fast", "not a duration"),
    ("ttft=2s,p0", "target"),
])
def test_parse_slo_refuses_what_cannot_work(text, message):
    with pytest.raises(ValueError, match=message):
        slo.parse_slo(text)


def test_a_percentile_and_a_target_that_disagree_are_refused():
    with pytest.raises(ValueError, match="disagree"):
        slo.parse_slo("ttft=2s,p90", target=0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        slo.parse_slo("ttft=2s", target=1.5)


# ------------------------------------------------------------------------------------------------ goodput


def test_request_record_from_timings():
    record = R.from_timings(True, ttft_s=0.5, latency_s=2.5, output_tokens=21, round_index=3)
    assert (record.ttft_ms, record.tpot_ms, record.e2e_ms) == pytest.approx((500.0, 100.0, 2500.0))
    assert record.output_tokens == 21 and record.round == 3
    assert R.from_timings(True, 0.5, 0.5, 1).tpot_ms is None  # one token: no decode
    assert R.from_timings(False, 0.0, 0.0, 0, 2) == R(False, round=2)


def test_goodput_and_attainment_of_a_known_level():
    """Ten requests over 5 s under TTFT ≤ 1 s and TPOT ≤ 100 ms: six meet both (60 tokens each), one misses the
    TTFT bound, one the TPOT bound, one completes a single token after 0.4 s (no TPOT: meets), one failed."""
    spec = slo.parse_slo("ttft=1s,tpot=100ms", target=0.7)
    good = [R(True, 400.0, 80.0, 5120.0, 60) for _ in range(6)]
    records = good + [
        R(True, 1500.0, 50.0, 4500.0, 60),  # TTFT missed
        R(True, 300.0, 120.0, 7380.0, 60),  # TPOT missed
        R(True, 400.0, None, 400.0, 1),  # one token, in time
        R(False),  # an error: meets nothing
    ]
    numbers = slo.level_goodput(records, duration_s=5.0, spec=spec)
    assert numbers["requests"] == 10 and numbers["good_requests"] == 7
    assert numbers["attainment"] == pytest.approx(0.7) and numbers["passes"]  # exactly at the target
    assert numbers["attainment_by_metric"] == pytest.approx({"ttft": 0.8, "tpot": 0.8})
    assert numbers["goodput_req_s"] == pytest.approx(7 / 5.0)
    assert numbers["goodput_tok_s"] == pytest.approx((6 * 60 + 1) / 5.0)
    assert not slo.level_goodput(records, 5.0, slo.parse_slo("ttft=1s,tpot=100ms", target=0.75))["passes"]
    # Bounds are inclusive; an end-to-end bound counts too.
    assert slo.meets(R(True, 1000.0, 100.0, 7000.0, 61), slo.parse_slo("ttft=1s,tpot=100ms,e2e=7s")) == {
        "ttft": True, "tpot": True, "e2e": True}
    assert slo.meets(R(True, 1000.0, 100.0, 7000.1, 61), slo.parse_slo("e2e=7s")) == {"e2e": False}
    # An empty level attains nothing and does not pass; no time, no goodput.
    empty = slo.level_goodput([], 0.0, spec)
    assert (empty["attainment"], empty["passes"], empty["goodput_tok_s"]) == (0.0, False, 0.0)


def test_round_goodput_and_round_medians():
    spec = slo.parse_slo("tpot=100ms")
    records = [R(True, 10.0, 50.0, 1000.0, 20, 0), R(True, 10.0, 200.0, 4000.0, 20, 0),
               R(True, 10.0, 25.0, 500.0, 20, 1), R(False, round=1)]
    assert slo.round_goodput_tok_s(records, [2.0, 4.0], spec) == pytest.approx([20 / 2.0, 20 / 4.0])
    assert slo.per_round_values(records, 3, slo.decode_speed) == [pytest.approx([20.0, 5.0]), [40.0], []]
    assert slo.e2e_speed(records[0]) == pytest.approx(20.0)


def test_records_survive_their_json_columns():
    records = [R(True, 12.34, 56.78, 901.23, 17, 1), R(False, round=2), R(True, 1.0, None, 1.0, 1, 0)]
    columns = slo.records_to_columns(records)
    assert columns["ttft_ms"] == [12.3, None, 1.0] and columns["round"] == [1, 2, 0]
    again = slo.records_from_columns(columns)
    assert [r.ok for r in again] == [True, False, True] and again[0].tpot_ms == 56.8 and again[2].tpot_ms is None
    assert slo.records_from_columns(None) == [] and slo.records_from_columns({"ok": []}) == []
    no_rounds = slo.records_from_columns({k: v for k, v in columns.items() if k != "round"})
    assert [r.round for r in no_rounds] == [0, 0, 0]


# ------------------------------------------------------------------------------------------------ intervals


def test_bootstrap_interval_known_answers():
    # Two paired rounds: a draw takes round 1 twice, round 2 twice (a quarter each) or one of each, so the 95 %
    # interval runs from one round's ratio to the other's.
    assert slo.bootstrap_ratio_interval([88.0, 102.0], [100.0, 100.0]) == pytest.approx((0.88, 1.02))
    # The same ratio in every round, whatever the machine's speed did between rounds: no uncertainty.
    low, high = slo.bootstrap_ratio_interval([60.0, 120.0, 90.0, 30.0], [50.0, 100.0, 75.0, 25.0])
    assert low == pytest.approx(1.2) and high == pytest.approx(1.2)
    assert slo.resolved((low, high)) == 1
    # A configuration against itself.
    assert slo.bootstrap_ratio_interval([7.0, 9.0, 8.0], [7.0, 9.0, 8.0]) == pytest.approx((1.0, 1.0))
    # Fewer than two usable pairs, unpaired lengths, a baseline that never produced: no interval.
    assert slo.bootstrap_ratio_interval([1.0], [1.0]) is None
    assert slo.bootstrap_ratio_interval([1.0, None, 2.0], [1.0, 3.0, None]) is None
    assert slo.bootstrap_ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0]) is None
    assert slo.bootstrap_ratio_interval([1.0, 2.0], [0.0, 0.0]) is None


def test_bootstrap_interval_matches_the_exact_resampling_distribution():
    """Three rounds: all 27 equally likely draws enumerated. Each extreme (every draw the same round: 0.9 or 1.3)
    carries 1/27 = 3.7 % > 2.5 %, so the exact 95 % interval is (0.9, 1.3); the seeded bootstrap finds it, and
    reproducibly. Four rounds: an extreme carries 1/256 < 2.5 %, so the interval lies strictly inside the range."""
    mine, base = [90.0, 110.0, 130.0], [100.0, 100.0, 100.0]
    exact = sorted(sum(mine[i] for i in draw) / sum(base[i] for i in draw)
                   for draw in itertools.product(range(3), repeat=3))

    def exact_quantile(q):  # the smallest value whose cumulative probability reaches q
        return next(value for k, value in enumerate(exact, 1) if k / len(exact) >= q)

    assert (exact_quantile(0.025), exact_quantile(0.975)) == pytest.approx((0.9, 1.3))
    assert slo.bootstrap_ratio_interval(mine, base, resamples=20000, seed=1) == pytest.approx((0.9, 1.3))
    assert slo.bootstrap_ratio_interval(mine, base, seed=3) == slo.bootstrap_ratio_interval(mine, base, seed=3)
    low, high = slo.bootstrap_ratio_interval([90.0, 110.0, 130.0, 150.0], [100.0] * 4, resamples=20000, seed=1)
    assert 0.9 < low < 1.2 < high < 1.5


def test_the_pooled_interval_is_of_the_printed_median():
    """Per-user speeds print the median over all the level's requests; their interval resamples the rounds and pools
    their requests, so it is an interval of that same number: it holds the point estimate where rounds disagree (a
    ratio of per-round medians did not: one round of many slow requests and one of few fast ones put the pooled
    median outside it)."""
    mine = [[10.0] * 9, [30.0, 30.0], [30.0, 30.0], [30.0, 30.0]]
    base = [[20.0] * 9, [20.0, 20.0], [20.0, 20.0], [20.0, 20.0]]
    point = statistics.median([v for r in mine for v in r]) / statistics.median([v for r in base for v in r])
    low, high = slo.bootstrap_pooled_ratio_interval(mine, base, resamples=4000, seed=1)
    assert low <= point <= high and point == pytest.approx(0.5)
    old_low, old_high = slo.bootstrap_ratio_interval([statistics.median(r) for r in mine],
                                                     [statistics.median(r) for r in base], resamples=4000, seed=1)
    assert not old_low <= point <= old_high  # the statistic the table used to pair with this point
    same = [[5.0, 6.0, 7.0], [6.0, 8.0]]
    assert slo.bootstrap_pooled_ratio_interval(same, same) == pytest.approx((1.0, 1.0))
    assert slo.bootstrap_pooled_ratio_interval([[1.0]], [[1.0]]) is None
    assert slo.bootstrap_pooled_ratio_interval([[1.0], []], [[1.0], [2.0]]) is None
    assert slo.bootstrap_pooled_ratio_interval([[1.0], [2.0]], [[0.0], [0.0]]) is None


def test_sustained_rate_is_tokens_over_latency_and_its_interval_is_of_that_number():
    """Σ tokens / Σ seconds over completed requests (failed ones and zero latencies left out); the pooled interval
    with that statistic resamples rounds of (tokens, seconds) rows and holds the point estimate."""
    records = [slo.RequestRecord(True, 100.0, 10.0, 2000.0, 64), slo.RequestRecord(True, 100.0, 20.0, 6000.0, 64),
               slo.RequestRecord(False), slo.RequestRecord(True, None, None, None, 5)]
    assert slo.sustained_rate(records) == pytest.approx(128 / 8.0)
    assert slo.sustained_rate([slo.RequestRecord(False)]) is None
    mine = [[(64.0, 2.0), (64.0, 6.0)], [(64.0, 4.0)], [(32.0, 1.0), (64.0, 3.0)]]
    base = [[(64.0, 4.0), (64.0, 4.0)], [(64.0, 4.0)], [(64.0, 4.0), (64.0, 4.0)]]
    point = (sum(t for r in mine for t, _ in r) / sum(s for r in mine for _, s in r)) / 16.0
    low, high = slo.bootstrap_pooled_ratio_interval(mine, base, statistic=slo.pooled_sustained_rate, seed=2)
    assert low <= point <= high and low < high
    assert slo.bootstrap_pooled_ratio_interval(base, base, statistic=slo.pooled_sustained_rate) == pytest.approx(
        (1.0, 1.0))
    assert slo.tokens_and_latency(records[0]) == (64.0, 2.0) and slo.tokens_and_latency(records[2]) is None


def test_bootstrap_interval_covers_a_true_ratio_of_one_most_of_the_time():
    """Two identical servers on a drifting machine (each round's speed drawn anew, ±10 % noise per server): over 300
    simulated runs of 8 rounds, the 95 % interval holds the true ratio 1.0 in at least 85 % of them (a percentile
    bootstrap over few rounds covers a little less than its nominal level) and resolves a 30 % gain in nearly all."""
    rng = np.random.default_rng(0)
    covered = resolved_gain = 0
    for run in range(300):
        machine = rng.uniform(50, 150, size=8)
        base = machine * rng.normal(1.0, 0.1, size=8)
        same = machine * rng.normal(1.0, 0.1, size=8)
        covered += slo.resolved(slo.bootstrap_ratio_interval(same, base, seed=run)) == 0
        resolved_gain += slo.resolved(slo.bootstrap_ratio_interval(1.3 * same, base, seed=run)) == 1
    assert covered >= 0.85 * 300
    assert resolved_gain >= 0.95 * 300


def test_resolved_only_when_the_interval_excludes_one():
    assert slo.resolved((1.01, 1.3)) == 1
    assert slo.resolved((0.7, 0.99)) == -1
    assert slo.resolved((0.9, 1.1)) == 0
    assert slo.resolved((1.0, 1.0)) == 0  # a configuration against itself: no difference
    assert slo.resolved(None) == 0


# ------------------------------------------------------------------------------------------------ max-load search


def test_max_passing_load_is_the_highest_with_every_lower_load_passing():
    assert slo.max_passing_load({1: True, 4: True, 16: False}) == (4, 16)
    assert slo.max_passing_load({16: True, 1: True, 4: True}) == (16, None)  # every tested load passed
    assert slo.max_passing_load({1: False, 4: True}) == (None, 1)  # a pass above a miss does not count
    assert slo.max_passing_load({1: True, 2: False, 4: True, 8: False}) == (1, 2)
    assert slo.max_passing_load({}) == (None, None)


@pytest.mark.parametrize("passing, failing, probe", [
    (4, 16, 8),  # the geometric middle of the bracket
    (8, 16, 11),
    (4, 8, 6),
    (4, 6, 5),
    (4, 5, None),  # as narrow as concurrency goes
    (None, 4, 2),  # nothing passed: search below the lowest miss
    (None, 2, 1),
    (None, 1, None),  # one user already misses: the answer is 0
    (16, None, None),  # nothing failed: at least the highest tested
])
def test_next_probe_for_concurrency(passing, failing, probe):
    assert slo.next_probe(passing, failing, integer=True) == probe


def test_next_probe_for_request_rates():
    assert slo.next_probe(1.0, 4.0, integer=False) == pytest.approx(2.0)
    assert slo.next_probe(2.0, 2.4, integer=False) is None  # within 25 %
    assert slo.next_probe(None, 1.0, integer=False) == pytest.approx(0.5)
    assert slo.next_probe(4.0, None, integer=False) is None


def test_a_search_converges_on_the_known_limit():
    """A server that meets the SLO up to 11 users: climbing 1, 4, 16 then halving finds 11 within three probes."""
    limit = 11
    tested = {load: load <= limit for load in (1, 4, 16)}
    probes = []
    for _ in range(3):
        probe = slo.next_probe(*slo.max_passing_load(tested), integer=True)
        probes.append(probe)
        tested[probe] = probe <= limit
    assert probes == [8, 11, 13]
    assert slo.max_passing_load(tested) == (11, 13)
