"""Every package folder ships: pyproject.toml lists each one (a non-editable install, the Docker images', carries
only the listed packages, and a missing one fails there, not here)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_folder():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "sglang_dspark").rglob("__init__.py")}
    for package, folder in config["package-dir"].items():
        folders |= {package + "".join("." + part for part in p.parent.relative_to(REPO / folder).parts)
                    for p in (REPO / folder).rglob("__init__.py")}
    assert folders - listed == set()
