"""oneDNN packed linear on the CPU (sglang_dspark/cpu/packed_linear.py) and its hooks (patches/cpu_packed_linear.py).

* parity with ``F.linear`` (fp32 to 1e-4 relative, bf16 to bf16 rounding) for every input shape SGLang passes;
* each output row depends only on its input row, bit for bit (why a verify row equals the decode row);
* only bucketed row counts reach oneDNN (its per-shape primitives would otherwise grow a server's memory with every
  prompt length), all of them built at a shape's first call; more than MAX_PACKED_ROWS rows stay on F.linear;
* the hooks take SGLang's real ``UnquantizedLinearMethod.apply`` / ``LogitsProcessor._compute_lm_head`` path only in
  the plain case, pack once, and re-pack after a weight update or a replaced weight tensor.
"""

from __future__ import annotations

import pkgutil
import types

import pytest
import torch
import torch.nn.functional as F

from sglang_dspark.cpu.packed_linear import (
    MAX_PACKED_ROWS,
    ROW_BUCKETS,
    can_pack,
    fits,
    pack_weight,
    packed_linear,
    packing_available,
    packs_dtype,
    reference_linear,
    row_bucket,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("leading", [(1,), (2,), (8,), (37,), (0,), (2, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_parity_with_f_linear_fp32(leading, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 40)
    bias = torch.randn(96) if with_bias else None
    x = torch.randn(*leading, 40)
    got = packed_linear(x, pack_weight(weight), bias)
    want = reference_linear(x, weight, bias)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_parity_bf16_and_strided_input():
    torch.manual_seed(1)
    weight = torch.randn(64, 48)
    x = torch.randn(5, 96)[:, ::2]  # not contiguous
    torch.testing.assert_close(packed_linear(x, pack_weight(weight)), F.linear(x, weight), rtol=1e-4, atol=1e-4)
    wb, xb = weight.bfloat16(), torch.randn(7, 48).bfloat16()
    assert can_pack(wb) == packs_dtype(torch.bfloat16)
    if not packs_dtype(torch.bfloat16):  # an AVX2 CPU: bf16 weights are not offered for packing (next test)
        return
    got = packed_linear(xb, pack_weight(wb))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(xb.float(), wb.float()), rtol=2e-2, atol=5e-2)


def test_bf16_weights_are_packed_only_where_onednn_can(monkeypatch):
    """On a CPU without bf16 support oneDNN's reorder raises; can_pack must refuse such weights beforehand (a bf16
    server would otherwise stop at start-up), and say yes where the CPU has it."""
    wb = torch.randn(16, 8).bfloat16()
    try:
        pack_weight(wb)
        reorder_works = True
    except RuntimeError:
        reorder_works = False
    assert packs_dtype(torch.bfloat16) == reorder_works  # the probe agrees with what the reorder does here
    assert can_pack(wb) == reorder_works and can_pack(torch.randn(16, 8))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    packs_dtype.cache_clear()
    try:
        assert not can_pack(wb) and can_pack(torch.randn(16, 8))
    finally:
        monkeypatch.undo()
        packs_dtype.cache_clear()


def test_a_row_does_not_depend_on_the_other_rows():
    """A verify forward's row for a token equals the decode forward's row for it, bit for bit, at any M."""
    torch.manual_seed(2)
    packed = pack_weight(torch.randn(3072, 576))
    x = torch.randn(16, 576)
    alone = packed_linear(x[:1], packed)
    for rows in (2, 3, 8, 16):
        assert torch.equal(packed_linear(x[:rows], packed)[:1], alone), rows


def test_only_bucketed_row_counts_reach_onednn(monkeypatch):
    """Every row count from 1 to MAX_PACKED_ROWS gives F.linear's rows, yet oneDNN only ever sees ROW_BUCKETS."""
    torch.manual_seed(6)
    seen = []
    onednn = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda *args: seen.append(args[0].shape[0]) or onednn(*args))
    weight, bias = torch.randn(40, 24), torch.randn(40)
    packed = pack_weight(weight)
    x = torch.randn(MAX_PACKED_ROWS, 24)
    alone = packed_linear(x[:1], packed, bias)
    assert seen == [*ROW_BUCKETS, 1]  # the first call built every bucket of this shape
    for rows in range(1, MAX_PACKED_ROWS + 1):
        got = packed_linear(x[:rows], packed, bias)
        assert got.shape == (rows, 40)
        torch.testing.assert_close(got, F.linear(x[:rows], weight, bias), rtol=1e-4, atol=1e-4)
        assert torch.equal(got[:1], alone), rows  # zero padding to the bucket changes no real row
    assert set(seen) == set(ROW_BUCKETS)
    assert [row_bucket(r) for r in (1, 8, 9, 13, 65, 256)] == [1, 8, 12, 16, 96, 256]
    too_many = torch.randn(MAX_PACKED_ROWS + 1, 24)
    assert not fits(too_many) and fits(x)
    with pytest.raises(ValueError, match="at most"):
        packed_linear(too_many, packed)


def test_what_can_be_packed():
    assert can_pack(torch.randn(4, 3))
    assert can_pack(torch.randn(4, 3).bfloat16()) == packs_dtype(torch.bfloat16)  # bf16: where oneDNN has it
    assert not can_pack(torch.randn(4, 3).half())
    assert not can_pack(torch.randn(4))
    assert not can_pack(torch.randn(4, 3, requires_grad=True))
    assert not can_pack(torch.randint(0, 3, (4, 3)))
    assert not can_pack(None)


# ---------------------------------------------------------------------------------------------- SGLang hooks

unquant = pytest.importorskip("sglang.srt.layers.quantization.unquant")
from sglang_dspark.patches import cpu_packed_linear  # noqa: E402


def test_every_hook_target_resolves():
    targets = [cpu_packed_linear.LINEAR_APPLY, cpu_packed_linear.COMPUTE_LM_HEAD, *cpu_packed_linear._WEIGHT_UPDATERS,
               cpu_packed_linear.STACKED_CONTEXT_KV]
    for target in targets:
        owner, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), attr)), target


