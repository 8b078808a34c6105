"""Soak a running SGLang server: concurrent streaming clients, client-side aborts, mixed sampling, near the KV limit.

Used by ``tests/e2e/test_e2e_soak.py`` (about a minute of load) and ``scripts/soak.py`` (longer, prints the figures).
Loopback only; bounded in requests and in time.

What one run does (:func:`run_soak`):

1. Greedy probe: a fixed prompt, greedy, ``ignore_eos``; its output ids are kept.
2. Warm-up: ``warmup_requests`` requests of the same mix as the soak, then wait until the server is idle; the
   scheduler processes' RSS (``VmRSS`` of ``/proc/<pid>/status``; schedulers are the server's child processes whose
   command line starts with ``sglang::scheduler``) is read now: the baseline.
3. Soak: ``concurrency`` client threads send requests until ``duration_s`` or ``max_requests`` is reached. Each
   request picks a kind (OpenAI ``/v1/chat/completions`` stream or not, ``/generate`` stream or not), sampling
   parameters (greedy, temperature, top-p, top-k, min-p, penalties, stop strings) and a length; a share
   ``near_limit_share`` of the ``/generate`` requests has ``len(prompt) + max_new_tokens`` close to, and sometimes
   above, the KV pool (``--max-total-tokens``). A share ``abort_share`` of the requests is abandoned by the client
   on purpose: a stream is closed after a few chunks, a non-streamed request after a short read timeout (the
   connection is closed mid-request in both cases; SGLang aborts such requests when it sees the disconnect).
4. After: wait until ``/v1/loads`` reports no running or waiting request, then read ``num_used_tokens`` (KV tokens
   held by requests, ``max_total - available - evictable``: the radix cache's evictable prefix tokens are not
   "used"), ``/health``, the schedulers' RSS, and the greedy probe again.

Every request ends in exactly one outcome: ``completed`` (a finish reason ``length``/``stop``), ``aborted`` (the
client abandoned it on purpose), ``refused`` (an HTTP 4xx with an error message, an error event in a stream, or a
finish reason ``abort`` with a message: answered with a clear status) or ``error`` (anything else: 5xx, connection
refused or reset, a stream ending without a finish reason, a timeout that was not planned). No request is lost
when ``errors == 0`` and ``completed + aborted + refused == requests``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import requests

from sglang_dspark.local_server import sse_payloads

GREEDY_PROBE = {"text": "def main():", "max_new_tokens": 48}

# Sampling parameter mix (SGLang /generate names; the chat kinds map them to the OpenAI body, where SGLang accepts
# top_k, min_p and repetition_penalty as extra fields).
SAMPLING_MIX = (
    {"temperature": 0},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 20},
    {"temperature": 0.7, "min_p": 0.05},
    {"temperature": 1.0, "frequency_penalty": 0.5, "presence_penalty": 0.3},
    {"temperature": 0.9, "top_k": 10, "top_p": 0.8, "repetition_penalty": 1.1},
    {"temperature": 0, "stop": ["\n\n"]},
)
KINDS = ("chat_stream", "generate_stream", "generate", "chat")
KIND_WEIGHTS = (0.35, 0.35, 0.15, 0.15)
CODE_WORDS = ("def", "return", "self", "import", "class", "for", "in", "range", "if", "else", "None", "True",
              "print", "value", "items", "(", ")", ":", ",", "=", "[", "]", "\n", "    ")
OUTCOMES = ("completed", "aborted", "refused", "error")


@dataclass
class SoakConfig:
    duration_s: float = 60.0  # new requests are issued until then ...
    min_requests: int = 0  # ... or until this many were issued, whichever is later,
    hard_limit_s: float = 600.0  # but never after this (a slow, shared machine still ends)
    concurrency: int = 6
    max_requests: int = 300
    warmup_requests: int = 24
    abort_share: float = 0.2
    near_limit_share: float = 0.25
    max_total_tokens: int = 2048  # the server's --max-total-tokens
    vocab_low: int = 10  # input_ids are drawn from [vocab_low, vocab_high): ordinary tokens of the model
    vocab_high: int = 3990
    seed: int = 0
    request_timeout_s: float = 300.0
    idle_timeout_s: float = 180.0


@dataclass
class SoakReport:
    requests: int = 0
    outcomes: dict = field(default_factory=lambda: {name: 0 for name in OUTCOMES})
    by_kind: dict = field(default_factory=dict)  # kind -> outcome -> count
    refusals: dict = field(default_factory=dict)  # short reason -> count
    error_samples: list = field(default_factory=list)
    warmup_errors: list = field(default_factory=list)
    near_limit_requests: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    scheduler_pids: list = field(default_factory=list)
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    kv_used_before: Optional[int] = None
    kv_used_after: Optional[int] = None
    running_after: Optional[int] = None
    waiting_after: Optional[int] = None
    healthy_after: bool = False
    greedy_before: list = field(default_factory=list)
    greedy_after: list = field(default_factory=list)

    @property
    def rss_drift(self) -> float:
        return (self.rss_after_kb - self.rss_before_kb) / self.rss_before_kb if self.rss_before_kb else float("nan")

    @property
    def greedy_unchanged(self) -> bool:
        return bool(self.greedy_before) and self.greedy_before == self.greedy_after

    @property
    def accounted(self) -> bool:
        return sum(self.outcomes.values()) == self.requests

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(rss_drift=self.rss_drift, greedy_unchanged=self.greedy_unchanged, accounted=self.accounted)
        return data

    def lines(self) -> list[str]:
        o = self.outcomes
        rate = self.requests / self.elapsed_s if self.elapsed_s else 0.0
        return [
            f"requests: {self.requests} in {self.elapsed_s:.0f} s ({rate:.2f} req/s), "
            f"{self.near_limit_requests} near the KV limit, {self.completion_tokens} completion tokens",
            f"outcomes: completed {o['completed']}, aborted by the client {o['aborted']}, refused {o['refused']}, "
            f"errors {o['error']} (all accounted for: {self.accounted})",
            "by kind: " + "; ".join(f"{k}: {dict(v)}" for k, v in sorted(self.by_kind.items())),
            "refusals: " + (", ".join(f"{k} x{v}" for k, v in self.refusals.items()) or "none"),
            f"scheduler RSS (pids {self.scheduler_pids}): {self.rss_before_kb / 1024:.1f} MiB after warm-up -> "
            f"{self.rss_after_kb / 1024:.1f} MiB after the soak ({self.rss_drift * 100:+.2f} %)",
            f"KV tokens in use: {self.kv_used_before} before -> {self.kv_used_after} after "
            f"(running {self.running_after}, waiting {self.waiting_after})",
            f"healthy after: {self.healthy_after}; greedy probe unchanged: {self.greedy_unchanged}",
        ] + [f"error sample: {e}" for e in self.error_samples[:5]]


# --- server state ------------------------------------------------------------------------------------------------


def scheduler_pids(server_pid: int) -> list[int]:
    """PIDs of the server's scheduler processes: its children whose command line starts with ``sglang::scheduler``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != server_pid:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if cmdline.startswith("sglang::scheduler"):
            found.append(int(entry))
    return sorted(found)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def loads(url: str) -> dict:
    """The first DP rank's entry of ``GET /v1/loads`` (num_running_reqs, num_waiting_reqs, num_used_tokens, ...)."""
    response = requests.get(f"{url}/v1/loads", timeout=30)
    response.raise_for_status()
    return response.json()["loads"][0]


