"""The input guard's pure checks and hook functions (no server, no SGLang import: seconds)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sglang_dspark.patches import input_guard as ig
from sglang_dspark.testing.fuzz_corpus import ENDPOINTS, build_corpus

V = 4096


def request(**fields):
    """A stand-in for SGLang's GenerateReqInput as received (before normalization)."""
    base = dict(text=None, input_ids=None, input_embeds=None, sampling_params=None, return_logprob=None,
                top_logprobs_num=None, logprob_start_len=None, rid=None, session_params=None, stream=False)
    base.update(fields)
    return SimpleNamespace(**base)


def rejected(fn, *args, **kwargs) -> ig.InputError:
    with pytest.raises(ig.InputError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)  # SGLang's handlers turn ValueError into HTTP 400
    assert info.value.status_code == 400
    assert f"`{info.value.field}`" in str(info.value) or info.value.field == "prompt"
    return info.value


# --- prompts ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", [""], ["def f():", ""], ("x", "")])
def test_empty_text_is_refused(text):
    error = rejected(ig.check_request, request(text=text), V)
    assert error.field == "text" and "empty" in str(error)


def test_empty_text_named_as_the_endpoint_spells_it():
    assert rejected(ig.check_request, request(text=["a", ""]), V, path="/v1/completions").field == "prompt"
    assert rejected(ig.check_request, request(text=""), V, path="/generate").field == "text"


@pytest.mark.parametrize("text", ["x", " ", ["a", "b"], []])
def test_non_empty_text_passes(text):
    ig.check_request(request(text=text), V)  # [] is SGLang's own business (it answers 200 with no outputs)


def test_empty_text_passes_when_the_tokenizer_gives_it_tokens():
    ig.check_request(request(text=""), V, empty_text_has_tokens=True)


def test_input_ids_win_over_text():
    """SGLang tokenizes text only without input_ids: the ids are checked, an empty text beside them is fine."""
    ig.check_request(request(text="", input_ids=[5]), V)
    assert rejected(ig.check_request, request(text="x", input_ids=[V]), V).field == "input_ids"


def test_cross_encoder_pairs_are_not_prompts():
    ig.check_request(request(text=[["query", ""]]), V)


@pytest.mark.parametrize(
    "ids, bad",
    [([V], V), ([5, V + 10], V + 10), ([-1], -1), ([3, -7, 9], -7), ([[5], [6, V]], V), ([10**30], 10**30)],
)
def test_token_ids_outside_the_vocabulary_are_refused(ids, bad):
    error = rejected(ig.check_request, request(input_ids=ids), V)
    assert error.field == "input_ids"
    assert str(bad) in str(error) and f"[0, {V})" in str(error)


def test_token_id_message_names_the_openai_field():
    error = rejected(ig.check_request, request(input_ids=[[1], [2, V]]), V, path="/v1/completions")
    assert error.field == "prompt" and "prompt 1 of the batch" in str(error)


@pytest.mark.parametrize("ids", [[0], [V - 1], [[1, 2], [3]], list(range(V))])
def test_token_ids_inside_the_vocabulary_pass(ids):
    ig.check_request(request(input_ids=ids), V)


def test_empty_row_in_a_batch_is_refused():
    error = rejected(ig.check_request, request(input_ids=[[5, 6], []]), V)
    assert error.field == "input_ids" and "prompt 1" in str(error)


def test_empty_single_input_ids_left_to_sglang():
    ig.check_request(request(input_ids=[]), V)  # SGLang: 400 "input_ids cannot be empty."


def test_session_requests_may_send_no_new_tokens():
    ig.check_request(request(input_ids=[[]], session_params={"id": "s"}), V)
    ig.check_request(request(text="", session_params={"id": "s"}), V)
    ig.check_tokenized_prompt(request(session_params={"id": "s"}), [], V)


@pytest.mark.parametrize("ids", [["5"], [5.5], [None]])
def test_non_integer_ids_are_refused(ids):
    assert rejected(ig.check_token_ids, ids, V).field == "input_ids"


def test_input_embeds_skip_the_token_checks():
    ig.check_request(request(input_embeds=[[0.0] * 8], input_ids=None), V)
    assert rejected(ig.check_tokenized_prompt, request(input_embeds=[]), None, V).field == "input_embeds"


# --- the backstop: final token ids -------------------------------------------------------------------------------


def test_tokenized_prompt_without_tokens_is_refused():
    error = rejected(ig.check_tokenized_prompt, request(text="\u200b"), [], V)
    assert "no tokens after tokenization" in str(error)


def test_tokenized_prompt_out_of_vocabulary_is_refused():
    assert rejected(ig.check_tokenized_prompt, request(), [1, 2, V], V).field == "input_ids"


