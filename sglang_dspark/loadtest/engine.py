"""The request engine and per-level metrics of the load test, shared with ``benchmarks/``.

Requests are SGLang's own: ``sglang.benchmark.serving`` (what ``python -m sglang.bench_serving`` runs) provides the
streaming OpenAI chat client (``async_request_openai_chat_completions``: TTFT, inter-token gaps, usage), the arrival
process (``get_request``: Poisson at a request rate, or back to back) and the metric maths (``calculate_metrics``:
throughput, TTFT / TPOT / ITL / E2E percentiles). This module adds only what a sweep needs around them: a
concurrency cap, a per-request and a per-level time bound, per-user speed, the accept length of each request and the
difference of two ``/server_info`` admission snapshots (with prompt lookup beside the draft: per proposal source too).

Two settings of bench_serving are process-wide (it reads a module-level ``args``): we set them once, and wrap its
``sglext`` hook so that the per-request speculative details SGLang streams at the end of each response
(``return_spec_tokens_details``: ``spec_verify_ct``, ``spec_accept_length``) are kept on the request's output.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import statistics
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import requests

# What every request asks the server for besides the prompt (OpenAI fields and SGLang's extensions).
STREAM_EXTRAS = {
    "stream_options": {"include_usage": True},  # completion_tokens of each request, from the server
    "return_spec_tokens_details": True,  # per-request verify steps and accept length (speculative servers)
}

RequestFunc = Callable[..., Awaitable[Any]]

_serving_module = None


def serving():
    """``sglang.benchmark.serving``, set up for our use (imported lazily: it pulls in transformers and SGLang)."""
    global _serving_module
    if _serving_module is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.benchmark import serving as module
        module.set_global_args(
            argparse.Namespace(
                disable_stream=False,
                disable_ignore_eos=False,  # each request sets ignore_eos itself (extra body)
                print_requests=False,
                cache_report=True,  # makes the chat client hand every chunk's sglext to the hook below
                header=None,
            )
        )
        original = module._extract_cache_from_sglext
        if not getattr(original, "_sglang_dspark", False):

            def extract_sglext(data, output, _original=original):
                _original(data, output)
                details = (data.get("sglext") or {}).get("spec_tokens_details")
                if isinstance(details, list):  # n > 1: one entry per choice; we send n = 1
                    details = details[0] if details else None
                if isinstance(details, dict):
                    output.spec_accept_length = float(details.get("spec_accept_length") or 0.0)
                    output.spec_verify_ct = int(details.get("spec_verify_ct") or 0)

            extract_sglext._sglang_dspark = True
            module._extract_cache_from_sglext = extract_sglext
        _serving_module = module
    return _serving_module


def _failed(message: str, *, kind: str):
    output = serving().RequestFuncOutput(success=False, error=message)
    output.failure_kind = kind  # "timeout" | "not_sent"
    return output


MIN_SEND_SECONDS = 0.01


async def run_requests(
    api_url: str,
    model: str,
    prompts: Sequence[str],
    *,
    max_tokens: int | Sequence[int],
    concurrency: int | None = None,
    request_rate: float = math.inf,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    request_timeout: float = 300.0,
    level_timeout: float = 600.0,
    request_func: RequestFunc | None = None,
    pbar=None,
    extra_body: dict | None = None,
) -> tuple[list, float]:
    """Send ``prompts`` (one chat message each) with at most ``concurrency`` in flight and arrivals at
    ``request_rate`` (Poisson; ``inf``: all at once, the concurrency cap then sets the load). Returns the outputs
    (bench_serving's ``RequestFuncOutput``, in prompt order) and the wall time from the first send to the last answer.
    ``max_tokens``: one length for every request, or one per prompt.

    Bounded: a request is cut after ``request_timeout`` s, and nothing runs past ``level_timeout`` s after the first
    send (requests cut there count as timeouts; requests not sent by then as ``not_sent``).
    """
    module = serving()
    request_func = request_func or module.async_request_openai_chat_completions
    body = {**STREAM_EXTRAS, "temperature": temperature, "ignore_eos": ignore_eos, **(extra_body or {})}
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(lengths) != len(prompts):
        raise ValueError(f"{len(lengths)} output lengths for {len(prompts)} prompts")
    rows = [module.DatasetRow(prompt=p, prompt_len=0, output_len=n) for p, n in zip(prompts, lengths)]
    semaphore = asyncio.Semaphore(concurrency) if concurrency else None
    start = time.perf_counter()
    deadline = start + level_timeout

    async def one(row):
        if semaphore is not None:
            await semaphore.acquire()
        try:
            remaining = deadline - time.perf_counter()
            # asyncio may fire the previous request's timeout a hair before the deadline: a request sent with almost
            # no time left cannot be answered, it was not sent in time.
            if remaining <= MIN_SEND_SECONDS:
                output = _failed(f"not sent: the level's time limit ({level_timeout:g} s) was reached", kind="not_sent")
            else:
                limit = min(request_timeout, remaining)
                request = module.RequestFuncInput(
                    prompt=row.prompt, api_url=api_url, prompt_len=0, output_len=row.output_len, model=model,
                    lora_name="", image_data=None, extra_request_body=dict(body),
                )
                try:
                    output = await asyncio.wait_for(request_func(request, pbar=None), timeout=limit)
                except asyncio.TimeoutError:
                    output = _failed(f"timeout: no complete answer within {limit:.0f} s", kind="timeout")
        finally:
            if semaphore is not None:
                semaphore.release()
        if pbar is not None:
            pbar.update(1)
        return output

    tasks = []
    async for row in module.get_request(rows, request_rate):
        if time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(one(row)))
    outputs = list(await asyncio.gather(*tasks))
    for _ in rows[len(tasks):]:
        outputs.append(_failed("not sent: the level's time limit was reached", kind="not_sent"))
        if pbar is not None:
            pbar.update(1)
    return outputs, time.perf_counter() - start


class _WordTokenizer:
    """Stand-in when the server's tokenizer cannot be loaded here: counts words (only bench_serving's
    "retokenized" totals use it; throughput uses the server's own completion_tokens)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


OVERLAP_N = 4


def _units(text: str, tokenizer=None) -> list:
    """``text`` as the tokenizer's token ids, or as whitespace-split words without a tokenizer (or if it fails)."""
    if tokenizer is not None:
        try:
            return list(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # noqa: BLE001 - words are the fallback
            pass
    return text.split()


def output_overlap(prompt: str, output: str, tokenizer=None, n: int = OVERLAP_N) -> float | None:
    """The share of ``output``'s tokens (whitespace words without a tokenizer) that lie inside an ``n``-gram that
    also appears in ``prompt``: 1.0 for an answer copied from the prompt, about 0 for one that shares no run of
    ``n`` tokens with it. None for an empty output."""
    out = _units(output, tokenizer)
    if not out:
        return None
    source = _units(prompt, tokenizer)
    grams = {tuple(source[i : i + n]) for i in range(len(source) - n + 1)}
    covered = [False] * len(out)
    for i in range(len(out) - n + 1):
        if tuple(out[i : i + n]) in grams:
            covered[i : i + n] = [True] * n
    return sum(covered) / len(out)


def mean_output_overlap(prompts: Sequence[str], outputs: Sequence, tokenizer=None, n: int = OVERLAP_N) -> float | None:
    """:func:`output_overlap` averaged over the completed requests with an output (prompt ``i`` is output ``i``'s);
    None when there is none."""
    shares = [output_overlap(prompt, o.generated_text or "", tokenizer, n)
              for prompt, o in zip(prompts, outputs) if o.success]
    shares = [share for share in shares if share is not None]
    return sum(shares) / len(shares) if shares else None


def _percentiles(values: list[float], scale: float = 1.0) -> dict | None:
    if not values:
        return None
    import numpy as np

    array = np.asarray(values, dtype=float) * scale
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
    }


def level_metrics(outputs: list, duration: float, tokenizer=None) -> dict:
    """One level's numbers. Throughput, TTFT / TPOT / ITL / E2E come from bench_serving's ``calculate_metrics``
    (ITL per token: a streamed chunk carrying k tokens counts as k gaps of 1/k, bench_serving's rule for speculative
    servers, applied to every configuration so they compare; per chunk when no tokenizer is available).

    per_user_tok_s: median over requests of the decode speed a user sees, (tokens - 1) / (latency - TTFT) = 1/TPOT;
    per_user_e2e_tok_s: median of tokens / latency (TTFT included). accept_length: generated tokens / verify steps
    over the level's requests (speculative servers; bonus token included, as SGLang reports it)."""
    module = serving()
    ok = [o for o in outputs if o.success]
    kinds = [getattr(o, "failure_kind", "error") for o in outputs if not o.success]
    errors = [o.error for o in outputs if not o.success and getattr(o, "failure_kind", "error") == "error"]
    samples: list[str] = []
    for message in errors:
        line = (message.strip().splitlines() or [""])[-1][:300]
        if line not in samples:
            samples.append(line)
    result: dict[str, Any] = {
        # One digest per prompt (in prompt order; None where it failed), to compare configurations' outputs.
        "output_digests": [hashlib.sha1(o.generated_text.encode()).hexdigest()[:16] if o.success else None
                           for o in outputs],
        "requests": len(outputs),
        "completed": len(ok),
        "errors": kinds.count("error"),
        "timeouts": kinds.count("timeout"),
        "not_sent": kinds.count("not_sent"),
        "error_samples": samples[:3],
        "duration_s": duration,
    }
    if not ok:
        return result
    rows = [module.DatasetRow(prompt="", prompt_len=o.prompt_len, output_len=o.output_len) for o in outputs]
    per_token = tokenizer is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            metrics, _ = module.calculate_metrics(
                input_requests=rows, outputs=outputs, dur_s=duration, tokenizer=tokenizer or _WordTokenizer(),
                backend="sglang-oai-chat", accept_length=1.0 if per_token else None,
            )
        except ZeroDivisionError:  # a streamed chunk that retokenizes to nothing: fall back to per-chunk gaps
            per_token = False
            metrics, _ = module.calculate_metrics(
                input_requests=rows, outputs=outputs, dur_s=duration, tokenizer=_WordTokenizer(),
                backend="sglang-oai-chat", accept_length=None,
            )
    decode = [(o.output_len - 1) / (o.latency - o.ttft) for o in ok if o.output_len > 1 and o.latency > o.ttft > 0]
    e2e = [o.output_len / o.latency for o in ok if o.latency > 0]
    verify_steps = sum(getattr(o, "spec_verify_ct", 0) for o in ok)
    spec_tokens = sum(o.output_len for o in ok if getattr(o, "spec_verify_ct", 0))
    result.update(
        {
            "output_tokens": int(metrics.total_output),
            "input_tokens": int(metrics.total_input),
            "output_tok_s": float(metrics.output_throughput),
            "request_throughput": float(metrics.request_throughput),
            "peak_output_tok_s": float(metrics.max_output_tokens_per_s),
            "achieved_concurrency": float(metrics.concurrency),
            "per_user_tok_s": statistics.median(decode) if decode else None,
            "per_user_e2e_tok_s": statistics.median(e2e) if e2e else None,
            "ttft_ms": _ms(metrics, "ttft"),
            "tpot_ms": _ms(metrics, "tpot"),
            "itl_ms": _ms(metrics, "itl"),
            "itl_unit": "token" if per_token else "chunk",
            "e2e_latency_ms": _ms(metrics, "e2e_latency"),
            "accept_length": spec_tokens / verify_steps if verify_steps else None,
            "verify_steps": verify_steps,
        }
    )
    return result


def _ms(metrics, name: str) -> dict:
    return {
        "mean": float(getattr(metrics, f"mean_{name}_ms")),
        "p50": float(getattr(metrics, f"median_{name}_ms")),
        "p90": float(getattr(metrics, f"p90_{name}_ms")),
        "p99": float(getattr(metrics, f"p99_{name}_ms")),
    }


# ------------------------------------------------------------------------------------------ server-side snapshots


def server_snapshot(base_url: str, timeout: float = 30.0) -> dict:
    """What ``/server_info`` says about speculation now: the DSPARK admission summary (our worker only) and
    SGLang's lifetime average accept length. Empty when the server does not answer."""
    try:
        info = requests.get(f"{base_url}/server_info", timeout=timeout).json()
    except (requests.RequestException, ValueError):
        return {}
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states[0], dict) else {}
    return {
        "speculative_algorithm": info.get("speculative_algorithm"),
        "dspark_admission": state.get("dspark_admission"),
        "avg_spec_accept_length": state.get("avg_spec_accept_length"),
    }


