"""Ragged (compact) verify on SGLang's Triton backend (issue #10): the torch reference, the patch's hooks, and parity.

* The torch reference ``kernels/ragged_verify_attention.py`` against an independent per-row formulation.
* The hooks of ``patches/triton_ragged_verify.py`` on stand-in backends (pass-through, restore-on-exit, refusals).
* Parity (``sglang_dspark.engine.self_check.ragged_verify_parity``, in a subprocess with ``TRITON_INTERPRET=1`` so the flag,
  read when ``@triton.jit`` runs, never leaks into this process): the *patched* ``TritonAttnBackend`` (built with
  ``object.__new__``: its ``__init__`` needs a ModelRunner and a device) builds eager and CUDA-graph (capture every
  tier, replay live layouts into the same buffers) metadata; SGLang's own ``extend_attention_fwd`` and the
  deterministic ``extend_attention_fwd_unified`` run with it (through the backend's ``forward_extend``) and match the
  reference within the fp32 tolerance; upstream's unpatched eager metadata is the control and must be wrong.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.kernels.ragged_verify_attention import (
    pad_verify_lens_host,
    ragged_verify_attention_torch,
    ragged_verify_metadata,
)
from sglang_dspark.patches import triton_ragged_verify as patch

# ----------------------------------------------------------------------------------------------------------------------
# The torch reference
# ----------------------------------------------------------------------------------------------------------------------


def _paged_world(seed, hq, hkv, d, prefix, verify, pool_rows=5, max_context=24):
    g = torch.Generator().manual_seed(seed)
    slots = pool_rows * max_context
    req_to_token = torch.randperm(slots, generator=g).view(pool_rows, max_context)
    k = torch.randn(slots, hkv, d, generator=g)
    v = torch.randn(slots, hkv, d, generator=g)
    rows = torch.randperm(pool_rows, generator=g)[: len(prefix)]
    q = torch.randn(sum(verify) + 3, hq, d, generator=g)  # 3 padding rows past the layout
    return q, k, v, req_to_token, rows


def _per_row(q, k, v, req_to_token, rows, prefix, verify, scale):
    """Independent formulation: one query row and one head at a time, explicit key list, float64."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    row = 0
    for r, (p, n) in enumerate(zip(prefix, verify)):
        for i in range(n):
            keys = req_to_token[int(rows[r]), : p + i + 1]  # causal: the prefix and verify rows 0..i
            for h in range(q.shape[1]):
                kh, vh = k[keys, h // group].double(), v[keys, h // group].double()
                w = torch.softmax(kh @ q[row, h].double() * scale, dim=0)
                out[row, h] = w @ vh
            row += 1
    return out


@pytest.mark.parametrize("hq,hkv,d,prefix,verify", [
    (4, 2, 16, [3, 7, 1], [2, 1, 4]),
    (4, 1, 32, [5, 0], [3, 3]),
    (2, 2, 16, [9], [1]),
    (8, 2, 16, [2, 4, 6], [4, 0, 2]),  # a zero-length row (a padding slot of a capped layout)
])
def test_reference_matches_per_row_formulation(hq, hkv, d, prefix, verify):
    q, k, v, r2t, rows = _paged_world(1, hq, hkv, d, prefix, verify)
    scale = 1.0 / math.sqrt(d)
    got = ragged_verify_attention_torch(q, k, v, r2t, rows, prefix, verify)
    want = _per_row(q, k, v, r2t, rows, prefix, verify, scale)
    assert (got.double() - want).abs().max() < 1e-5
    assert torch.count_nonzero(got[sum(verify):]) == 0  # rows past the layout are not written


def test_reference_single_row_is_decode_attention():
    """verify_len 1: the anchor attends to the prefix and itself (bottom-right aligned), like a decode step."""
    q, k, v, r2t, rows = _paged_world(2, 4, 2, 16, [6], [1])
    got = ragged_verify_attention_torch(q, k, v, r2t, rows, [6], [1])[0]
    keys = r2t[int(rows[0]), :7]
    kh = k[keys].repeat_interleave(2, 1).transpose(0, 1)
    vh = v[keys].repeat_interleave(2, 1).transpose(0, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q[0][:, None, :], kh, vh)[:, 0]
    assert (got - want).abs().max() < 1e-5


def test_reference_soft_cap_and_errors():
    q, k, v, r2t, rows = _paged_world(3, 2, 1, 16, [4, 2], [2, 3])
    capped = ragged_verify_attention_torch(q, k, v, r2t, rows, [4, 2], [2, 3], logit_cap=0.5)
    plain = ragged_verify_attention_torch(q, k, v, r2t, rows, [4, 2], [2, 3])
    assert not torch.allclose(capped, plain)
    with pytest.raises(ValueError, match="packs"):
        ragged_verify_attention_torch(q[:2], k, v, r2t, rows, [4, 2], [2, 3])
    with pytest.raises(ValueError, match="multiple"):
        ragged_verify_attention_torch(q[:, :1], k.repeat(1, 2, 1), v.repeat(1, 2, 1), r2t, rows, [4, 2], [2, 3])


def test_metadata_reference():
    m = ragged_verify_metadata([7, 3, 12], [1, 4, 2])
    assert m.qo_indptr.tolist() == [0, 1, 5, 7]
    assert m.extend_start_loc.tolist() == [0, 1, 5]
    assert m.prefix_indptr.tolist() == [0, 7, 10, 22]
    assert m.kv_lens.tolist() == [8, 7, 14] and m.kv_indptr.tolist() == [0, 8, 15, 29]
    assert m.max_q_len == 4 and m.qo_indptr.dtype == torch.int32
    with pytest.raises(ValueError):
        ragged_verify_metadata([1, 2], [1])


@pytest.mark.parametrize("verify,tier,slots,cap,want", [
    ([4, 1], 8, 3, None, [4, 1, 3]),       # leftover 3 on the one padding row
    ([2], 4, 3, None, [2, 1, 1]),          # spread over two padding rows
    ([1, 2], 8, 3, 4, [1, 2, 4]),          # leftover 5 capped at N
    ([2, 3, 1], 8, 3, None, [2, 3, 3]),    # no padding row: the last live row takes the leftover
    ([2, 3, 1], 8, 3, 2, [2, 2, 2]),       # ... and the cap clamps every row
    ([1], 4, 4, None, [1, 1, 1, 1]),
    ([1], 2, 4, None, [1, 1, 0, 0]),       # fewer leftover tokens than padding rows: zero-length rows
])
def test_pad_verify_lens_host(verify, tier, slots, cap, want):
    assert pad_verify_lens_host(verify, tier, slots, cap=cap) == want
    with pytest.raises(ValueError):
        pad_verify_lens_host([1, 1, 1], 4, 2)


# ----------------------------------------------------------------------------------------------------------------------
# Hooks on stand-in backends
# ----------------------------------------------------------------------------------------------------------------------


class _Mode:
    def __init__(self, verify):
        self.verify = verify

    def is_target_verify(self):
        return self.verify


class _Layout:
    """The fields of RaggedVerifyLayout the hooks read; padded_to_bucket as SGLang's (host mirror)."""

    def __init__(self, lens, tier, cap=None, host=True):
        self.verify_lens = torch.tensor(lens, dtype=torch.int32)
        self.qo_indptr_device = ragged_verify_metadata([0] * len(lens), lens).qo_indptr
        self.graph_num_tokens, self.cap = tier, cap
        self.verify_lens_cpu = list(lens) if host else None
        self.calls = []

    @property
    def bs(self):
        return int(self.verify_lens.numel())

    def padded_to_bucket(self, *, padded_bs, cap=None):
        self.calls.append((padded_bs, cap))
        return _Layout(pad_verify_lens_host(self.verify_lens.tolist(), self.graph_num_tokens, padded_bs, cap),
                       self.graph_num_tokens, cap=cap, host=False)


class _Backend:
    """What the hooks read of TritonAttnBackend."""

    def __init__(self, n=4, size=6):
        self.qo_indptr = torch.zeros(size, dtype=torch.int64)
        self.forward_metadata = None
        self.n = n
        self.use_verify_splitkv = True
        self.use_verify_shared_kv = False

    def _target_verify_num_tokens_per_req(self, spec_info):
        return spec_info.num_tokens_per_req if spec_info is not None and spec_info.num_tokens_per_req > 0 else self.n


def _spec(layout, n=4, custom_mask=None):
    return SimpleNamespace(ragged_verify_layout=layout, num_tokens_per_req=n, custom_mask=custom_mask)


def _uniform_eager(self, fb):
    bs = len(fb.req_pool_indices)
    self.forward_metadata = SimpleNamespace(qo_indptr=torch.arange(0, (bs + 1) * 4, 4, dtype=torch.int32),
                                            max_extend_len=4)
    return "upstream"


def test_eager_hook_uses_the_layout():
    b, layout = _Backend(), _Layout([1, 4, 2], 12)
    fb = SimpleNamespace(forward_mode=_Mode(True), spec_info=_spec(layout), req_pool_indices=torch.arange(3))
    assert patch.init_forward_metadata_with_ragged_verify(_uniform_eager, b, fb) == "upstream"
    md = b.forward_metadata
    assert md.qo_indptr.tolist() == [0, 1, 5, 7] and md.max_extend_len == 4  # exact host max
    lens, start = getattr(md, "_dspark_ragged_extend")
    assert lens.tolist() == [1, 4, 2] and start.tolist() == [0, 1, 5]
    device_only = _Layout([3, 1], 8, host=False)
    fb = SimpleNamespace(forward_mode=_Mode(True), spec_info=_spec(device_only), req_pool_indices=torch.arange(2))
    patch.init_forward_metadata_with_ragged_verify(_uniform_eager, b, fb)
    assert b.forward_metadata.qo_indptr.tolist() == [0, 3, 4] and b.forward_metadata.max_extend_len == 4  # N
    assert device_only.calls == []  # same bs: no padding


@pytest.mark.parametrize("fb", [
    SimpleNamespace(forward_mode=_Mode(False), spec_info=_spec(_Layout([1], 4)), req_pool_indices=torch.arange(1)),
    SimpleNamespace(forward_mode=_Mode(True), spec_info=_spec(None), req_pool_indices=torch.arange(2)),
    SimpleNamespace(forward_mode=_Mode(True), spec_info=None, req_pool_indices=torch.arange(2)),
])
def test_eager_hook_leaves_other_batches_to_upstream(fb):
    b = _Backend()
    patch.init_forward_metadata_with_ragged_verify(_uniform_eager, b, fb)
    assert not hasattr(b.forward_metadata, "_dspark_ragged_extend")
    assert b.forward_metadata.qo_indptr[1] == 4


def test_custom_mask_is_refused():
    b = _Backend()
    fb = SimpleNamespace(forward_mode=_Mode(True), spec_info=_spec(_Layout([1, 2], 8), custom_mask=torch.ones(3)),
                         req_pool_indices=torch.arange(2))
    with pytest.raises(NotImplementedError, match="custom"):
        patch.init_forward_metadata_with_ragged_verify(_uniform_eager, b, fb)


def test_graph_buffers_hook_copies_into_the_fixed_buffer():
    b = _Backend()
    buf_ptr = b.qo_indptr.data_ptr()

    def upstream(self, plan, bs, seq_lens, spec_info, rpi):
        self.qo_indptr[: bs + 1] = torch.arange(0, (bs + 1) * 4, 4)
        return (self.qo_indptr[: bs + 1], "kv")

    live = _Layout([1, 2], 8, host=False)  # R = 2 live rows, S = 3 slots: padded and capped like the runner
    out = patch.update_target_verify_buffers_with_ragged_verify(upstream, b, None, 3, None, _spec(live), None)
    assert out[1] == "kv" and live.calls == [(3, 4)]
    assert b.qo_indptr.tolist()[:4] == [0, 1, 3, 7] and b.qo_indptr.data_ptr() == buf_ptr
    lens = getattr(b, "_dspark_ragged_extend_lens_buf")
    assert lens.tolist()[:3] == [1, 2, 4] and lens.dtype == torch.int32
    lens_ptr = lens.data_ptr()
    patch.update_target_verify_buffers_with_ragged_verify(upstream, b, None, 3, None, _spec(_Layout([4, 4, 4], 12)),
                                                          None)
    assert b.qo_indptr.tolist()[:4] == [0, 4, 8, 12]
    assert getattr(b, "_dspark_ragged_extend_lens_buf").data_ptr() == lens_ptr  # never reallocated
    # No layout: upstream's uniform fill stays.
    patch.update_target_verify_buffers_with_ragged_verify(upstream, b, None, 2, None, _spec(None), None)
    assert b.qo_indptr.tolist()[:3] == [0, 4, 8]


def test_graph_layout_padding_rule():
    layout = _Layout([2, 3], 8)
    assert patch.graph_padded_layout(layout, 3, 4).verify_lens.tolist() == [2, 3, 3]
    already = _Layout([2, 3, 3], 8, cap=4)
    assert patch.graph_padded_layout(already, 3, 4) is already
    with pytest.raises(ValueError, match="slots"):
        patch.graph_padded_layout(_Layout([1, 1, 1, 1], 8), 3, 4)


def test_capture_metadata_hook_bounds_the_grid_by_n():
    b = _Backend()

    def upstream(self, bs, mode, spec_info, swa=None):
        return SimpleNamespace(max_extend_len=99, qo_indptr=self.qo_indptr[: bs + 1])

    md = patch.build_cuda_graph_forward_metadata_with_ragged_verify(upstream, b, 3, _Mode(True),
                                                                    _spec(_Layout([3, 3, 2], 8), n=4))
    assert md.max_extend_len == 4
    lens, start = getattr(md, "_dspark_ragged_extend")
    assert lens.numel() == 3 and start.data_ptr() == b.qo_indptr.data_ptr()
    md = patch.build_cuda_graph_forward_metadata_with_ragged_verify(upstream, b, 3, _Mode(False), None)
    assert md.max_extend_len == 99 and not hasattr(md, "_dspark_ragged_extend")


def test_unified_hook_swaps_and_restores():
    b = _Backend()
    seen = {}

    def upstream(self, q, o, layer, fb, *args, **kwargs):
        seen["lens"], seen["start"] = fb.extend_seq_lens, fb.extend_start_loc
        if kwargs.get("boom"):
            raise RuntimeError("boom")
        return "o"

    fb = SimpleNamespace(forward_mode=_Mode(True), extend_seq_lens=None, extend_start_loc=None)
    b.forward_metadata = SimpleNamespace()
    assert patch.forward_extend_unified_with_ragged_verify(upstream, b, 1, 2, 3, fb) == "o"
    assert seen == {"lens": None, "start": None}
    b.forward_metadata._dspark_ragged_extend = ("L", "S")
    patch.forward_extend_unified_with_ragged_verify(upstream, b, 1, 2, 3, fb)
    assert seen == {"lens": "L", "start": "S"} and fb.extend_seq_lens is None and fb.extend_start_loc is None
    with pytest.raises(RuntimeError):
        patch.forward_extend_unified_with_ragged_verify(upstream, b, 1, 2, 3, fb, boom=True)
    assert fb.extend_seq_lens is None and fb.extend_start_loc is None


def test_uniform_verify_kernels_are_skipped_for_ragged_metadata():
    b = _Backend()
    seen = []

    def upstream(self, *args, **kwargs):
        seen.append((self.use_verify_splitkv, self.use_verify_shared_kv))
        return "o"

    b.forward_metadata = SimpleNamespace()
    patch.forward_extend_without_uniform_verify_kernels(upstream, b, "q")
    b.forward_metadata._dspark_ragged_extend = ("L", "S")
    patch.forward_extend_without_uniform_verify_kernels(upstream, b, "q")
    assert seen == [(True, False), (False, False)]
    assert (b.use_verify_splitkv, b.use_verify_shared_kv) == (True, False)


@pytest.mark.parametrize("gfx95", [False, True])
def test_hook_table_targets(monkeypatch, gfx95):
    monkeypatch.setattr(patch, "_uniform_verify_kernels_possible", lambda: gfx95)  # keeps sglang out of this test
    targets = [t for t, _ in patch.hook_table()]
    assert targets[:4] == [patch.EAGER_METADATA_TARGET, patch.GRAPH_BUFFERS_TARGET, patch.GRAPH_METADATA_TARGET,
                           patch.UNIFIED_EXTEND_TARGET]
    assert (patch.FORWARD_EXTEND_TARGET in targets) is gfx95  # the uniform-kernel guard only where they exist
    assert all(t.startswith("sglang.srt.layers.attention.triton_backend.TritonAttnBackend.") for t in targets)


def test_hook_targets_exist_in_sglang_source():
    """The hooked methods and the lines the patch replaces, in the pinned SGLang's source (drift guard)."""
    spec = importlib.util.find_spec("sglang")
    path = os.path.join(list(spec.submodule_search_locations)[0], "srt", "layers", "attention", "triton_backend.py")
    src = open(path).read()
    for target in (patch.EAGER_METADATA_TARGET, patch.GRAPH_BUFFERS_TARGET, patch.GRAPH_METADATA_TARGET,
                   patch.UNIFIED_EXTEND_TARGET, patch.FORWARD_EXTEND_TARGET):
        assert f"    def {target.rsplit('.', 1)[1]}(" in src, target
    assert "ragged_verify_layout" not in src  # still upstream's gap: the patch is needed
    assert "qo_indptr = self.qo_indptr[: bs + 1]" in src and "max_extend_len = self._target_verify_num_tokens_per_req" \
        in src


# ----------------------------------------------------------------------------------------------------------------------
# Parity with SGLang's Triton kernels under the interpreter
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    assert importlib.util.find_spec("triton") is not None, "triton is not installed"
    out = tmp_path_factory.mktemp("ragged_verify") / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_dspark.engine.self_check.ragged_verify_parity", "--device", "cpu", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.exists(), f"parity run failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_parity_every_case_within_fp32_tolerance(parity):
    from sglang_dspark.engine.self_check.ragged_verify_parity import FP32_DOT_PRECISION, FP32_IEEE_ABS_TOL

    cases = parity["triton"]["cases"]
    assert cases, parity
    worst = max(cases, key=lambda c: c["error"])
    assert worst["error"] <= worst["tolerance"] == FP32_IEEE_ABS_TOL, worst
    assert {c["dtype"] for c in cases} == {"float32"}  # the interpreter's bf16 dot multiplies raw bits: GPU only
    kernels = {(c["mode"].split("(")[0], c["kernel"]) for c in cases}
    assert kernels == {(m, k) for m in ("eager", "graph") for k in ("extend_attention_fwd",
                                                                    "extend_attention_fwd_unified")}
    assert parity["precision"]["fp32_dot"] == FP32_DOT_PRECISION  # what Triton read in the harness process


def test_parity_metadata_and_buffer_checks(parity):
    for part in ("shared", "triton"):
        failed = [name for name, ok in parity[part]["checks"].items() if not ok]
        assert not failed and not parity[part]["exceptions"], (part, failed, parity[part]["exceptions"])
    checks = parity["triton"]["checks"]
    assert checks["flag off before the patch"] and checks["flag on after the patch"]
    assert parity["backends"] == ["triton"]  # FlashInfer's part needs a GPU


def test_parity_graph_cases_cover_padding_shapes(parity):
    graph = [c for c in parity["triton"]["cases"] if c["mode"].startswith("graph")]
    assert any(len(c["verify_lens"]) < c["slots"] for c in graph)  # padding slots
    assert any(len(c["verify_lens"]) == c["slots"] and sum(c["verify_lens"]) < c["tier"] for c in graph)  # last row
    assert len({c["tier"] for c in graph}) >= 3  # several tiers sharing S slots


def test_upstream_metadata_is_wrong_control(parity):
    controls = parity["triton"]["controls"]
    assert controls
    for control in controls:
        assert control["ok"] and control["error"] > 100 * control["tolerance"], control
    assert parity["ok"] is True
