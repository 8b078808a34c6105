"""``scripts/gpu_smoke.sh`` on the CPU (issue #38 item 3, issue #46 item 5): which servers it starts, on which pair,
and what it claims each backend proved.

The GPU run cannot happen here; fake servers stand in for SGLang. A fake "model" gives every prefix a top token and a
runner-up (a near-tie on some prefixes); no-spec decodes greedily and scores any sequence the way SGLang's input
logprobs do (entry j is token ``start + j`` given its prefix, entry 0 is None: scheduler_components/
logprob_result_processor.py:26-79). A speculative run that breaks a near-tie the other way must pass; one that emits a
token far below no-spec's must fail; no server may get ``--dtype float32`` unless it runs triton. ``/server_info`` is
faked per run: ours (lookup on) reports lookup proposals, the others none, unless a test says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_dspark.testing import gpu_smoke

V = 50


def top_two(prefix):
    """(top token, runner-up, gap in nats) of the fake model after ``prefix``: a near-tie every 16th length."""
    top = (sum((i + 1) * t for i, t in enumerate(prefix)) * 31 + len(prefix)) % V
    gap = 0.05 if len(prefix) % 16 == 3 else 3.0
    return top, (top + 1) % V, gap


def logprob(prefix, token):
    top, second, gap = top_two(prefix)
    return -0.1 if token == top else -0.1 - gap if token == second else -12.0


def tokenize(text):
    return [ord(c) % V for c in text]


class FakeServer:
    """A started server: ``pick(prefix, step)`` decides each greedy token (no-spec: the top one)."""

    def __init__(self, label, args, env, pick, log=""):
        self.label, self.args, self.env, self.pick, self.log = label, list(args), dict(env or {}), pick, log
        self.startup_seconds = 12.0
        self.stopped = False
        self.requests = []

    def generate(self, text=None, sampling_params=None, **extra):
        ids = list(extra["input_ids"]) if "input_ids" in extra else tokenize(text)
        self.requests.append(ids)
        meta = {}
        if extra.get("return_logprob"):
            start = extra["logprob_start_len"]
            entries, tops = [], []
            for j, token in enumerate(ids[start:]):
                prefix = ids[: start + j]
                if j == 0:
                    entries.append((None, token, None))
                    tops.append(None)
                else:
                    entries.append((logprob(prefix, token), token, None))
                    top = top_two(prefix)[0]
                    tops.append([(logprob(prefix, top), top, None)])
            meta["input_token_logprobs"] = entries
            if extra.get("top_logprobs_num"):
                meta["input_top_logprobs"] = tops
        out = []
        for step in range(sampling_params.get("max_new_tokens", 1)):
            out.append(self.pick(ids + out, step) if not extra.get("return_logprob") else top_two(ids + out)[0])
        return {"output_ids": out, "meta_info": meta}

    def log_text(self):
        return self.log

    @property
    def url(self):
        return f"fake://{self.label}"

    def stop(self):
        self.stopped = True


def greedy(prefix, step):
    return top_two(prefix)[0]


def flips_near_ties(prefix, step):
    """What bf16 does to a correct server: a near-tie broken the other way."""
    top, second, gap = top_two(prefix)
    return second if gap < 0.1 else top


def wrong_token(prefix, step):
    """A broken verify: now and then a token no-spec would never pick."""
    top = top_two(prefix)[0]
    return (top + 7) % V if step == 20 else top


COMPACT_LOG = "sglang-dspark: Compact verify for admission policy async: fa3 ..."
LOOKUP_ON = {"steps": {"plain": 5, "drafted": 3, "lookup": 2, "mixed": 1}, "overlap_kept_at": [],
             "lookup": {"proposals": 9, "rows": 7, "verified": 12, "accepted": 9, "accept_length": 2.29}}


def run_label(args, env):
    if "--speculative-algorithm" not in args:
        return gpu_smoke.NO_SPEC
    env = env or {}
    if env.get("SGLANG_DSPARK_WORKER") == "upstream":
        return gpu_smoke.UPSTREAM
    return gpu_smoke.OURS_LOOKUP_OFF if env.get("SGLANG_DSPARK_LOOKUP") == "off" else gpu_smoke.OURS


def fake_launcher(picks, started, fail=(), logs=None):
    def start_server(target, args, *, env=None, cpu=True, log_dir=None, timeout=240):
        assert cpu is False
        backend = args[args.index("--attention-backend") + 1]
        label = run_label(args, env)
        started.append((backend, label, list(args), dict(env or {})))
        if (backend, label) in fail:
            raise RuntimeError("SGLang server exited with code 1 during start-up")
        log = (logs or {}).get(label, COMPACT_LOG if label in (gpu_smoke.OURS, gpu_smoke.OURS_LOOKUP_OFF) else "")
        return FakeServer(label, args, env, picks.get(label, greedy), log)
    return start_server


@pytest.fixture(autouse=True)
def server_info(monkeypatch):
    """``/server_info``'s lookup summary per run label (what ``loadtest.engine.server_snapshot`` returns); a test
    changes it by assigning ``server_info[label]``."""
    from sglang_dspark.loadtest import engine

    summaries = {gpu_smoke.OURS: LOOKUP_ON}

    def snapshot(url):
        return {"dspark_admission": {"lookup": summaries.get(url.split("://", 1)[1])}}

    monkeypatch.setattr(engine, "server_snapshot", snapshot)
    return summaries


EXPLAIN_ON = {"verify_mode": "compact", "prompt_lookup": "on: per request and step, the continuation of ..."}


def fake_explain(argv, device, gpu):
    return dict(EXPLAIN_ON)


def run_smoke(tmp_path, picks, backends=("fa3", "flashinfer"), fail=(), explain=fake_explain, logs=None,
              head_dim=128):
    started = []
    report = gpu_smoke.smoke("/pair/target", "/pair/draft", list(backends), tmp_path,
                             start_server=fake_launcher(picks, started, fail, logs), explain=explain,
                             head_dim=head_dim)
    return report, started


def checks_of(report, backend):
    return {check["name"]: check for check in report["backends"][backend]["checks"]}


def test_four_servers_per_backend_and_no_float32_outside_triton(tmp_path):
    report, started = run_smoke(tmp_path, {}, backends=("fa3", "flashinfer", "triton"))
    assert len(started) == 12
    for backend, label, args, env in started:
        dtype = args[args.index("--dtype") + 1]
        assert dtype == ("float32" if backend == "triton" else "bfloat16"), (backend, label, args)
    assert gpu_smoke.server_args("fa3")[:2] == ["--dtype", "bfloat16"]
    # upstream static, ours with the lookup on and off (the switch stated both ways), then no-spec, which scores
    assert [(label, env) for _, label, _, env in started[:4]] == [
        ("dspark-upstream-static", {"SGLANG_DSPARK_WORKER": "upstream"}),
        ("dspark-ours", {"SGLANG_DSPARK_LOOKUP": "on"}),
        ("dspark-ours-lookup-off", {"SGLANG_DSPARK_LOOKUP": "off"}),
        ("no-spec", {})]
    assert report["ok"], gpu_smoke.render_table(report)
    for backend in ("fa3", "flashinfer", "triton"):
        statuses = {name: check["status"] for name, check in checks_of(report, backend).items()}
        assert statuses == {"servers": "PASS", "verify mode": "PASS", "match": "PASS", "lookup": "PASS",
                            "lookup off": "PASS", "ours vs upstream": "INFO", "lookup on vs off": "INFO"}


def test_echo_prompts_carry_the_models_own_continuation(tmp_path):
    """Built once by the first server that serves, sent as token ids to every run and scored with them."""
    report, _ = run_smoke(tmp_path, {}, backends=("fa3", "flashinfer"), fail={("fa3", "dspark-upstream-static")})
    echo = report["echo_prompts"]
    assert report["echo_built_by"] == "fa3 dspark-ours" and len(echo) == len(gpu_smoke.PROMPTS)
    for prompt, ids in zip(gpu_smoke.PROMPTS, echo):
        p = tokenize(prompt)
        continued = []
        for _ in range(gpu_smoke.ECHO_TOKENS):
            continued.append(top_two(p + continued)[0])
        assert ids == p + continued + p  # P + what the model continued P with + P: its tail recurs in the prompt
    ours = report["backends"]["flashinfer"]["runs"]["dspark-ours"]
    # code at c = 1 (warm-up) and 16, echo at c = 1 and 16: every output scored, each equal to no-spec's
    assert ours["outputs"] == 4 * len(gpu_smoke.PROMPTS) and ours["identical_outputs"] == ours["outputs"]
    assert set(ours["tok_s"]) == {"code_c1", "code_c16", "echo_c1", "echo_c16"} == set(ours["ratio"])


def test_a_tie_broken_the_other_way_passes_and_is_stated_in_the_table(tmp_path):
    report, _ = run_smoke(tmp_path, {"dspark-ours": flips_near_ties}, backends=("fa3",))
    ours = report["backends"]["fa3"]["runs"]["dspark-ours"]
    # A flipped near-tie changes the rest of the free-running output, yet every token is no-spec's choice or a tie.
    assert ours["identical_outputs"] < 64 and ours["outputs"] == 64
    assert 0.9 <= ours["match_rate"] < 1.0 and ours["worst_gap_nats"] == pytest.approx(0.05)
    assert ours["failures"] == [] and report["ok"]
    upstream = report["backends"]["fa3"]["runs"]["dspark-upstream-static"]
    assert upstream["match_rate"] == 1.0 and upstream["identical_outputs"] == 64
    table = gpu_smoke.render_table(report)
    rows = [line for line in table.splitlines() if line.startswith("fa3 ") and ("dspark" in line or "no-spec" in line)]
    assert len(rows) == 4 and all(row.rstrip().endswith("ok") for row in rows)
    ours_row = next(row for row in rows if "dspark-ours " in row)
    assert "compact" in ours_row and "bfloat16" in ours_row
    assert "bfloat16 >= 0.90" in table and "1.0 nats" in table and table.splitlines()[-1].startswith("PASS")
    assert "  PASS  match: greedy match >= 0.90" in table


def test_a_wrong_token_fails_even_at_a_high_match_rate(tmp_path):
    report, _ = run_smoke(tmp_path, {"dspark-ours-lookup-off": wrong_token}, backends=("fa3",))
    off = report["backends"]["fa3"]["runs"]["dspark-ours-lookup-off"]
    assert off["match_rate"] > 0.95  # one bad token per output, the rest re-synchronised...
    assert off["worst_gap_nats"] > 10 and not report["ok"]  # ...but that token is no tie
    assert "nats below no-spec's" in off["failures"][0]
    match = checks_of(report, "fa3")["match"]
    assert match["status"] == "FAIL" and "dspark-ours-lookup-off: a differing token" in match["claim"]
    table = gpu_smoke.render_table(report)
    assert "FAIL" in table.splitlines()[-1] and "FAIL: match" in table


def test_a_server_that_does_not_start_fails_the_check(tmp_path):
    report, started = run_smoke(tmp_path, {}, backends=("flashinfer",), fail={("flashinfer", "no-spec")})
    runs = report["backends"]["flashinfer"]["runs"]
    assert runs["no-spec"]["failures"] == ["did not start"]
    assert runs["dspark-ours"]["failures"] == ["not scored by no-spec"]  # nothing to compare against
    checks = checks_of(report, "flashinfer")
    assert checks["servers"] == {"status": "FAIL", "name": "servers",
                                 "claim": "did not start: no-spec (see the server logs)"}
    assert checks["match"]["status"] == "FAIL" and not report["ok"]


def test_flashinfer_needs_head_dim_64_so_a_head_dim_32_row_is_not_run_and_fails(tmp_path):
    report, started = run_smoke(tmp_path, {}, backends=("fa3", "flashinfer"), head_dim=32)
    assert {backend for backend, *_ in started} == {"fa3"}  # no flashinfer server is started for nothing
    assert report["backends"]["fa3"]["ok"] and not report["ok"]
    (check,) = report["backends"]["flashinfer"]["checks"]
    assert check["status"] == "FAIL" and "head dim 32 < 64" in check["claim"]
    assert run_smoke(tmp_path, {}, backends=("flashinfer",), head_dim=64)[0]["ok"]


# ------------------------------------------------------------------------------------------------ verdicts


def served(verify_mode="compact", lookup=None, tok_s=None, ratio=None, **extra):
    run = {"verify_mode": verify_mode, "lookup": lookup, "match_rate": 0.97, "worst_gap_nats": 0.2,
           "unscored_outputs": 0, "tok_s": tok_s or {}, "ratio": ratio or {}, **extra}
    run["failures"] = gpu_smoke.run_failures(run, "bfloat16")
    return run


def entry(ours=None, off=None, upstream=None, explain=None):
    no_spec = served(verify_mode=None)
    return {"dtype": "bfloat16", "min_match": 0.9, "explain": dict(EXPLAIN_ON) if explain is None else explain,
            "runs": {"dspark-upstream-static": upstream or served(verify_mode=None),
                     "dspark-ours": ours or served(lookup=dict(proposals=5, rows=2, accepted=3, verified=4,
                                                               accept_length=2.5, chain_steps=2, steps=40)),
                     "dspark-ours-lookup-off": off or served(),
                     "no-spec": no_spec}}


def verdicts(e):
    return {check["name"]: (check["status"], check["claim"]) for check in gpu_smoke.backend_checks(e)}


def test_verdicts_of_a_good_backend_say_what_was_proved():
    v = verdicts(entry())
    assert v["servers"] == ("PASS", "all 4 servers started and served")
    assert v["verify mode"] == ("PASS", "ours (dspark-ours and dspark-ours-lookup-off) verified compact, as explain "
                                        "predicted")
    assert v["match"][0] == "PASS" and "dspark-ours 0.970" in v["match"][1]
    assert v["lookup"][0] == "PASS" and v["lookup"][1].startswith("lookup proposed: 5 request-steps got a proposal, "
                                                                  "2 verified a chain")
    assert v["lookup off"][0] == "PASS"


def test_a_compact_backend_whose_lookup_proposes_nothing_fails():
    """What issue #46 found by reading on fa3's overlap path: the lookup summary is there, its proposals are 0."""
    silent = dict(proposals=0, rows=0, accepted=0, verified=0, accept_length=None, chain_steps=0, steps=300)
    v = verdicts(entry(ours=served(lookup=silent)))
    assert v["lookup"] == ("FAIL", "lookup proposed nothing on a compact backend over 300 decode steps, echo prompts "
                                   "included (their tails recur in their prompts): the lookup path does not run here")
    # proposals without a verified chain are not a failure: a random pair's chains may rightly be declined
    declined = dict(silent, proposals=12)
    status, claim = verdicts(entry(ours=served(lookup=declined)))["lookup"]
    assert status == "PASS" and "no chain verified" in claim
    # explain says on, ours verifies compact, yet /server_info has no lookup at all
    assert verdicts(entry(ours=served(lookup=None)))["lookup"][0] == "FAIL"