def _diff(after: list | None, before: list | None) -> list[float]:
    after, before = list(after or []), list(before or [])
    size = max(len(after), len(before))
    after += [0] * (size - len(after))
    before += [0] * (size - len(before))
    return [a - b for a, b in zip(after, before)]


def admission_delta(before: dict | None, after: dict | None) -> dict | None:
    """The DSPARK admission statistics of the traffic between two ``dspark_admission`` summaries (lifetime
    counters, so the difference is exactly the level's): verify steps, admitted-length distribution (drafts admitted
    per request-step, 0..gamma), accepted-length distribution, mean accept length (accepted drafts + the bonus token)
    and the confidence ECE of that traffic."""
    if not after:
        return None
    before = before or {}
    admitted = _diff(after.get("admitted_len_histogram"), before.get("admitted_len_histogram"))
    accepted = _diff(after.get("accepted_len_histogram"), before.get("accepted_len_histogram"))
    n_admitted, n_accepted = sum(admitted), sum(accepted)
    bins_after, bins_before = after.get("calibration_bins") or {}, before.get("calibration_bins") or {}
    count = _diff(bins_after.get("count"), bins_before.get("count"))
    predicted = _diff(bins_after.get("prediction_sum"), bins_before.get("prediction_sum"))
    observed = _diff(bins_after.get("label_sum"), bins_before.get("label_sum"))
    steps = (after.get("steps") or 0) - (before.get("steps") or 0)
    drafted = (after.get("drafted_steps") or 0) - (before.get("drafted_steps") or 0)

    def delta(key):
        return (after.get(key) or 0) - (before.get(key) or 0)

    timed_drafted = delta("timed_drafted_steps")
    timed_skipped = delta("timed_steps") - timed_drafted
    skipped_seconds = delta("step_seconds_sum") - delta("drafted_step_seconds_sum")
    return {
        "policy": after.get("policy"),
        "steps": steps,
        # Share of this level's decode steps that ran the draft block (the draft gate skips it where it does not pay).
        "drafted_step_share": drafted / steps if steps > 0 and "drafted_steps" in after else None,
        "admitted_len_histogram": admitted,
        "admitted_len_share": [c / n_admitted for c in admitted] if n_admitted else None,
        "mean_admitted_draft_len": sum(k * c for k, c in enumerate(admitted)) / n_admitted if n_admitted else None,
        "accepted_len_histogram": accepted,
        "mean_accept_len": sum((k + 1) * c for k, c in enumerate(accepted)) / n_accepted if n_accepted else None,
        "ece": sum(abs(o - p) for p, o in zip(predicted, observed)) / sum(count) if sum(count) > 0 else None,
        # Mean decode-step time (all requests of the batch) of steps that drafted and of steps the gate skipped.
        "drafted_step_ms": 1000.0 * delta("drafted_step_seconds_sum") / timed_drafted if timed_drafted > 0 else None,
        "skipped_step_ms": 1000.0 * skipped_seconds / timed_skipped if timed_skipped > 0 else None,
        # Why the draft gate drafted or skipped this level's steps (scheduling/draft_gate.py GateDecision.reason).
        "gate_reasons": _reason_delta(after.get("draft_gate"), before.get("draft_gate")),
    }


