"""The training instruction prompts stay apart from the load test's built-in chat and grounded sets (held-out sets
of the draft)."""

import re

import pytest

from sglang_dspark.loadtest.grounded_prompts import grounded_items
from sglang_dspark.loadtest.prompts import SUBJECTS, TASKS, builtin_prompts
from sglang_dspark.training import instructions
from sglang_dspark.training.instructions import TASK_NAME, instruction_prompts


def test_prompts_are_distinct_deterministic_and_of_every_kind():
    prompts = instruction_prompts(600, seed=3)
    texts = [p.text for p in prompts]
    assert len(set(texts)) == 600
    assert [p.index for p in prompts] == list(range(600))
    assert {p.task for p in prompts} == {TASK_NAME}
    assert texts == [p.text for p in instruction_prompts(600, seed=3)]
    assert texts != [p.text for p in instruction_prompts(600, seed=4)]
    assert any("Python" in t for t in texts)                      # code
    assert any(t.startswith("Solve for x") for t in texts)       # arithmetic
    assert any(t.startswith("Write a polite email") for t in texts)  # writing
    assert any(t.startswith("Give me a simple recipe") for t in texts)  # everyday


def test_no_subject_or_task_form_of_the_held_out_chat_set():
    texts = [p.text for p in instruction_prompts(3000, seed=0)]
    lowered = [t.lower() for t in texts]
    for subject in SUBJECTS:
        word = re.compile(rf"\b{re.escape(subject.lower())}\b")
        assert not any(word.search(t) for t in lowered), subject
    for form in TASKS:
        head, tail = form.split("{s}")
        assert not any(t.startswith(head) and t.endswith(tail) for t in texts), form
    assert not set(texts) & set(builtin_prompts(seed=1))


def test_no_prompt_or_passage_of_the_held_out_grounded_set():
    texts = [p.text for p in instruction_prompts(3000, seed=0)]
    items = grounded_items(seed=0)
    assert not set(texts) & {item.text for item in items}
    passages = {item.passage for item in items}
    assert not any(passage in text for text in texts for passage in passages)
    assert not any(text.startswith("Here ") and "```" in text for text in texts)  # the grounded prompts' form


def test_asking_for_more_than_the_templates_give_raises(monkeypatch):
    monkeypatch.setattr(instructions, "_KINDS", [lambda rng: f"Say {rng.randint(1, 3)}."])
    assert len(instruction_prompts(3)) == 3
    with pytest.raises(ValueError, match="only 3 distinct instruction prompts"):
        instruction_prompts(4)


def test_cli_writes_prompts_the_generate_step_reads(tmp_path):
    from sglang_dspark.training.__main__ import build_parser
    from sglang_dspark.training.corpus import read_prompts

    out = tmp_path / "instruction_prompts.jsonl"
    args = build_parser().parse_args(["instructions", "--out", str(out), "--count", "40", "--seed", "2"])
    assert args.func(args) == 0
    assert read_prompts(out) == instruction_prompts(40, seed=2)
