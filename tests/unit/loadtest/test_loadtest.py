"""The load tester without servers: metric maths on synthetic timings, prompt freshness across levels, loopback
refusal, clear errors, and a whole sweep writing JSON + PNG through a fake request engine."""

from __future__ import annotations

import asyncio
import http.server
import json
import statistics
import threading
import time

import pytest

from sglang_dspark.loadtest import engine, prompts, report, runner


@pytest.fixture(scope="module")
def serving():
    return engine.serving()


def output(serving, *, tokens, ttft, gaps, chunks=None, start=0.0, verify=0, success=True):
    out = serving.RequestFuncOutput(success=success)
    out.output_len = tokens
    out.ttft = ttft
    out.itl = list(gaps)
    out.text_chunks = list(chunks or ["x"] * len(gaps))
    out.latency = ttft + sum(gaps)
    out.start_time = start
    if verify:
        out.spec_verify_ct = verify
    return out


class CharTokenizer:
    """One token per character: a streamed chunk "ab" carries two tokens."""

    def encode(self, text, add_special_tokens=False):
        return list(text)


# ------------------------------------------------------------------------------------------------ metric maths


def test_level_metrics_on_synthetic_timings(serving):
    # Request A: 5 tokens, TTFT 0.1 s, then chunks of 1, 2, 1 tokens after 0.2, 0.4, 0.2 s.
    a = output(serving, tokens=5, ttft=0.1, gaps=[0.2, 0.4, 0.2], chunks=["a", "bc", "d"], verify=3)
    # Request B: 3 tokens, TTFT 0.3 s, two 1-token chunks after 0.1 s each.
    b = output(serving, tokens=3, ttft=0.3, gaps=[0.1, 0.1], chunks=["e", "f"], start=0.05, verify=2)
    failed = output(serving, tokens=0, ttft=0.0, gaps=[], success=False)
    failed.error = "Traceback...\naiohttp.ClientConnectorError: refused"
    timed_out = engine._failed("timeout: no complete answer within 1 s", kind="timeout")
    m = engine.level_metrics([a, b, failed, timed_out], duration=2.0, tokenizer=CharTokenizer())

    assert (m["requests"], m["completed"], m["errors"], m["timeouts"], m["not_sent"]) == (4, 2, 1, 1, 0)
    assert m["error_samples"] == ["aiohttp.ClientConnectorError: refused"]
    assert m["output_tokens"] == 8 and m["output_tok_s"] == pytest.approx(8 / 2.0)
    # per-user speed = median of (tokens - 1) / (latency - TTFT): A 4/0.8 = 5, B 2/0.2 = 10
    assert m["per_user_tok_s"] == pytest.approx(statistics.median([5.0, 10.0]))
    assert m["per_user_e2e_tok_s"] == pytest.approx(statistics.median([5 / 0.9, 3 / 0.5]))
    assert m["ttft_ms"]["p50"] == pytest.approx(200.0) and m["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert m["tpot_ms"]["p50"] == pytest.approx(statistics.median([200.0, 100.0]))
    # Per-token ITL: the 2-token chunk becomes two gaps of 0.2 s -> [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]
    assert m["itl_unit"] == "token"
    assert m["itl_ms"]["mean"] == pytest.approx(1000 * 1.0 / 6)
    assert m["itl_ms"]["p50"] == pytest.approx(200.0)
    # accept length = generated tokens / verify steps over the level
    assert m["accept_length"] == pytest.approx(8 / 5) and m["verify_steps"] == 5


def test_level_metrics_without_tokenizer_counts_chunks_and_survives_total_failure(serving):
    a = output(serving, tokens=5, ttft=0.1, gaps=[0.2, 0.4, 0.2], chunks=["a", "bc", "d"])
    m = engine.level_metrics([a], duration=1.0, tokenizer=None)
    assert m["itl_unit"] == "chunk" and m["itl_ms"]["mean"] == pytest.approx(1000 * 0.8 / 3)
    assert m["accept_length"] is None  # no speculative details: a no-spec server
    dead = engine.level_metrics([engine._failed("timeout", kind="timeout")], duration=1.0)
    assert dead["completed"] == 0 and dead["timeouts"] == 1 and "output_tok_s" not in dead


def test_admission_delta_is_the_traffic_between_snapshots():
    before = {"policy": "async", "steps": 10, "admitted_len_histogram": [5, 5], "accepted_len_histogram": [8, 2],
              "calibration_bins": {"count": [4, 0], "prediction_sum": [1.0, 0], "label_sum": [1.0, 0]}}
    after = {"policy": "async", "steps": 16, "admitted_len_histogram": [6, 5, 0, 4],
             "accepted_len_histogram": [10, 3, 2],
             "calibration_bins": {"count": [6, 4], "prediction_sum": [1.5, 3.0], "label_sum": [1.0, 2.0]}}
    d = engine.admission_delta(before, after)
    assert d["steps"] == 6
    assert d["admitted_len_histogram"] == [1, 0, 0, 4]
    assert d["admitted_len_share"] == [0.2, 0.0, 0.0, 0.8]
    assert d["mean_admitted_draft_len"] == pytest.approx((0 * 1 + 3 * 4) / 5)
    assert d["accepted_len_histogram"] == [2, 1, 2]
    assert d["mean_accept_len"] == pytest.approx((1 * 2 + 2 * 1 + 3 * 2) / 5)  # + the bonus token
    assert d["ece"] == pytest.approx((0.5 + 1.0) / 6)  # bins differ by (count 2, 4), |label - prediction| 0.5, 1
    assert d["drafted_step_share"] is None  # a summary without the draft gate's counter
    assert engine.admission_delta({}, None) is None  # not a DSPARK server of ours
    gated = engine.admission_delta(dict(before, drafted_steps=10), dict(after, drafted_steps=13))
    assert gated["drafted_step_share"] == pytest.approx(3 / 6)  # 3 of the level's 6 steps drafted
    assert d["gate_reasons"] is None
    reasons = engine.admission_delta(dict(before, draft_gate={"reasons": {"pays": 4, "pause": 9}}),
                                     dict(after, draft_gate={"reasons": {"pays": 4, "pause": 12, "probe": 1}}))
    assert reasons["gate_reasons"] == {"pause": 3, "probe": 1}  # the level's decisions only
    assert d["drafted_step_ms"] is None and d["skipped_step_ms"] is None  # no timed steps
    timed = engine.admission_delta(
        dict(before, timed_steps=10, step_seconds_sum=1.0, timed_drafted_steps=2, drafted_step_seconds_sum=0.3),
        dict(after, timed_steps=16, step_seconds_sum=1.8, timed_drafted_steps=4, drafted_step_seconds_sum=0.54),
    )
    # The level: 2 drafted steps in 0.24 s, 4 skipped steps in 0.56 s.
    assert timed["drafted_step_ms"] == pytest.approx(120.0) and timed["skipped_step_ms"] == pytest.approx(140.0)


def test_launch_configs_set_the_documented_switches():
    configs = {c.name: c for c in runner.launch_configs(list(runner.CONFIG_NAMES), draft=None, baseline_draft="/old")}
    assert configs["dspark-verify-all"].env == {"SGLANG_DSPARK_ADMISSION": "verify-all"}
    assert configs["dspark-gate-off"].env == {"SGLANG_DSPARK_DRAFT_GATE": "off"}
    assert configs["dspark-no-lookup"].env == {"SGLANG_DSPARK_LOOKUP": "off"}
    assert configs["dspark-upstream"].env == {"SGLANG_DSPARK_WORKER": "upstream"}
    assert configs["no-spec"].args == [] and "DSPARK" in configs["dspark"].args
    control = configs["no-spec-control"]  # the same launch as no-spec, under its own name and label
    assert (control.args, control.env) == (configs["no-spec"].args, configs["no-spec"].env)
    assert control.label != configs["no-spec"].label
    with pytest.raises(runner.LoadTestError, match="unknown configuration"):
        runner.launch_configs(["eagle"], draft=None)


def test_baseline_draft_is_a_second_dspark_server_with_the_other_draft(tmp_path, capsys):
    configs = {c.name: c for c in runner.launch_configs(["dspark", "dspark-baseline-draft"], draft="/new",
                                                          baseline_draft="/old")}
    assert configs["dspark"].args[-2:] == ["--speculative-draft-model-path", "/new"]
    assert configs["dspark-baseline-draft"].args == ["--speculative-algorithm", "DSPARK",
                                                     "--speculative-draft-model-path", "/old"]
    assert configs["dspark-baseline-draft"].env == {} and configs["dspark-baseline-draft"].label != configs["dspark"].label
    with pytest.raises(runner.LoadTestError, match="--baseline-draft-model-path"):
        runner.launch_configs(["dspark-baseline-draft"], draft=None)
    # The command line: the configuration without a draft, or a folder that is not a draft, is refused up front.
    for argv, message in (
        (["--configs", "no-spec", "dspark-baseline-draft"], "needs --baseline-draft-model-path"),
        (["--baseline-draft-model-path", str(tmp_path)], "no config.json there"),
        (["--url", "http://127.0.0.1:1", "--baseline-draft-model-path", str(tmp_path)], "already running"),
    ):
        with pytest.raises(SystemExit):
            runner.parse_args(argv)
        assert message in capsys.readouterr().err
    # A draft folder given: its server joins the configurations named (once), after them.
    (tmp_path / "config.json").write_text("{}")
    args = runner.parse_args(["--configs", "no-spec", "dspark", "--baseline-draft-model-path", str(tmp_path)])
    assert args.configs == ["no-spec", "dspark", "dspark-baseline-draft"]
    args = runner.parse_args(["--configs", "dspark-baseline-draft", "no-spec", "--baseline-draft-model-path", str(tmp_path)])
    assert args.configs == ["dspark-baseline-draft", "no-spec"]


# ------------------------------------------------------------------------------------------------ request engine


def _even_tail(prompt: str) -> bool:
    return len(prompt) % 2 == 0


def fake_request_func(log, *, delay=0.02, tokens_per_chunk=2, verify=True):
    state = {"in_flight": 0, "max_in_flight": 0}

    async def request(request_func_input, pbar=None):
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        start = time.perf_counter()
        try:
            await asyncio.sleep(delay)
            out = engine.serving().RequestFuncOutput(success=True)
            n = request_func_input.output_len
            out.output_len = n
            out.start_time = start
            out.ttft = delay / 2
            chunks = max(1, n // tokens_per_chunk)
            out.itl = [delay / 2 / chunks] * (chunks - 1)
            out.text_chunks = ["tok " * tokens_per_chunk] * (chunks - 1)
            out.latency = time.perf_counter() - start
            # The answer's text: the prompt, except that server 2 answers prompts ending in an even digit otherwise.
            prompt = request_func_input.prompt
            out.generated_text = prompt + ("!" if ":2/" in request_func_input.api_url and _even_tail(prompt) else "")
            if verify:
                out.spec_verify_ct = chunks
            log.append((request_func_input.api_url, request_func_input.prompt, request_func_input.model,
                        request_func_input.extra_request_body))
            return out
        finally:
            state["in_flight"] -= 1

    request.state = state
    return request


def test_output_lengths_vary_per_prompt_and_match_across_configurations():
    """``--random-range-ratio``: lengths in [ratio x max, max], a function of the prompt (so every server of a run
    generates the same lengths); ratio 1 is the fixed length; nonsense ratios are refused."""
    pool = [f"prompt {i}" for i in range(400)]
    lengths = prompts.output_lengths(pool, 64, 0.5, seed=3)
    assert min(lengths) >= 32 and max(lengths) <= 64 and len(set(lengths)) > 20
    assert prompts.output_lengths(list(reversed(pool)), 64, 0.5, seed=3) == list(reversed(lengths))
    assert prompts.output_lengths(pool, 64, 0.5, seed=4) != lengths
    assert prompts.output_lengths(pool, 64) == [64] * 400
    assert prompts.output_lengths(["a"], 1, 0.01) == [1]
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError):
            prompts.output_lengths(pool, 64, bad)


def test_run_requests_sends_each_prompt_its_own_length(serving):
    outputs, _ = asyncio.run(engine.run_requests(
        "http://127.0.0.1:1/v1/chat/completions", "m", ["a", "b", "c"], max_tokens=[4, 9, 6], concurrency=2,
        request_func=fake_request_func([]),
    ))
    assert [o.output_len for o in outputs] == [4, 9, 6]
    with pytest.raises(ValueError, match="2 output lengths for 3 prompts"):
        asyncio.run(engine.run_requests("http://127.0.0.1:1/v1/chat/completions", "m", ["a", "b", "c"],
                                        max_tokens=[4, 9], request_func=fake_request_func([])))


def test_run_requests_caps_concurrency_and_sends_stream_extras(serving):
    log = []
    func = fake_request_func(log)
    outputs, duration = asyncio.run(engine.run_requests(
        "http://127.0.0.1:1/v1/chat/completions", "m", [f"p{i}" for i in range(9)], max_tokens=8, concurrency=3,
        request_func=func,
    ))
    assert len(outputs) == 9 and all(o.success for o in outputs)
    assert func.state["max_in_flight"] == 3
    assert duration >= 3 * 0.02
    body = log[0][3]
    assert body["stream_options"] == {"include_usage": True} and body["return_spec_tokens_details"] is True
    assert body["ignore_eos"] is True and body["temperature"] == 0.0


def test_run_requests_bounds_time(serving):
    async def slow(request_func_input, pbar=None):
        await asyncio.sleep(5)

    outputs, duration = asyncio.run(engine.run_requests(
        "http://127.0.0.1:1/v1/chat/completions", "m", ["a", "b", "c"], max_tokens=8, concurrency=1,
        request_func=slow, request_timeout=10, level_timeout=0.3,
    ))
    assert duration < 2
    kinds = [getattr(o, "failure_kind", None) for o in outputs]
    assert kinds == ["timeout", "not_sent", "not_sent"]


def test_sglext_hook_keeps_spec_details(serving):
    out = serving.RequestFuncOutput()
    serving._extract_cache_from_sglext(
        {"choices": [], "sglext": {"spec_tokens_details": {"spec_accept_length": 2.5, "spec_verify_ct": 12}}}, out
    )
    assert out.spec_accept_length == 2.5 and out.spec_verify_ct == 12
    assert serving.args.cache_report is True and serving.args.disable_stream is False


# ------------------------------------------------------------------------------------------------ prompts


def test_builtin_prompts_are_distinct_and_split_fresh_per_level():
    pool = prompts.builtin_prompts()
    assert len(pool) == len(set(pool)) == len(prompts.SUBJECTS) * len(prompts.TASKS)
    assert prompts.WARMUP_PROMPT not in pool
    counts = [8, 8, 16, 32, 64, 128, 256]  # the default sweep
    slices = prompts.split_for_levels(pool, counts)
    assert [len(s) for s in slices] == counts
    seen = set()
    for level in slices:
        assert not seen & set(level)
        seen |= set(level)
    with pytest.raises(ValueError, match="distinct prompts"):
        prompts.split_for_levels(pool[:10], [8, 8])


def test_prompt_files_jsonl_and_sharegpt(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "one"}, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "two"}]},
        {"conversations": [{"from": "human", "value": "three"}, {"from": "gpt", "value": "x"}]}, {"prompt": "one"},
        "four",
    ]) + "\n\n")
    assert prompts.load_prompts(jsonl) == ["one", "two", "three", "four"]  # duplicate dropped
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only"}]},
    ]))
    assert prompts.load_prompts(sharegpt) == ["hi"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        prompts.load_prompts(bad)


# ------------------------------------------------------------------------------------------------ URLs and errors


@pytest.mark.parametrize("url", ["http://127.0.0.1:30000", "localhost:30000", "http://[::1]:30000",
                                 "http://127.0.0.5:1/v1/chat/completions"])
def test_loopback_urls_are_accepted(url):
    base = runner.normalize_url(url)
    assert base.startswith("http://") and not base.endswith("/v1/chat/completions") and not base.endswith("/")


@pytest.mark.parametrize("url", ["http://10.0.0.7:30000", "http://example.com:30000", "https://8.8.8.8"])
def test_non_loopback_urls_are_refused_unless_allowed(url):
    with pytest.raises(runner.LoadTestError, match="--allow-remote"):
        runner.normalize_url(url)
    assert runner.normalize_url(url, allow_remote=True)


def test_cli_refuses_remote_url_with_a_clear_error(capsys):
    from sglang_dspark import cli

    assert cli.main(["loadtest", "--url", "http://192.168.1.20:30000", "--quiet"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


def _serve(routes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = routes.get(self.path, (404, "not found"))
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_clear_errors_for_down_server_wrong_url_and_model_mismatch():
    from sglang_dspark.local_server import free_port

    with pytest.raises(runner.LoadTestError, match="connection refused"):
        runner.probe_server(f"http://127.0.0.1:{free_port()}", timeout=2)
    wrong = _serve({})
    try:
        with pytest.raises(runner.LoadTestError, match="wrong URL"):
            runner.probe_server(f"http://127.0.0.1:{wrong.server_port}", timeout=2)
    finally:
        wrong.shutdown()
    sglang_like = _serve({"/health": (200, ""), "/v1/models": (200, {"data": [{"id": "served-model"}]})})
    try:
        url = f"http://127.0.0.1:{sglang_like.server_port}"
        assert runner.probe_server(url, timeout=2).model == "served-model"
        with pytest.raises(runner.LoadTestError, match="model mismatch.*served-model"):
            runner.probe_server(url, model="other-model", timeout=2)
    finally:
        sglang_like.shutdown()


# ------------------------------------------------------------------------------------------------ a whole sweep


def fake_servers(serving, monkeypatch, *, snapshots: bool = False) -> list:
    """Every server the runner talks to answers through ``fake_request_func`` (the log of requests is returned),
    probes and warms up at once, and (``snapshots``) has an empty /server_info."""
    log: list = []
    monkeypatch.setattr(serving, "async_request_openai_chat_completions", fake_request_func(log))
    monkeypatch.setattr(runner, "probe_server", lambda url, model=None: runner.ServerInfo(url=url, model="m"))
    monkeypatch.setattr(runner, "warm_up", lambda info, timeout: None)
    if snapshots:
        monkeypatch.setattr(engine, "server_snapshot", lambda url, timeout=30.0: {})
    return log


def test_sweep_writes_json_png_and_table_with_a_fake_engine(serving, monkeypatch, tmp_path, capsys):
    log = fake_servers(serving, monkeypatch)
    counter = {"steps": 0}

    def snapshot(url, timeout=30.0):
        counter["steps"] += 5  # every snapshot sees five more steps, all admitting 2 drafts, 1 accepted
        n = counter["steps"]
        return {"dspark_admission": {"policy": "async", "steps": n, "admitted_len_histogram": [0, 0, n],
                                     "accepted_len_histogram": [0, n]}}

    monkeypatch.setattr(engine, "server_snapshot", snapshot)
    out_dir = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "http://127.0.0.1:2", "--label", "base", "fast",
                      "--concurrency", "1", "2", "--prompts-per-level", "3", "--max-tokens", "8",
                      "--output-dir", str(out_dir), "--quiet"])
    assert rc == 0
    result = json.loads((out_dir / "loadtest.json").read_text())
    assert (out_dir / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [c["label"] for c in result["configs"]] == ["base", "fast"]
    assert result["settings"]["fresh_prompts_per_level"] and result["baseline"] == "base"
    for config in result["configs"]:
        assert [lv["concurrency"] for lv in config["levels"]] == [1, 2]
        for level in config["levels"]:
            assert level["completed"] == 3 and level["output_tokens"] == 24
            assert level["accept_length"] == pytest.approx(2.0)  # 8 tokens / 4 chunks
            assert level["admission"]["steps"] == 5 and level["admission"]["mean_admitted_draft_len"] == 2.0
            for key in ("ttft_ms", "tpot_ms", "itl_ms"):
                assert set(level[key]) == {"mean", "p50", "p90", "p99"}
            assert level["output_tok_s_ratio"] is not None
    assert all(lv["output_tok_s_ratio"] == 1.0 for lv in result["configs"][0]["levels"])
    # Fresh prompts at every level; the same prompts for every server at a level.
    by_server: dict[str, list[str]] = {}
    for api_url, prompt, model, _ in log:
        assert api_url.endswith("/v1/chat/completions") and model == "m"
        by_server.setdefault(api_url, []).append(prompt)
    first, second = by_server.values()
    assert sorted(first) == sorted(second) and len(set(first)) == len(first) == 6
    level1 = set(first[:3])
    assert level1 == set(second[:3]) and not level1 & set(first[3:])
    # Outputs compared with the baseline's, prompt by prompt: the fake server 2 changed those with an even length.
    assert 0 < sum(_even_tail(p) for p in first) < 6  # some answers differ, some do not
    for config in result["configs"]:
        for level, prompts in zip(config["levels"], (first[:3], first[3:])):
            changed = sum(_even_tail(p) for p in prompts) if config["label"] == "fast" else 0
            assert level["same_output"] == [3 - changed, 3]
    table = capsys.readouterr().out
    assert "| fast | c=2 |" in table and "python -m sglang_dspark.loadtest --url" in table
    assert "same text as base" in table
    # --replot redraws from the JSON alone
    assert runner.main(["--replot", str(out_dir / "loadtest.json"), "--output-dir", str(tmp_path / "re")]) == 0
    assert (tmp_path / "re" / "frontier.png").is_file()


def test_several_temperatures_are_levels_with_fresh_prompts(serving, monkeypatch, tmp_path):
    log = fake_servers(serving, monkeypatch, snapshots=True)
    out_dir = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "http://127.0.0.1:2", "--label", "base", "fast",
                      "--concurrency", "1", "2", "--temperature", "0", "0.7", "--prompts-per-level", "2",
                      "--max-tokens", "8", "--output-dir", str(out_dir), "--quiet"])
    assert rc == 0
    result = json.loads((out_dir / "loadtest.json").read_text())
    keys = ["c=1 T=0", "c=2 T=0", "c=1 T=0.7", "c=2 T=0.7"]
    for config in result["configs"]:
        assert [report.level_key(lv) for lv in config["levels"]] == keys
        # Outputs are compared at temperature 0 only (sampled answers differ by design).
        assert [lv.get("same_output") is not None for lv in config["levels"]] == [True, True, False, False]
    sent = [(body["temperature"], prompt) for url, prompt, _, body in log if url.startswith("http://127.0.0.1:1")]
    assert [t for t, _ in sent] == [0.0] * 4 + [0.7] * 4
    assert len({p for _, p in sent}) == 8  # a fresh prompt for every request of every level
    assert (out_dir / "frontier.png").is_file()


def test_dataset_grounded_sends_grounded_prompts_fresh_per_level(serving, monkeypatch, tmp_path):
    log = fake_servers(serving, monkeypatch, snapshots=True)
    out_dir = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "--concurrency", "1", "2", "--prompts-per-level", "3",
                      "--max-tokens", "8", "--dataset", "grounded", "--seed", "5", "--output-dir", str(out_dir),
                      "--quiet"])
    assert rc == 0
    assert json.loads((out_dir / "loadtest.json").read_text())["settings"]["dataset"] == "grounded"
    sent = [prompt for _, prompt, _, _ in log]
    assert len(set(sent)) == 6 and set(sent) <= set(prompts.grounded_prompts(5))
    assert not set(sent[:3]) & set(sent[3:])  # fresh prompts at the second level


