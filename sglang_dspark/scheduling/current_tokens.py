"""Whether a batch with a lookup match gives up SGLang's overlap so its tokens are current (pure; issues #39, #46).

A lookup proposal needs the request's tail up to the anchor; under SGLang's overlap scheduler the host's tokens lag a
step, so such a batch runs after the previous result is processed (``patches/lookup_current_tokens.py``, which also
tells the planner how each batch was launched). That is a cost: on a GPU (by reading SGLang's loop) the device idles
while the host processes the previous result and prepares the next launch (a gap before the step that its own
record does not time: ``engine/step_record.StepRecord.gap_seconds`` does;
``profiler/overlap_gap.py`` learns it). So, per load bucket (``load_bucket``, as the step costs are), the overlap is
given up only while both hold:

* **chains are being verified**: fewer than ``overlap_patience`` matched steps in a row verified none (a step the
  scheduler waited for that then had no proposal, or whose proposals the choice declined, counts as one that verified
  none);
* **they pay for the wait**: the chains' predicted saving per matched step (``saved_seconds``, a mean over matched
  steps, zeros included) is at least the gap the wait costs at that load (unknown saving: assumed to pay).

Otherwise batches keep the overlap, except one in ``overlap_patience``, whose current tokens let the scheduler weigh
the chains again. Where the wait costs nothing (gap 0: the CPU, where the forward runs on the host either way) the
second rule always holds. The knobs (``overlap_patience``, ``saving_rate``) are ``lookup/config.LookupConfig``'s.
"""

from __future__ import annotations

from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.profiler.step_overhead import load_bucket

__all__ = ["CurrentTokensPolicy"]

class CurrentTokensPolicy:
    def __init__(self, config: LookupConfig = DEFAULT) -> None:
        self.config = config
        self._declined: dict[int, int] = {}  # per load bucket: matched steps in a row that verified no chain
        self._kept: dict[int, int] = {}  # per load bucket: matched batches in a row that kept the overlap
        self._saving: dict[int, float] = {}  # per load bucket: mean predicted seconds the chains saved per matched step
        self._gap: dict[int, float] = {}  # per load bucket: the gap cost the last decision read (summary only)

    @property
    def patience(self) -> int:
        """``config.overlap_patience`` (module docstring)."""
        return self.config.overlap_patience

    def _pays(self, bucket: int, gap_seconds: float) -> bool:
        saving = self._saving.get(bucket)
        return gap_seconds <= 0.0 or saving is None or saving >= gap_seconds

    def wants(self, num_requests: int, gap_seconds: float = 0.0) -> bool:
        """For a batch with a lookup match of ``num_requests``: True to run it on current tokens (no overlap), given
        ``gap_seconds``, what waiting for the previous result costs at this load."""
        bucket = load_bucket(num_requests)
        self._gap[bucket] = float(gap_seconds)
        if self._declined.get(bucket, 0) < self.patience and self._pays(bucket, gap_seconds):
            return True
        kept = self._kept.get(bucket, 0) + 1
        if kept >= self.patience:  # one batch in ``patience``: let the scheduler weigh the chains again
            self._kept[bucket] = 0
            return True
        self._kept[bucket] = kept
        return False

    def observe(self, num_requests: int, verified_chains: bool, saved_seconds: float | None = None) -> None:
        """A matched step (one with lookup proposals, or one that waited for current tokens): whether it verified any
        chain, and the seconds its chains were predicted to save against the same step without them (0 when none;
        None: not known, e.g. before the step costs exist)."""
        bucket = load_bucket(num_requests)
        self._declined[bucket] = 0 if verified_chains else self._declined.get(bucket, 0) + 1
        saved = 0.0 if not verified_chains else saved_seconds
        if saved is not None:
            previous = self._saving.get(bucket)
            self._saving[bucket] = float(saved) if previous is None else (
                previous + self.config.saving_rate * (float(saved) - previous))

    def summary(self) -> dict:
        """Load buckets where batches keep the overlap now: the chains were not verified lately, or their saving was
        below the gap the wait costs."""
        kept = sorted(b for b in set(self._declined) | set(self._saving)
                      if self._declined.get(b, 0) >= self.patience or not self._pays(b, self._gap.get(b, 0.0)))
        return {"overlap_kept_at": kept,
                "chain_saving_ms": {b: round(1e3 * s, 3) for b, s in sorted(self._saving.items())}}
