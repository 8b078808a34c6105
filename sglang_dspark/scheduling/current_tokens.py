"""Whether a batch with a lookup match gives up SGLang's overlap so its tokens are current (pure; issue #39).

A lookup proposal needs the request's tail up to the anchor; under SGLang's overlap scheduler the host's tokens lag a
step, so such a batch runs after the previous result is processed (``patches/lookup_current_tokens.py``). On a GPU
that is a host gap per step (by reading: the device idles while the host processes the previous result), a cost the
step records cannot see (they time the forward, not the gap before it). So the overlap is given up only where the
chains are being verified: at a load where the last ``patience`` steps that had proposals all verified none (the
scheduler found no chain worth its verify), batches keep the overlap, except one in ``patience``, whose current
tokens let the scheduler weigh the chains again. Loads are bucketed as the step costs are (``load_bucket``).
"""

from __future__ import annotations

from sglang_dspark.profiler.step_overhead import load_bucket

__all__ = ["CurrentTokensPolicy"]


class CurrentTokensPolicy:
    def __init__(self, patience: int = 16) -> None:
        if patience < 1:
            raise ValueError(f"CurrentTokensPolicy: patience must be >= 1, got {patience}")
        self.patience = int(patience)
        self._declined: dict[int, int] = {}  # per load bucket: steps with proposals in a row that verified no chain
        self._kept: dict[int, int] = {}  # per load bucket: matched batches in a row that kept the overlap

    def wants(self, num_requests: int) -> bool:
        """For a batch with a lookup match of ``num_requests``: True to run it on current tokens (no overlap)."""
        bucket = load_bucket(num_requests)
        if self._declined.get(bucket, 0) < self.patience:
            return True
        kept = self._kept.get(bucket, 0) + 1
        if kept >= self.patience:  # one batch in ``patience``: let the scheduler weigh the chains again
            self._kept[bucket] = 0
            return True
        self._kept[bucket] = kept
        return False

    def observe(self, num_requests: int, verified_chains: bool) -> None:
        """A planned step that had lookup proposals: whether it verified any chain."""
        bucket = load_bucket(num_requests)
        self._declined[bucket] = 0 if verified_chains else self._declined.get(bucket, 0) + 1

    def summary(self) -> dict:
        """Load buckets where batches keep the overlap now (the chains were not verified lately)."""
        return {"overlap_kept_at": sorted(b for b, n in self._declined.items() if n >= self.patience)}
