"""The DSpark Markov sampling step on the CPU (torch; upstream's CUDA/Triton step is
``sglang.kernels.ops.speculative.dspark.markov_sample.MarkovSampleStep``).

Same contract as upstream's step on one unsharded vocabulary: step logits = base + Markov bias on the first ``width``
columns, rounded through ``step_dtype`` and kept; greedy rows take the first maximum (``torch.argmax`` order, the
lowest-index tie-break upstream uses), sampled rows an exact sample of softmax(logits / T). What differs is the
noise: upstream's torch path draws Philox4x32-10 Gumbel noise over the whole vocabulary for every row (greedy rows
too, because a CUDA graph cannot read temperatures on the host); here greedy batches draw none and each sampled row
one uniform number from torch's CPU generator, inverted through the row's cumulative softmax (a Gumbel draw over the
vocabulary costs one exponential per token from a single-threaded generator; docs/scheduling.md, "Why each rule
exists"). Any exact sampler keeps verification lossless (the kept step logits, not the noise, enter the acceptance
test).
"""

from __future__ import annotations


def markov_noise_seed(key: int, offset: int, step: int) -> int:
    """One generator seed per (server key, block offset, slot): distinct blocks and slots draw distinct noise."""
    return (key * 0x9E3779B1 + (offset & 0xFFFFFFFF) * 0x85EBCA77 + step * 0xC2B2AE3D) & 0x7FFFFFFFFFFFFFFF


def cpu_markov_step(base_logits, bias, temperatures, step_dtype, logits_out=None, noise_seed=None):
    """Upstream's step on one unsharded vocabulary, in few passes. Step logits = base + bias on the first
    ``width = bias.shape[1]`` columns, rounded through ``step_dtype`` and kept in ``logits_out`` (padding
    included, as upstream keeps them). Greedy rows (temperature 0, or every row when ``noise_seed`` is None) take
    the first maximum, or the first NaN (``torch.argmax`` order = upstream's lowest-index tie-break); sampled rows
    take an exact sample of softmax(logits / T) (:func:`sample_rows`). Returns int64 ids [rows].

    A draft block runs this once per slot on a few rows, so its cost is the number of tensor operations, not their
    size: the common cases (fp32 without padding: the hot-space loop; a batch all sampled or all greedy) take the
    shortest sequence of operations that gives the same numbers (an fp32 add written straight into ``logits_out``;
    no argmax or row gather for a batch with no greedy row)."""
    import torch

    width = bias.shape[1]
    if (base_logits.shape[1] == width and base_logits.dtype == step_dtype == torch.float32
            and (logits_out is None or logits_out.dtype == torch.float32)):
        # The general path below without its copies (fp32 rounds nothing); ``out=`` only where autograd is not
        # watching (a draft head's parameters outside inference mode).
        if logits_out is None or base_logits.requires_grad or bias.requires_grad:
            value = base_logits + bias.float()
            if logits_out is not None:
                logits_out.copy_(value)
        else:
            value = torch.add(base_logits, bias.float(), out=logits_out)
    else:
        value = base_logits.to(torch.float32, copy=True)
        value[:, :width] += bias.float()
        value = value.to(step_dtype).float()
        if logits_out is not None:
            logits_out.copy_(value)
    keys = value[:, :width]
    if noise_seed is None:
        return keys.argmax(dim=1)
    sampled = temperatures != 0
    if bool(sampled.all()):
        return sample_rows(keys / temperatures[:, None], torch.Generator().manual_seed(noise_seed))
    tokens = keys.argmax(dim=1)
    rows = sampled.nonzero().squeeze(1)
    if rows.numel():
        generator = torch.Generator().manual_seed(noise_seed)
        tokens[rows] = sample_rows(keys[rows] / temperatures[rows, None], generator)
    return tokens


def sample_rows(scaled_logits, generator):
    """One exact sample of softmax(row) per row: a uniform number inverted through the row's cumulative softmax
    (summed in float64, so no token's mass is lost in a long sum, and a zero-probability token is never drawn). A row
    with no finite maximum (a NaN, +inf, or all −inf) takes its argmax, as upstream's Gumbel argmax ends up doing."""
    import torch

    logits = scaled_logits.float()
    top = logits.max(dim=1, keepdim=True).values  # NaN when the row holds one
    usable = torch.isfinite(top).squeeze(1)
    all_usable = bool(usable.all())  # the common case: no fallback to mask or take
    weights = torch.exp(logits - (top if all_usable else torch.where(usable[:, None], top, torch.zeros_like(top))))
    cumulative = weights.cumsum(dim=1, dtype=torch.float64)
    uniform = torch.rand(logits.shape[0], 1, generator=generator, dtype=torch.float64) * cumulative[:, -1:]
    picks = torch.searchsorted(cumulative, uniform, right=True).squeeze(1).clamp_(max=logits.shape[1] - 1)
    return picks if all_usable else torch.where(usable, picks, logits.argmax(dim=1))
