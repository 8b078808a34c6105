"""Every tuned constant of the prompt lookup, once, validated (pure Python, no SGLang imports).

:class:`LookupConfig` is frozen and checked on construction: a value out of range raises ``ValueError`` naming the
field. :data:`DEFAULT` holds the served values. Each part of the lookup takes a config and reads its knobs from it
only: ``book.LookupBook`` (n-gram range, :class:`IndexLimits`), ``shared_index.SharedIndices`` (capacity, budget),
``calibration.LookupCalibration`` (acceptance estimate, exploration, sampling classes),
``scheduling/current_tokens.CurrentTokensPolicy`` (when a batch gives up the overlap), ``profiler/overlap_gap.OverlapGap``
(what that costs) and ``scheduling/step_choice.py`` (``chain_min_gain``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["DEFAULT", "IndexLimits", "LookupConfig"]


@dataclass(frozen=True)
class IndexLimits:
    """The host time and memory the lookup's per-request indices may take (applied by ``lookup/book.py``; what they
    cost: ``benchmarks/lookup_index_cost.py``)."""

    tokens_per_call: int = 2048  # catch-up tokens per book call, shared by the requests behind: bounds one step's stall
    keep_up_tokens: int = 64  # a request with at most this many pending (a step's commits and drops) is never held back
    window: Optional[int] = 32768  # the index covers a request's last `window` tokens (None: its whole context)

    def __post_init__(self) -> None:
        bad = [] if self.tokens_per_call >= 1 else ["tokens_per_call"]
        bad += [] if self.keep_up_tokens >= 0 else ["keep_up_tokens"]
        bad += [] if self.window is None or self.window >= 1 else ["window"]
        if bad:
            raise ValueError(f"IndexLimits: out of range: {', '.join(f'{n}={getattr(self, n)}' for n in bad)}")


@dataclass(frozen=True)
class LookupConfig:
    """The prompt lookup's knobs (module docstring for who reads which). Validated on construction."""

    # Proposals (lookup/index.py, lookup/book.py).
    # A chain's longest length on a step without the draft where chains past the draft's block can run (the eager host
    # path, engine/long_chain_step.py); elsewhere, and on drafted steps, a chain stops at the block (γ tokens).
    max_chain_tokens: int = 31
    min_ngram: int = 2  # the shortest tail that may match: a recurring tail of fewer tokens proposes nothing
    max_ngram: int = 6  # the longest tail tried; matching goes from here down, the first (longest) recurring one wins
    index_limits: IndexLimits = field(default_factory=IndexLimits)  # the indices' host time and memory (above)

    # The shared suffix cache (lookup/shared_index.py): finished requests' tokens, proposing for other requests.
    shared_capacity_tokens: int = 1 << 16  # tokens held over all scopes (host RAM: about 50 MB full, at the default)
    shared_tokens_per_call: int = 1024  # tokens it indexes per decode step: bounds one step's stall
    shared_max_scopes: int = 1024  # scopes held at once (each holds an index): many tiny tenants stay bounded too

    # Acceptance estimate (lookup/calibration.py).
    match_buckets: tuple[int, ...] = (2, 3, 4, 6)  # lower match-length edges of the buckets learned apart
    acceptance_prior: tuple[float, float] = (1.0, 1.0)  # Beta(a, b) prior of each position's conditional acceptance
    optimism: float = 1.0  # an exploring step plans with the mean plus this many posterior standard deviations
    explore_every: int = 16  # one planned step with proposals in this many explores (plans optimistically)
    ece_bins: int = 10  # bins of the reported expected calibration error
    temperature_bands: tuple[float, ...] = (0.5, 1.0)  # sampled rows' class edges: T <= 0.5 class 1, <= 1.0 2, above 3

    # Giving up the overlap for current tokens (scheduling/current_tokens.py).
    overlap_patience: int = 16  # N matched steps in a row with no chain verified: a load keeps the overlap, bar 1 in N
    saving_rate: float = 0.125  # weight of the newest matched step in the mean predicted saving per load bucket

    # What that costs the device (profiler/overlap_gap.py): a prior, by reading SGLang's loop (not measured).
    gap_prior_seconds: float = 1e-3  # a decode result's processing and the next launch's host work, per step
    gap_prior_seconds_per_request: float = 25e-6  # their per-request share (Python per request in both)
    gap_min_samples: int = 8  # timed gaps of each kind (waited, kept) a load bucket needs before they replace the prior
    gap_rate: float = 0.1  # weight of the newest gap in each running mean (at least 1/count while it fills)

    # Which rows verify a chain (scheduling/step_choice.py).
    # A step verifies lookup chains only where they promise at least this much more throughput than the step without
    # them. A chain speeds the requests it is accepted for and not the rest, so requests that started together finish
    # apart: later steps run fewer requests and prefills land one by one, a cost the per-step objective does not see.
    # Below this gain a chain does not pay for putting requests out of step (docs/lookup.md, "The margin"); chains
    # that pay clearly (a long accepted run, a light batch) are kept.
    chain_min_gain: float = 0.05

    def __post_init__(self) -> None:
        for name in ("match_buckets", "acceptance_prior", "temperature_bands"):  # lists accepted, stored as tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"LookupConfig: need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if not isinstance(self.index_limits, IndexLimits):
            raise ValueError(f"LookupConfig: index_limits must be an IndexLimits, got {self.index_limits!r}")
        window = self.index_limits.window
        if window is not None and window <= self.max_ngram:
            raise ValueError(f"LookupConfig: need index_limits.window > max_ngram, got {window}, {self.max_ngram}")
        if self.shared_capacity_tokens <= self.max_ngram:
            raise ValueError(f"LookupConfig: need shared_capacity_tokens > max_ngram, got "
                             f"{self.shared_capacity_tokens}, {self.max_ngram}")
        buckets, bands = self.match_buckets, self.temperature_bands
        bad = [] if buckets and buckets[0] >= 1 and _increasing(buckets) else ["match_buckets"]
        bad += [] if len(self.acceptance_prior) == 2 and all(
            0 < v < math.inf for v in self.acceptance_prior) else ["acceptance_prior"]
        bad += [] if 0 <= self.optimism < math.inf else ["optimism"]
        bad += [n for n in ("explore_every", "ece_bins", "overlap_patience", "gap_min_samples",
                            "shared_tokens_per_call", "shared_max_scopes", "max_chain_tokens") if getattr(self, n) < 1]
        bad += [] if all(0 < v < math.inf for v in bands) and _increasing(bands) else ["temperature_bands"]
        bad += [n for n in ("saving_rate", "gap_rate") if not 0 < getattr(self, n) <= 1]
        bad += [n for n in ("gap_prior_seconds", "gap_prior_seconds_per_request", "chain_min_gain")
                if not 0 <= getattr(self, n) < math.inf]
        if bad:
            raise ValueError(f"LookupConfig: out of range: {', '.join(f'{n}={getattr(self, n)}' for n in bad)}")

    @property
    def sampling_classes(self) -> int:
        """Sampling classes the calibration learns apart: greedy, then one per temperature band, then above them all."""
        return 2 + len(self.temperature_bands)


def _increasing(values: tuple) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


DEFAULT = LookupConfig()
