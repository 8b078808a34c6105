"""``scripts/gpu_smoke.sh`` on the CPU (issue #38, item 3): which servers it starts and how it judges them.

The GPU run cannot happen here; fake servers stand in for SGLang. A fake "model" gives every prefix a top token and a
runner-up (a near-tie on some prefixes); no-spec decodes greedily and scores any sequence the way SGLang's input
logprobs do (entry j is token ``start + j`` given its prefix, entry 0 is None: scheduler_components/
logprob_result_processor.py:26-79). A speculative run that breaks a near-tie the other way must pass; one that emits a
token far below no-spec's must fail; no server may get ``--dtype float32`` unless it runs triton.
"""

from __future__ import annotations

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

    def __init__(self, args, env, pick, log=""):
        self.args, self.env, self.pick, self.log = list(args), dict(env or {}), pick, log
        self.startup_seconds = 12.0
        self.stopped = False

    def generate(self, text=None, sampling_params=None, **extra):
        ids = list(extra["input_ids"]) if "input_ids" in extra else tokenize(text)
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
        return "fake-ours" if self.log else "fake-other"  # only ours runs the lookup


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


def fake_launcher(picks, started, fail=()):
    def start_server(target, args, *, env=None, cpu=True, log_dir=None, timeout=240):
        assert cpu is False
        spec = "--speculative-algorithm" in args
        backend = args[args.index("--attention-backend") + 1]
        label = ("dspark-upstream-static" if (env or {}).get("SGLANG_DSPARK_WORKER") == "upstream" else
                 "dspark-ours") if spec else "no-spec"
        started.append((backend, label, list(args)))
        if (backend, label) in fail:
            raise RuntimeError("SGLang server exited with code 1 during start-up")
        log = "sglang-dspark: Compact verify for admission policy async: fa3 ..." if label == "dspark-ours" else ""
        return FakeServer(args, env, picks.get(label, greedy), log)
    return start_server


def fake_explain(argv, device, gpu):
    return {"verify_mode": "compact"}


def run_smoke(tmp_path, picks, backends=("fa3", "flashinfer"), fail=()):
    started = []
    report = gpu_smoke.smoke("/pair/target", "/pair/draft", list(backends), tmp_path,
                             start_server=fake_launcher(picks, started, fail), explain=fake_explain)
    return report, started


def test_no_server_gets_float32_outside_triton(tmp_path):
    report, started = run_smoke(tmp_path, {}, backends=("fa3", "flashinfer", "triton"))
    assert len(started) == 9
    for backend, label, args in started:
        dtype = args[args.index("--dtype") + 1]
        assert dtype == ("float32" if backend == "triton" else "bfloat16"), (backend, label, args)
    assert gpu_smoke.server_args("fa3")[:2] == ["--dtype", "bfloat16"]
    # no-spec runs last: it scores the others
    assert [label for _, label, _ in started[:3]] == ["dspark-upstream-static", "dspark-ours", "no-spec"]
    assert report["ok"], gpu_smoke.render_table(report)


def test_a_tie_broken_the_other_way_passes_and_is_stated_in_the_table(tmp_path):
    report, _ = run_smoke(tmp_path, {"dspark-ours": flips_near_ties}, backends=("fa3",))
    ours = report["backends"]["fa3"]["runs"]["dspark-ours"]
    # A flipped near-tie changes the rest of the free-running output, yet every token is no-spec's choice or a tie.
    assert ours["identical_outputs"] < 32 and ours["outputs"] == 32  # c = 1 and c = 16, 16 prompts each
    assert 0.9 <= ours["match_rate"] < 1.0 and ours["worst_gap_nats"] == pytest.approx(0.05)
    assert ours["failures"] == [] and report["ok"]
    upstream = report["backends"]["fa3"]["runs"]["dspark-upstream-static"]
    assert upstream["match_rate"] == 1.0 and upstream["identical_outputs"] == 32
    table = gpu_smoke.render_table(report)
    rows = [line for line in table.splitlines() if line.startswith("fa3")]
    assert len(rows) == 3 and all(row.rstrip().endswith("ok") for row in rows)
    ours_row = next(row for row in rows if "dspark-ours" in row)
    assert "compact" in ours_row and "bfloat16" in ours_row
    assert "bfloat16 >= 0.90" in table and "1.0 nats" in table and table.splitlines()[-1].startswith("PASS")


def test_a_wrong_token_fails_even_at_a_high_match_rate(tmp_path):
    report, _ = run_smoke(tmp_path, {"dspark-ours": wrong_token}, backends=("fa3",))
    ours = report["backends"]["fa3"]["runs"]["dspark-ours"]
    assert ours["match_rate"] > 0.95  # one bad token per output, the rest re-synchronised...
    assert ours["worst_gap_nats"] > 10 and not report["ok"]  # ...but that token is no tie
    assert "nats below no-spec's" in ours["failures"][0]
    assert "FAIL" in gpu_smoke.render_table(report).splitlines()[-1]


def test_a_server_that_does_not_start_fails_the_check(tmp_path):
    report, started = run_smoke(tmp_path, {}, backends=("flashinfer",), fail={("flashinfer", "no-spec")})
    runs = report["backends"]["flashinfer"]["runs"]
    assert runs["no-spec"]["failures"] == ["did not start"]
    assert runs["dspark-ours"]["failures"] == ["not scored by no-spec"]  # nothing to compare against
    assert not report["ok"]


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


def test_main_prints_one_table(tmp_path, monkeypatch, capsys):
    report, _ = run_smoke(tmp_path, {}, backends=("fa3",))
    monkeypatch.setattr(gpu_smoke, "smoke", lambda *a, **k: report)
    out_json = tmp_path / "report.json"
    assert gpu_smoke.main(["--target", "/t", "--draft", "/d", "--backends", "fa3", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("backend") and "{" not in printed
    assert out_json.is_file()
    with pytest.raises(SystemExit):
        gpu_smoke.main(["--target", "/t"])  # a target without its draft


def test_the_table_says_whether_the_lookup_path_ran(tmp_path, monkeypatch):
    from sglang_dspark.loadtest import engine

    def snapshot(url):  # /server_info as our worker reports it (the lookup's summary), none for the others
        lookup = {"steps": {"plain": 5, "drafted": 3, "lookup": 2, "mixed": 1},
                  "lookup": {"rows": 7, "accept_length": 3.25}} if url == "fake-ours" else None
        return {"dspark_admission": {"lookup": lookup}}

    monkeypatch.setattr(engine, "server_snapshot", snapshot)
    report, _ = run_smoke(tmp_path, {}, backends=("fa3",))
    runs = report["backends"]["fa3"]["runs"]
    assert runs["dspark-ours"]["lookup"] == {"rows": 7, "accept_length": 3.25, "chain_steps": 3, "steps": 11}
    assert runs["dspark-upstream-static"]["lookup"] is None and "lookup" not in runs["no-spec"]
    rows = {row[2]: row for row in gpu_smoke.table_rows(report)}
    column = gpu_smoke.COLUMNS.index("lookup rows / τ")
    assert rows["dspark-ours"][column] == "7 / 3.25" and rows["no-spec"][column] == "-"
    assert gpu_smoke.lookup_activity({}) is None