LOOKUP_STEP_KINDS = ("plain", "drafted", "lookup", "mixed")


def lookup_delta(before: dict | None, after: dict | None) -> dict | None:
    """Per proposal source, the traffic between two ``dspark_admission["lookup"]`` summaries (prompt lookup beside
    the draft, ``engine/lookup_source.py``; lifetime counters, so the difference is exactly the level's): the decode
    steps of each kind (plain: no draft, no lookup; drafted: draft only; lookup: lookup chains without the draft
    forward; mixed: a drafted step where some rows verified a lookup chain) and their shares of the level's steps,
    and per source (lookup, draft) the request-steps that verified it, the tokens verified and accepted, and the
    accept length (1 + accepted / rows: tokens per request-step, the bonus included). ``plan_us_per_step`` and
    ``lookup_ece`` are the after-snapshot's lifetime values. None where the server has no lookup (off, not DSPARK)."""
    if not isinstance(after, dict):
        return None
    before = before if isinstance(before, dict) else {}

    def delta(section: str, key: str) -> float:
        return _number((after.get(section) or {}).get(key)) - _number((before.get(section) or {}).get(key))

    steps = {kind: delta("steps", kind) for kind in LOOKUP_STEP_KINDS}
    total = sum(steps.values())
    sources = {}
    for source in ("lookup", "draft", "shared"):  # shared: the lookup rows whose chain came from the shared cache
        rows, verified, accepted = (delta(source, key) for key in ("rows", "verified", "accepted"))
        sources[source] = {
            "rows": rows,
            "verified": verified,
            "accepted": accepted,
            "accept_length": 1.0 + accepted / rows if rows > 0 else None,
            # Share of the verified proposed tokens that were accepted.
            "acceptance": accepted / verified if verified > 0 else None,
        }
    sources["lookup"]["proposals"] = delta("lookup", "proposals")
    sources["shared"]["proposals"] = delta("shared", "proposals")
    # Of the rows with a proposal, the share the shared suffix cache made (None: no proposal, or the cache is off).
    shared_on = (after.get("shared") or {}).get("scope", "off") != "off"
    sources["shared"]["hit_rate"] = (sources["shared"]["proposals"] / sources["lookup"]["proposals"]
                                     if shared_on and sources["lookup"]["proposals"] > 0 else None)
    for name in ("verified_lengths", "accepted_lengths"):  # the level's chain-length histograms {length: rows}
        now, then = (after.get("lookup") or {}).get(name) or {}, (before.get("lookup") or {}).get(name) or {}
        sources["lookup"][name] = {k: v - int(then.get(k, 0)) for k, v in now.items() if v - int(then.get(k, 0)) > 0}
    plan_us = after.get("plan_us_per_step")
    ece = (after.get("lookup") or {}).get("ece")
    return {
        "mode": after.get("mode"),
        "steps": steps,
        "step_share": {kind: count / total if total > 0 else None for kind, count in steps.items()},
        "lookup": sources["lookup"],
        "draft": sources["draft"],
        "shared": sources["shared"],
        "lookup_accept_length": sources["lookup"]["accept_length"],
        "draft_accept_length": sources["draft"]["accept_length"],
        "plan_us_per_step": float(plan_us) if _is_number(plan_us) else None,
        "lookup_ece": float(ece) if _is_number(ece) else None,
    }


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value) -> float:
    return value if _is_number(value) else 0


