"""What a decode step costs, as the capacity search and the draft gate read it, and how served steps refine it.

    drafted(R, B)   = scale · verify(R, B) + level(R) + block(R)     (steps per second: ``drafted``, a StepCostModel)
    undrafted(R, B) = scale · verify(R, B) + level(R)                (steps per second: a step verifying lookup
                                                                      chains without the draft block)
    plain(R)        = scale · verify(R, R) + level(R)                (seconds: ``plain``)

``verify``: the SPS table profiled at start-up (``sps_table.py``); ``scale``: its online agreement with the steps
served (``table_trust.TableAgreement``); ``level`` and ``block``: the rest of a step, learned from every step and
from drafted/plain pairs (``step_overhead.DraftedAndPlainOverheads``). ``observe`` is the one door through which a
served step teaches all three.
"""

from __future__ import annotations

from typing import Optional

from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads, OverheadAdjustedCost
from sglang_dspark.profiler.table_trust import TableAgreement


class StepCosts:
    def __init__(self, table, *, source: str = "") -> None:
        self.table = table
        self.overheads = DraftedAndPlainOverheads()
        self.agreement = TableAgreement(source=source)
        self.drafted = OverheadAdjustedCost(table, self.overheads.drafted)
        self.undrafted = OverheadAdjustedCost(table, self.overheads.level)

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
        table_seconds = self.table.step_seconds(num_requests, sum(record.verify_lens))
        rescaled = self.agreement.observe(record.seconds, table_seconds)
        if rescaled:
            self.drafted.verify_scale = self.undrafted.verify_scale = self.agreement.scale
        self.overheads.observe(num_requests, record.drafted, record.seconds, self.drafted.verify_scale * table_seconds)
        return rescaled

    def table_summary(self) -> dict:
        return dict(self.table.summary(), **self.agreement.summary())


__all__ = ["StepCosts"]
