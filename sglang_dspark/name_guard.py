"""Guard for our three root folders (``kernels/``, ``profiler/``, ``patches/``) when imported under their bare name.

They install as ``sglang_dspark.kernels`` etc. But with a checkout's root on ``sys.path`` (``python -m`` run from it)
``import kernels`` finds the folder itself, and that name can belong to another distribution (``kernels`` is one
SGLang and transformers probe for). Posing as an unusable, version-0 install makes their "is it installed?" checks
say no: version checks reject it and ``from kernels import x`` fails with ImportError, as they expect.
"""

from __future__ import annotations


def pose_as_unusable_install(module_globals: dict) -> None:
    name = module_globals["__name__"]

    def __getattr__(attr):
        raise AttributeError(f"{name!r} on sys.path here is the folder of sglang_dspark.{name}; it has no {attr!r}")

    module_globals["__version__"] = "0.0.0"
    module_globals["__getattr__"] = __getattr__
