"""The draft shipped for SmolLM2 (sglang_dspark/embedded/smollm2_draft): size, schema, calibration file, packaging,
and the argument-resolution defaults that pick it (no SmolLM2 conversion needed: fast)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sglang_dspark.engine.arg_resolution import SHIPPED_STS_NAME, shipped_sts_path
from sglang_dspark.embedded.defaults import PACKAGED_DRAFT_DIR, is_embedded_target
from sglang_dspark.draft.checkpoint import expected_tensor_names, load_draft

REPO = Path(__file__).resolve().parents[3]
MAX_BYTES = 40 * 1024 * 1024  # issue 4: the shipped draft stays under 40 MB
SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "num_target_layers": 30}


def _config() -> dict:
    return json.loads((PACKAGED_DRAFT_DIR / "config.json").read_text())


def test_size_and_config():
    total = sum(p.stat().st_size for p in PACKAGED_DRAFT_DIR.iterdir() if p.is_file())
    assert total <= MAX_BYTES, f"{total / 2**20:.1f} MiB"
    cfg = _config()
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert cfg["block_size"] == 7 and cfg["markov_rank"] > 0 and cfg["enable_confidence_head"] is True
    assert {k: cfg[k] for k in SMOLLM2} == SMOLLM2
    assert all(0 <= i < SMOLLM2["num_target_layers"] - 1 for i in cfg["target_layer_ids"])


def test_tensors_follow_the_deepspec_schema_and_load_strictly():
    cfg = _config()
    with safe_open(str(PACKAGED_DRAFT_DIR / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert names == expected_tensor_names(cfg, include_shared=False)
    v, d = cfg["vocab_size"], cfg["hidden_size"]
    shared = {"embed_tokens.weight": torch.zeros(v, d), "lm_head.weight": torch.zeros(v, d)}
    model = load_draft(PACKAGED_DRAFT_DIR, shared=shared)
    assert model.gamma == 7
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_sts_file_matches_the_block_and_is_picked_up():
    sts = json.loads((PACKAGED_DRAFT_DIR / SHIPPED_STS_NAME).read_text())
    assert len(sts["temperatures"]) == _config()["block_size"]
    assert all(t > 0 for t in sts["temperatures"])
    assert shipped_sts_path(PACKAGED_DRAFT_DIR) == str(PACKAGED_DRAFT_DIR / SHIPPED_STS_NAME)
    assert shipped_sts_path(None) is None and shipped_sts_path("Qwen/some-hub-id") is None


def test_embedded_target_is_recognised_by_its_conversion_stamp(tmp_path):
    from sglang_dspark.embedded.smollm2 import STAMP_NAME

    assert not is_embedded_target(tmp_path) and not is_embedded_target(None)
    (tmp_path / STAMP_NAME).write_text("{}")
    assert is_embedded_target(tmp_path)


def test_the_draft_is_package_data():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = cfg["tool"]["setuptools"]["package-data"]["sglang_dspark.embedded"]
    assert "smollm2_draft/*" in data
    assert PACKAGED_DRAFT_DIR.parent.name == "embedded" and PACKAGED_DRAFT_DIR.name == "smollm2_draft"


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", SHIPPED_STS_NAME, "TRAINING.md"])
def test_shipped_files_exist(name):
    assert (PACKAGED_DRAFT_DIR / name).is_file()
