"""What a decode step costs, as the capacity search and the draft gate read it, and how served steps refine it.

    drafted(R, B)   = scale · verify(R, B) + level(R) + block(R)     (steps per second: ``drafted``, a StepCostModel)
    undrafted(R, B) = scale · verify(R, B) + level(R) + chain(R)·(B − R)
                                                                     (steps per second: a step verifying lookup
                                                                      chains without the draft block)
    plain(R)        = scale · verify(R, R) + level(R)                (seconds: ``plain``)

``verify``: the SPS table profiled at start-up (``sps_table.py``); ``scale``: its online agreement with the steps
served (``table_trust.TableAgreement``); ``level`` and ``block``: the rest of a step, learned from every step and
from drafted/plain pairs (``step_overhead.DraftedAndPlainOverheads``); ``chain``: what a step without the draft pays
per verified chain token (B − R) beyond its scaled table verify and its level, whatever part of the step it goes to,
learned per load bucket from those steps (:class:`ChainTokenCost`; what it measures to and where it goes:
docs/lookup.md, "What it costs"). ``observe`` is the one door through which a served step teaches all four; a chain
step teaches the level and the scale net of its chain cost.
"""

from __future__ import annotations

from typing import Optional

import math
from typing import Union

import torch

from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads, OverheadAdjustedCost, StepOverhead
from sglang_dspark.profiler.table_trust import TableAgreement


class ChainTokenCost:
    """Seconds per chain token (beyond the anchors) a step without the draft pays over its table verify and level,
    per load bucket: (measured − verify − level) / (B − R), learned as ``StepOverhead`` learns a step's rest (a
    robust start at the lower quartile of a bucket's first samples, then bounded moves); 0 until such a step ran.

    Why robust: a per-token sample divides a whole step's stall by a few tokens, and a cost read too high stops
    chains from being chosen, so nothing would ever measure it down again (the run: docs/lookup.md, "Why each rule
    exists")."""

    def __init__(self, rate: float = 0.2) -> None:
        self._learned = StepOverhead(rate=rate, label="lookup chain token")

    def seconds(self, num_requests: int) -> float:
        return self._learned.known(num_requests) or 0.0

    def observe(self, num_requests: int, chain_tokens: int, residual_seconds: float, step_seconds: float = 0.0) -> None:
        """``residual_seconds``: the step's measured time beyond ``step_seconds``, its table verify and level."""
        if chain_tokens <= 0 or not math.isfinite(residual_seconds):
            return
        # An update moves the estimate by at most a quarter of the step's share per chain token (and of itself): a
        # stall washes out, a real shift converges, and an estimate read near 0 can still grow.
        self._learned.observe_sample(num_requests, max(0.0, residual_seconds) / chain_tokens,
                                     max(0.0, step_seconds) / chain_tokens)

    def summary(self) -> dict:
        return self._learned.summary()


class UndraftedCost:
    """A ``StepCostModel`` for a step without the draft block: the verify and level of ``base`` plus the chain cost."""

    def __init__(self, base: OverheadAdjustedCost, chain: ChainTokenCost) -> None:
        self.base, self.chain = base, chain

    def steps_per_second(self, num_requests: int, verify_tokens: Union[int, torch.Tensor]):
        per_token = self.chain.seconds(num_requests)
        rate = self.base.steps_per_second(num_requests, verify_tokens)
        if per_token == 0.0:
            return rate
        if isinstance(verify_tokens, torch.Tensor):
            extra = per_token * (verify_tokens.to(torch.float64) - num_requests).clamp(min=0)
            return 1.0 / (1.0 / rate + extra)
        return 1.0 / (1.0 / rate + per_token * max(0, int(verify_tokens) - num_requests))


class StepCosts:
    def __init__(self, table, *, source: str = "") -> None:
        self.table = table
        self.overheads = DraftedAndPlainOverheads()
        self.agreement = TableAgreement(source=source)
        self.chain = ChainTokenCost()
        self.drafted = OverheadAdjustedCost(table, self.overheads.drafted)
        self.undrafted = UndraftedCost(OverheadAdjustedCost(table, self.overheads.level), self.chain)

    def undrafted_for(self, explored: bool):
        """The cost of a step without the draft as a step plans with it: an exploring step (``LookupChains.explored``)
        prices chain tokens at its table verify alone, so a chain cost read too high is measured again."""
        return self.undrafted.base if explored else self.undrafted

    def plain(self, num_requests: int) -> Optional[float]:
        """Seconds of a step that skips the draft and verifies the R anchors (None before a plain step was timed)."""
        rest = self.overheads.plain_seconds(num_requests)
        if rest is None:
            return None
        verify = self.drafted.verify_seconds(num_requests, num_requests)
        return max(verify + rest, OverheadAdjustedCost.MIN_SHARE_OF_TABLE * verify)

    def pairs(self, num_requests: int) -> int:
        """Drafted/plain step pairs that taught R's bucket the draft block's cost."""
        return self.overheads.pairs(num_requests)

    def observe(self, record) -> bool:
        """A served decode step (``engine/step_record.StepRecord``: its requests, verify lengths, kind and measured
        seconds); True when the table's scale changed (its summary is new)."""
        if record.seconds is None:
            return False
        num_requests = len(record.commit_lens)
        verify_tokens = sum(record.verify_lens)
        table_seconds = self.table.step_seconds(num_requests, verify_tokens)
        seconds = record.seconds
        chain_tokens = verify_tokens - num_requests if not record.drafted else 0
        if chain_tokens > 0:
            expected = self.drafted.verify_scale * table_seconds + self.overheads.level.seconds(num_requests)
            self.chain.observe(num_requests, chain_tokens, seconds - expected, expected)
            seconds = max(0.0, seconds - self.chain.seconds(num_requests) * chain_tokens)
        rescaled = self.agreement.observe(seconds, table_seconds)
        if rescaled:
            self.drafted.verify_scale = self.undrafted.base.verify_scale = self.agreement.scale
        self.overheads.observe(num_requests, record.drafted, seconds, self.drafted.verify_scale * table_seconds)
        return rescaled

    def table_summary(self) -> dict:
        return dict(self.table.summary(), **self.agreement.summary())


__all__ = ["StepCosts"]
