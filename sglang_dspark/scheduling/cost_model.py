"""What a verify step costs: the step-rate model the admission policies maximise throughput against.

DSpark scores an admission by the expected throughput ``Θ = τ · SPS(R, B)`` (accepted tokens per second), where
``R`` is the number of requests in the step and ``B = Σ_r (1 + ℓ_r)`` the number of tokens the target verifies
(every request's anchor plus its ``ℓ_r`` admitted draft tokens, so ``B ≥ R``). ``SPS`` is the engine's step rate,
profiled once at start-up. This module only fixes the interface; the real profiled 2-D table lives in
``sglang_dspark.profiler``.
"""

from __future__ import annotations

from typing import Protocol, Sequence, Union, runtime_checkable

import torch

__all__ = ["StepCostModel", "TabulatedSps1D"]

VerifyTokens = Union[torch.Tensor, int]


@runtime_checkable
class StepCostModel(Protocol):
    """Steps per second of a target verify forward of ``R`` requests carrying ``B`` tokens in all.

    ``verify_tokens`` is ``B = Σ_r (1 + ℓ_r)`` (anchors included, so ``B ≥ num_requests``). For a tensor ``B`` the
    answer is a float tensor of the same shape, element by element (the policies ask for a whole range of ``B`` at
    once); for an ``int`` it is a ``float``. Values must be positive. Nothing requires monotonicity in ``B``: real
    curves are jagged (kernel tiles, CUDA-graph buckets) and the policies are written for that.
    """

    def steps_per_second(self, num_requests: int, verify_tokens: VerifyTokens) -> Union[torch.Tensor, float]: ...


class TabulatedSps1D:
    """SPS as a function of ``B`` only (the request count is ignored), from a dense table.

    ``steps_per_second[i]`` is the rate at ``B = first_verify_tokens + i``. A ``B`` outside the table raises
    ``ValueError`` rather than extrapolating: a silent guess would change admission decisions. The policies ask for
    every ``B`` in ``[R, R + R·γ]``, so a table for them must cover that whole range.
    """

    def __init__(self, steps_per_second: Union[Sequence[float], torch.Tensor], *, first_verify_tokens: int = 1):
        table = torch.as_tensor(steps_per_second, dtype=torch.float64).detach().cpu()
        if table.dim() != 1 or table.numel() == 0:
            raise ValueError(f"steps_per_second must be a non-empty 1-D sequence, got shape {tuple(table.shape)}")
        if not bool(torch.all(torch.isfinite(table) & (table > 0))):
            raise ValueError("steps_per_second must be finite and positive")
        if first_verify_tokens < 0:
            raise ValueError(f"first_verify_tokens must be >= 0, got {first_verify_tokens}")
        self._table = table
        self.first_verify_tokens = int(first_verify_tokens)

    @property
    def last_verify_tokens(self) -> int:
        """The largest ``B`` the table covers."""
        return self.first_verify_tokens + self._table.numel() - 1

    def steps_per_second(self, num_requests: int, verify_tokens: VerifyTokens) -> Union[torch.Tensor, float]:
        del num_requests  # a 1-D table: only the token count matters
        index = torch.as_tensor(verify_tokens, dtype=torch.long) - self.first_verify_tokens
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self._table.numel()):
            raise ValueError(
                f"verify_tokens outside the SPS table [{self.first_verify_tokens}, {self.last_verify_tokens}]: "
                f"asked for [{int(index.min()) + self.first_verify_tokens}, "
                f"{int(index.max()) + self.first_verify_tokens}]"
            )
        if not isinstance(verify_tokens, torch.Tensor):
            return float(self._table[int(index)])
        # index_select, not advanced indexing: the latter's parallel CPU path costs milliseconds on a busy host.
        flat = self._table.index_select(0, index.reshape(-1).cpu())
        return flat.reshape(index.shape).to(verify_tokens.device)

    def __repr__(self) -> str:
        return f"TabulatedSps1D(B={self.first_verify_tokens}..{self.last_verify_tokens})"