def _reason_delta(after: dict | None, before: dict | None) -> dict | None:
    reasons_after = (after or {}).get("reasons")
    if not reasons_after:
        return None
    reasons_before = (before or {}).get("reasons") or {}
    delta = {reason: count - reasons_before.get(reason, 0) for reason, count in reasons_after.items()}
    return {reason: count for reason, count in delta.items() if count}


def request_timings(outputs: Sequence, rounds: Sequence[int] | None = None) -> dict[str, list]:
    """Each request's TTFT, TPOT, end-to-end latency (ms), output tokens, success and round, as columns
    (``slo.records_to_columns``): what goodput under any SLO is computed from, then or later (``--replot --slo``)."""
    from sglang_dspark.loadtest import slo

    rounds = list(rounds) if rounds is not None else [0] * len(outputs)
    return slo.records_to_columns([
        slo.RequestRecord.from_timings(bool(o.success), o.ttft, o.latency, o.output_len, r)
        for o, r in zip(outputs, rounds)
    ])


class LevelRun:
    """One load level against one server, run in one or more rounds (the runner interleaves other servers' rounds
    between them): the server's admission counters are read before the first round and after the last, the rounds'
    request outputs are pooled and their durations add up, so the level's numbers are those of all its requests
    over the time this server spent on them. Each round's tok/s and duration and each request's timings and round
    (``request_timings``) are kept too: the intervals over rounds and goodput under an SLO are computed from them."""

    def __init__(self, base_url: str, snapshot_func: Callable[[], dict] | None = None) -> None:
        self.base_url = base_url
        self.snapshot_func = snapshot_func or (lambda: server_snapshot(base_url))
        self.before = self.snapshot_func()
        self.outputs: list = []
        self.duration = 0.0
        # Each round's output tokens per second: rounds of different servers taking turns are close in time, so
        # their round-by-round ratios show how much of a level's ratio the machine's drift could move.
        self.round_tok_s: list[float] = []
        self.round_durations: list[float] = []
        self.output_rounds: list[int] = []  # the round (0-based) each output was sent in
        self.prompts: list[str] = []  # the prompt of each output

    def run_round(self, prompts: Sequence[str], *, concurrency: int | None, max_tokens: int | Sequence[int],
                  request_rate: float = math.inf, temperature: float = 0.0, model: str = "default",
                  request_timeout: float = 300.0, level_timeout: float = 600.0,
                  request_func: RequestFunc | None = None, pbar=None) -> int:
        """Send one round's prompts (a closed loop at ``concurrency``); returns how many completed."""
        outputs, duration = asyncio.run(
            run_requests(
                f"{self.base_url}/v1/chat/completions", model, prompts, max_tokens=max_tokens,
                concurrency=concurrency, request_rate=request_rate, temperature=temperature,
                request_timeout=request_timeout, level_timeout=level_timeout, request_func=request_func, pbar=pbar,
            )
        )
        self.output_rounds.extend([len(self.round_durations)] * len(outputs))
        self.prompts.extend(prompts)
        self.outputs.extend(outputs)
        self.duration += duration
        self.round_durations.append(duration)
        tokens = sum(output.output_len for output in outputs if output.success)
        self.round_tok_s.append(tokens / duration if duration > 0 else 0.0)
        return sum(1 for output in outputs if output.success)

    def result(self, tokenizer=None) -> dict:
        after = self.snapshot_func()
        result = level_metrics(self.outputs, self.duration, tokenizer)
        result["round_output_tok_s"] = list(self.round_tok_s)
        result["round_duration_s"] = list(self.round_durations)
        result["request_timings"] = request_timings(self.outputs, self.output_rounds)
        admission = admission_delta(self.before.get("dspark_admission"), after.get("dspark_admission"))
        if admission is not None:
            result["admission"] = admission
            if result.get("accept_length") is None:
                result["accept_length"] = admission["mean_accept_len"]
        sources = lookup_delta((self.before.get("dspark_admission") or {}).get("lookup"),
                               (after.get("dspark_admission") or {}).get("lookup"))
        if sources is not None:
            result["sources"] = sources
        if after.get("avg_spec_accept_length") is not None:
            result["server_lifetime_accept_length"] = after["avg_spec_accept_length"]
        return result


def measure_level(
    base_url: str,
    prompts: Sequence[str],
    *,
    concurrency: int | None,
    max_tokens: int,
    request_rate: float = math.inf,
    temperature: float = 0.0,
    model: str = "default",
    tokenizer=None,
    request_timeout: float = 300.0,
    level_timeout: float = 600.0,
    request_func: RequestFunc | None = None,
    snapshot_func: Callable[[], dict] | None = None,
    pbar=None,
) -> dict:
    """One load level against one server in one round: requests, metrics and the server-side admission delta
    (``snapshot_func``: how to read ``/server_info``; default :func:`server_snapshot` of ``base_url``)."""
    level = LevelRun(base_url, snapshot_func)
    level.run_round(prompts, concurrency=concurrency, max_tokens=max_tokens, request_rate=request_rate,
                    temperature=temperature, model=model, request_timeout=request_timeout,
                    level_timeout=level_timeout, request_func=request_func, pbar=pbar)
    return level.result(tokenizer)
