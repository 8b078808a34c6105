"""The speculative length cap (patches/spec_length_headroom.py): binds only near the KV pool's edge, never on a
non-speculative server, and keeps min_new_tokens <= max_new_tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dspark.patches import spec_length_headroom as headroom


def test_decode_headroom_rounds_the_reserve_to_pages_and_adds_one():
    assert headroom.decode_headroom(16, 1) == 17
    assert headroom.decode_headroom(16, 16) == 32
    assert headroom.decode_headroom(17, 16) == 48


@pytest.mark.parametrize(
    "max_new, input_len, expected",
    [(32, 100, 32), (32, 2000, 2047 - 2000 - 1 - 17), (32, 2046, 0), (5, 2020, 5)],
)
def test_cap_binds_only_near_the_edge(max_new, input_len, expected):
    assert headroom.capped_max_new_tokens(max_new, input_len, max_req_len=2047, headroom=17) == expected


class _Spec:
    def __init__(self, none: bool):
        self._none = none

    def is_none(self):
        return self._none


def _scheduler(spec_none: bool):
    return SimpleNamespace(spec_algorithm=_Spec(spec_none), max_req_len=2047,
                           token_to_kv_pool_allocator=SimpleNamespace(page_size=1))


def _req(input_len: int, max_new: int, min_new: int = 0):
    return SimpleNamespace(rid="r", origin_input_ids=[1] * input_len, finished=lambda: False,
                           sampling_params=SimpleNamespace(max_new_tokens=max_new, min_new_tokens=min_new))


def _sglang_clamp(self, req):  # what SGLang's own init_req_max_new_tokens does to a request this size
    params = req.sampling_params
    params.max_new_tokens = max(0, min(params.max_new_tokens, self.max_req_len - len(req.origin_input_ids) - 1))


def test_hook_lowers_the_clamp_on_a_speculative_server(monkeypatch):
    monkeypatch.setattr("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode", lambda: 16)
    req = _req(input_len=2030, max_new=40, min_new=40)
    headroom.init_req_max_new_tokens_with_headroom(_sglang_clamp, _scheduler(spec_none=False), req)
    assert req.sampling_params.max_new_tokens == 0  # 2047 - 2030 - 1 - 17 < 0: nothing fits beside the reserve
    assert req.sampling_params.min_new_tokens == req.sampling_params.max_new_tokens
    far = _req(input_len=100, max_new=40)
    headroom.init_req_max_new_tokens_with_headroom(_sglang_clamp, _scheduler(spec_none=False), far)
    assert far.sampling_params.max_new_tokens == 40  # far from the edge: untouched
    near = _req(input_len=1990, max_new=100)
    headroom.init_req_max_new_tokens_with_headroom(_sglang_clamp, _scheduler(spec_none=False), near)
    assert near.sampling_params.max_new_tokens == 2047 - 1990 - 1 - 17  # 39, where SGLang alone allows 56


def test_hook_keeps_sglangs_bound_without_speculation():
    req = _req(input_len=1990, max_new=100)
    headroom.init_req_max_new_tokens_with_headroom(_sglang_clamp, _scheduler(spec_none=True), req)
    assert req.sampling_params.max_new_tokens == 2047 - 1990 - 1