def test_the_lookup_is_judged_against_what_explain_says():
    off_note = {"verify_mode": "static", "prompt_lookup": "off: static verify / verify-all has no per-request ..."}
    static = entry(ours=served(verify_mode="static"), off=served(verify_mode="static"), explain=off_note)
    v = verdicts(static)
    assert v["verify mode"][0] == "PASS" and v["lookup"][0] == "PASS" and "as explain says" in v["lookup"][1]
    ran = entry(ours=served(verify_mode="static", lookup=dict(proposals=3, steps=9)), off=served(verify_mode="static"),
                explain=off_note)
    assert verdicts(ran)["lookup"][0] == "FAIL"  # a lookup explain said would not run
    mismatch = verdicts(entry(ours=served(verify_mode="static", lookup=dict(proposals=3, steps=9))))
    assert mismatch["verify mode"] == ("FAIL", "dspark-ours verified static, explain predicted compact")
    assert mismatch["lookup"][0] == "SKIP"  # not compact: the verify-mode check already fails the row
    assert verdicts(entry(explain={"error": "boom"}))["verify mode"][0] == "SKIP"
    assert verdicts(entry(ours=served(verify_mode=None)))["verify mode"][0] == "FAIL"  # the plugin logged nothing


def test_lookup_off_must_run_no_lookup():
    v = verdicts(entry(off=served(lookup=dict(proposals=1, steps=2))))
    assert v["lookup off"][0] == "FAIL" and "SGLANG_DSPARK_LOOKUP=off still ran the lookup" in v["lookup off"][1]


