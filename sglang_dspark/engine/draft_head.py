"""Whether the DSpark draft has a confidence head, read wherever the draft comes from, without a download.

Per-request admission (compact verify) needs the draft's confidence head. Upstream builds that head in every
non-static mode whatever the config says (``models/dspark.py:487-507``, ``models/deepseek_v4_dspark.py:538-561``,
paths under ``sglang/srt/``) and then refuses to start without its weights (``models/dspark.py:672-696``;
``speculative/dspark_components/dspark_planner.py:137-147`` where the model has none). So compact is chosen only
where the draft's ``config.json`` was read here and says ``enable_confidence_head: true`` (DeepSpec writes it; we
read its value, ``scheduling/policy.py``); a draft whose config says false, or whose config cannot be read, runs
verify-all (engine/verify_mode.py names the reason in the one log line).

Sources: a local folder (an explicit path, ``<target>/dspark/``, the embedded target's shipped draft) is read
directly; a hub id is looked up in the local Hugging Face cache only (``huggingface_hub.try_to_load_from_cache``, no
network). Upstream's own ``_handle_dspark`` reads the draft's config through ``get_config``
(``arg_groups/speculative_hook.py:791-804``, ``speculative/dspark_components/dspark_config.py:137-159``), which
downloads it into that same cache, so a hub draft not cached before upstream's resolution is cached after it
(``engine/arg_resolution.py`` decides then).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional


@dataclass(frozen=True)
class DraftConfidenceHead:
    """``present``: True / False as the draft's config says, None when its config could not be read here.
    ``source``: where it was read, or why it could not be (for the log line and ``explain``)."""

    present: Optional[bool]
    source: str

    @property
    def known(self) -> bool:
        return self.present is not None


def hf_cache_config_file(repo_id: str, revision: Optional[str]) -> Optional[str]:
    """The cached ``config.json`` of a hub repo (no network), or None when it is not in the local cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - not a valid repo id (HFValidationError), unreadable cache: not cached
        return None
    return found if isinstance(found, str) else None  # None, or _CACHED_NO_EXIST: the repo has no config.json


def read_local_config(
    model_path: Optional[str],
    revision: Optional[str] = None,
    *,
    hub_config_file: Optional[Callable[[str, Optional[str]], Optional[str]]] = None,
) -> tuple[Optional[dict], str]:
    """(``config.json`` as a dict, where it was read) of a local model folder or of a hub id in the local Hugging Face
    cache; (None, why not) otherwise. Never downloads anything (the target's model facts read it too:
    ``engine/verify_mode.py`` ``read_target_attention``)."""
    if not model_path:
        return None, "no model path"
    model_path = str(model_path)
    local = Path(model_path) / "config.json"
    if local.is_file():
        config_file, where = str(local), str(local)
    elif os.path.isdir(model_path):
        return None, f"the folder {model_path} has no config.json"
    else:
        config_file = (hub_config_file or hf_cache_config_file)(model_path, revision)
        if config_file is None:
            return None, f"hub id {model_path} is not in the local Hugging Face cache (nothing is downloaded to check)"
        where = f"{model_path} in the local Hugging Face cache"
    try:
        config = json.loads(Path(config_file).read_text())
    except (OSError, ValueError) as exc:
        return None, f"{where} could not be read ({exc})"
    if not isinstance(config, dict):
        return None, f"{where} is not a JSON object"
    return config, where


def read_draft_confidence_head(
    draft_path: Optional[str],
    revision: Optional[str] = None,
    *,
    hub_config_file: Callable[[str, Optional[str]], Optional[str]] = hf_cache_config_file,
) -> DraftConfidenceHead:
    """The draft's confidence head as its config says (see the module docstring); never downloads anything."""
    if not draft_path:
        return DraftConfidenceHead(None, "no draft path yet (SGLang picks a bundled draft in its own resolution)")
    config, where = read_local_config(draft_path, revision, hub_config_file=hub_config_file)
    if config is None:
        if os.path.isdir(str(draft_path)) and not (Path(str(draft_path)) / "config.json").is_file():
            where = f"the draft folder {draft_path} has no config.json"
        return DraftConfidenceHead(None, where)
    from sglang_dspark.scheduling.policy import confidence_head_enabled  # lazily: explain imports no torch

    present = confidence_head_enabled(config)
    return DraftConfidenceHead(present, f"enable_confidence_head={str(present).lower()} in {where}")


__all__ = ["DraftConfidenceHead", "hf_cache_config_file", "read_draft_confidence_head", "read_local_config"]