def _layer(out=24, inp=16, bias=False):
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(out, inp), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(out), requires_grad=False) if bias else None
    return layer


class _Calls:
    def __init__(self, fn):
        self.fn, self.count = fn, 0

    def __call__(self, *args, **kwargs):
        self.count += 1
        return self.fn(*args, **kwargs)


def test_linear_hook_uses_the_packed_weight_and_repacks_when_it_changes():
    torch.manual_seed(3)
    method = unquant.UnquantizedLinearMethod()
    original = _Calls(unquant.UnquantizedLinearMethod.apply)
    layer = _layer(bias=True)
    x = torch.randn(3, 16)
    got = cpu_packed_linear.linear_through_packed_weight(original, method, layer, x, layer.bias)
    assert original.count == 0
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
    first = layer.__dict__[cpu_packed_linear._PACKED_ATTR]
    cpu_packed_linear.linear_through_packed_weight(original, method, layer, x, layer.bias)
    assert layer.__dict__[cpu_packed_linear._PACKED_ATTR] is first  # packed once

    # An in-place update through .data (how SGLang's weight loaders write) is invisible to the tensor; the
    # weight-update hook makes every packed copy stale.
    with torch.no_grad():
        layer.weight.data.copy_(torch.randn(24, 16))
    cpu_packed_linear.weights_changed(None, object())
    got = cpu_packed_linear.linear_through_packed_weight(original, method, layer, x, layer.bias)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)

    layer.weight = torch.nn.Parameter(torch.randn(24, 16), requires_grad=False)  # a replaced tensor
    got = cpu_packed_linear.linear_through_packed_weight(original, method, layer, x, layer.bias)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)
    assert original.count == 0


