"""The DSpark Markov sampling step on the CPU (torch; upstream's CUDA/Triton step is
``sglang.kernels.ops.speculative.dspark.markov_sample.MarkovSampleStep``).

Same contract as upstream's step on one unsharded vocabulary: step logits = base + Markov bias on the first ``width``
columns, rounded through ``step_dtype`` and kept; greedy rows take the first maximum (``torch.argmax`` order, the
lowest-index tie-break upstream uses), sampled rows an exact sample of softmax(logits / T). What differs is the
noise: upstream's torch path draws Philox4x32-10 Gumbel noise over the whole vocabulary for every row (greedy rows
too, because a CUDA graph cannot read temperatures on the host); here greedy batches draw none and sampled rows one
Gumbel draw each from torch's CPU generator. Any exact sampler keeps verification lossless (the kept step logits,
not the noise, enter the acceptance test).
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
    take argmax(logits / T + Gumbel noise), an exact sample of softmax(logits / T). Returns int64 ids [rows]."""
    import torch

    width = bias.shape[1]
    value = base_logits.to(torch.float32, copy=True)
    value[:, :width] += bias.float()
    value = value.to(step_dtype).float()
    if logits_out is not None:
        logits_out.copy_(value)
    keys = value[:, :width]
    if noise_seed is not None:
        sampled = temperatures != 0
        rows = sampled.nonzero().squeeze(1)
        gen = torch.Generator().manual_seed(noise_seed)
        gumbel = torch.empty(rows.numel(), width).exponential_(generator=gen).log_().neg_()
        keys = keys.clone()
        keys[rows] = keys[rows] / temperatures[rows, None] + gumbel
    return keys.argmax(dim=1)
