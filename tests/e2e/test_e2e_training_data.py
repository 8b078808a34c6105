"""Training data pipeline: the BIG-bench prompt corpus (read from the sdist) and answer generation through our
server (resumable)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from sglang_dspark.training.corpus import (
    Prompt,
    bigbench_prompts,
    read_prompts,
    split_prompts,
    task_is_held_out,
    write_prompts,
)

LONG = "Explain why the sky looks blue to an observer standing on the ground at noon."


def _sdist(path, tasks: dict) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, spec in tasks.items():
            data = json.dumps(spec).encode()
            info = tarfile.TarInfo(f"bigbench-1.0.0/bigbench/benchmark_tasks/{name}/task.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        # a subtask folder one level deeper is not read
        data = json.dumps({"examples": [{"input": LONG + " (subtask)"}]}).encode()
        info = tarfile.TarInfo("bigbench-1.0.0/bigbench/benchmark_tasks/task_a/sub/task.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_bigbench_prompts_filter_sample_and_split(tmp_path):
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    tasks = {
        f"task_{c}": {"examples": [{"input": f"{LONG} #{i}"} for i in range(30)]
                      + [{"input": "short"}, {"input": "ü" * 100}, {"target": "no input"}]}
        for c in "abcdefghij"
    }
    _sdist(sdist, tasks)
    prompts = bigbench_prompts(sdist, per_task=5, seed=3)
    assert len(prompts) == 10 * 5
    assert all(p.text.startswith(LONG) and "(subtask)" not in p.text for p in prompts)
    assert prompts == bigbench_prompts(sdist, per_task=5, seed=3)  # deterministic
    train, held = split_prompts(prompts, held_out_percent=40)
    assert {p.task for p in train}.isdisjoint({p.task for p in held})
    assert len(train) + len(held) == len(prompts) and held
    assert all(task_is_held_out(p.task, 40) for p in held)
    write_prompts(tmp_path / "p.jsonl", train)
    assert read_prompts(tmp_path / "p.jsonl") == train


@pytest.mark.server
def test_generate_answers_through_the_server_and_resume(tiny_pair, tmp_path):
    from sglang_dspark.training.generate import generate_answers

    prompts = [Prompt("t", i, f"def f{i}():") for i in range(3)]
    out = tmp_path / "answers.jsonl"
    assert generate_answers(tiny_pair.target_dir, prompts[:2], out, max_new_tokens=4, concurrency=2,
                            progress=False) == 2
    # resume: only the missing prompt is answered
    assert generate_answers(tiny_pair.target_dir, prompts, out, max_new_tokens=4, concurrency=2,
                            progress=False) == 1
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in recs) == [0, 1, 2]
    for r in recs:
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        assert 1 <= r["completion_tokens"] <= 4
    assert generate_answers(tiny_pair.target_dir, prompts, out, progress=False) == 0  # nothing to do: no server
