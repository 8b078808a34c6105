"""Host tensors onto the step's device without a host sync (the decode step's per-step inputs built on the host)."""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device`` with the step's other inputs: pinned and copied without blocking off the CPU (a
    pageable ``.to(device)`` is a copy plus a stream synchronize)."""
    if torch.device(device).type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