def _turns(log, urls) -> list[int]:
    """The servers (1-based) in the order they were sent requests, one entry per uninterrupted turn."""
    turns = []
    for api_url, _, _, _ in log:
        server = urls.index(api_url.removesuffix("/v1/chat/completions")) + 1
        if not turns or turns[-1] != server:
            turns.append(server)
    return turns


def test_levels_are_interleaved_across_servers_each_level_starting_from_the_next(serving, monkeypatch, tmp_path):
    """A machine that drifts over minutes must shift every server of a level alike: level i runs on every server
    before level i + 1, and no server always goes first."""
    log = fake_servers(serving, monkeypatch, snapshots=True)
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    rc = runner.main(["--url", *urls, "--concurrency", "1", "1", "1", "--prompts-per-level", "2",
                      "--max-tokens", "4", "--output-dir", str(tmp_path / "out"), "--quiet"])
    assert rc == 0
    assert _turns(log, urls) == [1, 2, 3, 2, 3, 1, 3, 1, 2]
    result = json.loads((tmp_path / "out" / "loadtest.json").read_text())
    assert result["settings"]["schedule"] == "interleaved"
    assert all(len(config["levels"]) == 3 for config in result["configs"])


def test_a_level_runs_in_rounds_that_take_turns_and_pool_into_one_level(serving, monkeypatch, tmp_path):
    """Rounds within a level: 8 prompts at c = 2 on two servers make 2 rounds (two waves each, the default) taking
    turns 1 2 | 2 1; each server's level pools its 8 requests, in prompt order, over the two rounds' time."""
    log = fake_servers(serving, monkeypatch)
    snapshots = []
    monkeypatch.setattr(engine, "server_snapshot", lambda url, timeout=30.0: snapshots.append(url) or {})
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    out = tmp_path / "out"
    rc = runner.main(["--url", *urls, "--concurrency", "2", "--prompts-per-level", "8", "--max-tokens", "4",
                      "--output-dir", str(out), "--quiet"])
    assert rc == 0
    assert _turns(log, urls) == [1, 2, 1]  # round 1: server 1 then 2; round 2: server 2 (still its turn) then 1
    prompts = {url: [prompt for api, prompt, _, _ in log if api.startswith(url)] for url in urls}
    assert prompts[urls[0]] == prompts[urls[1]] and len(set(prompts[urls[0]])) == 8
    result = json.loads((out / "loadtest.json").read_text())
    assert result["settings"]["rounds_per_level"] == [2]
    for config in result["configs"]:
        (level,) = config["levels"]
        assert level["requests"] == level["completed"] == 8 and level["prompts"] == 8
        assert len(level["round_output_tok_s"]) == 2 and all(r > 0 for r in level["round_output_tok_s"])
        assert len(level["round_ratios"]) == 2
    assert result["configs"][0]["levels"][0]["round_ratios"] == [1.0, 1.0]
    # Digests in prompt order across the rounds: server 2's answers differ exactly where the fake makes them differ.
    expected_same = sum(not runner_even for runner_even in map(_even_tail, prompts[urls[0]]))
    assert [c["levels"][0]["same_output"] for c in result["configs"]] == [[8, 8], [expected_same, 8]]
    # Admission counters: read once before a server's first round and once after its last (not per round).
    assert sorted(snapshots) == sorted(urls * 2)
    args = runner.build_parser().parse_args(["--quiet"])
    assert [runner.level_rounds(args, {"concurrency": c}, n) for c, n in [(1, 8), (4, 16), (64, 256), (4, 4)]] == [
        4, 2, 2, 1]
    args = runner.build_parser().parse_args(["--quiet", "--rounds", "3"])
    assert runner.level_rounds(args, {"concurrency": 1}, 2) == 2
    assert runner.split_rounds(list("abcdefg"), 3) == [["a", "b"], ["c", "d", "e"], ["f", "g"]]


