"""Bookkeeping shared by the stand-in's modules.

* ``not_provided`` / ``make_module_getattr``: SGLang imports many ``sgl_kernel`` names at module level that
  are never called on the CPU engine path we support. They must import (or SGLang's modules fail to load),
  but calling one must fail loudly instead of computing something wrong.
* ``traced``: opt-in log of the first call of every helper (``SGLANG_DSPARK_STANDIN_TRACE=1``), to see which
  helpers a server run really exercised.
* ``define_op``: the single ``torch.library`` fragment holding our ``torch.ops.sgl_kernel.*`` ops. It is
  idempotent, so an op that already exists (a real CPU build of sgl_kernel loaded first, or this package
  imported a second time under another name) is left alone.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Iterable, Optional

import torch

from sglang_dspark import envs

logger = logging.getLogger("sglang_dspark.cpu.sgl_kernel_standin")

OPS_NAMESPACE = "sgl_kernel"

_TRACE = envs.STANDIN_TRACE.get() == "1"
_traced_names: set = set()

# The Library object must stay alive: torch removes its registrations when it is garbage collected.
_LIBRARY: Optional[torch.library.Library] = None


class StandinNotProvided(NotImplementedError):
    """Raised by every ``sgl_kernel`` name the stand-in only pretends to have.

    A subclass of NotImplementedError (itself a RuntimeError), so SGLang's ``except RuntimeError`` fallbacks
    still catch it.
    """


def not_provided(qualname: str) -> Callable:
    """A placeholder for a kernel we do not implement: importable, raises when called."""

    def _missing(*args, **kwargs):
        raise StandinNotProvided(
            f"{qualname} is not provided by the sglang-dspark CPU stand-in of sgl_kernel (pure torch). "
            "SGLang reached a code path that needs SGLang's C++ CPU build of sgl_kernel; only the "
            "helpers of the CPU engine path (KV bookkeeping, speculative trees, intel_amx attention) exist."
        )

    _missing.__name__ = qualname.rsplit(".", 1)[-1]
    _missing.__qualname__ = _missing.__name__
    _missing.__doc__ = f"Placeholder for {qualname}; always raises {StandinNotProvided.__name__}."
    _missing._sglang_dspark_standin_missing = True
    return _missing


def make_module_getattr(public_name: str, absent: Iterable[str] = ()) -> Callable[[str], object]:
    """Module ``__getattr__`` returning a raising placeholder for any kernel-like name.

    Private and dunder names raise AttributeError (tools probe ``__file__``, ``__wrapped__``, ...). Names in
    ``absent`` also raise AttributeError: they are real sgl_kernel submodules that SGLang imports inside
    ``try/except ImportError`` and must see as missing (for example ``sgl_kernel.scalar_type``, whose absence
    selects SGLang's mock scalar types).
    """
    absent = frozenset(absent)

    def __getattr__(name: str):
        if name.startswith("_") or name in absent:
            raise AttributeError(f"module {public_name!r} has no attribute {name!r}")
        return not_provided(f"{public_name}.{name}")

    return __getattr__


def traced(qualname: str) -> Callable[[Callable], Callable]:
    """Log the first call of ``qualname`` when SGLANG_DSPARK_STANDIN_TRACE=1; free otherwise."""

    def decorate(fn: Callable) -> Callable:
        if not _TRACE:
            return fn

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if qualname not in _traced_names:
                _traced_names.add(qualname)
                logger.warning("sgl_kernel stand-in: first call of %s (pid %d)", qualname, os.getpid())
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def op_exists(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, OPS_NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def define_op(name: str, schema: str, impl: Callable, fake: Optional[Callable] = None) -> bool:
    """Define ``torch.ops.sgl_kernel.<name>`` with a CPU kernel; no-op if the op already exists."""
    global _LIBRARY
    if op_exists(name):
        return False
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(OPS_NAMESPACE, "FRAGMENT")
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, impl, "CPU")
    if fake is not None:
        torch.library.register_fake(f"{OPS_NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return True
