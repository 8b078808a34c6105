"""The embedded default model pair the demo serves when no model is given.

Until a trained pair ships (issue 4), the default is the tiny random pair built offline in seconds. Built once into
the cache folder ($SGLANG_DSPARK_CACHE, default ~/.cache/sglang-dspark) and reused.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_DSPARK_CACHE", Path.home() / ".cache" / "sglang-dspark"))


def ensure_default_pair() -> tuple[Path, Path]:
    from sglang_dspark.models.tiny_pair import build_tiny_pair

    pair = build_tiny_pair(cache_dir() / "tiny-pair")
    return Path(pair.target_dir), Path(pair.draft_dir)