def test_room_for_another_server_counts_the_last_ones_footprint():
    gib = 1 << 30
    assert runner.room_for_another_server(10 * gib, 8 * gib)  # 2 GiB used, 8 left: 2.5 + 1 fits
    assert not runner.room_for_another_server(10 * gib, 4 * gib)  # 6 GiB used, 4 left: 7.5 + 1 does not
    assert runner.room_for_another_server(None, 4 * gib)  # no /proc/meminfo: no grouping
    assert runner.memory_available_bytes() is None or runner.memory_available_bytes() > 0


def test_a_server_that_dies_keeps_its_levels_and_the_others_go_on(monkeypatch):
    """Interleaved: a server gone at level 2 keeps level 1, gets no level 3, and the other server runs all three."""
    levels = [{"concurrency": 1}] * 3
    prompts_by_level = [["a"], ["b"], ["c"]]
    args = runner.build_parser().parse_args(["--quiet"])
    calls = []

    class FakeLevelRun:
        def __init__(self, url, snapshot_func=None):
            self.url, self.completed = url, 0

        def run_round(self, prompts, **kwargs):
            calls.append((self.url, prompts[0]))
            dead = self.url == "http://dead" and prompts[0] != "a"
            self.completed += 0 if dead else 1
            return 0 if dead else 1

        def result(self, tokenizer=None):
            return {"completed": self.completed, "requests": 1}

    monkeypatch.setattr(engine, "LevelRun", FakeLevelRun)
    alive = {"http://dead": lambda: False, "http://ok": lambda: True}
    targets = [runner.SweepTarget(runner.ServerInfo(url=u, model="m"), u, {"levels": []}, None, alive[u])
               for u in ("http://dead", "http://ok")]
    runner.sweep_interleaved(targets, levels, prompts_by_level, args)
    dead, ok = targets
    assert len(dead.entry["levels"]) == 2 and "stopped during" in dead.entry["error"]
    assert len(ok.entry["levels"]) == 3 and not ok.entry.get("error")
    assert ("http://dead", "c") not in calls


