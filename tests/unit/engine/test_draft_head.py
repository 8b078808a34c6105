"""A draft without a confidence head runs verify-all wherever it comes from (issue #38, item 5).

Upstream builds a confidence head in every ragged mode and refuses to start without its weights
(models/dspark.py:672-696, dspark_components/dspark_planner.py:137-147), so compact may only be exported for a draft
whose config was read and has one. A hub id used to count as "has a head"; here its config is read from a fake local
Hugging Face cache (the real ``huggingface_hub`` lookup, no network), and the launcher's hook runs with a stand-in for
upstream's ``_handle_dspark`` that downloads the config into that cache, as its ``get_config`` does.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types

import pytest

from sglang_dspark.engine.draft_head import read_draft_confidence_head

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    """A local Hugging Face cache (the hub layout: models--org--name/refs/main + snapshots/<commit>/)."""
    import huggingface_hub.constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))

    def put(repo_id, config):
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
    return put


def test_a_hub_draft_is_read_from_the_local_cache(hf_cache):
    hf_cache("org/headless-draft", {"block_size": 7})  # DeepSpec without the key: no head
    hf_cache("org/draft", {"block_size": 7, "enable_confidence_head": True})
    headless = read_draft_confidence_head("org/headless-draft")
    assert headless.present is False and "org/headless-draft in the local Hugging Face cache" in headless.source
    assert read_draft_confidence_head("org/draft").present is True
    missing = read_draft_confidence_head("org/not-downloaded")
    assert missing.present is None and not missing.known and "not in the local Hugging Face cache" in missing.source
    assert read_draft_confidence_head("org/draft", revision="some-branch").present is None  # only what is cached


def test_local_folders_and_no_draft(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": False}))
    assert read_draft_confidence_head(str(tmp_path)).present is False
    (tmp_path / "config.json").write_text(json.dumps({"enable_confidence_head": True}))
    assert read_draft_confidence_head(str(tmp_path)).present is True
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_draft_confidence_head(str(empty)).present is None
    assert read_draft_confidence_head(None).present is None
    calls = []
    read_draft_confidence_head(str(tmp_path), hub_config_file=lambda *a: calls.append(a))
    assert calls == []  # a local folder never asks the hub cache


# ---------------------------------------------------------------------------------------------------------------------
# The launcher's hook: decide once the draft's config can be read, never export compact without a head
# ---------------------------------------------------------------------------------------------------------------------


def _view(draft):
    return types.SimpleNamespace(
        device="cuda", attention_backend="fa3", prefill_attention_backend=None, decode_attention_backend=None,
        speculative_attention_mode="prefill", disaggregation_mode="null", cuda_graph_backend_decode=None,
        disable_cuda_graph=False, disable_decode_cuda_graph=False, cuda_graph_config=None, tp_size=1, dp_size=1,
        attn_dp_size=1, enable_dp_attention=False, moe_a2a_backend="none", dcp_size=1, enable_two_batch_overlap=False,
        enable_lora=None, lora_paths=None, disable_cuda_graph_padding=False, enable_linear_replayssm_spec=False,
        speculative_dspark_sps_table_path=None, model_path="/nonexistent/target", speculative_draft_model_path=draft,
        speculative_draft_model_revision=None, speculative_dspark_confidence_sts_path=None, dtype="bfloat16")


@pytest.fixture()
def hook(monkeypatch):
    """``handle_dspark`` with SGLang's resolving view and our worker switch stood in for."""
    import sglang.srt.arg_groups.overrides as overrides

    from sglang_dspark.cpu import startup
    from sglang_dspark.engine import arg_resolution

    monkeypatch.setattr(overrides, "declare_resolution", lambda *a, **k: None)
    monkeypatch.setattr(startup, "cpu_platform_active", lambda: False)
    monkeypatch.setitem(sys.modules, "sglang_dspark.engine.worker",
                        types.SimpleNamespace(use_upstream_worker=lambda: False))
    for name in ("SGLANG_RAGGED_VERIFY_MODE", "SGLANG_DSPARK_ADMISSION", "_SGLANG_DSPARK_RAGGED_PATCHES"):
        monkeypatch.setenv(name, "")  # so that what the hook exports is undone after the test
        monkeypatch.delenv(name)

    def run(view, upstream):
        monkeypatch.setattr(overrides, "resolving_view", lambda server_args: view)
        return arg_resolution.handle_dspark(upstream, object())
    return run


