"""Every SGLANG_DSPARK_* switch is declared once (sglang_dspark/envs.py), validated, and documented in the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_dspark import envs
from sglang_dspark.scheduling import ADMISSION_POLICIES

ROOT = Path(__file__).resolve().parents[2]


def readme_switch_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    table = text.split("### Switches", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(SGLANG_DSPARK_[A-Z_]+).*$", table, re.M)}


def test_readme_table_lists_exactly_the_declared_switches_with_their_choices():
    rows = readme_switch_rows()
    assert set(rows) == {s.name for s in envs.SWITCHES}
    for switch in envs.SWITCHES:
        for choice in switch.choices:
            assert choice in rows[switch.name], (switch.name, choice)


def _switch_names(folder: Path) -> set[str]:
    pattern = re.compile(r"(?<![A-Za-z0-9_])SGLANG_DSPARK_[A-Z_]*[A-Z]")
    return {name for path in folder.rglob("*.py") for name in pattern.findall(path.read_text(errors="replace"))}


def test_code_reads_no_undeclared_switch():
    """Any SGLANG_DSPARK_* name in our code is declared in envs.py, or is upstream SGLang's own (e.g. its STS data
    collection path), and none of ours collides with upstream's."""
    import sglang

    upstream = _switch_names(Path(sglang.__file__).parent / "srt")
    ours = set().union(*(_switch_names(ROOT / d) for d in ("sglang_dspark", "kernels", "patches", "profiler")))
    declared = {s.name for s in envs.SWITCHES}
    assert ours - declared - upstream == set()
    assert declared & upstream == set()


def test_admission_choices_are_the_policies():
    assert set(envs.ADMISSION.choices) == set(ADMISSION_POLICIES)


@pytest.mark.parametrize("switch", envs.SWITCHES, ids=lambda s: s.name)
def test_bad_value_names_switch_and_choices(switch, monkeypatch):
    monkeypatch.setenv(switch.name, "not-a-choice")
    if not switch.choices:
        assert switch.get() == "not-a-choice"  # free text (a path)
        return
    with pytest.raises(ValueError) as err:
        envs.validate_all()
    assert switch.name in str(err.value) and all(c in str(err.value) for c in switch.choices)


@pytest.mark.parametrize("switch", envs.SWITCHES, ids=lambda s: s.name)
def test_empty_means_default(switch, monkeypatch):
    monkeypatch.setenv(switch.name, "  ")
    assert switch.get() == switch.default


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_DSPARK_CACHE", str(tmp_path))
    assert envs.cache_root() == tmp_path
    monkeypatch.setenv("SGLANG_DSPARK_CACHE", "")
    assert envs.cache_root() == Path.home() / ".cache" / "sglang-dspark"
