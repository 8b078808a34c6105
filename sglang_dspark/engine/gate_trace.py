"""One JSON line per decode step, for reading what the draft gate saw and did (``SGLANG_DSPARK_GATE_TRACE=path``).

The gate's choices hang on small differences between learned costs (scheduling/draft_gate.py), and what went wrong in a
run is only visible step by step: which costs were predicted, what the step took, what it committed. ``/server_info``
shows the gate's running state, not its history. With the switch set, every decode step the planner observes appends
one line to the file (every scheduler process appends to the same file; ``pid`` tells them apart):

``t`` (host clock, s), ``pid``, ``R`` (requests), ``drafted``, ``reason`` (the gate's latest decision: this step's
on the CPU, where a step's record is read as it ends), ``seconds`` (measured),
``verify_tokens``, ``committed`` (tokens, anchors included), ``table_seconds`` (the profiled verify of the step), and,
when the gate decided with a prediction: ``predicted_tokens`` and ``expected_tokens`` (per request, before and after the
realized fit), ``capacity``, ``predicted_draft_seconds`` and ``predicted_plain_seconds``; on a step with prompt-lookup
rows: ``lookup_rows``, ``lookup_tokens`` (chain tokens verified), ``lookup_expected`` and ``lookup_accepted`` (chain
tokens the choice expected and got) and, without the draft, ``lookup_predicted_seconds``.

Lines are written unbuffered and only on the host (the step is over by then), so a trace costs a file append per
step; off (the default) it costs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Optional, TextIO

from sglang_dspark import envs

logger = logging.getLogger(__name__)


class GateTrace:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Optional[TextIO] = None
        self._failed = False

    @classmethod
    def from_env(cls) -> Optional["GateTrace"]:
        path = envs.GATE_TRACE.get()
        return cls(path) if path else None

    def write(self, fields: dict) -> None:
        """Append one step; a trace that cannot be written logs once and stops (it must never stop a decode step)."""
        if self._failed:
            return
        try:
            if self._file is None:
                self._file = open(self.path, "a", buffering=1)
            line = {"t": round(time.perf_counter(), 6), "pid": os.getpid()}
            line.update(fields)
            self._file.write(json.dumps(line, allow_nan=True) + "\n")
        except OSError as exc:
            self._failed = True
            logger.warning("sglang-dspark: gate trace %s cannot be written (%s); tracing stopped", self.path, exc)

    def write_step(self, record, gate, lookup, sps_table, undrafted_cost) -> None:
        """The line of one observed step (module docstring): ``gate`` as it decided (before the step teaches it; None:
        no gate), ``lookup`` the lookup source, ``sps_table`` the profiled table (None: none), ``undrafted_cost`` a
        step without the draft's cost (None: not known)."""
        num_requests = len(record.commit_lens)
        fields = {"R": num_requests, "drafted": bool(record.drafted), "seconds": record.seconds,
                  "verify_tokens": sum(record.verify_lens), "committed": sum(record.commit_lens)}
        if gate is not None:
            fields["reason"] = gate.last.reason if gate.last is not None else None
            fields.update(gate.trace_fields(record.gate_choice, num_requests))
        if sps_table is not None and num_requests > 0:
            fields["table_seconds"] = sps_table.step_seconds(num_requests, sum(record.verify_lens))
        if record.lookup is not None:
            fields.update(lookup.trace_fields(record, undrafted_cost if not record.drafted else None))
        self.write(fields)