def test_round_ratios_pair_each_round_with_the_baselines_and_the_table_shows_their_range():
    """Round i of a configuration is compared with round i of the baseline (they ran back to back); the table
    prints the pooled ratio and the range of the round ratios, so a level's noise is visible beside its ratio."""
    assert report.round_ratios([90.0, 120.0, 100.0], [100.0, 100.0, 100.0]) == pytest.approx([0.9, 1.2, 1.0])
    assert report.round_ratios([90.0], [100.0]) is None  # one round: no spread to show
    assert report.round_ratios([90.0, 80.0], [100.0, 100.0, 100.0]) is None  # rounds that do not pair
    result = {"settings": {}, "configs": [
        {"label": "base", "levels": [{"concurrency": 4, "output_tok_s": 100.0, "round_output_tok_s": [100.0, 100.0]}]},
        {"label": "spec", "levels": [{"concurrency": 4, "output_tok_s": 95.0, "round_output_tok_s": [88.0, 102.0]}]},
    ]}
    report.add_ratios(result)
    spec_level = result["configs"][1]["levels"][0]
    assert spec_level["round_ratios"] == pytest.approx([0.88, 1.02])
    row = [line for line in report.markdown_table(result).splitlines() if line.startswith("| spec")][0]
    assert "| 0.95 (0.88–1.02) |" in row
    base_row = [line for line in report.markdown_table(result).splitlines() if line.startswith("| base")][0]
    assert "| 1.00 (1.00–1.00) |" in base_row