def wait_idle(url: str, timeout_s: float) -> dict:
    """Poll ``/v1/loads`` until no request runs or waits and no KV token is held; returns the last reading."""
    deadline = time.monotonic() + timeout_s
    state = loads(url)
    while time.monotonic() < deadline:
        if state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0 and state["num_used_tokens"] == 0:
            return state
        time.sleep(0.5)
        state = loads(url)
    return state


def greedy_probe(url: str, timeout_s: float) -> list[int]:
    body = {"text": GREEDY_PROBE["text"],
            "sampling_params": {"max_new_tokens": GREEDY_PROBE["max_new_tokens"], "temperature": 0,
                                "ignore_eos": True}}
    response = requests.post(f"{url}/generate", json=body, timeout=timeout_s)
    response.raise_for_status()
    return response.json()["output_ids"]


# --- one request -------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    kind: str
    params: dict
    prompt_ids: Optional[list] = None
    prompt_text: Optional[str] = None
    max_new_tokens: int = 32
    abort: bool = False
    abort_after_chunks: int = 2
    near_limit: bool = False


def _planned_abort(index: int, share: float) -> bool:
    """Exactly ``share`` of the requests, spread evenly over the issue order (0-based ``index``)."""
    return math.floor((index + 1) * share) > math.floor(index * share)


