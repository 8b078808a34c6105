"""``python -m sglang_dspark.profiler``: show / plot / compare on table files of every accepted kind."""

from __future__ import annotations

import json

import pytest

from sglang_dspark.profiler.__main__ import compare_tables, load_any_table, main
from sglang_dspark.profiler.sps_table import SpsTable


def table(scale: float = 1.0) -> SpsTable:
    return SpsTable({1: {1: 0.010 * scale, 8: 0.012 * scale}, 4: {4: 0.020 * scale, 32: 0.040 * scale}})


def test_reads_our_json_and_cache_entries(tmp_path):
    ours = tmp_path / "ours.json"
    ours.write_text(table().to_json())
    entry = tmp_path / "sps-cache.json"
    entry.write_text(json.dumps({"kind": "sglang-dspark-sps-cache", "key": {"model": "m"}, "table": table().to_dict()}))
    for path in (ours, entry):
        assert load_any_table(path).probe_seconds() == table().probe_seconds()


def test_compare_reports_per_cell_ratios():
    ratios = compare_tables(table(), table(scale=1.5))
    assert len(ratios) == 4
    assert all(r == pytest.approx(1.5) for _, _, r in ratios)


def test_show_plot_compare_commands(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(table().to_json())
    b.write_text(table(scale=2.0).to_json())
    assert main(["show", str(a)]) == 0
    shown = capsys.readouterr().out
    assert "R=1" in shown and "B=8: 12.00 ms" in shown
    png = tmp_path / "sps.png"
    assert main(["plot", str(a), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(a), str(b)]) == 0
    compared = capsys.readouterr().out
    assert "largest difference" in compared and "other/base = 2.000" in compared


def test_profile_needs_a_model_path():
    with pytest.raises(SystemExit, match="--model-path"):
        main(["profile", "--", "--dtype", "float32"])