def test_the_table_shows_requests_in_flight_and_end_to_end_speed_beside_throughput():
    """A configuration whose requests finish out of step keeps fewer in flight (clients idle at a round's end): the
    table shows that share and each request's end-to-end speed, so a lower output tok/s with an unchanged per-request
    speed reads as such."""
    result = {"settings": {}, "configs": [
        {"label": "base", "levels": [{"concurrency": 16, "output_tok_s": 80.0, "achieved_concurrency": 16.0,
                                      "per_user_tok_s": 7.0, "per_user_e2e_tok_s": 5.0}]},
        {"label": "spec", "levels": [{"concurrency": 16, "output_tok_s": 72.0, "achieved_concurrency": 14.4,
                                      "per_user_tok_s": 5.6, "per_user_e2e_tok_s": 5.0}]},
        {"label": "rate", "levels": [{"request_rate": 2.0, "concurrency": None, "output_tok_s": 10.0}]},
    ]}
    report.add_ratios(result)
    header, _, base, spec, rate = report.markdown_table(result).splitlines()
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = [cell.strip() for cell in spec.strip("|").split("|")]
    assert len(cells) == len(columns)
    assert cells[columns.index("in flight")] == "90 %"
    assert cells[columns.index("e2e per-user × base")] == "1.00"
    assert cells[columns.index("× base")] == "0.90"
    assert [c.strip() for c in rate.strip("|").split("|")][columns.index("in flight")] == "–"
    assert [c.strip() for c in base.strip("|").split("|")][columns.index("in flight")] == "100 %"


def test_sustained_throughput_leaves_out_the_drain_that_out_of_step_requests_add():
    """Two rounds of 4 requests at c = 2, 64 tokens each. The baseline runs in lockstep (every request 4 s, each round
    8 s: no drain); the speculative server serves every request faster on average (2, 2, 2, 5 s) but its rounds end
    on the slow one, so its output tok/s reads the drain (rounds of 7 s: 64 / 56 ≈ 1.14×) where its sustained tok/s
    (2 × 64 / mean latency) reads 4 / 2.75 ≈ 1.45×; the baseline's sustained equals its output tok/s. A request-rate
    level has none, nor a level whose requests did not fit the server's KV pool at once."""
    def level(latencies_s, round_s):
        rounds = [0] * 4 + [1] * 4
        timings = {"ok": [True] * 8, "ttft_ms": [100.0] * 8, "tpot_ms": [10.0] * 8,
                   "e2e_ms": [1000.0 * t for t in latencies_s * 2], "output_tokens": [64] * 8, "round": rounds}
        return {"concurrency": 2, "output_tok_s": 512 / (2 * round_s), "round_output_tok_s": [256 / round_s] * 2,
                "round_duration_s": [round_s] * 2, "request_timings": timings}

    result = {"settings": {"seed": 0}, "configs": [
        {"label": "no-spec", "name": "no-spec", "levels": [level([4.0, 4.0, 4.0, 4.0], 8.0)]},
        {"label": "DSPARK", "name": "dspark", "levels": [level([2.0, 2.0, 2.0, 5.0], 7.0)]},
        {"label": "rate", "name": "rate", "levels": [{"request_rate": 2.0, "concurrency": None, "output_tok_s": 1.0}]},
    ]}
    report.add_ratios(result)
    base, spec = result["configs"][0]["levels"][0], result["configs"][1]["levels"][0]
    assert base["sustained_tok_s"] == pytest.approx(base["output_tok_s"]) == pytest.approx(32.0)
    assert spec["output_tok_s_ratio"] == pytest.approx(8 / 7)
    assert spec["sustained_tok_s"] == pytest.approx(2 * 64 / 2.75) and spec["sustained_tok_s_ratio"] == pytest.approx(
        4 / 2.75)
    assert spec["intervals"]["sustained_tok_s_ratio"] == pytest.approx([4 / 2.75, 4 / 2.75])
    assert result["configs"][2]["levels"][0]["sustained_tok_s"] is None
    queued = dict(spec, completed=8, input_tokens=8 * 200, output_tokens=8 * 64)  # 2 × 264 tokens held at once
    assert report.sustained_tok_s(queued, pool_tokens=528) == pytest.approx(spec["sustained_tok_s"])
    assert report.sustained_tok_s(queued, pool_tokens=527) is None  # a queue at the server: no steady state
    text = report.summary_tables(result)
    assert "| sustained tok/s (no drain, Little's law), × no-spec (95 % CI) | c=2 |" in text
    assert "| no-spec | 32.0 tok/s |" in text and "| DSPARK | 1.45 (1.45–1.45) ▲ |" in text
    assert report.SUSTAINED_LEGEND in text