def test_speed_is_stated_never_failed():
    slow = entry(ours=served(lookup=dict(proposals=5, rows=1, steps=9), tok_s={"code_c16": 80.0, "echo_c1": 30.0},
                             ratio={"code_c16": 0.8}),
                 off=served(tok_s={"code_c16": 100.0, "echo_c1": 20.0}),
                 upstream=served(verify_mode=None, ratio={"code_c16": 1.1}))
    checks = gpu_smoke.backend_checks(slow, default_pair=True)
    v = {c["name"]: (c["status"], c["claim"]) for c in checks}
    assert v["ours vs upstream"][0] == "INFO"
    assert v["ours vs upstream"][1].startswith("ours < upstream static at c=16 on the code prompts: 0.80x against "
                                               "1.10x no-spec (random pair")
    assert v["lookup on vs off"] == ("INFO", "tok/s of ours with the lookup over ours without: code c16 0.80x, "
                                             "echo c1 1.50x (random pair: a GPU step is host and launch time, no "
                                             "speed claim)")
    assert not any(c["status"] == "FAIL" for c in checks)


def test_the_whole_smoke_fails_when_the_lookup_proposes_nothing(tmp_path, server_info):
    server_info["dspark-ours"] = {"steps": {"plain": 300, "drafted": 0, "lookup": 0, "mixed": 0},
                                  "lookup": {"proposals": 0, "rows": 0}}
    report, _ = run_smoke(tmp_path, {}, backends=("fa3",))
    assert not report["ok"] and checks_of(report, "fa3")["lookup"]["status"] == "FAIL"
    table = gpu_smoke.render_table(report)
    summary = next(line for line in table.splitlines() if line.startswith("fa3 ") and "FAIL: lookup" in line)
    assert "0 / 0 / 300" in summary
    assert "  FAIL  lookup: lookup proposed nothing on a compact backend" in table


