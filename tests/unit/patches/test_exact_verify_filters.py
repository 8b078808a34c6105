"""patches/exact_verify_filters.py: the sampled verify's target distribution equals the non-speculative sampler's.

In-process, no server: upstream's ``_accept_sampling_core`` (SGLang 0.5.23) is called through our hook with a
recorder in place of the chain sampler, so the target distribution the rejection test uses is read exactly and
compared with the law of SGLang's own pytorch sampler (``top_k_top_p_min_p_sampling_from_probs_torch``, the CPU's
non-speculative sampler) on the same logits. Tolerances: supports equal exactly; probabilities 1e-6 abs (fp32).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_dspark.patches import exact_verify_filters as evf

VOCAB = 64


def _sampler_law(logits, temperatures, top_ks, top_ps, min_ps, need_min_p):
    """Exact law of SGLang's non-speculative pytorch sampler: its own filtered weights, renormalised (multinomial)."""
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    probs = torch.softmax(logits / temperatures.view(-1, 1), dim=-1)
    _, filtered, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, min_ps, need_min_p, None, None, return_filtered_probs=True
    )
    law = torch.zeros_like(probs).scatter_(-1, idx.long(), filtered)
    return law / law.sum(dim=-1, keepdim=True)


def _random_case(seed, rows):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=gen) * 3.0
    temperatures = torch.empty(rows).uniform_(0.5, 1.5, generator=gen)
    top_ks = torch.randint(1, VOCAB + 1, (rows,), generator=gen).to(torch.int32)
    top_ks[::3] = 1 << 30  # TOP_K_ALL on some rows
    top_ps = torch.empty(rows).uniform_(0.3, 1.0, generator=gen)
    min_ps = torch.empty(rows).uniform_(0.0, 0.3, generator=gen)
    min_ps[1::4] = 0.0
    return logits, temperatures, top_ks, top_ps, min_ps


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("with_min_p", [True, False])
def test_support_equals_the_samplers(seed, with_min_p):
    logits, temperatures, top_ks, top_ps, min_ps = _random_case(seed, rows=32)
    keep = evf.nonspec_support(logits, temperatures, top_ks, top_ps, min_ps if with_min_p else None)
    law = _sampler_law(logits, temperatures, top_ks, top_ps, min_ps, with_min_p)
    assert torch.equal(keep, law > 0)


class _Recorder:
    """Stands in for the chain sampler: keeps the target distribution, then samples with our torch sampler."""

    def __init__(self):
        self.target_probs = None

    def __call__(self, **kwargs):
        from sglang_dspark.kernels.rejection_sampling import chain_speculative_sampling_torch

        self.target_probs = kwargs["target_probs"].clone()
        return chain_speculative_sampling_torch(**kwargs)


def _sampling_info(bs, temperatures, top_ks, top_ps, min_ps):
    return types.SimpleNamespace(
        temperatures=temperatures.view(bs, 1),
        top_ks=top_ks,
        top_ps=top_ps,
        min_ps=min_ps,
        need_top_k_sampling=bool((top_ks != 1 << 30).any()),
        need_top_p_sampling=bool((top_ps != 1.0).any()),
        need_min_p_sampling=bool((min_ps > 0).any()),
        is_all_greedy=False,
        is_any_greedy=False,
    )


def _verify_target_probs(monkeypatch, *, hooked, logits, info, rows_per_request):
    """Run upstream's ``_accept_sampling_core`` (through our hook or not); return its target distribution."""
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    recorder = _Recorder()
    monkeypatch.setattr(dspark_accept, "chain_speculative_sampling_triton", recorder)
    original = getattr(dspark_accept._accept_sampling_core, "__wrapped__", dspark_accept._accept_sampling_core)
    bs = logits.shape[0] // rows_per_request
    gen = torch.Generator().manual_seed(7)
    candidates = torch.randint(0, VOCAB, (bs, rows_per_request), generator=gen)
    draft_probs = torch.softmax(torch.randn(bs, rows_per_request - 1, VOCAB, generator=gen), dim=-1)
    kwargs = dict(
        candidates=candidates,
        target_logits=logits.clone(),
        draft_probs=draft_probs,
        sampling_info=info,
        draft_input=types.SimpleNamespace(max_top_k=None, uniform_top_k_value=None),
        gamma=rows_per_request - 1,
        verify_num_draft_tokens=rows_per_request,
        cutoff_verify_lens=None,
        block_verification=False,
    )
    if hooked:
        evf.accept_sampling_core_exact(original, **kwargs)
    else:
        original(**kwargs)
    return recorder.target_probs.view(bs * rows_per_request, VOCAB)