# ------------------------------------------------------------------------------------------------ per proposal source


def lookup_summary(k: int, *, mode: str = "on") -> dict:
    """``LookupSource.summary()`` after ``k`` equal slices of traffic: per slice 10 decode steps (2 plain, 4 drafted,
    3 lookup, 1 mixed), 4 lookup rows verifying 12 tokens with 6 accepted, 8 draft rows verifying 24 with 8
    accepted, 1 of the 5 proposals from the shared cache, its row verifying 3 tokens with 3 accepted; the lifetime plan
    cost grows by 1 µs per slice so the test sees which snapshot it came from."""
    return {
        "mode": mode,
        "steps": {"plain": 2 * k, "drafted": 4 * k, "lookup": 3 * k, "mixed": k},
        "indexed_requests": 3,
        "lookup": {"proposals": 5 * k, "rows": 4 * k, "verified": 12 * k, "accepted": 6 * k,
                   "accept_length": 2.5 if k else None, "ece": 0.05 if k else None},
        "draft": {"rows": 8 * k, "verified": 24 * k, "accepted": 8 * k, "accept_length": 2.0 if k else None},
        "shared": {"scope": "key", "proposals": k, "rows": k, "verified": 3 * k, "accepted": 3 * k},
        "plan_us_per_step": 10.0 + k if k else None,
    }


def test_lookup_delta_is_the_traffic_between_snapshots():
    d = engine.lookup_delta(lookup_summary(3), lookup_summary(5))  # two slices of traffic
    assert d["mode"] == "on"
    assert d["steps"] == {"plain": 4, "drafted": 8, "lookup": 6, "mixed": 2}
    assert d["step_share"] == pytest.approx({"plain": 0.2, "drafted": 0.4, "lookup": 0.3, "mixed": 0.1})
    assert (d["lookup"]["rows"], d["lookup"]["verified"], d["lookup"]["accepted"]) == (8, 24, 12)
    assert d["lookup"]["proposals"] == 10 and d["lookup"]["acceptance"] == pytest.approx(0.5)
    assert d["lookup_accept_length"] == pytest.approx(1 + 12 / 8)  # the bonus token included
    assert (d["draft"]["rows"], d["draft"]["verified"], d["draft"]["accepted"]) == (16, 48, 16)
    assert d["draft_accept_length"] == pytest.approx(1 + 16 / 16)
    assert d["plan_us_per_step"] == 15.0 and d["lookup_ece"] == 0.05  # the after-snapshot's lifetime values
    # A level whose accept lengths differ from the lifetime ones: only the level's traffic counts.
    after = lookup_summary(5)
    after["lookup"]["accepted"] += 8  # this level's 8 lookup rows accepted 20 of their 24 tokens
    assert engine.lookup_delta(lookup_summary(3), after)["lookup_accept_length"] == pytest.approx(1 + 20 / 8)
    # No before-snapshot (the server did not answer): the lifetime counts are the level's.
    first = engine.lookup_delta(None, lookup_summary(1))
    assert first["steps"] == {"plain": 2, "drafted": 4, "lookup": 3, "mixed": 1}
    # Lookup off, a non-DSPARK server, NGRAM: nothing to difference.
    assert engine.lookup_delta(lookup_summary(1), None) is None and engine.lookup_delta(None, None) is None
    # No decode step in the level, and a forced lookup that verified no draft row: no share, no τ, no crash.
    idle = engine.lookup_delta(lookup_summary(2), lookup_summary(2))
    assert idle["step_share"] == dict.fromkeys(("plain", "drafted", "lookup", "mixed"))
    assert idle["lookup_accept_length"] is None and idle["draft_accept_length"] is None
    forced = engine.lookup_delta(None, {"mode": "forced", "steps": {"lookup": 4}, "lookup": {"rows": 4,
                                        "verified": 8, "accepted": 4, "ece": None}, "draft": {},
                                        "plan_us_per_step": None})
    assert forced["mode"] == "forced" and forced["step_share"]["lookup"] == 1.0
    assert forced["lookup_accept_length"] == 2.0 and forced["draft_accept_length"] is None
    assert forced["plan_us_per_step"] is None and forced["lookup_ece"] is None


def test_sources_table_prints_a_row_per_level_with_dashes_where_a_server_has_no_lookup():
    sources = engine.lookup_delta(lookup_summary(1), lookup_summary(2))
    idle = engine.lookup_delta(lookup_summary(2), lookup_summary(2))
    result = {"settings": {}, "configs": [
        {"label": "no-spec", "levels": [{"concurrency": 1, "output_tok_s": 10.0}]},
        {"label": "dspark", "levels": [{"concurrency": 1, "output_tok_s": 12.0, "admission": {"steps": 0}}]},
        {"label": "lookup", "levels": [{"concurrency": 1, "output_tok_s": 15.0, "sources": sources},
                                       {"concurrency": 4, "output_tok_s": 30.0, "sources": idle}]},
    ]}
    report.add_ratios(result)
    text = report.summary_tables(result)
    assert text.startswith(report.markdown_table(result))
    table = report.sources_table(result)
    assert table in text
    header, separator, *rows = [line for line in table.splitlines() if line.startswith("|")]
    assert header == ("| configuration | load | steps plain / drafted / lookup / mixed % | lookup τ | draft τ | "
                      "shared % / τ | lookup µs/step |")
    assert separator == "| --- " * 7 + "|"
    assert rows == [
        "| no-spec | c=1 | – | – | – | – | – |",
        "| dspark | c=1 | – | – | – | – | – |",
        "| lookup | c=1 | 20 / 40 / 30 / 10 | 2.50 | 2.00 | 20 / 4.00 | 12.0 |",
        "| lookup | c=4 | – | – | – | – | 12.0 |",  # no decode step in the level: no share, no τ
    ]
    # A run where no server reported a lookup prints the main table alone.
    for config in result["configs"]:
        for level in config["levels"]:
            level.pop("sources", None)
    assert report.sources_table(result) == "" and report.summary_tables(result) == report.markdown_table(result)
    assert report.source_cells({"sources": None}) == {"steps": "–", "lookup_tau": "–", "draft_tau": "–",
                                                      "shared": "–", "plan_us": "–"}