def _plan(rng: random.Random, cfg: SoakConfig, index: int) -> _Plan:
    kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
    params = dict(rng.choice(SAMPLING_MIX))
    plan = _Plan(kind=kind, params=params, abort=_planned_abort(index, cfg.abort_share),
                 abort_after_chunks=rng.randint(1, 4))
    limit = cfg.max_total_tokens
    if kind.startswith("generate") and rng.random() < cfg.near_limit_share:
        # Close to the KV pool: prompt + max_new_tokens from 90 % to 105 % of it, mostly prompt (a long
        # generation would only make the run slow; the pool fills just the same).
        plan.max_new_tokens = rng.randint(8, 48)
        prompt_len = max(16, rng.randint(int(0.90 * limit), int(1.05 * limit)) - plan.max_new_tokens)
        plan.near_limit = True
    else:
        prompt_len = rng.randint(4, 160)
        plan.max_new_tokens = rng.randint(4, 64)
    if kind.startswith("generate"):
        plan.prompt_ids = [rng.randrange(cfg.vocab_low, cfg.vocab_high) for _ in range(prompt_len)]
    else:
        plan.prompt_text = " ".join(rng.choice(CODE_WORDS) for _ in range(prompt_len))
    return plan


def _chat_body(plan: _Plan, stream: bool) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": plan.prompt_text}],
            "max_tokens": plan.max_new_tokens, "stream": stream, **plan.params}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _generate_body(plan: _Plan, stream: bool) -> dict:
    return {"input_ids": plan.prompt_ids, "stream": stream,
            "sampling_params": {"max_new_tokens": plan.max_new_tokens, **plan.params}}


def _error_message(response: requests.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)[:200]
        return str(error)[:200]
    return str(payload)[:200]


def _short(reason: str) -> str:
    reason = " ".join(reason.split())
    return reason[:90]


def _run_one(url: str, plan: _Plan, cfg: SoakConfig) -> tuple[str, str, int]:
    """(outcome, detail, completion tokens) of one request."""
    stream = plan.kind.endswith("stream")
    chat = plan.kind.startswith("chat")
    path = "/v1/chat/completions" if chat else "/generate"
    body = _chat_body(plan, stream) if chat else _generate_body(plan, stream)
    # A planned abort of a non-streamed request: a read timeout the request cannot meet closes the connection.
    read_timeout = 0.2 + 0.3 * plan.abort_after_chunks if plan.abort and not stream else cfg.request_timeout_s
    try:
        response = requests.post(f"{url}{path}", json=body, stream=stream, timeout=(10, read_timeout))
    except requests.ReadTimeout:
        return ("aborted", "closed before the answer", 0) if plan.abort else ("error", "read timeout", 0)
    except requests.RequestException as exc:
        return "error", f"{type(exc).__name__}: {exc}", 0
    with response:
        if 400 <= response.status_code < 500:
            return "refused", f"HTTP {response.status_code}: {_error_message(response)}", 0
        if response.status_code != 200:
            return "error", f"HTTP {response.status_code}: {_error_message(response)}", 0
        if not stream:
            payload = response.json()
            finish = payload["choices"][0].get("finish_reason") if chat else payload["meta_info"]["finish_reason"]
            tokens = payload["usage"]["completion_tokens"] if chat else payload["meta_info"]["completion_tokens"]
            return _finish_outcome(finish, chat, tokens)
        return _read_stream(response, plan, chat)


def _finish_outcome(finish, chat: bool, tokens: int) -> tuple[str, str, int]:
    if chat:
        if finish in ("length", "stop"):
            return "completed", finish, tokens
        return ("refused", f"finish_reason {finish}", tokens) if finish else ("error", "no finish reason", tokens)
    kind = (finish or {}).get("type")
    if kind in ("length", "stop"):
        return "completed", kind, tokens
    if kind == "abort" and finish.get("message"):
        return "refused", f"abort: {finish.get('message')}", tokens
    return "error", f"finish_reason {finish}", tokens


