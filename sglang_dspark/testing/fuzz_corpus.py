"""Malformed and extreme requests for the three generation endpoints, and a liveness-checked runner.

Shared by ``tests/e2e/test_e2e_input_guard.py`` (the whole corpus against one no-spec and one DSPARK server) and
``scripts/fuzz_inputs.py`` (the corpus plus random combinations, with restarts, against any server: run it with
``--without-dspark-plugin`` to see what stock SGLang 0.5.23 does with each input).

The oracle is the server itself: after every request its scheduler must not have logged a crash, the process must
run and the health endpoint must answer (``run_corpus``); a request may succeed (2xx) or be refused (4xx with a
message), never kill or wedge the server.

A case is ``FuzzCase(endpoint, body, description, field)``. ``field`` is set where our input guard
(``sglang_dspark.patches.input_guard``) must refuse the request with HTTP 400 and a message naming that field
(stock SGLang 0.5.23 crashes its scheduler on most of those). Cases are data: the vocabulary size of the served
model is the only parameter (``build_corpus(vocab_size)``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Callable, Iterable, NamedTuple, Optional

import requests

from sglang_dspark.local_server import sse_payloads

GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
ENDPOINTS = (GENERATE, COMPLETIONS, CHAT)

# Every valid request stays short: the corpus runs in CI on two CPU cores.
SHORT = 4
PROMPT = "def main():"


class FuzzCase(NamedTuple):
    endpoint: str
    body: dict
    description: str
    field: Optional[str] = None  # the guard must answer 400 naming this field

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _gen(description: str, field: Optional[str] = None, *, text: Any = PROMPT, **body) -> FuzzCase:
    sampling = {"max_new_tokens": SHORT, **body.pop("sampling_params", {})}
    payload = {"sampling_params": sampling, **body}
    if text is not None and "input_ids" not in body:
        payload["text"] = text
    return FuzzCase(GENERATE, payload, description, field)


def _cmp(description: str, field: Optional[str] = None, *, prompt: Any = PROMPT, **body) -> FuzzCase:
    body = {"model": "default", "prompt": prompt, "max_tokens": SHORT, **body}
    return FuzzCase(COMPLETIONS, body, description, field)


def _chat(description: str, field: Optional[str] = None, *, content: Any = PROMPT, **body) -> FuzzCase:
    messages = body.pop("messages", [{"role": "user", "content": content}])
    return FuzzCase(CHAT, {"model": "default", "messages": messages, "max_tokens": SHORT, **body}, description, field)


def build_corpus(vocab_size: int) -> list[FuzzCase]:
    """The corpus for a model whose embedding has ``vocab_size`` rows (``config.json`` ``vocab_size``)."""
    v = vocab_size
    cases = [
        # --- the three reported crashers and their relatives: prompts ---------------------------------------
        _gen("empty text (scheduler: reshape of 0 elements in rotary embedding)", "text", text=""),
        _gen("empty text, streamed", "text", text="", stream=True),
        _gen("batch with one empty text", "text", text=[PROMPT, ""]),
        _gen("batch of one empty text", "text", text=[""]),
        _gen("empty batch of texts", text=[]),
        _gen("empty input_ids", "input_ids", text=None, input_ids=[]),
        _gen("batch with an empty input_ids list", "input_ids", text=None, input_ids=[[5, 6], []]),
        _gen("input_ids == vocab_size (IndexError in embedding)", "input_ids", text=None, input_ids=[5, v]),
        _gen("input_ids far beyond the vocabulary", "input_ids", text=None, input_ids=[10**9]),
        _gen("negative input_ids (IndexError in embedding)", "input_ids", text=None, input_ids=[-1]),
        _gen("negative input_ids, streamed", "input_ids", text=None, input_ids=[-3], stream=True),
        _gen("out-of-vocabulary id in the second prompt of a batch", "input_ids", text=None,
             input_ids=[[5], [6, v + 7]]),
        _gen("input_ids beyond int64", "input_ids", text=None, input_ids=[2**64]),
        _gen("input_ids as floats", text=None, input_ids=[5.5]),
        _gen("input_ids as strings", text=None, input_ids=["5"]),
        _gen("input_ids nested three deep", text=None, input_ids=[[[5]]]),
        _gen("last id of the padded vocabulary (valid)", text=None, input_ids=[5, v - 1]),
        _gen("neither text nor input_ids", text=None),
        _gen("both text and input_ids", input_ids=[5, 6]),
        _gen("both text and input_ids, an id out of vocabulary", "input_ids", input_ids=[5, v]),
        _gen("whitespace-only text (valid: one token)", text=" "),
        _gen("parallel sampling n=2 with empty text", "text", text="", sampling_params={"n": 2, "temperature": 1.0}),
        # --- sampling parameters (/generate) -------------------------------------------------------------------
        _gen("max_new_tokens negative", sampling_params={"max_new_tokens": -1}),
        _gen("max_new_tokens zero", sampling_params={"max_new_tokens": 0}),
        _gen("max_new_tokens beyond the context", sampling_params={"max_new_tokens": 10**9}),
        _gen("max_new_tokens beyond int64", sampling_params={"max_new_tokens": 2**64}),
        _gen("max_new_tokens as a string", sampling_params={"max_new_tokens": "many"}),
        _gen("temperature NaN", sampling_params={"temperature": float("nan")}),
        _gen("temperature +inf", sampling_params={"temperature": float("inf")}),
        _gen("temperature negative", sampling_params={"temperature": -1.0}),
        _gen("temperature tiny positive", sampling_params={"temperature": 2e-6}),
        _gen("temperature huge", sampling_params={"temperature": 1e30}),
        _gen("top_p zero", sampling_params={"top_p": 0.0}),
        _gen("top_p above one", sampling_params={"top_p": 1.5}),
        _gen("top_p NaN", sampling_params={"top_p": float("nan")}),
        _gen("top_p tiny", sampling_params={"top_p": 1e-30, "temperature": 1.0}),
        _gen("top_k zero", sampling_params={"top_k": 0}),
        _gen("top_k -2", sampling_params={"top_k": -2}),
        _gen("top_k above the vocabulary", sampling_params={"top_k": v * 10, "temperature": 1.0}),
        _gen("top_k = int32 max", sampling_params={"top_k": 2**31 - 1, "temperature": 1.0}),
        _gen("top_k beyond int32", "top_k", sampling_params={"top_k": 2**31, "temperature": 1.0}),
        _gen("top_k beyond int64", sampling_params={"top_k": 2**64, "temperature": 1.0}),
        _gen("min_p negative", sampling_params={"min_p": -0.5}),
        _gen("min_p one", sampling_params={"min_p": 1.0, "temperature": 1.0}),
        _gen("min_p NaN", sampling_params={"min_p": float("nan")}),
        _gen("frequency_penalty out of range", sampling_params={"frequency_penalty": 5.0}),
        _gen("presence_penalty NaN", sampling_params={"presence_penalty": float("nan")}),
        _gen("repetition_penalty zero", sampling_params={"repetition_penalty": 0.0}),
        _gen(
            "repetition_penalty denormal (logits / 1e-45 overflow)",
            sampling_params={"repetition_penalty": 1e-45, "temperature": 1.0},
        ),
        _gen("min_new_tokens above max_new_tokens", sampling_params={"min_new_tokens": 10}),
        _gen("min_new_tokens beyond int64", sampling_params={"min_new_tokens": 2**64, "max_new_tokens": 2**64}),
        _gen("n zero", sampling_params={"n": 0}),
        _gen("n negative", sampling_params={"n": -1}),
        _gen("n large", "n", sampling_params={"n": 10**6, "temperature": 1.0}),
        _gen("n moderate (valid)", sampling_params={"n": 8, "temperature": 1.0}),
        _gen("stop empty string", sampling_params={"stop": ""}),
        _gen("stop list with an empty string", sampling_params={"stop": ["", "x"]}),
        _gen("stop list of 1000 strings", sampling_params={"stop": [f"s{i}" for i in range(1000)]}),
        _gen("stop string of 100k characters", sampling_params={"stop": "ab" * 50_000}),
        _gen("stop_token_ids negative", "stop_token_ids", sampling_params={"stop_token_ids": [-1]}),
        _gen("stop_token_ids beyond the vocabulary", "stop_token_ids", sampling_params={"stop_token_ids": [v + 5]}),
        _gen("stop_token_ids beyond int64", sampling_params={"stop_token_ids": [2**64]}),
        _gen("stop_token_ids beyond the vocabulary with min_new_tokens", "stop_token_ids",
             sampling_params={"stop_token_ids": [v + 5], "min_new_tokens": 2}),
        _gen("stop_token_ids negative with min_new_tokens", "stop_token_ids",
             sampling_params={"stop_token_ids": [-1], "min_new_tokens": 2}),
        _gen("stop_regex invalid", "stop_regex", sampling_params={"stop_regex": "("}),
        _gen("stop_regex matching anything (valid)", sampling_params={"stop_regex": ".*"}),
        _gen("logit_bias negative id", sampling_params={"logit_bias": {"-1": 1.0}}),
        _gen("logit_bias id beyond the vocabulary", sampling_params={"logit_bias": {str(v): 1.0}}),
        _gen("logit_bias non-numeric id", sampling_params={"logit_bias": {"abc": 1.0}}),
        _gen("logit_bias value NaN (not JSON: refused by the parser)",
             sampling_params={"logit_bias": {"5": float("nan")}}),
        _gen("logit_bias value 1e308 (inf in float32)",
             sampling_params={"logit_bias": {"5": 1e308}, "temperature": 1.0}),
        _gen("logit_bias value -1e308 on one token",
             sampling_params={"logit_bias": {"5": -1e308}, "temperature": 1.0}),
        _gen("logit_bias value 1e308, greedy", sampling_params={"logit_bias": {"5": 1e308}, "temperature": 0}),
        _gen("logit_bias -1e308 on every token",
             sampling_params={"logit_bias": {str(i): -1e308 for i in range(v)}, "temperature": 1.0}),
        _gen("temperature 1e308 (inf in float32)", sampling_params={"temperature": 1e308}),
        _gen("top_p 1e-308 (0 in float32)", sampling_params={"top_p": 1e-308, "temperature": 1.0}),
        _gen("min_p 1e-308", sampling_params={"min_p": 1e-308, "temperature": 1.0}),
        _gen("sampling_seed beyond int64", sampling_params={"sampling_seed": 2**64, "temperature": 1.0}),
        _gen("unknown sampling parameter", sampling_params={"no_such_param": 1}),
        FuzzCase(GENERATE, {"text": PROMPT, "sampling_params": [{"max_new_tokens": SHORT}] * 2},
                 "sampling_params is a list for one prompt"),
        FuzzCase(GENERATE, {"text": [PROMPT, PROMPT], "sampling_params": [{"max_new_tokens": SHORT}]},
                 "sampling_params list shorter than the batch", "sampling_params"),
        _gen("return_logprob list shorter than the batch", "return_logprob", text=[PROMPT, PROMPT, PROMPT],
             return_logprob=[True, False]),
        _gen("rid list for a single prompt", "rid", rid=["a", "b"]),
        _gen("regex invalid", sampling_params={"regex": "(unclosed"}),
        _gen("json_schema not JSON", sampling_params={"json_schema": "{not json"}),
        _gen("json_schema invalid schema", sampling_params={"json_schema": json.dumps({"type": "nonsense"})}),
        _gen("ebnf invalid", sampling_params={"ebnf": "root ::= ("}),
        _gen("two grammars at once", sampling_params={"regex": "a+", "json_schema": "{}"}),
        # --- logprobs -----------------------------------------------------------------------------------------
        _gen("top_logprobs_num above the vocabulary", "top_logprobs_num", return_logprob=True,
             top_logprobs_num=v + 1),
        _gen("top_logprobs_num huge", "top_logprobs_num", return_logprob=True, top_logprobs_num=10**9),
        _gen("top_logprobs_num negative", "top_logprobs_num", return_logprob=True, top_logprobs_num=-5),
        _gen("top_logprobs_num = vocab (valid)", return_logprob=True, top_logprobs_num=v),
        _gen("logprob_start_len negative", "logprob_start_len", return_logprob=True, logprob_start_len=-7),
        _gen("logprob_start_len -1 (valid)", return_logprob=True, logprob_start_len=-1),
        _gen("logprob_start_len beyond the prompt", return_logprob=True, logprob_start_len=10**6),
        _gen("logprob_start_len 0 (valid)", return_logprob=True, logprob_start_len=0),
        _gen("logprob_start_len -2, streamed", "logprob_start_len", stream=True, return_logprob=True,
             logprob_start_len=-2),
        _gen("top_logprobs_num = vocab with n=2, streamed (valid)", stream=True, return_logprob=True,
             top_logprobs_num=v, sampling_params={"n": 2, "temperature": 1.0}),
        _gen("token_ids_logprob of the whole vocabulary (valid)", return_logprob=True,
             token_ids_logprob=list(range(v))),
        _gen("token_ids_logprob out of vocabulary", return_logprob=True, token_ids_logprob=[v]),
        _gen("token_ids_logprob negative", return_logprob=True, token_ids_logprob=[-1]),
        # --- other request fields -----------------------------------------------------------------------------
        _gen("image_data on a text model", image_data="http://127.0.0.1:9/none.png"),
        _gen("image_data garbage base64 on a text model", image_data="data:image/png;base64,AAAA"),
        _gen("return_hidden_states on a server without it", return_hidden_states=True),
        _gen("custom_logit_processor on a server without it", custom_logit_processor="x"),
        _gen("lora_path on a server without LoRA", lora_path="nope"),
        _gen("session_params with an unknown session", session_params={"id": "nope"}),
        _gen("duplicate rids in a batch", text=[PROMPT, PROMPT], rid=["same", "same"]),
        _gen("rid list shorter than the batch", text=[PROMPT, PROMPT], rid=["one"]),
        _gen("priority beyond int64", priority=2**64),
        _gen("input_embeds without --disable-radix-cache", text=None, input_embeds=[[0.0] * 8]),
        _gen("empty input_ids with an unknown session", text=None, input_ids=[], session_params={"id": "nope"}),
        _gen("watermark with a huge context window", watermark={"enabled": True, "context_window": 10**9}),
        _gen("watermark with an unknown field", watermark={"enabled": True, "bogus": 1}),
        _gen("prompt longer than the context", text=None, input_ids=[5] * 5000),
        _gen("batch of 256 prompts", text=[PROMPT] * 256, sampling_params={"max_new_tokens": 1}),
        _gen("stream with n=2", stream=True, sampling_params={"n": 2, "temperature": 1.0}),
        _gen("plain request (valid)"),
        # --- /v1/completions -----------------------------------------------------------------------------------
        _cmp("empty prompt", prompt=""),
        _cmp("empty prompt list", prompt=[]),
        _cmp("prompt list with an empty string", "prompt", prompt=[PROMPT, ""]),
        _cmp("prompt list with an empty string, streamed", "prompt", prompt=["", PROMPT], stream=True),
        _cmp("empty token-id list in a batch", "prompt", prompt=[[5, 6], []]),
        _cmp("token ids out of vocabulary", "prompt", prompt=[5, v]),
        _cmp("token ids negative", "prompt", prompt=[-2, 5]),
        _cmp("token ids negative, streamed", "prompt", prompt=[-2, 5], stream=True),
        _cmp("batch of token ids, one out of vocabulary", "prompt", prompt=[[5], [v + 1]]),
        _cmp("max_tokens negative", max_tokens=-1),
        _cmp("max_tokens huge", max_tokens=10**9),
        _cmp("temperature NaN", temperature=float("nan")),
        _cmp("top_p zero", top_p=0.0),
        _cmp("top_k beyond int32", "top_k", top_k=2**31, temperature=1.0),
        _cmp("n zero", n=0),
        _cmp("n large", "n", n=10**6, temperature=1.0),
        _cmp("logprobs huge", "logprobs", logprobs=10**6),
        _cmp("logprobs above the vocabulary, streamed", "logprobs", logprobs=v + 1, stream=True),
        _cmp("logprobs negative", "logprobs", logprobs=-1),
        _cmp("echo with logprobs (valid)", echo=True, logprobs=2),
        _cmp("logit_bias bad id", logit_bias={"-5": 1.0}),
        _cmp("logit_bias 1e308", logit_bias={"5": 1e308}),
        _cmp("stop empty list", stop=[]),
        _cmp("stop_token_ids out of vocabulary", "stop_token_ids", stop_token_ids=[v]),
        _cmp("best_of 0", best_of=0),
        _cmp("suffix (unsupported)", suffix="x"),
        _cmp("regex invalid, streamed", regex="(", stream=True),
        _cmp("plain request (valid)"),
        _cmp("plain request, streamed (valid)", stream=True),
        # --- /v1/chat/completions ------------------------------------------------------------------------------
        _chat("no messages", messages=[]),
        _chat("empty user content (valid: the template has tokens)", content=""),
        _chat("content as an empty list of parts", content=[]),
        _chat("image_url part on a text model",
              content=[{"type": "text", "text": "hi"},
                       {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
        _chat("unknown role", messages=[{"role": "wizard", "content": "hi"}]),
        _chat("max_tokens negative", max_tokens=-1),
        _chat("max_completion_tokens huge", max_completion_tokens=10**9, max_tokens=None),
        _chat("temperature +inf", temperature=float("inf")),
        _chat("top_p above one", top_p=2.0),
        _chat("top_k beyond int32", "top_k", top_k=2**31, temperature=1.0),
        _chat("n zero", n=0),
        _chat("n large", "n", n=10**6, temperature=1.0),
        _chat("top_logprobs huge", "top_logprobs", logprobs=True, top_logprobs=10**6),
        _chat("top_logprobs above the vocabulary, streamed", "top_logprobs", logprobs=True, top_logprobs=v + 1,
              stream=True),
        _chat("top_logprobs negative", "top_logprobs", logprobs=True, top_logprobs=-1),
        _chat("logit_bias bad id", logit_bias={str(v + 3): 1.0}),
        _chat("logit_bias 1e308", logit_bias={"5": 1e308}),
        _chat("stop_token_ids negative", "stop_token_ids", stop_token_ids=[-4]),
        _chat("response_format json_schema invalid",
              response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}),
        _chat("response_format json_object (valid)", response_format={"type": "json_object"}),
        _chat("tool_choice required without tools", tool_choice="required"),
        _chat("continue_final_message without an assistant message", continue_final_message=True),
        _chat("plain request (valid)"),
        _chat("plain request, streamed (valid)", stream=True),
        _chat("streamed with include_usage and n=2 (valid)", stream=True, n=2, temperature=1.0,
              stream_options={"include_usage": True}),
    ]
    return [_drop_none(c) for c in cases]


def _drop_none(case: FuzzCase) -> FuzzCase:
    return case._replace(body={k: val for k, val in case.body.items() if val is not None})


# --- sending and the liveness oracle ---------------------------------------------------------------------------


@dataclass
class Reply:
    status: Optional[int]  # None: no HTTP answer at all (connection dropped or timed out)
    message: str = ""  # the error message of a refusal (HTTP 4xx/5xx, or an error event inside a 200 stream)
    error_in_stream: bool = False
    exception: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error_in_stream

    @property
    def refused(self) -> bool:
        return (self.status is not None and 400 <= self.status < 500) or self.error_in_stream


def error_message(payload: Any) -> str:
    """The human-readable message in any of SGLang's error bodies (native, OpenAI, contract, FastAPI 422)."""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict):
        for key in ("message", "error", "detail"):
            if key in payload and payload[key]:
                return error_message(payload[key])
        return ""
    if isinstance(payload, list):
        return "; ".join(filter(None, (error_message(p) for p in payload)))
    return ""


