"""Each CPU fallback of the DSPARK plugin, checked in-process against SGLang 0.5.23 with the CPU platform active.

The plugins are loaded the way SGLang loads them (entry points + HookRegistry), so these tests exercise the real
hook targets, not copies.
"""

from __future__ import annotations

import types

import pytest
import torch


@pytest.fixture(scope="module")
def loaded_plugins():
    from sglang_dspark.cpu.startup import cpu_platform_active

    assert cpu_platform_active(), "these tests run on the CPU platform (CPU torch build)"
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.plugins.hook_registry import HookRegistry

    return HookRegistry


def test_entry_points_are_registered():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("dspark") == "sglang_dspark.plugin:register"
    assert names.get("dspark_cpu_platform") == "sglang_dspark.cpu.platform:register"


def test_kernels_and_profiler_install_under_our_namespace():
    import importlib.util

    import sglang_dspark.kernels
    import sglang_dspark.profiler

    assert sglang_dspark.kernels.__name__ == "sglang_dspark.kernels"
    assert sglang_dspark.profiler.__name__ == "sglang_dspark.profiler"
    top_level = importlib.util.find_spec("profiler")
    assert top_level is None or "sglang_dspark" not in str(top_level.origin)


def test_sgl_kernel_resolves_to_the_standin_on_cpu():
    import sgl_kernel

    import sglang_dspark.cpu.sgl_kernel_standin as standin

    assert sgl_kernel is standin


def test_b1_dspark_args_resolve_on_cpu(loaded_plugins, tiny_pair, monkeypatch):
    """B1 (+ platform): DSPARK resolves on device cpu, keeps intel_amx, reads γ=7 from the draft config."""
    # Resolution sets the verify mode in os.environ (for the processes it spawns); keep it out of this process.
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "static")
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(
        [
            "--model-path", str(tiny_pair.target_dir),
            "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", str(tiny_pair.draft_dir),
            "--device", "cpu",
            "--max-total-tokens", "4096",
        ]
    )
    args.resolve_once()
    view = resolving_view(args)
    assert view.device == "cpu"
    assert view.attention_backend == "intel_amx"
    assert view.speculative_num_draft_tokens == 8


def test_b1_guard_still_refuses_unknown_devices():
    from sglang_dspark.patches.cpu_dspark import _DeviceReadsAsCuda

    view = types.SimpleNamespace(device="cpu", attn_dp_size=1)
    proxy = _DeviceReadsAsCuda(view)
    assert proxy.device == "cuda" and proxy.attn_dp_size == 1


def test_b2_intel_amx_is_a_draft_backend(loaded_plugins):
    from sglang.srt.arg_groups import choices

    assert "intel_amx" in choices.DRAFT_ATTENTION_BACKEND_CHOICES


def test_b3_fused_kv_write_is_off_for_cpu_pools(loaded_plugins):
    from sglang.srt.models.dspark import DSparkDraftMixin

    calls = []

    class Draft(DSparkDraftMixin):
        _fused_kv_write_cache = None

        def _build_fused_kv_write_bundle(self, pool):
            calls.append(pool)
            return "triton-bundle"

    assert object.__new__(Draft)._fused_kv_write_bundle(types.SimpleNamespace(device="cpu")) is None
    assert calls == []


def test_b4_record_stream_is_a_noop_on_cpu(loaded_plugins):
    tensor = torch.arange(4)
    tensor.record_stream(torch.cpu.current_stream())  # raised "unknown parameter type" before the patch
    assert tensor.tolist() == [0, 1, 2, 3]


def test_b5_dflash_verify_is_a_linear_chain(loaded_plugins):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    assert DFlashVerifyInput.tree_topk == 1


def test_b6_dflash_attention_uses_torch_qk_norm_rope(loaded_plugins):
    from sglang.srt.models.dflash import DFlashAttention

    hooked = DFlashAttention.__init__
    assert hooked is not getattr(hooked, "__wrapped__", None)
    from sglang_dspark.patches.cpu_dspark import dflash_attention_torch_qk_norm_rope

    layer = types.SimpleNamespace(use_table_qk_norm_rope=True)
    dflash_attention_torch_qk_norm_rope(None, layer)
    assert layer.use_table_qk_norm_rope is False


