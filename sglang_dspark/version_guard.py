"""sglang-dspark hooks private internals of one SGLang release; refuse any other one loudly."""

from __future__ import annotations

import importlib.metadata

from sglang_dspark import SUPPORTED_SGLANG_VERSION


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_supported_sglang() -> None:
    found = installed_sglang_version()
    if found != SUPPORTED_SGLANG_VERSION:
        raise RuntimeError(
            f"sglang-dspark {__import__('sglang_dspark').__version__} supports sglang=={SUPPORTED_SGLANG_VERSION} "
            f"only (it patches private internals of that release), but found sglang {found}. "
            f"Install `sglang=={SUPPORTED_SGLANG_VERSION}` (scripts/install.sh cpu|gpu), or uninstall sglang-dspark."
        )