def send(base_url: str, case: FuzzCase, timeout: float = 120.0) -> Reply:
    started = time.monotonic()
    try:
        data = json.dumps(case.body, allow_nan=True)  # NaN/Infinity on purpose: Python's JSON reader accepts them
        response = requests.post(
            base_url + case.endpoint,
            data=data,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
            stream=case.stream,
        )
        reply = Reply(status=response.status_code)
        if case.stream and response.status_code == 200:
            for payload in sse_payloads(response):
                try:
                    event = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(event, dict) and ("error" in event or event.get("object") == "error"):
                    reply.error_in_stream = True
                    reply.message = error_message(event)
        elif response.status_code >= 300:
            try:
                reply.message = error_message(response.json())
            except ValueError:
                reply.message = response.text[:500]
    except requests.RequestException as exc:
        reply = Reply(status=None, exception=f"{type(exc).__name__}: {exc}"[:300])
    reply.seconds = time.monotonic() - started
    return reply


def healthy(base_url: str, timeout: float = 30.0, deep: bool = True) -> bool:
    """``deep``: ``GET /health``, which on SGLang 0.5.23 runs a one-token generation through the scheduler (and
    waits at least 1 s); otherwise ``GET /ping``, the tokenizer manager's health flag (milliseconds)."""
    try:
        return requests.get(base_url + ("/health" if deep else "/ping"), timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


# SGLang's scheduler logs this the moment it dies; the launcher (and /health) follow about 5 s later, after
# "Sleeping 5 seconds before crash diagnostics", so the log is the prompt signal and /health the slow one.
SCHEDULER_CRASH = "Scheduler hit an exception"


class CrashWatch:
    """Counts scheduler crashes in a server's log from where the previous call stopped reading."""

    def __init__(self, log_path):
        self.log_path = log_path
        self.offset = 0
        self.crash_lines: list[str] = []
        self.poll()

    def poll(self) -> int:
        """New crashes since the last poll (and their exception lines, in ``crash_lines``)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return 0
        # Only whole lines: the next poll re-reads a line still being written.
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        text = chunk[:end].decode(errors="replace")
        crashes = text.count(SCHEDULER_CRASH)
        if crashes:
            self.crash_lines += [
                line for line in text.splitlines() if line[:1].isalpha() and ("Error:" in line or "Exception:" in line)
            ]
        return crashes


def alive(
    server, settle: float = 0.0, timeout: float = 30.0, watch: Optional[CrashWatch] = None, deep: bool = True
) -> bool:
    """The scheduler logged no crash (with ``watch``), the process runs and the health endpoint answers 200."""
    if settle:
        time.sleep(settle)
    crashed = watch.poll() if watch is not None else 0
    return not crashed and server.alive() and healthy(server.url, timeout=timeout, deep=deep)


def generation_works(base_url: str, timeout: float = 120.0) -> bool:
    """A real generation round trip (catches a wedged scheduler that ``/health`` alone would not)."""
    try:
        r = requests.post(
            base_url + GENERATE,
            json={"text": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
            timeout=timeout,
        )
        return r.status_code == 200 and len(r.json().get("output_ids", [])) == 2
    except (requests.RequestException, ValueError):
        return False


@dataclass
class Result:
    case: FuzzCase
    reply: Reply
    alive_after: bool
    problems: list = dataclass_field(default_factory=list)


def judge(case: FuzzCase, reply: Reply, alive_after: bool) -> list[str]:
    """What is wrong with the server's answer to ``case`` (empty: nothing)."""
    problems = []
    if not alive_after:
        problems.append("server dead or unhealthy after the request")
    if reply.status is None:
        problems.append(f"no HTTP answer ({reply.exception})")
    elif reply.status >= 500:
        problems.append(f"HTTP {reply.status}: {reply.message[:200]}")
    elif reply.refused and not reply.message.strip():
        problems.append(f"HTTP {reply.status} refusal without a message")
    if case.field is not None:
        if reply.status != 400:
            problems.append(
                f"guarded input: expected HTTP 400, got {reply.status} (stream error: {reply.error_in_stream})"
            )
        elif case.field not in reply.message:
            problems.append(f"guarded input: the message does not name {case.field!r}: {reply.message[:200]}")
    return problems


def run_corpus(
    server,
    cases: Iterable[FuzzCase],
    *,
    timeout: float = 120.0,
    health_every: int = 1,
    on_result: Optional[Callable[[Result], None]] = None,
    stop_on_death: bool = True,
) -> list[Result]:
    """Send each case to ``server`` (an ``SGLangServer``), checking liveness after each one.

    After every case: no scheduler crash in the log (SGLang logs it the moment the scheduler dies; the process and
    /health follow ~5 s later), the process runs, and ``/ping`` answers. Every ``health_every`` cases and after the
    last one: a real ``/health`` (a generation through the scheduler, >= 1 s on SGLang 0.5.23), which also catches
    a wedged scheduler."""
    results = []
    watch = CrashWatch(server.log_path)
    cases = list(cases)
    for i, case in enumerate(cases):
        reply = send(server.url, case, timeout=timeout)
        deep = health_every <= 1 or (i + 1) % health_every == 0 or i == len(cases) - 1
        ok = alive(server, watch=watch, deep=deep)
        result = Result(case, reply, ok, judge(case, reply, ok))
        results.append(result)
        if on_result is not None:
            on_result(result)
        if not ok and stop_on_death:
            break
    return results


def describe(result: Result) -> str:
    c, r = result.case, result.reply
    status = "DROPPED" if r.status is None else str(r.status) + (" +stream-error" if r.error_in_stream else "")
    verdict = "OK " if not result.problems else "BAD"
    line = f"{verdict} {c.endpoint:<22} {status:<18} {r.seconds:6.2f}s  {c.description}"
    if r.message:
        line += f"\n      message: {r.message[:220]}"
    for p in result.problems:
        line += f"\n      problem: {p}"
    return line
