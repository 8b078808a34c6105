"""Every patch installs at most once per process (patches/install_once.py): hooks never stack."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import sglang_dspark.patches as patches_package
from sglang_dspark.patches.install_once import install_once


def test_runs_once_and_returns_the_first_result():
    calls = []
    install = install_once(lambda: calls.append(1) or len(calls))
    assert not install.ran() and install.result() is None
    assert install() == 1 and install() == 1 and calls == [1]
    assert install.ran() and install.result() == 1
    install.forget()
    assert not install.ran() and install() == 2


def test_a_failed_install_is_tried_again():
    attempts = []

    @install_once
    def install():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("SGLang lacks a hook target")
        return "installed"

    with pytest.raises(RuntimeError):
        install()
    assert not install.ran()
    assert install() == "installed" and install() == "installed" and len(attempts) == 2


def test_every_patch_module_installs_through_it():
    """Each module's install/apply entry point is wrapped (no hand-kept flag of its own)."""
    entry_points = {}
    for info in pkgutil.iter_modules(patches_package.__path__):
        if info.name in ("install_once", "__init__"):
            continue
        module = importlib.import_module(f"sglang_dspark.patches.{info.name}")
        for name in ("install", "apply"):
            function = getattr(module, name, None)
            if callable(function) and getattr(function, "__module__", None) == module.__name__:
                entry_points[f"{info.name}.{name}"] = function
    assert len(entry_points) >= 10
    unwrapped = sorted(name for name, function in entry_points.items() if not hasattr(function, "ran"))
    assert unwrapped == []
