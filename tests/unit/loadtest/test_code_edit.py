"""The code-edit set (real standard-library code and an edit task), and the output-overlap measure beside it."""

from __future__ import annotations

import asyncio
import json
import re
import time
import tokenize
from pathlib import Path

import pytest

from sglang_dspark.loadtest import code_edit_prompts as code_edit
from sglang_dspark.loadtest import engine, prompts, report, runner


@pytest.fixture(scope="module")
def items():
    return code_edit.code_edit_items(seed=0)


def test_deterministic_per_seed_and_different_across_seeds(items):
    assert code_edit.code_edit_prompts(seed=0) == [item.text for item in items]
    other = code_edit.code_edit_prompts(seed=1)
    assert other != [item.text for item in items]
    assert set(other) != {item.text for item in items}  # other tasks too, not only another order
    assert prompts.code_edit_prompts is code_edit.code_edit_prompts  # re-exported next to the other sets


def test_distinct_and_enough_for_a_sweep(items):
    texts = [item.text for item in items]
    assert len(texts) == len(set(texts)) >= 512  # the default sweep c = 1..64 needs 512
    assert len({item.passage for item in items}) == len(items)  # one prompt per passage: none repeats at a level
    for level in prompts.split_for_levels(texts, [8, 16]):  # the recommended --concurrency 1 4
        assert len(level) == len(set(level))


def test_passages_are_real_stdlib_source_of_40_to_150_lines(items):
    root = code_edit.stdlib_root()
    by_path: dict[str, str] = {}
    for item in items[:300]:
        span = item.span
        assert code_edit.MIN_LINES <= len(item.passage.splitlines()) <= code_edit.MAX_LINES
        assert span.last_line - span.first_line + 1 == len(item.passage.splitlines())
        assert "test" not in Path(span.path).parts and not Path(span.path).name.startswith("test_")
        if span.path not in by_path:
            with tokenize.open(root / span.path) as handle:  # the file's own encoding
                by_path[span.path] = handle.read()
        text = by_path[span.path]
        source = text.splitlines()
        original = "\n".join(source[span.first_line - 1 : span.last_line])
        if not span.indent:
            assert item.passage == original  # verbatim
            assert item.passage in text
        else:  # a method, dedented: every line is the file's line less the method's indentation
            for line, raw in zip(item.passage.splitlines(), original.splitlines()):
                assert raw == span.indent + line or (not line and not raw.strip())
        assert f"```python\n{item.passage}\n```" in item.text
        assert item.text.startswith("Here is a ") and "Python's standard library" in item.text.splitlines()[0]
        assert max(len(line) for line in item.passage.splitlines()) <= code_edit.MAX_LINE_CHARS


def test_every_task_kind_appears_and_names_what_is_in_the_passage(items):
    assert {item.task_kind for item in items} == set(code_edit.TASK_KINDS)
    variants = {(item.task_kind, item.variant) for item in items}
    assert {("loop", "comprehension"), ("loop", "while"), ("rename", "parameter"),
            ("rename", "local variable"), ("reformat", "two-spaces")} <= variants
    for item in items:
        task = item.text.rsplit("\n\n", 1)[1]
        assert task.endswith(".") and "return the whole" in task
        if item.task_kind == "rename":
            old, new = task.split("`")[1], task.split("`")[-2]
            assert re.search(rf"\b{old}\b", item.passage) and not re.search(rf"\b{new}\b", item.passage)
        if item.task_kind == "loop":
            assert task.split("`")[1] in item.passage  # the loop's first line, quoted


def test_skips_unparsable_modules_and_long_lines():
    body = "\n".join(f"    x{i} = {i}" for i in range(45))
    good = f"def f(a, b):\n{body}\n    return a\n"
    assert [s.name for s in code_edit.file_spans("m.py", good)] == ["f"]
    assert code_edit.file_spans("m.py", good + "def broken(:\n") == []  # does not parse
    long_line = good.replace("x3 = 3", "x3 = '" + "y" * 120 + "'")
    assert code_edit.file_spans("m.py", long_line) == []
    short = "def g():\n    return 1\n"
    assert code_edit.file_spans("m.py", short) == []  # under 40 lines


