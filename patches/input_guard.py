"""Input guard: refuse, with HTTP 400 and a message naming the field, requests that would take the server down.

Stock SGLang 0.5.23 validates most request fields in the tokenizer manager (launcher process), where a
``ValueError`` becomes an HTTP 400. A few inputs slip past those checks and blow up in the scheduler process on a
tensor operation; an exception there is fatal: the scheduler exits, SIGQUITs the launcher, the connection drops and
the whole server is gone (a few more only wedge it, or answer HTTP 500). What stock SGLang does with each input
below (``scripts/fuzz_inputs.py --without-dspark-plugin``): docs/reliability.md, "Inputs the guard refuses". The
guard's answer to each, with and without DSPARK, is checked by ``tests/e2e/test_e2e_input_guard.py``. ``v`` is the
model's ``vocab_size`` (``model_config.vocab_size``); the /v1 rows take the same tokenizer-manager and scheduler path
as the /generate ones once converted.

* empty prompt: /generate ``text: ""`` (also streamed, with n>1, or ``""`` in a batch), ``input_ids: [[5, 6], []]``;
  /v1/completions ``prompt: ["", "x"]``, ``[[5, 6], []]`` → 400 ``text`` / ``input_ids`` (``prompt``). (``text:
  []``, ``prompt: ""`` and ``input_ids: []`` alone: SGLang already answers 200/400.)
* token id >= v or < 0: /generate ``input_ids`` (also one prompt of a batch, streamed, or beside a ``text``, which
  input_ids override), /v1/completions ``prompt`` as token ids → 400 ``input_ids`` (``prompt``).
* top-logprobs count: /generate ``top_logprobs_num``, /v1/completions ``logprobs``, /v1/chat/completions
  ``top_logprobs`` → 400 outside [0, v], naming ``top_logprobs_num`` (``logprobs``, ``top_logprobs``).
* ``logprob_start_len`` < -1, with logprobs (also streamed) → 400 ``logprob_start_len``.
* ``top_k`` >= 2**31 (every endpoint) → 400 ``top_k``.
* ``stop_token_ids`` outside [0, v) → 400 ``stop_token_ids``, with or without ``min_new_tokens`` (without it they
  are never matched, but with it they index the min-new-tokens penalizer).
* ``n`` above 1024 (every endpoint) → 400 ``n``.
* ``stop_regex`` that does not compile → 400 ``stop_regex``.
* a per-prompt list that does not fit the prompts: ``sampling_params``, ``return_logprob``, ``top_logprobs_num``,
  ``logprob_start_len`` or ``rid`` as a list for one prompt, or shorter than the batch → 400 naming that field.

Everything else in the fuzz corpus (``sglang_dspark/testing/fuzz_corpus.py``: negative/zero/huge max_new_tokens,
temperature/top_p/min_p/penalties out of range or 1e308 (JSON has no NaN/inf: SGLang's parser refuses them), top_k
0/-2/above v, n 0/-1/8, empty and 1000-long stop lists, logit_bias bad ids and 1e308 values, invalid regex/JSON
schema/EBNF, image_data/image_url on a text model, 256-prompt batches, sessions, LoRA, hidden states, streaming
variants) SGLang already serves or refuses with a 4xx; the guard leaves it alone.

Where the guard hooks (HookRegistry, this release only: ``install()`` refuses any other SGLang):

* BEFORE ``TokenizerManager.generate_request``: every endpoint's request (native /generate, the OpenAI routes,
  /encode, Engine.generate) passes here, in the launcher process, before anything is tokenized or sent to the
  scheduler. The whole request, batch included, is checked at once, so a batch with one bad prompt is refused
  before any of its other prompts reaches the scheduler. The caller turns the ``ValueError`` into a 400.
* BEFORE ``TokenizerManager._validate_one_request``: the one place every tokenized prompt passes (single, batch,
  parallel sampling, chat templates, multimodal expansion), with its final token ids: the backstop for prompts
  that are non-empty text but tokenize to nothing, and for ids produced by anything but the client.
* AROUND ``http_server.serve_generate_request``: a *streamed* /generate answers HTTP 200 before the tokenizer
  manager runs, so its errors arrive as an SSE error event; the guard runs the request check first and answers a
  real 400 instead (the OpenAI routes already start their streams only after the first chunk).

Requests of a session (``session_params`` with an ``id``) may send no new tokens: the scheduler rebuilds the prompt
from the session's history, so the empty-prompt check skips them (the scheduler itself refuses one that is still
empty).
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from typing import Any, Optional, Sequence

from sglang_dspark.patches.install_once import install_once

logger = logging.getLogger(__name__)

TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
GENERATE_REQUEST_TARGET = f"{TOKENIZER_MANAGER}.generate_request"
VALIDATE_ONE_REQUEST_TARGET = f"{TOKENIZER_MANAGER}._validate_one_request"
SERVE_GENERATE_TARGET = "sglang.srt.entrypoints.http_server.serve_generate_request"

INT32_MAX = 2**31 - 1
# Parallel samples per prompt: SGLang fans ``n`` out into n scheduler requests in the tokenizer manager's event
# loop, so a huge n blocks it (/health times out; docs/reliability.md). 1024 is 8x OpenAI's documented maximum (128).
MAX_PARALLEL_SAMPLES = 1024
TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k (sampling_params.TOP_K_ALL)

# How each endpoint spells the fields the guard checks (the tokenizer manager only sees SGLang's internal names).
_ALIASES = {
    "/v1/completions": {
        "text": "prompt",
        "input_ids": "prompt",
        "top_logprobs_num": "logprobs",
    },
    "/v1/chat/completions": {
        "text": "messages",
        "input_ids": "messages",
        "top_logprobs_num": "top_logprobs",
    },
}


class InputError(ValueError):
    """A request the server must refuse. A ``ValueError``: SGLang's handlers turn it into HTTP 400."""

    status_code = 400

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def field_name(field: str, path: Optional[str]) -> str:
    """``field`` (SGLang's internal name) as the endpoint at ``path`` spells it."""
    return _ALIASES.get(path or "", {}).get(field, field)