def test_b7_chain_sampling_dispatches_cpu_to_torch(loaded_plugins):
    from sglang.kernels.ops.speculative import reject_sampling
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from sglang_dspark.kernels.rejection_sampling import chain_speculative_sampling_torch

    # The module attribute and dspark_accept's `from ... import` binding both go through our dispatcher.
    assert reject_sampling.chain_speculative_sampling_triton is dspark_accept.chain_speculative_sampling_triton
    bs, slots, vocab = 3, 4, 11
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(bs, slots, vocab, generator=gen), -1)
    draft = torch.softmax(torch.randn(bs, slots, vocab, generator=gen), -1)
    candidates = torch.randint(0, vocab, (bs, slots), generator=gen)
    retrive_index = torch.arange(bs * slots).view(bs, slots)
    retrive_next_token = torch.full((bs, slots), -1, dtype=torch.long)
    retrive_next_token[:, :-1] = torch.arange(1, slots)
    coins = torch.rand(bs, slots, generator=gen)
    final = torch.rand(bs, generator=gen)

    def run(fn):
        predicts = torch.full((bs * slots,), -1, dtype=torch.int32)
        accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        fn(predicts, accept_index, accept_num, candidates, retrive_index, retrive_next_token,
           torch.full_like(retrive_next_token, -1), coins, final, target, draft, 1.0, 1.0, True)
        return predicts, accept_index, accept_num

    via_hook = run(reject_sampling.chain_speculative_sampling_triton)
    direct = run(chain_speculative_sampling_torch)
    for a, b in zip(via_hook, direct):
        assert torch.equal(a, b)


def test_b8_ragged_verify_metadata(loaded_plugins):
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    layout = types.SimpleNamespace(
        verify_lens=torch.tensor([3, 1, 8], dtype=torch.int32),
        extend_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32),
    )
    batch = types.SimpleNamespace(
        batch_size=3,
        seq_lens=torch.tensor([10, 20, 5]),
        forward_mode=ForwardMode.TARGET_VERIFY,
        spec_info=types.SimpleNamespace(ragged_verify_layout=layout, draft_token_num=8, tree_topk=1),
    )
    backend = object.__new__(IntelAMXAttnBackend)
    backend.device = "cpu"
    seq_lens, extend_lens, start_loc, tree_mask = backend._build_extend_metadata(batch)
    assert seq_lens.tolist() == [13, 21, 13]
    assert extend_lens.tolist() == [3, 1, 8] and start_loc.tolist() == [0, 3, 4]
    assert tree_mask is None
    # Without a layout (uniform verify) upstream's own metadata is used: every request verifies 8 tokens.
    batch.spec_info.ragged_verify_layout = None
    seq_lens, extend_lens, start_loc, _ = backend._build_extend_metadata(batch)
    assert extend_lens.tolist() == [8, 8, 8] and seq_lens.tolist() == [18, 28, 13]


@pytest.mark.parametrize("step_dtype, padded", [(torch.float32, 40), (torch.bfloat16, 40), (torch.float32, 37)])
def test_cpu_markov_step_matches_upstream_for_greedy_rows(loaded_plugins, monkeypatch, step_dtype, padded):
    """The CPU Markov-step hook never runs upstream's Philox noise, yet greedy rows get upstream's tokens and the
    kept step logits are upstream's (ties and NaN included), alone or next to sampled rows; with padded columns
    and without (fp32 without padding: the hook's one-add path)."""
    from sglang.kernels.ops.speculative.dspark import markov_sample

    step_cls = markov_sample.MarkovSampleStep
    upstream = step_cls.__dict__["torch"].__func__.__wrapped__  # the original function under the hook
    philox_calls = []
    real_philox = markov_sample._philox
    monkeypatch.setattr(markov_sample, "_philox", lambda *a: philox_calls.append(1) or real_philox(*a))

    rows, width = 5, 37  # padded columns past the bias width must never win
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(rows, padded, generator=gen)
    base[:, width:] = 100.0
    base[1, 4] = base[1, 9] = 50.0  # a tie: the lowest index wins
    base[2, 7] = float("nan")  # a NaN wins over every number
    bias = torch.randn(rows, width, generator=gen) * 0.1

    def run(fn, temperatures):
        out = torch.empty(rows, padded, dtype=step_dtype)
        tokens = fn(step_cls, base_logits=base, bias=bias, temperatures=temperatures, key=1234,
                    offset=torch.tensor([5]), step=2, step_dtype=step_dtype, logits_out=out, has_sampled_rows=None)
        return tokens, out

    hooked = lambda cls, **kw: step_cls.torch(**kw)  # noqa: E731
    for temperatures in (torch.zeros(rows), torch.tensor([0.0, 0.7, 0.0, 1.0, 0.0])):
        philox_calls.clear()
        hooked_tokens, hooked_logits = run(hooked, temperatures)
        assert philox_calls == []
        upstream_tokens, upstream_logits = run(upstream, temperatures)
        assert philox_calls  # upstream draws it even for the all-greedy batch
        greedy = (temperatures == 0).nonzero().squeeze(1)
        assert hooked_tokens[greedy].tolist() == upstream_tokens[greedy].tolist()
        assert hooked_tokens[1] == 4 or temperatures[1] != 0
        assert hooked_tokens[2] == 7 and int(hooked_tokens.max()) < width
        assert torch.equal(hooked_logits.float().nan_to_num(), upstream_logits.float().nan_to_num())