def test_tokenized_prompt_passes():
    ig.check_tokenized_prompt(request(), [1, 2, V - 1], V)
    ig.check_tokenized_prompt(request(), None, V)  # a multimodal processor fills them in later


# --- logprobs and sampling parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize("num", [V + 1, 10**9, -1, -5, [1, V + 1], 2.5])
def test_top_logprobs_num_outside_the_vocabulary_is_refused(num):
    text = ["x"] * len(num) if isinstance(num, list) else "x"
    error = rejected(ig.check_request, request(text=text, return_logprob=True, top_logprobs_num=num), V)
    assert error.field == "top_logprobs_num"


@pytest.mark.parametrize("path, name", [("/v1/completions", "logprobs"), ("/v1/chat/completions", "top_logprobs")])
def test_top_logprobs_named_as_the_endpoint_spells_it(path, name):
    error = rejected(ig.check_request, request(text="x", return_logprob=True, top_logprobs_num=10**6), V, path=path)
    assert error.field == name


@pytest.mark.parametrize("num", [0, 1, 20, V, None, [0, 5]])
def test_top_logprobs_num_inside_the_vocabulary_passes(num):
    text = ["x"] * len(num) if isinstance(num, list) else "x"
    ig.check_request(request(text=text, return_logprob=True, top_logprobs_num=num), V)


@pytest.mark.parametrize("start", [-2, -7, [0, -3]])
def test_logprob_start_len_below_minus_one_is_refused(start):
    text = ["x"] * len(start) if isinstance(start, list) else "x"
    error = rejected(ig.check_request, request(text=text, return_logprob=True, logprob_start_len=start), V)
    assert error.field == "logprob_start_len" and "-1" in str(error)


@pytest.mark.parametrize("start", [-1, 0, 5, 10**6, None])
def test_logprob_start_len_minus_one_or_more_passes(start):
    ig.check_request(request(text="x", return_logprob=True, logprob_start_len=start), V)
    ig.check_request(request(text="x", return_logprob=False, logprob_start_len=-7), V)  # ignored by SGLang


@pytest.mark.parametrize("top_k", [2**31, 2**63, 2**64])
def test_top_k_beyond_int32_is_refused(top_k):
    error = rejected(ig.check_request, request(text="x", sampling_params={"top_k": top_k}), V)
    assert error.field == "top_k" and "-1" in str(error)


@pytest.mark.parametrize("top_k", [-1, 1, 50, V * 10, 2**30, 2**31 - 1, None])
def test_top_k_within_int32_is_left_to_sglang(top_k):
    ig.check_request(request(text="x", sampling_params={"top_k": top_k}), V)
    ig.check_request(request(text=["x", "y"], sampling_params=[{"top_k": top_k}, {}]), V)


@pytest.mark.parametrize("stop", [[V], [-1], [5, V + 5], {V}])
def test_stop_token_ids_outside_the_vocabulary_are_refused(stop):
    error = rejected(ig.check_request, request(text="x", sampling_params={"stop_token_ids": stop}), V)
    assert error.field == "stop_token_ids" and f"[0, {V})" in str(error)


@pytest.mark.parametrize("stop", [[0], [V - 1], [], None, [None, 5]])
def test_stop_token_ids_inside_the_vocabulary_pass(stop):
    ig.check_request(request(text="x", sampling_params={"stop_token_ids": stop}), V)


def test_too_many_parallel_samples_are_refused():
    error = rejected(ig.check_request, request(text="x", sampling_params={"n": 10**6}), V, path="/v1/chat/completions")
    assert error.field == "n" and str(ig.MAX_PARALLEL_SAMPLES) in str(error)


@pytest.mark.parametrize("n", [-1, 0, 1, 8, ig.MAX_PARALLEL_SAMPLES])
def test_parallel_samples_up_to_the_cap_pass(n):
    ig.check_request(request(text="x", sampling_params={"n": n}), V)


@pytest.mark.parametrize("pattern", ["(", ["ok", "[a-"], "a{2,1}"])
def test_invalid_stop_regex_is_refused(pattern):
    error = rejected(ig.check_request, request(text="x", sampling_params={"stop_regex": pattern}), V)
    assert error.field == "stop_regex" and "regular expression" in str(error)


@pytest.mark.parametrize("pattern", ["\\n\\n", ["a+", "b|c"], None, []])
def test_valid_stop_regex_passes(pattern):
    ig.check_request(request(text="x", sampling_params={"stop_regex": pattern}), V)