# ------------------------------------------------------------------------------------------------ pieces


def test_thresholds_per_dtype():
    run = {"match_rate": 0.93, "worst_gap_nats": 0.2, "unscored_outputs": 0}
    assert gpu_smoke.run_failures(run, "bfloat16") == []
    assert gpu_smoke.run_failures(run, "float32") == ["match 0.930 < 0.95"]
    assert gpu_smoke.run_failures(run, "float32", min_match=0.9) == []
    assert gpu_smoke.run_failures(dict(run, worst_gap_nats=1.2), "bfloat16")[0].startswith("a differing token")


def test_scored_positions_refuses_a_misaligned_answer():
    meta = {"input_token_logprobs": [(None, 3, None), (-0.1, 4, None), (-0.2, 5, None)],
            "input_top_logprobs": [None, [(-0.1, 4, None)], [(-0.1, 6, None)]]}
    assert gpu_smoke.scored_positions(meta, [4, 5]) == [(-0.1, -0.1, 4), (-0.2, -0.1, 6)]
    assert gpu_smoke.scored_positions(meta, [3, 4, 5]) is None  # the first output token would have no logprob
    assert gpu_smoke.scored_positions(meta, [9, 5]) is None
    assert gpu_smoke.scored_positions({}, [4]) is None


def test_verify_mode_from_the_server_log():
    assert gpu_smoke.verify_mode_from_log("x\nsglang-dspark: Static verify (admission verify-all ...): y\n") == "static"
    assert gpu_smoke.verify_mode_from_log("sglang-dspark: Compact verify for admission policy async: z") == "compact"
    assert gpu_smoke.verify_mode_from_log(
        "sglang-dspark: SGLANG_RAGGED_VERIFY_MODE=static was set by the user: every draft token") == "static"
    assert gpu_smoke.verify_mode_from_log("no plugin lines") is None