def _read_stream(response: requests.Response, plan: _Plan, chat: bool) -> tuple[str, str, int]:
    chunks = 0
    finish = None
    tokens = 0
    try:
        for payload in sse_payloads(response):
            event = json.loads(payload)
            if "error" in event:
                return "refused", f"stream error: {_short(str(event['error'].get('message', event['error'])))}", 0
            chunks += 1
            if chat:
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                if event.get("usage"):
                    tokens = event["usage"].get("completion_tokens", tokens)
            else:
                meta = event.get("meta_info", {})
                finish = meta.get("finish_reason") or finish
                tokens = meta.get("completion_tokens", tokens)
            if plan.abort and chunks >= plan.abort_after_chunks and finish is None:
                response.close()  # mid-stream: the client goes away
                return "aborted", f"closed after {chunks} chunks", tokens
    except requests.RequestException as exc:
        return "error", f"stream broke: {type(exc).__name__}: {exc}", tokens
    if finish is None:
        return "error", f"stream ended without a finish reason after {chunks} chunks", tokens
    return _finish_outcome(finish, chat, tokens)


# --- the run -----------------------------------------------------------------------------------------------------


def _drive(url: str, cfg: SoakConfig, report: SoakReport, *, requests_cap: int, duration_s: float,
           seed: int, min_requests: int = 0) -> None:
    lock = threading.Lock()
    counter = {"issued": 0}
    started = time.monotonic()

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while True:
            with lock:
                elapsed = time.monotonic() - started
                if counter["issued"] >= requests_cap or elapsed >= cfg.hard_limit_s:
                    return
                if elapsed >= duration_s and counter["issued"] >= min_requests:
                    return
                issued = counter["issued"]
                counter["issued"] += 1
            plan = _plan(rng, cfg, issued)
            outcome, detail, tokens = _run_one(url, plan, cfg)
            with lock:
                report.requests += 1
                report.outcomes[outcome] += 1
                report.by_kind.setdefault(plan.kind, collections.Counter())[outcome] += 1
                report.completion_tokens += int(tokens or 0)
                report.near_limit_requests += int(plan.near_limit)
                if outcome == "refused":
                    key = _short(detail)
                    report.refusals[key] = report.refusals.get(key, 0) + 1
                elif outcome == "error" and len(report.error_samples) < 20:
                    report.error_samples.append(f"{plan.kind} near_limit={plan.near_limit} "
                                                f"max_new={plan.max_new_tokens} params={plan.params}: {detail}")

    with concurrent.futures.ThreadPoolExecutor(cfg.concurrency) as pool:
        for future in [pool.submit(client, i) for i in range(cfg.concurrency)]:
            future.result()


def run_soak(url: str, server_pid: int, cfg: SoakConfig, log=print) -> SoakReport:
    """Run the soak against the server at ``url`` whose launcher process is ``server_pid`` (see module docstring)."""
    report = SoakReport()
    report.scheduler_pids = scheduler_pids(server_pid)
    if not report.scheduler_pids:
        raise RuntimeError(f"no sglang::scheduler child of pid {server_pid}")
    report.greedy_before = greedy_probe(url, cfg.request_timeout_s)
    warm = SoakReport()
    _drive(url, cfg, warm, requests_cap=cfg.warmup_requests, duration_s=cfg.duration_s, seed=cfg.seed + 1)
    log(f"warm-up: {warm.requests} requests, outcomes {warm.outcomes}")
    for sample in warm.error_samples:
        log(f"warm-up error: {sample}")
    report.warmup_errors = list(warm.error_samples)
    state = wait_idle(url, cfg.idle_timeout_s)
    report.kv_used_before = state["num_used_tokens"]
    report.rss_before_kb = sum(rss_kb(pid) for pid in report.scheduler_pids)

    started = time.monotonic()
    _drive(url, cfg, report, requests_cap=cfg.max_requests, duration_s=cfg.duration_s, seed=cfg.seed,
           min_requests=cfg.min_requests)
    report.elapsed_s = time.monotonic() - started

    state = wait_idle(url, cfg.idle_timeout_s)
    report.kv_used_after = state["num_used_tokens"]
    report.running_after = state["num_running_reqs"]
    report.waiting_after = state["num_waiting_reqs"]
    try:
        report.healthy_after = requests.get(f"{url}/health", timeout=30).status_code == 200
    except requests.RequestException:
        report.healthy_after = False
    report.rss_after_kb = sum(rss_kb(pid) for pid in report.scheduler_pids)
    report.greedy_after = greedy_probe(url, cfg.request_timeout_s)
    report.by_kind = {k: dict(v) for k, v in report.by_kind.items()}
    return report