def _decisions(caplog):
    return [r.getMessage() for r in caplog.records if "verify" in r.getMessage() and "sglang-dspark: " in
            r.getMessage()]


def test_hub_draft_without_a_head_runs_verify_all_after_upstream_fetched_its_config(hook, hf_cache, caplog):
    caplog.set_level(logging.INFO, logger="sglang_dspark.engine.arg_resolution")
    seen_by_upstream = []

    def upstream(server_args):  # upstream's _handle_dspark: reads (downloads) the draft's config
        seen_by_upstream.append(os.environ.get("SGLANG_RAGGED_VERIFY_MODE"))
        hf_cache("org/headless-draft", {"block_size": 7, "enable_confidence_head": False})

    hook(_view("org/headless-draft"), upstream)
    assert seen_by_upstream == [None]  # nothing decided (nor taken back) before the config could be read
    assert os.environ["SGLANG_RAGGED_VERIFY_MODE"] == "static"
    assert os.environ["SGLANG_DSPARK_ADMISSION"] == "verify-all"
    (line,) = _decisions(caplog)  # one log line, naming the reason and where it was read
    assert "no confidence head" in line and "org/headless-draft in the local Hugging Face cache" in line


def test_hub_draft_with_a_head_in_the_cache_is_decided_before_upstream(hook, hf_cache, caplog):
    caplog.set_level(logging.INFO, logger="sglang_dspark.engine.arg_resolution")
    hf_cache("org/draft", {"block_size": 7, "enable_confidence_head": True})
    seen_by_upstream = []
    hook(_view("org/draft"), lambda server_args: seen_by_upstream.append(os.environ["SGLANG_RAGGED_VERIFY_MODE"]))
    assert seen_by_upstream == ["compact"] and os.environ["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    assert len(_decisions(caplog)) == 1


def test_a_config_that_cannot_be_read_never_exports_compact(hook, hf_cache, caplog):
    caplog.set_level(logging.INFO, logger="sglang_dspark.engine.arg_resolution")
    hook(_view("org/offline-draft"), lambda server_args: None)  # upstream could not fetch it either
    assert os.environ["SGLANG_RAGGED_VERIFY_MODE"] == "static"
    (line,) = _decisions(caplog)
    assert "no confidence head" in line and "not in the local Hugging Face cache" in line


def test_a_forced_compact_waits_for_the_config_instead_of_refusing_early(hook, hf_cache, monkeypatch):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    hook(_view("org/draft"), lambda server_args: hf_cache("org/draft", {"enable_confidence_head": True}))
    assert os.environ["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    with pytest.raises(ValueError, match="confidence head"):  # forced compact on a headless draft: refused by name
        hook(_view("org/headless"), lambda server_args: hf_cache("org/headless", {"enable_confidence_head": False}))


def test_explain_reads_the_same_cache(hf_cache, monkeypatch):
    from sglang_dspark.engine.explain import explain

    for name in ("SGLANG_RAGGED_VERIFY_MODE", "SGLANG_DSPARK_ADMISSION"):
        monkeypatch.delenv(name, raising=False)
    hf_cache("org/headless-draft", {"block_size": 5})
    argv = ["--model-path", "/nonexistent/target", "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path"]
    headless = explain(argv + ["org/headless-draft"], None, "H100")
    assert (headless["verify_mode"], headless["admission_policy"], headless["gamma"]) == ("static", "verify-all", 7)
    assert headless["confidence_head"].startswith("no (verify-all)") and "no confidence head" in headless["reason"]
    unknown = explain(argv + ["org/not-downloaded"], None, "H100")
    assert unknown["verify_mode"] == "compact" and unknown["confidence_head"].startswith("unknown here")
    assert "runs verify-all if it has no confidence head" in unknown["confidence_head"]