def test_lookup_activity_from_server_info():
    summary = dict(LOOKUP_ON, overlap_kept_at=[4])
    assert gpu_smoke.lookup_activity({"lookup": summary}) == {
        "proposals": 9, "rows": 7, "verified": 12, "accepted": 9, "accept_length": 2.29, "chain_steps": 3,
        "steps": 11, "overlap_kept_at": [4]}
    assert gpu_smoke.lookup_activity({}) is None and gpu_smoke.lookup_activity({"lookup": None}) is None


def test_the_table_shows_lookup_on_and_off_side_by_side(tmp_path):
    report, _ = run_smoke(tmp_path, {}, backends=("fa3",))
    runs = report["backends"]["fa3"]["runs"]
    assert runs["dspark-ours"]["lookup"]["proposals"] == 9 and runs["dspark-ours-lookup-off"]["lookup"] is None
    assert runs["dspark-upstream-static"]["lookup"] is None and "lookup" not in runs["no-spec"]
    rows = {row[2]: row for row in gpu_smoke.table_rows(report)}
    column = gpu_smoke.COLUMNS.index("lookup prop / rows / τ")
    assert rows["dspark-ours"][column] == "9 / 7 / 2.29" and rows["no-spec"][column] == "-"
    (summary,) = gpu_smoke.summary_rows(report)
    cells = dict(zip(gpu_smoke.SUMMARY_COLUMNS, summary))
    assert cells["verify ours / explain"] == "compact, off compact / compact"
    assert cells["lookup prop / rows / steps"] == "9 / 7 / 11" and cells["result"] == "ok"
    for column in ("upstream static x", "ours lookup on x", "ours lookup off x"):  # c1/c16, echo c1/c16
        assert ", echo " in cells[column] and cells[column].count("/") == 2