@pytest.mark.parametrize("case", ["dtype mismatch", "bias dtype", "amx layer", "3-D weight", "prefill-sized"])
def test_linear_hook_leaves_other_cases_to_sglang(case):
    method = unquant.UnquantizedLinearMethod()
    original = _Calls(lambda self, layer, x, bias=None: "sglang")
    layer = _layer()
    x, bias = torch.randn(2, 16), None
    if case == "dtype mismatch":
        x = x.bfloat16()
    elif case == "bias dtype":
        bias = torch.randn(24).bfloat16()
    elif case == "amx layer":
        layer.use_intel_amx_backend = True
    elif case == "prefill-sized":
        x = torch.randn(MAX_PACKED_ROWS + 1, 16)
    else:
        layer.weight = torch.nn.Parameter(torch.randn(2, 24, 16), requires_grad=False)
    assert cpu_packed_linear.linear_through_packed_weight(original, method, layer, x, bias) == "sglang"
    assert original.count == 1


def _logits_processor(**fields):
    values = {"use_fp32_lm_head": False, "rl_on_policy_target": None}
    values.update(fields)
    return types.SimpleNamespace(**values)


def test_lm_head_hook_matches_sglangs_plain_branch():
    torch.manual_seed(4)
    head = _layer(out=300, inp=16)
    head.quant_method = unquant.UnquantizedEmbeddingMethod()
    hidden = torch.randn(5, 16)
    original = _Calls(lambda *a, **k: "sglang")
    got = cpu_packed_linear.lm_head_through_packed_weight(original, _logits_processor(), hidden, head)
    assert original.count == 0
    torch.testing.assert_close(got, torch.matmul(hidden, head.weight.T), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["fp32 lm head", "rl on-policy", "lora"])
def test_lm_head_hook_leaves_other_branches_to_sglang(case):
    head = _layer(out=300, inp=16)
    processor = _logits_processor()
    if case == "fp32 lm head":
        processor.use_fp32_lm_head = True
    elif case == "rl on-policy":
        processor.rl_on_policy_target = "fsdp"
    else:
        head.set_lora, head.apply_lora = object(), object()
    original = _Calls(lambda *a, **k: "sglang")
    assert cpu_packed_linear.lm_head_through_packed_weight(original, processor, torch.randn(2, 16), head) == "sglang"
    assert original.count == 1


def test_sps_cache_key_tells_the_linear_backends_apart(monkeypatch, tmp_path):
    """A table timed with MKL's products grows with the verify length several times faster than with packed ones: a
    server must not reuse one for the other (profiler/engine_measurer.py puts the backend in the cache key)."""
    from sglang_dspark.profiler import engine_measurer
    from sglang_dspark.profiler.sps_cache import make_cache_key

    (tmp_path / "config.json").write_text("{}")
    keys = {}
    for installed in (False, True):
        monkeypatch.setattr(cpu_packed_linear, "installed", lambda installed=installed: installed)
        extra = engine_measurer._linear_backend_entry("cpu")
        keys[installed] = make_cache_key(model_path=tmp_path, dtype="float32", device="cpu", tp_size=1,
                                         attention_backend="IntelAMXAttnBackend", max_total_tokens=1024,
                                         probe_grid={"requests": [1]}, extra=extra).digest()
    assert keys[False] != keys[True]
    assert engine_measurer._linear_backend_entry("cuda:0") == {}


def test_draft_model_module_multiplies_through_torch_functional():
    """The routed module name must be the one whose ``F.linear`` computes the stacked K/V projection."""
    import inspect

    module = pkgutil.resolve_name(cpu_packed_linear.DRAFT_MODEL_MODULE)
    assert module.F is F or isinstance(module.F, cpu_packed_linear._FunctionalWithPackedLinear)
    source = inspect.getsource(module.DSparkDraftMixin._project_ctx_kv_stacked)
    assert 'F.linear(ctx_hidden, stacked["weight"]' in source