def test_sweep_records_and_prints_per_source_numbers(serving, monkeypatch, tmp_path, capsys):
    """Three servers: DSPARK with prompt lookup, DSPARK with lookup off (``"lookup": None``) and one without
    ``dspark_admission`` (no-spec, NGRAM). One slice of lookup traffic between each pair of snapshots."""
    fake_servers(serving, monkeypatch)
    calls = {"lookup": 0}

    def snapshot(url, timeout=30.0):
        if url.endswith(":1"):
            calls["lookup"] += 1
            admission = {"policy": "async", "steps": 10 * calls["lookup"], "lookup": lookup_summary(calls["lookup"])}
            return {"speculative_algorithm": "DSPARK", "dspark_admission": admission}
        if url.endswith(":2"):
            return {"speculative_algorithm": "DSPARK", "dspark_admission": {"policy": "async", "lookup": None}}
        return {"speculative_algorithm": "NGRAM", "dspark_admission": None}

    monkeypatch.setattr(engine, "server_snapshot", snapshot)
    out_dir = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3",
                      "--label", "lookup", "off", "ngram", "--concurrency", "1", "2", "--prompts-per-level", "2",
                      "--max-tokens", "4", "--rounds", "1", "--output-dir", str(out_dir)])
    assert rc == 0
    result = json.loads((out_dir / "loadtest.json").read_text())
    lookup, off, ngram = result["configs"]
    for level in lookup["levels"]:
        assert level["sources"]["steps"] == {"plain": 2, "drafted": 4, "lookup": 3, "mixed": 1}
        assert level["sources"]["lookup_accept_length"] == pytest.approx(2.5)
        assert level["sources"]["draft_accept_length"] == pytest.approx(2.0)
    # The plan cost is the after-snapshot's (2nd and 4th reading of server 1).
    assert [lv["sources"]["plan_us_per_step"] for lv in lookup["levels"]] == [12.0, 14.0]
    assert all("sources" not in level for level in off["levels"] + ngram["levels"])
    captured = capsys.readouterr()
    assert "| lookup | c=1 | 20 / 40 / 30 / 10 | 2.50 | 2.00 | 20 / 4.00 | 12.0 |" in captured.out
    assert "| lookup | c=2 | 20 / 40 / 30 / 10 | 2.50 | 2.00 | 20 / 4.00 | 14.0 |" in captured.out
    assert "| off | c=2 | – | – | – | – |" in captured.out
    assert "| ngram | c=1 | – | – | – | – |" in captured.out
    assert "(lookup τ 2.50, draft τ 2.00)" in captured.err  # the progress line of each level
    # --replot prints the per-source table from the JSON alone
    assert runner.main(["--replot", str(out_dir / "loadtest.json"), "--output-dir", str(tmp_path / "re")]) == 0
    assert "| lookup | c=2 | 20 / 40 / 30 / 10 | 2.50 | 2.00 | 20 / 4.00 | 14.0 |" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------- SLO, intervals, search


def servers_slower_with_load(serving, monkeypatch, ttft_per_request: dict[str, float]) -> list:
    """Fake servers whose every request reports TTFT = ``ttft_per_request[port] x the level's concurrency`` (known
    answers: a server meets a TTFT bound exactly up to a concurrency), answering through ``fake_request_func``."""
    log: list = []
    fake_servers(serving, monkeypatch, snapshots=True)
    current = {}
    run_requests = engine.run_requests

    async def recording_run_requests(*args, **kwargs):
        current["concurrency"] = kwargs.get("concurrency")
        return await run_requests(*args, **kwargs)

    base = fake_request_func(log)

    async def request(request_func_input, pbar=None):
        out = await base(request_func_input, pbar)
        port = request_func_input.api_url.split(":")[2].split("/")[0]
        out.ttft = ttft_per_request[port] * current["concurrency"]
        out.latency = out.ttft + sum(out.itl)
        return out

    monkeypatch.setattr(engine, "run_requests", recording_run_requests)
    monkeypatch.setattr(serving, "async_request_openai_chat_completions", request)
    return log