# ------------------------------------------------------------------------------------------------ command line


@pytest.mark.parametrize("given, expected", [
    (["fa3,flashinfer"], ["fa3", "flashinfer"]),
    (["fa3", "flashinfer"], ["fa3", "flashinfer"]),
    (["triton,fa3", "fa3"], ["triton", "fa3"]),
    ([" flashinfer , "], ["flashinfer"]),
])
def test_backends_choose_the_rows(given, expected):
    assert gpu_smoke.parse_backends(given) == expected


@pytest.mark.parametrize("given", [[","], ["fa3,flashinfr"]])
def test_backends_refuse_nothing_and_unknown_names(given):
    with pytest.raises(ValueError):
        gpu_smoke.parse_backends(given)


def test_main_passes_the_chosen_backends_and_prints_the_tables(tmp_path, monkeypatch, capsys):
    report, _ = run_smoke(tmp_path, {}, backends=("fa3",))
    calls = []
    monkeypatch.setattr(gpu_smoke, "smoke", lambda target, draft, backends, *a, **k: calls.append(
        (target, draft, backends, k)) or report)
    out_json = tmp_path / "report.json"
    assert gpu_smoke.main(["--target", "/t", "--draft", "/d", "--backends", "fa3,flashinfer", "--json",
                           str(out_json)]) == 0
    assert calls[-1][:3] == ("/t", "/d", ["fa3", "flashinfer"]) and calls[-1][3]["default_pair"] is False
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("backend") and "{" not in printed
    assert "fa3 (bfloat16): PASS" in printed and out_json.is_file()
    gpu_smoke.main(["--target", "/t", "--draft", "/d"])
    assert calls[-1][2] == ["fa3", "flashinfer"]  # the default rows
    for bad in (["--target", "/t"], ["--draft", "/d"], ["--target", "/t", "--draft", "/d", "--backends", "fa5"]):
        with pytest.raises(SystemExit):
            gpu_smoke.main(bad)


def test_the_default_pair_has_a_head_dim_flashinfer_serves(tmp_path, monkeypatch):
    """main builds the released-schema pair at SMOKE_SIZES; its target and draft configs say head dim 128, read back
    the way the smoke reads a given pair. The builder is stood in for by the config functions (no weights)."""
    from sglang_dspark.testing import deepspec_schema, tiny_pair

    def config_only(out_dir, seed=0, force=False, **options):
        opts = tiny_pair.TinyPairOptions(**options)
        ids = {token: i for i, token in enumerate((*tiny_pair.TRAINED_SPECIAL_TOKENS, tiny_pair.MASK_TOKEN))}
        target = tiny_pair.target_config(opts, 4096, ids)
        for sub, config in (("target", target), ("draft", tiny_pair.draft_config(opts, target, 5))):
            (Path(out_dir) / sub).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / sub / "config.json").write_text(json.dumps(config))
        return tiny_pair.TinyPair(Path(out_dir) / "target", Path(out_dir) / "draft", 5, 4096)

    monkeypatch.setattr(deepspec_schema, "build_tiny_pair", config_only)
    monkeypatch.setattr(gpu_smoke.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    seen = {}

    def smoke(target, draft, backends, log_dir, **kwargs):
        seen.update(target=target, draft=draft, **kwargs)
        return {"ok": True, "backends": {}, "tie_nats": 1.0, "target": target, "draft": draft}

    monkeypatch.setattr(gpu_smoke, "smoke", smoke)
    assert gpu_smoke.main(["--backends", "flashinfer"]) == 0
    assert seen["default_pair"] is True
    head_dim = gpu_smoke.target_head_dim(seen["target"])
    assert head_dim == 128 >= gpu_smoke.MIN_HEAD_DIM["flashinfer"]
    draft = json.loads((Path(seen["draft"]) / "config.json").read_text())
    assert draft["head_dim"] == 128 and draft["architectures"] == ["Qwen3DSparkModel"]
    assert deepspec_schema.SMOKE_SIZES["hidden_size"] == (deepspec_schema.SMOKE_SIZES["num_heads"]
                                                         * deepspec_schema.SMOKE_SIZES["head_dim"])
    # the other tests' reduced pair is unchanged
    assert deepspec_schema.REDUCED_SIZES["head_dim"] == 32 < gpu_smoke.MIN_HEAD_DIM["flashinfer"]
