"""patches/cpu_tree_sampling.py: NGRAM / EAGLE verify on the CPU samples from the non-speculative sampler's law.

In-process, no server. The target law the patched ``eagle_sample`` hands the tree sampler is read from our softmax
and compared with the law of SGLang's own pytorch sampler (``top_k_top_p_min_p_sampling_from_probs_torch``) on the
same logits: supports equal exactly, probabilities within 1e-6 (fp32). The hooks around ``eagle_sample`` and
``_verify_uses_greedy`` are called with recording stand-ins for upstream's functions. The law of the emitted tokens
given that target law is ``tests/unit/kernels/test_tree_sampling.py``'s; a server's sampled output is
``tests/e2e/test_e2e_sampled_exactness.py``'s.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_dspark.patches import cpu_tree_sampling as cts

VOCAB = 48
ROWS_PER_REQUEST = 3


def sampling_info(top_ks, top_ps, min_ps, temperatures, all_greedy=False):
    return types.SimpleNamespace(
        top_ks=top_ks, top_ps=top_ps, min_ps=min_ps, temperatures=temperatures.view(-1, 1),
        need_top_k_sampling=bool((top_ks < VOCAB).any()), need_top_p_sampling=bool((top_ps < 1).any()),
        need_min_p_sampling=bool((min_ps > 0).any()), is_all_greedy=all_greedy)


def sampler_law(logits, temperatures, top_ks, top_ps, min_ps):
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    probs = torch.softmax(logits / temperatures.view(-1, 1), dim=-1)
    _, filtered, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, min_ps, True, None, None, return_filtered_probs=True)
    law = torch.zeros_like(probs).scatter_(-1, idx.long(), filtered)
    return law / law.sum(dim=-1, keepdim=True)


def test_softmax_inside_a_cpu_verify_is_the_samplers_law():
    gen = torch.Generator().manual_seed(0)
    bs = 4
    logits = torch.randn(bs * ROWS_PER_REQUEST, VOCAB, generator=gen) * 3
    temperatures = torch.tensor([0.7, 1.0, 1.0, 1.3])
    top_ks = torch.tensor([VOCAB, 5, 1, 20], dtype=torch.int32)  # request 2 is a greedy row of a mixed batch
    top_ps = torch.tensor([0.8, 1.0, 1.0, 0.6])
    min_ps = torch.tensor([0.0, 0.1, 0.0, 0.05])
    info = sampling_info(top_ks, top_ps, min_ps, temperatures)
    per_row = lambda values: torch.repeat_interleave(values, ROWS_PER_REQUEST)  # noqa: E731
    expanded = per_row(temperatures).view(-1, 1)
    softmax = cts.exact_law_softmax(lambda x, temperatures=None: torch.softmax(x / temperatures, dim=-1))

    plain = softmax(logits, temperatures=expanded)
    assert torch.allclose(plain, torch.softmax(logits / expanded, dim=-1))  # outside a verify call: upstream's
    token = cts._current_law.set((info, ROWS_PER_REQUEST))
    try:
        ours = softmax(logits, temperatures=expanded)
    finally:
        cts._current_law.reset(token)
    law = sampler_law(logits, per_row(temperatures), per_row(top_ks), per_row(top_ps), per_row(min_ps))
    assert torch.equal(ours > 0, law > 0)
    assert torch.allclose(ours, law, atol=1e-6)
    greedy_rows = ours[2 * ROWS_PER_REQUEST: 3 * ROWS_PER_REQUEST]
    assert torch.equal(greedy_rows.argmax(-1), logits[2 * ROWS_PER_REQUEST: 3 * ROWS_PER_REQUEST].argmax(-1))
    assert torch.equal(greedy_rows.max(-1).values, torch.ones(ROWS_PER_REQUEST))


def fake_call(device="cpu", all_greedy=False):
    temperatures = torch.tensor([0.7, 1.0])
    info = sampling_info(torch.tensor([5, VOCAB]), torch.tensor([0.9, 1.0]), torch.tensor([0.0, 0.0]),
                         temperatures, all_greedy=all_greedy)
    batch = types.SimpleNamespace(device=device, sampling_info=info, seq_lens=torch.tensor([3, 4]))
    verify_input = types.SimpleNamespace(draft_token_num=ROWS_PER_REQUEST)
    return verify_input, batch, info


def upstream_signature(verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None, *,
                       watermark_state=None, watermark_full_mask=True):
    """Records what upstream's ``eagle_sample`` (same signature) would see."""
    upstream_signature.seen = (batch, grammar_mask, watermark_state, cts._current_law.get())
    return "result"


def test_a_sampling_cpu_batch_runs_with_its_law_and_filters_switched_off():
    verify_input, batch, info = fake_call()
    assert cts.eagle_sample_exact_on_cpu(upstream_signature, verify_input, batch, "logits", "grammar",
                                         watermark_state="wm") == "result"
    seen_batch, grammar, watermark, law = upstream_signature.seen
    assert (grammar, watermark) == ("grammar", "wm")
    assert law == (info, ROWS_PER_REQUEST)
    assert not seen_batch.sampling_info.need_top_k_sampling and not seen_batch.sampling_info.need_top_p_sampling
    assert seen_batch.sampling_info.temperatures is info.temperatures and seen_batch.seq_lens is batch.seq_lens
    assert cts._current_law.get() is None  # reset after the call


@pytest.mark.parametrize("device, all_greedy", [("cpu", True), ("cuda", False)])
def test_greedy_and_device_batches_keep_upstreams_path(device, all_greedy):
    verify_input, batch, _ = fake_call(device, all_greedy)
    cts.eagle_sample_exact_on_cpu(upstream_signature, verify_input, batch, "logits")
    assert upstream_signature.seen[0] is batch and upstream_signature.seen[3] is None


def test_the_cpu_takes_the_sampling_branch_unless_all_greedy():
    def upstream_predicate(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
        """SGLang 0.5.23's ``_verify_uses_greedy`` (eagle_utils.py:500); the real one may be hooked already."""
        return is_all_greedy or is_cpu or is_xpu or (is_hip and not use_rejection_sampling)

    flags = dict(is_hip=False, is_xpu=False, use_rejection_sampling=False)
    assert upstream_predicate(is_all_greedy=False, is_cpu=True, **flags)  # upstream: argmax at any temperature
    assert not cts.verify_samples_on_cpu(upstream_predicate, is_all_greedy=False, is_cpu=True, **flags)
    assert cts.verify_samples_on_cpu(upstream_predicate, is_all_greedy=True, is_cpu=True, **flags)
