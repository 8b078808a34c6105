"""The plan of the decode step being run, shared by the worker's parts.

Upstream's call chain between the worker, its proposer, its verify executor and its planner carries no argument of
ours, so they share one :class:`CurrentStep` that the worker sets for the duration of the step
(:meth:`CurrentStep.running`) and that reads :data:`~sglang_dspark.scheduling.step_plan.DRAFTED` otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sglang_dspark.scheduling.step_plan import DRAFTED, StepPlan


class CurrentStep:
    plan: StepPlan = DRAFTED

    @contextmanager
    def running(self, plan: StepPlan) -> Iterator[StepPlan]:
        self.plan = plan
        try:
            yield plan
        finally:
            self.plan = DRAFTED


__all__ = ["CurrentStep"]