def _fail(field: str, path: Optional[str], problem: str, remedy: str) -> InputError:
    name = field_name(field, path)
    return InputError(name, f"Invalid `{name}`: {problem}. {remedy}")


# --- pure checks ---------------------------------------------------------------------------------------------


def _is_batch_of_lists(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and isinstance(value[0], (list, tuple))


def check_token_ids(
    ids: Sequence[int],
    vocab_size: int,
    *,
    field: str = "input_ids",
    path: Optional[str] = None,
    prompt_index: Optional[int] = None,
    allow_empty: bool = False,
) -> None:
    """One prompt's token ids: non-empty (unless ``allow_empty``), integers, each in ``[0, vocab_size)``."""
    where = "" if prompt_index is None else f" (prompt {prompt_index} of the batch)"
    if len(ids) == 0:
        if allow_empty:
            return
        raise _fail(field, path, f"the prompt has no tokens{where}", "Send at least one token.")
    try:
        low, high = min(ids), max(ids)
    except TypeError:
        low = high = None
    if not isinstance(low, int) or not isinstance(high, int) or any(isinstance(t, bool) for t in (low, high)):
        raise _fail(field, path, f"token ids must be integers{where}", "Send a list of integer token ids.")
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        position = list(ids).index(bad)
        raise _fail(
            field,
            path,
            f"token id {bad} at position {position}{where} is outside this model's vocabulary [0, {vocab_size})",
            f"Send token ids produced by this model's tokenizer, each in [0, {vocab_size}).",
        )


def check_prompt_text(text: Any, *, path: Optional[str] = None, empty_text_has_tokens: bool = False) -> None:
    """``text`` (one prompt or a batch): no prompt may be the empty string.

    ``empty_text_has_tokens``: the tokenizer turns "" into tokens (e.g. it adds a BOS token); then an empty text
    is a valid prompt and is let through."""
    if empty_text_has_tokens or text is None:
        return
    if isinstance(text, str):
        if text == "":
            raise _fail("text", path, "the prompt is empty", "Send a non-empty prompt.")
        return
    if isinstance(text, (list, tuple)):
        for i, item in enumerate(text):
            if isinstance(item, str) and item == "":
                raise _fail(
                    "text", path, f"prompt {i} of the batch is empty", "Send a non-empty prompt for every item."
                )


def check_prompt_ids(
    input_ids: Any, vocab_size: int, *, path: Optional[str] = None, allow_empty: bool = False
) -> None:
    """``input_ids`` (one prompt or a batch of prompts)."""
    if input_ids is None:
        return
    if _is_batch_of_lists(input_ids):
        for i, row in enumerate(input_ids):
            check_token_ids(row, vocab_size, path=path, prompt_index=i, allow_empty=allow_empty)
    elif isinstance(input_ids, (list, tuple)):
        # [] alone: SGLang answers 400 itself ("input_ids cannot be empty") except for session requests.
        check_token_ids(input_ids, vocab_size, path=path, allow_empty=True)


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    return int(value)


def check_top_logprobs_num(value: Any, vocab_size: int, *, path: Optional[str] = None) -> None:
    """The count of top logprobs per position (one value, or one per prompt): ``[0, vocab_size]``."""
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if v is None:
            continue
        n = _as_int(v)
        if n is None or not 0 <= n <= vocab_size:
            raise _fail(
                "top_logprobs_num",
                path,
                f"must be an integer in [0, {vocab_size}] (this model's vocabulary size), got {v!r}",
                "Ask for fewer top logprobs per token.",
            )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_logprob_start_len(value: Any, *, path: Optional[str] = None) -> None:
    """Where prompt logprobs start (one value, or one per prompt): -1 (output tokens only) or a position >= 0
    (SGLang's scheduler refuses one beyond the prompt itself)."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if _is_int(v) and v < -1:
            raise _fail(
                "logprob_start_len",
                path,
                f"must be -1 (logprobs of the output only) or a prompt position >= 0, got {v}",
                "Use -1, or the index of the first prompt token whose logprob you want.",
            )


def check_sampling_params(params: Any, vocab_size: int, *, path: Optional[str] = None) -> None:
    """The sampling-parameter fields SGLang 0.5.23 lets through to a fatal tensor operation (or a wedge)."""
    for one in params if isinstance(params, (list, tuple)) else [params]:
        if not isinstance(one, dict):
            continue
        top_k = one.get("top_k")
        if _is_int(top_k) and top_k > INT32_MAX:
            raise _fail(
                "top_k",
                path,
                f"{top_k} is too large (the scheduler keeps top_k as a 32-bit integer)",
                f"Use -1 to sample from the whole vocabulary, or a value in [1, {TOP_K_ALL}].",
            )
        n = one.get("n")
        if _is_int(n) and n > MAX_PARALLEL_SAMPLES:
            raise _fail(
                "n",
                path,
                f"{n} samples per prompt is more than this server accepts in one request ({MAX_PARALLEL_SAMPLES})",
                f"Ask for at most {MAX_PARALLEL_SAMPLES}, or send several requests.",
            )
        stop_regex = one.get("stop_regex")
        for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or []:
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except (re.error, RecursionError, OverflowError) as error:
                    raise _fail(
                        "stop_regex",
                        path,
                        f"{pattern[:80]!r} is not a valid regular expression ({error})",
                        "Send a Python regular expression (escape special characters such as ( and [).",
                    ) from None
        stop_token_ids = one.get("stop_token_ids")
        if isinstance(stop_token_ids, (list, tuple, set)):
            for token_id in stop_token_ids:
                if _is_int(token_id) and not 0 <= token_id < vocab_size:
                    raise _fail(
                        "stop_token_ids",
                        path,
                        f"token id {token_id} is outside this model's vocabulary [0, {vocab_size})",
                        f"Use token ids of this model's tokenizer, each in [0, {vocab_size}).",
                    )


def prompt_count(obj: Any) -> Optional[int]:
    """The number of prompts of a request as received, or None for a single prompt (or an unknown layout)."""
    text = getattr(obj, "text", None)
    if text is not None:
        return len(text) if isinstance(text, (list, tuple)) else None
    input_ids = getattr(obj, "input_ids", None)
    if input_ids is not None:
        return len(input_ids) if _is_batch_of_lists(input_ids) else None
    return None


# Per-prompt fields that, as a list, SGLang indexes by prompt (a short list is an IndexError: HTTP 500).
_PER_PROMPT_LISTS = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num", "rid")


def check_per_prompt_lists(obj: Any, *, path: Optional[str] = None) -> None:
    """List-valued per-prompt fields: one entry per prompt of a batch; a single prompt takes a plain value."""
    count = prompt_count(obj)
    params = getattr(obj, "sampling_params", None)
    n = params[0].get("n", 1) if isinstance(params, list) and params and isinstance(params[0], dict) else 1
    for name in _PER_PROMPT_LISTS:
        value = getattr(obj, name, None)
        if not isinstance(value, list):
            continue
        if count is None:
            if name == "sampling_params" and len(value) == 1 and _is_int(n) and n > 1:
                continue  # SGLang turns a single prompt with n > 1 into a batch of one: a one-item list works
            raise _fail(
                name,
                path,
                f"a single prompt takes one value, not a list of {len(value)}",
                "Send one value, or send the prompts as a list (a batch) with one value per prompt.",
            )
        if len(value) != count:
            raise _fail(
                name,
                path,
                f"the list has {len(value)} entries for a batch of {count} prompts",
                "Send exactly one entry per prompt, or a single value for all of them.",
            )


def _session_supplies_prompt(obj: Any) -> bool:
    session_params = getattr(obj, "session_params", None)
    return isinstance(session_params, dict) and bool(session_params.get("id"))


def check_request(
    obj: Any, vocab_size: int, *, path: Optional[str] = None, empty_text_has_tokens: bool = False
) -> None:
    """A whole request (``GenerateReqInput`` or ``EmbeddingReqInput``, as received, before normalization)."""
    session = _session_supplies_prompt(obj)
    text = getattr(obj, "text", None)
    input_ids = getattr(obj, "input_ids", None)
    if getattr(obj, "input_embeds", None) is None:
        # SGLang tokenizes ``text`` only when no ``input_ids`` came with it (_tokenize_one_request).
        if input_ids is not None:
            check_prompt_ids(input_ids, vocab_size, path=path, allow_empty=session)
        elif text is not None and not _is_batch_of_lists(text):  # a list of lists: cross-encoder pairs
            check_prompt_text(text, path=path, empty_text_has_tokens=empty_text_has_tokens or session)
    check_per_prompt_lists(obj, path=path)
    return_logprob = getattr(obj, "return_logprob", None)
    if any(return_logprob) if isinstance(return_logprob, (list, tuple)) else return_logprob:
        check_top_logprobs_num(getattr(obj, "top_logprobs_num", None), vocab_size, path=path)
        check_logprob_start_len(getattr(obj, "logprob_start_len", None), path=path)
    check_sampling_params(getattr(obj, "sampling_params", None), vocab_size, path=path)


def check_tokenized_prompt(obj: Any, input_ids: Optional[Sequence[int]], vocab_size: int) -> None:
    """One tokenized prompt, just before SGLang's own per-request validation (its final token ids)."""
    if getattr(obj, "input_embeds", None) is not None:
        if len(obj.input_embeds) == 0:
            raise InputError(
                "input_embeds", "Invalid `input_embeds`: the prompt has no embeddings. Send at least one."
            )
        return
    if input_ids is None:
        return  # a multimodal processor builds them later (SGLang's own path)
    if len(input_ids) == 0 and not _session_supplies_prompt(obj):
        raise InputError(
            "prompt",
            "Invalid prompt (`text`/`input_ids` on /generate, `prompt` on /v1/completions, `messages` on "
            "/v1/chat/completions): it has no tokens after tokenization. Send a prompt with at least one token.",
        )
    check_token_ids(input_ids, vocab_size, allow_empty=True)


# --- hooks (run in the launcher process, where the tokenizer manager lives) -------------------------------------


def _request_path(request: Any) -> Optional[str]:
    try:
        return request.url.path
    except AttributeError:
        return None


def _empty_text_has_tokens(tokenizer_manager: Any) -> bool:
    cached = getattr(tokenizer_manager, "_sglang_dspark_empty_text_has_tokens", None)
    if cached is None:
        tokenizer = getattr(tokenizer_manager, "tokenizer", None)
        try:
            cached = tokenizer is not None and len(tokenizer.encode("")) > 0
        except Exception:  # noqa: BLE001 - an odd tokenizer: be strict, the backstop still sees the real ids
            cached = False
        tokenizer_manager._sglang_dspark_empty_text_has_tokens = cached
    return cached


def guard_generate_request(self, obj, request=None, *args, **kwargs):
    """BEFORE hook on ``TokenizerManager.generate_request``: raises ``InputError`` (-> HTTP 400)."""
    check_request(
        obj,
        self.model_config.vocab_size,
        path=_request_path(request),
        empty_text_has_tokens=_empty_text_has_tokens(self),
    )


def guard_validate_one_request(self, obj, input_ids, *args, **kwargs):
    """BEFORE hook on ``TokenizerManager._validate_one_request``."""
    check_tokenized_prompt(obj, input_ids, self.model_config.vocab_size)


async def guard_serve_generate_request(original, obj, request, *args, **kwargs):
    """AROUND hook on ``http_server.serve_generate_request``: a streamed /generate gets a real 400."""
    if getattr(obj, "stream", False):
        http_server = importlib.import_module(SERVE_GENERATE_TARGET.rsplit(".", 1)[0])  # our caller: imported
        tokenizer_manager = http_server._global_state.tokenizer_manager
        try:
            check_request(
                obj,
                tokenizer_manager.model_config.vocab_size,
                path=_request_path(request),
                empty_text_has_tokens=_empty_text_has_tokens(tokenizer_manager),
            )
        except InputError as error:
            logger.info("input guard: %s", error)
            return http_server._create_error_response(error)
    return await original(obj, request, *args, **kwargs)




def _check_targets(targets: dict) -> None:
    """The hooked functions exist with the parameters the hooks expect (they are private to SGLang 0.5.23)."""
    import inspect
    import pkgutil

    for target, params in targets.items():
        fn = pkgutil.resolve_name(target)
        found = list(inspect.signature(inspect.unwrap(fn)).parameters)[: len(params)]
        if found != params:
            raise RuntimeError(f"sglang-dspark input guard: {target} has parameters {found}, expected {params}")


def _is_launcher_process() -> bool:
    """The process SGLang's HTTP server runs in (SGLang starts its scheduler, detokenizer and data-parallel
    controller with ``multiprocessing``, so those have a parent process)."""
    import multiprocessing

    return multiprocessing.parent_process() is None


@install_once
def install() -> None:
    """Register the guard's hooks; SGLang's ``load_plugins`` applies them right after the plugins ran.

    The tokenizer-manager hooks are registered in every process (the tokenizer manager lives in the launcher for
    ``sglang.launch_server`` and ``Engine``; the module is small). The HTTP-layer hook only in the launcher, so
    the scheduler and detokenizer never import the HTTP server.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    hooks = [
        (GENERATE_REQUEST_TARGET, ["self", "obj", "request"], guard_generate_request, HookType.BEFORE),
        (VALIDATE_ONE_REQUEST_TARGET, ["self", "obj", "input_ids"], guard_validate_one_request, HookType.BEFORE),
    ]
    if _is_launcher_process():
        hooks.append((SERVE_GENERATE_TARGET, ["obj", "request"], guard_serve_generate_request, HookType.AROUND))
    _check_targets({target: params for target, params, _, _ in hooks})
    for target, _, hook, hook_type in hooks:
        HookRegistry.register(target, hook, hook_type)
    logger.debug("sglang-dspark: input guard installed (%d hooks)", len(hooks))
