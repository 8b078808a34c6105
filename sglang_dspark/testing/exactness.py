"""Two-sample tests of sampled output (DSPARK vs no-spec) for ``tests/e2e/test_e2e_sampled_exactness.py``.

A sample is a list of output-id tuples (one per completion). :func:`homogeneity_test` compares the law of a
statistic of the completions (first token, first two tokens, ...) between two samples with Pearson's chi-square
test of homogeneity on the 2 x K contingency table, after pooling rare categories: categories are taken in
decreasing order of combined count and kept while their combined count is >= ``min_combined`` (default 10, i.e.
an expected count >= 5 per sample for equal sample sizes); the rest form one "other" category, merged into the
smallest kept category when it is itself below ``min_combined``. A token one server emits and the other never does
therefore still counts (in its own category or in "other"). One category left means both samples are
concentrated on it: p = 1.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import requests

OTHER = "<other>"


@dataclass(frozen=True)
class Homogeneity:
    statistic: float
    dof: int
    p_value: float
    categories: int  # after pooling
    raw_categories: int  # before pooling
    n_a: int
    n_b: int

    def __str__(self) -> str:
        return (f"chi2={self.statistic:.1f} dof={self.dof} p={self.p_value:.3g} "
                f"(K={self.categories}, raw {self.raw_categories}, n={self.n_a}/{self.n_b})")


def pooled_table(a: Sequence[Hashable], b: Sequence[Hashable], min_combined: int = 10):
    """Counts of ``a`` and ``b`` per category, rare categories pooled (see the module docstring)."""
    count_a, count_b = collections.Counter(a), collections.Counter(b)
    combined = collections.Counter(a) + collections.Counter(b)
    ordered = [key for key, _ in sorted(combined.items(), key=lambda kv: (-kv[1], repr(kv[0])))]
    kept = [key for key in ordered if combined[key] >= min_combined]
    rest = [key for key in ordered if combined[key] < min_combined]
    rows_a = [count_a[key] for key in kept]
    rows_b = [count_b[key] for key in kept]
    labels = list(kept)
    if rest:
        other_a, other_b = sum(count_a[k] for k in rest), sum(count_b[k] for k in rest)
        if other_a + other_b >= min_combined or not kept:
            rows_a.append(other_a)
            rows_b.append(other_b)
            labels.append(OTHER)
        else:
            rows_a[-1] += other_a
            rows_b[-1] += other_b
    return labels, rows_a, rows_b, len(combined)


def homogeneity_test(a: Sequence[Hashable], b: Sequence[Hashable], min_combined: int = 10) -> Homogeneity:
    """Pearson chi-square test that ``a`` and ``b`` come from one distribution (no continuity correction)."""
    from scipy.stats import chi2_contingency

    labels, rows_a, rows_b, raw = pooled_table(a, b, min_combined)
    if len(labels) < 2:
        return Homogeneity(0.0, 0, 1.0, len(labels), raw, len(a), len(b))
    statistic, p_value, dof, _ = chi2_contingency([rows_a, rows_b], correction=False)
    return Homogeneity(float(statistic), int(dof), float(p_value), len(labels), raw, len(a), len(b))


# The statistics of a completion the tests compare.
STATISTICS: dict[str, Callable[[tuple], Hashable]] = {
    "first token": lambda ids: ids[0],
    "first two tokens": lambda ids: tuple(ids[:2]),
    "first three tokens": lambda ids: tuple(ids[:3]),
}


def compare(a: Sequence[tuple], b: Sequence[tuple], min_combined: int = 10) -> dict[str, Homogeneity]:
    return {name: homogeneity_test([f(x) for x in a], [f(x) for x in b], min_combined)
            for name, f in STATISTICS.items()}


@dataclass
class Sample:
    """Completions of one prompt under one set of sampling parameters, and what speculation did for them."""

    ids: list[tuple]
    verify_steps: int = 0  # sum of meta_info spec_verify_ct (0 without speculation)
    accepted_drafts: int = 0  # sum of meta_info spec_num_correct_drafts
    seconds: float = 0.0


def sample_completions(url: str, prompt, params: dict, n: int, chunk: int = 500,
                       timeout: float = 900) -> Sample:
    """``n`` sampled completions of ``prompt`` (a text, or a list of token ids; batched ``/generate`` with a list of
    prompts, ``chunk`` a request); every completion must have exactly ``params["max_new_tokens"]`` tokens (use
    ``ignore_eos``)."""
    sample = Sample(ids=[])
    started = time.monotonic()
    field = "text" if isinstance(prompt, str) else "input_ids"
    while len(sample.ids) < n:
        size = min(chunk, n - len(sample.ids))
        body = {field: [prompt] * size, "sampling_params": dict(params)}
        response = requests.post(f"{url}/generate", json=body, timeout=timeout)
        response.raise_for_status()
        results = response.json()
        assert len(results) == size
        for result in results:
            ids = tuple(result["output_ids"])
            meta = result["meta_info"]
            assert len(ids) == params["max_new_tokens"], meta
            sample.ids.append(ids)
            sample.verify_steps += int(meta.get("spec_verify_ct") or 0)
            sample.accepted_drafts += int(meta.get("spec_num_correct_drafts") or 0)
    sample.seconds = time.monotonic() - started
    return sample
