"""The grounded set: a passage and a task drawing on it, distinct, deterministic, apart from the other prompt sets."""

import pytest

from sglang_dspark.loadtest import grounded_prompts as grounded
from sglang_dspark.loadtest import prompts, runner
from sglang_dspark.training.instructions import instruction_prompts


@pytest.fixture(scope="module")
def items():
    return grounded.grounded_items(seed=0)


def test_enough_distinct_prompts_for_two_default_sweeps(items):
    texts = [item.text for item in items]
    assert len(texts) == len(set(texts)) >= 1024  # 512 per temperature of the default sweep, two temperatures
    counts = [8, 8, 16, 32, 64, 128, 256] * 2  # c = 1..64 at T = 0 and T = 0.7
    seen = set()
    for level in prompts.split_for_levels(texts, counts):
        assert not seen & set(level)
        seen |= set(level)


def test_deterministic_for_a_seed(items):
    assert grounded.grounded_prompts(seed=0) == [item.text for item in items]
    assert grounded.grounded_prompts(seed=1) != grounded.grounded_prompts(seed=0)
    for seed in (1, 2, 7):  # any seed gives enough (a rare repeated passage only drops its prompts)
        assert len(grounded.grounded_prompts(seed)) >= 1024
    assert prompts.grounded_prompts is grounded.grounded_prompts  # re-exported next to the chat set


def test_every_prompt_holds_its_passage_and_a_task_of_every_kind(items):
    for item in items:
        head, fence, rest = item.text.partition(f"```\n{item.passage}\n```\n\n")
        assert head.startswith("Here ") and fence and rest.strip(), item.text[:80]  # intro, passage, then the task
        assert 300 <= len(item.passage) <= 1500, item.text[:80]  # ~80-400 tokens: long spans to copy
        assert len(item.text) <= 2000
    assert {item.passage_kind for item in items} == set(grounded.PASSAGE_KINDS)
    assert {item.task_kind for item in items} == set(grounded.TASK_KINDS)
    texts = [item.text for item in items]
    for form in ("Python", "JavaScript", "SQL", "JSON config", "notes", "email", "list", "table"):
        assert any(t.startswith("Here ") and form in t.split(":", 1)[0] for t in texts), form
    assert any("| name | city |" in t for t in texts) and any("name,city,joined,amount" in t for t in texts)


def test_fix_tasks_carry_their_seeded_mistake(items):
    fixes = [item for item in items if item.task_kind == "fix"]
    typos = {typo for _, _, typo in grounded._TYPO_SENTENCES}
    for item in fixes:
        if "SQL" in item.text:
            assert "GROPU BY" in item.passage
        elif "notes" in item.text:
            assert any(typo in item.passage for typo in typos)


def test_apart_from_the_chat_set_and_the_training_prompts(items):
    texts = {item.text for item in items}
    assert not texts & set(prompts.builtin_prompts(seed=0))
    for form in prompts.TASKS:  # no chat task form
        head, tail = form.split("{s}")
        assert not any(t.startswith(head) and t.endswith(tail) for t in texts), form
    training = [p.text for p in instruction_prompts(3000, seed=0)]
    assert not texts & set(training)  # passages too: tests/unit/training/test_instructions.py


@pytest.mark.parametrize("name", ["grounded", "builtin", "chat"])
def test_dataset_flag_selects_the_set(name):
    args = runner.build_parser().parse_args(["--dataset", name, "--seed", "3"])
    pool = runner.prompt_pool(args)
    expected = grounded.grounded_prompts(3) if name == "grounded" else prompts.builtin_prompts(3)
    assert pool == expected