def test_stdlib_files_leave_out_test_packages(tmp_path):
    for rel in ("json/decoder.py", "test/test_json.py", "unittest/test/test_case.py", "test_thing.py",
                "site-packages/pkg/mod.py", "idlelib/idle_test/mock.py", "email/parser.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    assert code_edit.stdlib_files(tmp_path) == ["email/parser.py", "json/decoder.py"]


# ------------------------------------------------------------------------------------------------ output overlap


class SpaceTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [hash(word) for word in text.split()]


@pytest.mark.parametrize("tokenizer", [None, SpaceTokenizer()])
def test_overlap_is_one_for_a_copy_zero_for_unrelated_text_and_partial_for_half(items, tokenizer):
    prompt = items[0].text
    passage_words = items[0].passage.split()
    copied = " ".join(passage_words)
    assert engine.output_overlap(prompt, copied, tokenizer) == pytest.approx(1.0)
    unrelated = " ".join(f"word{i}" for i in range(len(passage_words)))
    assert engine.output_overlap(prompt, unrelated, tokenizer) == pytest.approx(0.0)
    half = passage_words[:100] + [f"fresh{i}" for i in range(100)]
    share = engine.output_overlap(prompt, " ".join(half), tokenizer)
    assert share == pytest.approx(0.5)
    assert engine.output_overlap(prompt, "", tokenizer) is None
    assert engine.output_overlap("a b c d e", "a b c", tokenizer) == 0.0  # no 4-gram fits


def test_mean_overlap_counts_completed_requests_only(serving):
    ok = serving.RequestFuncOutput(success=True)
    ok.generated_text = "one two three four"
    other = serving.RequestFuncOutput(success=True)
    other.generated_text = "five six seven eight"
    failed = serving.RequestFuncOutput(success=False)
    prompts_ = ["one two three four five", "nothing alike here at all", "one two three four"]
    assert engine.mean_output_overlap(prompts_, [ok, other, failed]) == pytest.approx(0.5)
    assert engine.mean_output_overlap(prompts_[2:], [failed]) is None


def test_the_table_shows_the_overlap_where_there_is_one_and_a_dash_elsewhere():
    result = {"settings": {}, "configs": [
        {"label": "base", "levels": [{"concurrency": 1, "output_tok_s": 10.0, "output_overlap": 0.834}]},
        {"label": "chat", "levels": [{"concurrency": 1, "output_tok_s": 10.0}]},
    ]}
    report.add_ratios(result)
    header, _, base, chat = report.markdown_table(result).splitlines()
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    base_cells = [cell.strip() for cell in base.strip("|").split("|")]
    chat_cells = [cell.strip() for cell in chat.strip("|").split("|")]
    assert len(base_cells) == len(chat_cells) == len(columns)
    assert base_cells[columns.index("copied from prompt")] == "83 %"
    assert chat_cells[columns.index("copied from prompt")] == "–"


# ------------------------------------------------------------------------------------------------ command line


def test_cli_accepts_code_edit_and_selects_the_set():
    args = runner.parse_args(["--dataset", "code-edit", "--max-tokens", "256", "--seed", "1"])
    assert args.dataset == "code-edit" and args.max_tokens == 256
    assert runner.build_parser().parse_args([]).max_tokens == 128  # the global default is unchanged
    assert runner.prompt_pool(args) == code_edit.code_edit_prompts(1)
    assert "code-edit" in runner.build_parser().format_help() and "256" in runner.build_parser().format_help()


@pytest.fixture(scope="module")
def serving():
    return engine.serving()


def _echo_server(log):
    """A fake chat server answering every prompt with the prompt itself (a copy: overlap 1)."""

    async def request(request_func_input, pbar=None):
        start = time.perf_counter()
        await asyncio.sleep(0.01)
        out = engine.serving().RequestFuncOutput(success=True)
        out.output_len, out.start_time, out.ttft = 4, start, 0.005
        out.itl, out.text_chunks = [0.001] * 3, ["x"] * 3
        out.latency = time.perf_counter() - start
        out.generated_text = request_func_input.prompt
        log.append(request_func_input.prompt)
        return out

    return request


@pytest.mark.parametrize("dataset", ["code-edit", "builtin"])
def test_a_code_edit_run_records_the_overlap_per_level(serving, monkeypatch, tmp_path, capsys, dataset):
    log: list = []
    monkeypatch.setattr(serving, "async_request_openai_chat_completions", _echo_server(log))
    monkeypatch.setattr(runner, "probe_server", lambda url, model=None: runner.ServerInfo(url=url, model="m"))
    monkeypatch.setattr(runner, "warm_up", lambda info, timeout: None)
    monkeypatch.setattr(engine, "server_snapshot", lambda url, timeout=30.0: {})
    out_dir = tmp_path / "out"
    rc = runner.main(["--url", "http://127.0.0.1:1", "--concurrency", "1", "2", "--prompts-per-level", "2",
                      "--max-tokens", "8", "--dataset", dataset, "--seed", "1", "--output-dir", str(out_dir),
                      "--quiet"])
    assert rc == 0
    result = json.loads((out_dir / "loadtest.json").read_text())
    levels = result["configs"][0]["levels"]
    table = capsys.readouterr().out
    if dataset == "code-edit":
        assert set(log) <= set(code_edit.code_edit_prompts(1)) and len(set(log)) == 4  # fresh per level
        assert not set(log[:2]) & set(log[2:])
        assert [level["output_overlap"] for level in levels] == [1.0, 1.0]
        assert result["settings"]["output_overlap"]["n"] == 4
        lines = table.splitlines()
        header = next(line for line in lines if line.startswith("| configuration |"))
        columns = [cell.strip() for cell in header.strip("|").split("|")]
        rows = [line for line in lines if line.startswith("| http://127.0.0.1:1 |")
                and len(line.strip("|").split("|")) == len(columns)]  # the main table's rows, not the comparison's
        column = columns.index("copied from prompt")
        assert [[cell.strip() for cell in row.strip("|").split("|")][column] for row in rows] == ["100 %", "100 %"]
    else:
        assert all("output_overlap" not in level for level in levels)
        assert result["settings"]["output_overlap"] is None
