"""The planner stays an adapter (issue #47): it gathers a step's facts and hands the plan on; the choice is
``scheduling/step_choice.choose_step``. Its class stays within 320 lines and names the prompt lookup in at most three
methods (the rest reaches it only through the plan), and nothing rewrites the gate's tallies after the fact."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PLANNER = REPO / "sglang_dspark" / "engine" / "planner.py"


def _planner_class() -> ast.ClassDef:
    tree = ast.parse(PLANNER.read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AdmissionVerifyPlanner"]
    return cls


def test_the_planner_class_is_at_most_320_lines():
    cls = _planner_class()
    assert cls.end_lineno - cls.lineno + 1 <= 320


def test_the_planner_names_the_lookup_in_at_most_three_methods():
    source = PLANNER.read_text().splitlines()
    methods = [node for node in _planner_class().body if isinstance(node, ast.FunctionDef)]
    naming = [m.name for m in methods if any("lookup" in line.lower()
                                             for line in source[m.lineno - 1:m.end_lineno])]
    assert len(naming) <= 3, naming


def test_one_chooser_no_process_global_no_recount():
    assert not (REPO / "sglang_dspark" / "lookup" / "active.py").exists()
    assert not (REPO / "sglang_dspark" / "scheduling" / "lookup_choice.py").exists()
    for folder in ("sglang_dspark", "patches", "profiler"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert "recount(" not in text and "set_active_lookup" not in text, path
    assert "choose_step(" in PLANNER.read_text()