@pytest.mark.parametrize("seed", range(3))
def test_verify_target_is_the_samplers_law(monkeypatch, seed):
    """Through the hook, every verify row's target distribution is the sampler's law (min_p, top-k, top-p mixed)."""
    bs, rows_per_request = 6, 4
    logits, temperatures, top_ks, top_ps, min_ps = _random_case(seed, rows=bs)
    info = _sampling_info(bs, temperatures, top_ks, top_ps, min_ps)
    verify_logits = torch.randn(bs * rows_per_request, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    got = _verify_target_probs(monkeypatch, hooked=True, logits=verify_logits, info=info,
                               rows_per_request=rows_per_request)

    def per_row(t):
        return torch.repeat_interleave(t, rows_per_request, dim=0)

    want = _sampler_law(verify_logits, per_row(temperatures), per_row(top_ks), per_row(top_ps), per_row(min_ps), True)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_upstream_ignores_min_p(monkeypatch):
    """The finding: without the hook the verify target keeps every token min_p cuts (dspark_accept.py:108-121)."""
    bs, rows_per_request = 2, 3
    logits = torch.randn(bs * rows_per_request, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    temperatures = torch.ones(bs)
    info = _sampling_info(bs, temperatures, torch.full((bs,), 1 << 30), torch.ones(bs), torch.full((bs,), 0.2))
    upstream = _verify_target_probs(monkeypatch, hooked=False, logits=logits, info=info,
                                    rows_per_request=rows_per_request)
    ours = _verify_target_probs(monkeypatch, hooked=True, logits=logits, info=info, rows_per_request=rows_per_request)
    torch.testing.assert_close(upstream, torch.softmax(logits, dim=-1), atol=1e-6, rtol=0)  # no cut at all
    assert (ours > 0).sum() < (upstream > 0).sum()
    probs = torch.softmax(logits, dim=-1)
    assert torch.equal(ours > 0, probs >= 0.2 * probs.max(dim=-1, keepdim=True).values)


def test_upstream_top_k_then_top_p_is_sequential(monkeypatch):
    """The finding's example: p = (0.4, 0.3, 0.3, 0...), top_k = 2, top_p = 0.5. The sampler cuts top-p on the full
    distribution (keeps 0.4 and 0.3 -> 4/7, 3/7); upstream's verify on the top-k-renormalised one (keeps 0.4 only)."""
    probs = torch.zeros(1, VOCAB)
    probs[0, :3] = torch.tensor([0.4, 0.3, 0.3])
    probs[0, 3:] = 1e-30
    logits = torch.log(probs).repeat(2, 1)  # one request, two verify rows
    info = _sampling_info(1, torch.ones(1), torch.tensor([2], dtype=torch.int32), torch.tensor([0.5]),
                          torch.zeros(1))
    upstream = _verify_target_probs(monkeypatch, hooked=False, logits=logits, info=info, rows_per_request=2)
    ours = _verify_target_probs(monkeypatch, hooked=True, logits=logits, info=info, rows_per_request=2)
    torch.testing.assert_close(upstream[0, :3], torch.tensor([1.0, 0.0, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ours[0, :3], torch.tensor([4 / 7, 3 / 7, 0.0]), atol=1e-6, rtol=0)
    law = _sampler_law(logits[:1], torch.ones(1), torch.tensor([2]), torch.tensor([0.5]), torch.zeros(1), False)
    torch.testing.assert_close(ours[:1], law, atol=1e-6, rtol=0)


def test_other_batches_keep_upstreams_path(monkeypatch):
    """Temperature-only, top-k-only and top-p-only batches are not touched (upstream already matches there)."""
    calls = []

    def original(**kwargs):
        calls.append(kwargs)

    logits = torch.randn(4, VOCAB)
    for top_k, top_p in ((1 << 30, 1.0), (5, 1.0), (1 << 30, 0.7)):
        info = _sampling_info(1, torch.ones(1), torch.tensor([top_k]), torch.tensor([top_p]), torch.zeros(1))
        evf.accept_sampling_core_exact(original, target_logits=logits, sampling_info=info, verify_num_draft_tokens=4)
        assert calls[-1]["target_logits"] is logits and calls[-1]["sampling_info"] is info


def test_hook_is_registered_on_the_cpu_platform():
    from sglang_dspark.cpu.startup import cpu_platform_active

    assert cpu_platform_active(), "these tests run on the CPU platform (CPU torch build)"
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_dspark.patches import cpu_dspark

    cpu_dspark.apply()
    hooks = HookRegistry._hooks.get(evf.ACCEPT_SAMPLING_CORE, [])
    assert any(hook is evf.accept_sampling_core_exact for _, hook, _ in hooks)
