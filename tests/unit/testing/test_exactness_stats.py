"""The two-sample test behind tests/e2e/test_e2e_sampled_exactness.py (sglang_dspark/testing/exactness.py)."""

from __future__ import annotations

import random

from sglang_dspark.testing.exactness import OTHER, compare, homogeneity_test, pooled_table


def _draw(rng, weights, n):
    return rng.choices(range(len(weights)), weights, k=n)


def test_pooling_keeps_frequent_categories_and_pools_the_rest():
    a = [0] * 50 + [1] * 20 + [2] * 3 + [3] * 2 + [4] * 4
    b = [0] * 45 + [1] * 25 + [2] * 4 + [5] * 3
    labels, rows_a, rows_b, raw = pooled_table(a, b)
    assert labels == [0, 1, OTHER] and raw == 6
    assert rows_a == [50, 20, 9] and rows_b == [45, 25, 7]
    assert sum(rows_a) == len(a) and sum(rows_b) == len(b)


def test_small_remainder_is_merged_into_the_smallest_kept_category():
    labels, rows_a, rows_b, _ = pooled_table([0] * 30 + [1] * 10 + [2], [0] * 30 + [1] * 10 + [3])
    assert labels == [0, 1] and rows_a == [30, 11] and rows_b == [30, 11]


def test_single_category_is_not_evidence_of_a_difference():
    assert homogeneity_test([7] * 100, [7] * 80).p_value == 1.0


def test_same_law_passes_and_a_shifted_law_fails_at_the_e2e_threshold():
    """2000 draws a sample, as in the e2e test; alpha per test there is 1e-3 / (3 x #configs) >= 1e-3 / 21."""
    rng = random.Random(0)
    alpha = 1e-3 / 21
    target = [0.4, 0.25, 0.15, 0.1, 0.05] + [0.05 / 20] * 20
    draft = [0.3, 0.3, 0.2, 0.1, 0.05] + [0.05 / 20] * 20
    passed = [homogeneity_test(_draw(rng, target, 2000), _draw(rng, target, 2000)).p_value > alpha
              for _ in range(20)]
    assert all(passed)
    assert homogeneity_test(_draw(rng, target, 2000), _draw(rng, draft, 2000)).p_value < alpha


def test_compare_reports_each_statistic():
    rng = random.Random(1)
    a = [tuple(_draw(rng, [0.5, 0.3, 0.2], 3)) for _ in range(500)]
    b = [tuple(_draw(rng, [0.5, 0.3, 0.2], 3)) for _ in range(500)]
    results = compare(a, b)
    assert set(results) == {"first token", "first two tokens", "first three tokens"}
    assert all(r.n_a == 500 and r.n_b == 500 for r in results.values())