def test_find_max_load_climbs_stops_at_the_first_miss_and_halves_the_bracket(serving, monkeypatch, tmp_path, capsys):
    """TTFT ≤ 450 ms: server 1 (100 ms per request in flight) meets it up to c = 4, server 2 (50 ms) up to c = 9.
    Climbing 1 2 4 8 16, server 1 stops after its miss at 8 (no c = 16) and server 2 after 16; two halving steps
    then test 6 and 5 (server 1), 11 and 9 (server 2), each step on fresh prompts shared by both."""
    log = servers_slower_with_load(serving, monkeypatch, {"1": 0.1, "2": 0.05})
    out = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "http://127.0.0.1:2", "--label", "slow", "fast",
                      "--concurrency", "16", "1", "4", "2", "8", "--prompts-per-level", "2", "--max-tokens", "4",
                      "--slo", "ttft=450ms,tpot=1s", "--find-max-load", "--output-dir", str(out), "--quiet"])
    assert rc == 0
    result = json.loads((out / "loadtest.json").read_text())
    slow, fast = result["configs"]
    assert [lv["concurrency"] for lv in slow["levels"]] == [1, 2, 4, 5, 6, 8]
    assert [lv["concurrency"] for lv in fast["levels"]] == [1, 2, 4, 8, 9, 11, 16]
    assert [lv["slo"]["passes"] for lv in slow["levels"]] == [True, True, True, False, False, False]
    assert [lv["slo"]["attainment"] for lv in fast["levels"]] == [1.0] * 5 + [0.0] * 2
    loads = {entry["label"]: (entry["max_load"], entry["first_failing_load"]) for entry in result["max_load"]}
    assert loads == {"slow": (4, 5), "fast": (9, 11)}
    assert result["slo"]["bounds_ms"] == {"ttft": 450.0, "tpot": 1000.0} and result["slo"]["target"] == 0.9
    assert result["settings"]["find_max_load"] and result["settings"]["search_steps"] == 2
    # Fresh prompts at every step; the servers of a step share its prompts.
    sent = {url: [prompt for api, prompt, _, _ in log if api.startswith(url)]
            for url in ("http://127.0.0.1:1", "http://127.0.0.1:2")}
    assert len(set(sent["http://127.0.0.1:1"])) == len(sent["http://127.0.0.1:1"]) == 12
    assert len(set(sent["http://127.0.0.1:2"])) == len(sent["http://127.0.0.1:2"]) == 14
    assert set(sent["http://127.0.0.1:1"][8:10]) == set(sent["http://127.0.0.1:2"][10:12])  # search step 1
    printed = capsys.readouterr().out
    assert "users per server at this SLO (TTFT ≤ 450 ms, TPOT ≤ 1 s, ≥ 90 % of requests): slow 4, fast 9" in printed
    assert "| fast | c=9 | 100 % ✓ | 100 % | 100 % |" in printed
    # The baseline misses: no goodput ratio.
    assert "| slow | c=8 | 0 % | 0 % | 100 % | 0.00 | 0.0 | – |" in printed
    assert (out / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_with_an_slo_reports_goodput_and_at_least_the_highest_tested_load(serving, monkeypatch, tmp_path,
                                                                                  capsys):
    """Without --find-max-load every level runs on every server; the users per server is read off the levels, "≥"
    where every one passed. --replot with another SLO re-evaluates the same requests (no new requests)."""
    servers_slower_with_load(serving, monkeypatch, {"1": 0.1, "2": 0.05})
    out = tmp_path / "out"
    assert runner.main(["--url", "http://127.0.0.1:1", "http://127.0.0.1:2", "--label", "slow", "fast",
                        "--concurrency", "1", "4", "--prompts-per-level", "4", "--rounds", "2", "--max-tokens", "4",
                        "--slo", "ttft=300ms,p75", "--output-dir", str(out), "--quiet"]) == 0
    result = json.loads((out / "loadtest.json").read_text())
    assert result["slo"]["target"] == 0.75
    slow, fast = result["configs"]
    assert [lv["slo"]["passes"] for lv in slow["levels"]] == [True, False]
    assert [lv["slo"]["passes"] for lv in fast["levels"]] == [True, True]
    level = fast["levels"][0]
    assert level["slo"]["goodput_tok_s"] == pytest.approx(level["output_tok_s"])  # every request met it
    assert level["slo"]["goodput_req_s"] == pytest.approx(4 / level["duration_s"])
    assert len(level["slo"]["round_goodput_tok_s"]) == 2 and level["intervals"]["goodput_tok_s_ratio"] is not None
    assert len(level["request_timings"]["ttft_ms"]) == 4 and level["request_timings"]["round"] == [0, 0, 1, 1]
    printed = capsys.readouterr().out
    assert "users per server at this SLO (TTFT ≤ 300 ms, ≥ 75 % of requests): slow 1, fast ≥ 4" in printed
    assert "(≥: every tested load met the SLO" in printed
    # The comparison table: the baseline's tok/s, the ratio with its interval, users per server.
    header = next(line for line in printed.splitlines() if line.startswith("| output tok/s, × slow"))
    assert header.endswith("| c=1 | c=4 | users per server at the SLO |")
    assert next(line for line in printed.splitlines() if line.startswith("| fast | 1.") or
                line.startswith("| fast | 0.")).endswith("| ≥ 4 |")
    # The JSON keeps each line of numbers on one line.
    text = (out / "loadtest.json").read_text()
    assert '"round": [0, 0, 1, 1]' in text and json.loads(text) == result
    # Replot under a tighter SLO: the same requests, another answer.
    assert runner.main(["--replot", str(out / "loadtest.json"), "--slo", "ttft=100ms", "--output-dir",
                        str(tmp_path / "re")]) == 0
    assert "TTFT ≤ 100 ms, ≥ 90 % of requests): slow 1, fast 1" in capsys.readouterr().out
    assert (tmp_path / "re" / "goodput.png").is_file()
    # Replot without --slo keeps the run's own SLO.
    assert runner.main(["--replot", str(out / "loadtest.json"), "--output-dir", str(tmp_path / "re2")]) == 0
    assert "slow 1, fast ≥ 4" in capsys.readouterr().out


def test_intervals_mark_resolved_differences_and_show_the_noise_floor():
    """Four paired rounds per level: DSPARK 1.2x the baseline in every round (resolved, ▲), the control within
    ±5 % (not resolved: the noise floor, shown under the table and marked in the comparison table)."""
    def level(rounds):
        return {"concurrency": 4, "output_tok_s": sum(rounds) / len(rounds), "round_output_tok_s": rounds,
                "round_duration_s": [1.0] * len(rounds)}

    result = {"settings": {"seed": 0}, "configs": [
        {"label": "no-spec", "name": "no-spec", "levels": [level([100.0, 80.0, 120.0, 100.0])]},
        {"label": "no-spec (control)", "name": "no-spec-control", "levels": [level([105.0, 76.0, 120.0, 95.0])]},
        {"label": "DSPARK", "name": "dspark", "levels": [level([120.0, 96.0, 144.0, 120.0])]},
    ]}
    report.add_ratios(result)
    control, dspark = result["configs"][1]["levels"][0], result["configs"][2]["levels"][0]
    assert dspark["intervals"]["output_tok_s_ratio"] == pytest.approx([1.2, 1.2])
    low, high = control["intervals"]["output_tok_s_ratio"]
    assert 0.94 < low < 1.0 < high < 1.06
    assert result["interval_method"]["confidence"] == 0.95 and result["interval_method"]["seed"] == 0
    assert dspark["intervals"]["per_user_tok_s_ratio"] is None  # no per-request timings in this record
    text = report.summary_tables(result)
    assert "| DSPARK | c=4 | 120.0 | 1.20 (1.20–1.20) ▲ |" in text
    assert f"| no-spec (control) | c=4 | 99.0 | 0.99 ({low:.2f}–{high:.2f}) |" in text
    assert "95 % interval (percentile bootstrap over the level's paired rounds, 2000 resamples, seed 0)" in text
    assert f"Noise floor (no-spec (control), a second identical server): c=4 0.99 ({low:.2f}–{high:.2f})." in text
    assert "| no-spec | 100.0 tok/s |" in text and "| no-spec (control), noise floor | 0.99 (" in text
    assert report.control_config(result)["label"] == "no-spec (control)"
    assert report.control_config({"configs": [{"label": "a"}, {"label": "b"}]}) is None


def test_slo_flags_are_checked_before_any_server_starts(capsys):
    for argv, message in (
        (["--find-max-load"], "need --slo"),
        (["--slo-target", "0.9"], "need --slo"),
        (["--slo", "ttft=fast"], "--slo: 'fast' is not a duration"),
        (["--slo", "ttft=2s,p90", "--slo-target", "0.5"], "disagree"),
        (["--slo", "ttft=2s", "--find-max-load", "--temperature", "0", "0.7"], "one temperature"),
        (["--repeats", "0"], "--repeats must be at least 1"),
    ):
        with pytest.raises(SystemExit):
            runner.parse_args(argv)
        assert message in capsys.readouterr().err
    args = runner.parse_args(["--slo", "tpot=100ms", "--slo-target", "0.8"])
    assert args.slo_spec.bounds_ms == {"tpot": 100.0} and args.slo_spec.target == 0.8
    assert runner.parse_args([]).slo_spec is None


def test_repeats_run_each_level_again_on_fresh_prompts_with_more_rounds():
    args = runner.parse_args(["--repeats", "3"])
    assert runner.prompts_per_level(args, {"concurrency": 4}) == 3 * 16
    assert runner.level_rounds(args, {"concurrency": 4}, 48) == 3 * 2  # 2 rounds per repeat, as without repeats
    args = runner.parse_args(["--repeats", "2", "--rounds", "3", "--prompts-per-level", "6"])
    assert runner.prompts_per_level(args, {"concurrency": 1}) == 12
    assert runner.level_rounds(args, {"concurrency": 1}, 12) == 6
    # The search climbs: levels ascending, each once.
    args = runner.parse_args(["--slo", "ttft=1s", "--find-max-load", "--concurrency", "8", "1", "4", "1"])
    assert [level["concurrency"] for level in runner.build_levels(args)] == [1, 4, 8]