def test_draft_torch_linears_take_the_packed_path(monkeypatch):
    """The draft's ``fc`` (a torch nn.Linear) runs through a packed copy, made once and remade after an update;
    subclasses and prefill-sized inputs keep torch's forward."""
    monkeypatch.setattr(cpu_packed_linear, "installed", lambda: True)
    monkeypatch.setattr(cpu_packed_linear, "_route_draft_model_functional", lambda: None)

    class Scaled(torch.nn.Linear):  # a subclass may compute something else: left alone
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), Scaled(24, 8)).requires_grad_(False)
    assert cpu_packed_linear.pack_draft_context_products(model) == 1
    x = torch.randn(5, 16)
    fc = model[0]
    torch.testing.assert_close(fc(x), F.linear(x, fc.weight, fc.bias), rtol=1e-4, atol=1e-4)
    first = fc.__dict__[cpu_packed_linear._PACKED_ATTR]
    fc(x)
    assert fc.__dict__[cpu_packed_linear._PACKED_ATTR] is first
    torch.testing.assert_close(model(x), 2 * F.linear(F.linear(x, fc.weight, fc.bias), model[1].weight,
                                                      model[1].bias), rtol=1e-4, atol=1e-4)
    assert cpu_packed_linear._PACKED_ATTR not in model[1].__dict__
    with torch.no_grad():
        fc.weight.data.copy_(torch.randn(24, 16))
    cpu_packed_linear.weights_changed(None, object())
    torch.testing.assert_close(fc(x), F.linear(x, fc.weight, fc.bias), rtol=1e-4, atol=1e-4)
    big = torch.randn(MAX_PACKED_ROWS + 1, 16)
    torch.testing.assert_close(fc(big), F.linear(big, fc.weight, fc.bias))  # left to torch: bit-identical


def test_draft_fc_as_sglang_builds_it_is_packed_when_serving(monkeypatch):
    """SGLang's DFlash ``fc`` is a plain nn.Linear whose parameters keep ``requires_grad=True``: served (no grad,
    inference mode) it takes the packed path; with grad on, torch's product, so autograd still sees it."""
    monkeypatch.setattr(cpu_packed_linear, "installed", lambda: True)
    monkeypatch.setattr(cpu_packed_linear, "_route_draft_model_functional", lambda: None)
    calls = _Calls(cpu_packed_linear.packed_linear)
    monkeypatch.setattr(cpu_packed_linear, "packed_linear", calls)
    torch.manual_seed(11)
    fc = torch.nn.Linear(48, 16, bias=False)
    assert fc.weight.requires_grad
    assert cpu_packed_linear.pack_draft_context_products(fc) == 1
    x = torch.randn(8, 48)
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            torch.testing.assert_close(fc(x), F.linear(x, fc.weight), rtol=1e-4, atol=1e-4)
    assert calls.count == 2
    out = fc(x)
    assert calls.count == 2 and out.requires_grad  # grad on: torch's product
    out.sum().backward()
    assert fc.weight.grad is not None


def test_stacked_kv_weight_gets_a_packed_copy_the_routed_functional_uses(monkeypatch):
    routed = cpu_packed_linear._FunctionalWithPackedLinear()
    assert routed.relu is F.relu and routed.silu is F.silu  # every other function is torch's own
    torch.manual_seed(7)
    weight, bias, x = torch.randn(40, 16), torch.randn(40), torch.randn(6, 16)
    calls = _Calls(cpu_packed_linear.packed_linear)
    monkeypatch.setattr(cpu_packed_linear, "packed_linear", calls)
    torch.testing.assert_close(routed.linear(x, weight, bias), F.linear(x, weight, bias))
    assert calls.count == 0  # no packed copy attached: torch's F.linear
    stacked = {"weight": weight, "bias": bias}
    assert cpu_packed_linear.attach_packed_copy(stacked, object()) is stacked
    first = weight.__dict__[cpu_packed_linear._PACKED_ATTR]
    cpu_packed_linear.attach_packed_copy(stacked, object())
    assert weight.__dict__[cpu_packed_linear._PACKED_ATTR] is first  # packed once
    torch.testing.assert_close(routed.linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
    assert calls.count == 1
    cpu_packed_linear.weights_changed(None, object())  # stale copy: torch's F.linear until re-attached
    routed.linear(x, weight, bias)
    assert calls.count == 1
    cpu_packed_linear.attach_packed_copy(stacked, object())
    routed.linear(x, weight, bias)
    assert calls.count == 2
    assert cpu_packed_linear.attach_packed_copy(None, object()) is None  # upstream found no stacked layout