def test_cpu_markov_step_samples_the_step_distribution(loaded_plugins):
    """Sampled rows draw from softmax(step logits / T). 6000 draws (one per block offset) of a 6-token
    distribution at T = 0.8, chi-square test at p > 1e-4: statistic < 25.74, the 5-degree-of-freedom critical value
    (a sampler a few percent off per token fails it)."""
    from sglang_dspark.kernels.markov_step import cpu_markov_step, markov_noise_seed

    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0]])
    bias = torch.tensor([[0.3, 0.0, 0.1, -0.2, 0.0, 0.5]])
    temperature = torch.tensor([0.8])
    draws = 6000
    tokens = torch.cat([cpu_markov_step(logits, bias, temperature, torch.float32,
                                        noise_seed=markov_noise_seed(7, offset, 1)) for offset in range(draws)])
    observed = torch.bincount(tokens, minlength=6).double()
    expected = torch.softmax((logits + bias)[0].double() / 0.8, -1) * draws
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 25.74, (observed.tolist(), expected.tolist())
    # Same seed, same token: a server seed reproduces a run.
    again = cpu_markov_step(logits, bias, temperature, torch.float32, noise_seed=markov_noise_seed(7, 11, 1))
    assert int(again) == int(tokens[11])


def test_cpu_markov_step_shortcuts_give_the_general_paths_numbers():
    """The short paths (fp32 without padding: one add into the kept logits; a batch with no greedy row: no argmax or
    row gather; rows all finite: no fallback masking) give the numbers of the general ones: the same rows through a
    padded base (general add), next to a greedy row (gather), next to a NaN row (fallback)."""
    from sglang_dspark.kernels.markov_step import cpu_markov_step, sample_rows

    gen = torch.Generator().manual_seed(11)
    rows, width = 4, 50
    base = torch.randn(rows, width, generator=gen) * 3
    base[1, 5] = float("-inf")  # a masked token
    bias = torch.randn(rows, width, generator=gen)
    padded = torch.cat([base, torch.full((rows, 2), 100.0)], dim=1)
    for temperatures, seed in ((torch.full((rows,), 0.7), 123), (torch.tensor([0.0, 0.9, 0.0, 1.3]), 77),
                               (torch.zeros(rows), None)):
        kept_fast = torch.empty(rows, 3, width)[:, 1]  # a slot of a block's kept logits: not contiguous
        kept_general = torch.empty(rows, width + 2)
        fast = cpu_markov_step(base, bias, temperatures, torch.float32, kept_fast, noise_seed=seed)
        general = cpu_markov_step(padded, bias, temperatures, torch.float32, kept_general, noise_seed=seed)
        assert torch.equal(fast, general) and int(fast.max()) < width
        assert torch.equal(kept_fast, kept_general[:, :width]) and torch.equal(kept_fast, base + bias)
    # All sampled, without vs with a greedy row beside them: one uniform per sampled row, in row order.
    temperatures = torch.full((rows,), 0.8)
    alone = cpu_markov_step(base, bias, temperatures, torch.float32, noise_seed=5)
    beside = cpu_markov_step(torch.cat([base, base[:1]]), torch.cat([bias, bias[:1]]),
                             torch.cat([temperatures, torch.zeros(1)]), torch.float32, noise_seed=5)
    assert torch.equal(alone, beside[:rows]) and int(beside[rows]) == int((base[0] + bias[0]).argmax())
    # Rows all finite, without vs with a row that falls back to its argmax.
    scaled = (base + bias) / 0.8
    finite = sample_rows(scaled, torch.Generator().manual_seed(9))
    with_nan = sample_rows(torch.cat([scaled, torch.tensor([[0.0, float("nan")] + [0.0] * (width - 2)])]),
                           torch.Generator().manual_seed(9))
    assert torch.equal(finite, with_nan[:rows]) and int(with_nan[rows]) == 1
    assert not torch.isin(torch.tensor([5]), finite[1:2]).any()


def test_version_guard_refuses_other_sglang(monkeypatch):
    import sglang_dspark.version_guard as guard

    monkeypatch.setattr(guard, "installed_sglang_version", lambda: "0.5.24")
    with pytest.raises(RuntimeError, match="sglang==0.5.23"):
        guard.require_supported_sglang()


def test_cpu_markov_sampler_never_draws_a_masked_token_and_keeps_odd_rows_on_argmax():
    """Rows with −inf entries (masked tokens) never draw them, over 2 000 draws; a row holding a NaN or +inf (no
    distribution to sample) takes its argmax, as the Gumbel argmax it replaces did."""
    from sglang_dspark.kernels.markov_step import sample_rows

    masked = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf"), -0.5]])
    generator = torch.Generator().manual_seed(5)
    draws = torch.cat([sample_rows(masked, generator) for _ in range(2000)])
    assert set(draws.tolist()) == {0, 2, 4}
    odd = torch.tensor([[0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0], [float("-inf")] * 3])
    assert sample_rows(odd, generator).tolist() == [1, 1, 0]