def test_single_prompt_with_a_list_of_sampling_params_is_refused():
    error = rejected(ig.check_request, request(text="x", sampling_params=[{}, {}]), V)
    assert error.field == "sampling_params" and "single prompt" in str(error)
    rejected(ig.check_request, request(input_ids=[1, 2], sampling_params=[{}]), V)


def test_single_prompt_with_one_sampling_params_and_n_passes():
    ig.check_request(request(text="x", sampling_params=[{"n": 2}]), V)  # SGLang makes it a batch of one


@pytest.mark.parametrize("name", ["sampling_params", "return_logprob", "top_logprobs_num", "logprob_start_len", "rid"])
def test_per_prompt_lists_must_match_the_batch(name):
    value = [{}] if name == "sampling_params" else [0]
    error = rejected(ig.check_request, request(text=["a", "b"], **{name: value}), V)
    assert error.field == name and "batch of 2 prompts" in str(error)
    ig.check_request(request(text=["a", "b"], **{name: value * 2}), V)
    ig.check_request(request(input_ids=[[1], [2]], **{name: value * 2}), V)


# --- the hook functions, with stand-ins for SGLang's objects ----------------------------------------------------


def fake_tokenizer_manager(empty_tokens=()):
    tokenizer = SimpleNamespace(encode=lambda s: list(empty_tokens) if s == "" else [1] * len(s))
    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=V), tokenizer=tokenizer)


def test_generate_request_hook_names_the_field_for_the_route():
    tm = fake_tokenizer_manager()
    raw = SimpleNamespace(url=SimpleNamespace(path="/v1/completions"))
    with pytest.raises(ig.InputError) as info:
        ig.guard_generate_request(tm, request(text=["a", ""]), raw)
    assert info.value.field == "prompt"
    ig.guard_generate_request(tm, request(input_ids=[0]), None)  # SGLang's own /health request


def test_generate_request_hook_lets_empty_text_through_for_a_bos_tokenizer():
    ig.guard_generate_request(fake_tokenizer_manager(empty_tokens=[1]), request(text=""), None)


def test_validate_one_request_hook():
    tm = fake_tokenizer_manager()
    with pytest.raises(ig.InputError):
        ig.guard_validate_one_request(tm, request(text="x"), [])
    ig.guard_validate_one_request(tm, request(text="x"), [5])


def test_serve_generate_hook_answers_a_streamed_request_with_400(monkeypatch):
    """A streamed /generate is checked before SGLang starts its 200 event stream; others go straight through."""
    import sys
    import types

    fake_http_server = types.ModuleType("sglang.srt.entrypoints.http_server")
    fake_http_server._global_state = SimpleNamespace(tokenizer_manager=fake_tokenizer_manager())
    fake_http_server._create_error_response = lambda e: ("error response", getattr(e, "status_code", None), str(e))
    monkeypatch.setitem(sys.modules, "sglang.srt.entrypoints.http_server", fake_http_server)
    calls = []

    async def original(obj, raw):
        calls.append(obj)
        return "served"

    raw = SimpleNamespace(url=SimpleNamespace(path="/generate"))
    answer = asyncio.run(ig.guard_serve_generate_request(original, request(text="", stream=True), raw))
    assert answer[:2] == ("error response", 400) and "`text`" in answer[2]
    assert calls == []
    assert asyncio.run(ig.guard_serve_generate_request(original, request(text="x", stream=True), raw)) == "served"
    # Not streamed: straight to SGLang (the tokenizer-manager hook raises the 400 there).
    assert asyncio.run(ig.guard_serve_generate_request(original, request(text="", stream=False), raw)) == "served"
    assert len(calls) == 2


def test_field_aliases():
    assert ig.field_name("input_ids", "/v1/completions") == "prompt"
    assert ig.field_name("top_logprobs_num", "/v1/chat/completions") == "top_logprobs"
    assert ig.field_name("top_k", "/v1/chat/completions") == "top_k"
    assert ig.field_name("input_ids", None) == "input_ids"


# --- the shared fuzz corpus is well-formed ----------------------------------------------------------------------


def test_fuzz_corpus_shape():
    corpus = build_corpus(V)
    assert len(corpus) > 100
    assert {c.endpoint for c in corpus} == set(ENDPOINTS)
    descriptions = [(c.endpoint, c.description) for c in corpus]
    assert len(descriptions) == len(set(descriptions)), "duplicate case descriptions"
    for case in corpus:
        assert isinstance(case.body, dict) and case.description
    # The three reported crashers are in it, each expecting a 400 naming its field.
    fields = {(c.endpoint, c.field) for c in corpus if c.field}
    assert {("/generate", "text"), ("/generate", "input_ids"), ("/v1/completions", "prompt")} <= fields
