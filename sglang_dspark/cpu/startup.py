"""Interpreter start-up hook of the CPU platform (loaded by the ``sglang_dspark_cpu.pth`` file).

SGLang starts its scheduler and detokenizer with the ``spawn`` method, and those processes import
``sgl_kernel`` and ``torchvision`` long before SGLang's own plugin loader runs; only a hook that every
interpreter runs at start-up reaches those imports. This module must stay cheap and inert: it imports
nothing heavy, and it only installs a meta-path finder that wakes up when ``sglang``, ``sgl_kernel`` or
``torchvision`` is imported.

The CPU platform is active when SGLang runs on a CPU: ``SGLANG_USE_CPU_ENGINE=1`` (SGLang's own switch),
or ``--device cpu`` on the command line, or a torch build without any GPU backend. When it decides so,
it sets ``SGLANG_USE_CPU_ENGINE=1`` so that every process SGLang spawns inherits the decision.
Set ``SGLANG_DSPARK_CPU_PLATFORM=0`` to switch it off entirely.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys

from sglang_dspark import envs

logger = logging.getLogger("sglang_dspark.cpu")

STANDIN_PACKAGE = "sglang_dspark.cpu.sgl_kernel_standin"
_active: bool | None = None


def cpu_platform_active() -> bool:
    """Decide (once per process) whether SGLang runs on the CPU here."""
    global _active
    if _active is None:
        _active = _decide_cpu_platform()
        if _active:
            os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    return _active


def _decide_cpu_platform() -> bool:
    if envs.CPU_PLATFORM.get() == "0":
        return False
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        return True
    argv = getattr(sys, "argv", None) or []
    for i, arg in enumerate(argv):
        if arg == "--device=cpu" or (arg == "--device" and i + 1 < len(argv) and argv[i + 1] == "cpu"):
            return True
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "0":
        return False
    # A torch built without any GPU backend can only run SGLang on the CPU.
    try:
        import torch
    except ImportError:
        return False
    return (
        torch.version.cuda is None
        and getattr(torch.version, "hip", None) is None
        and not (hasattr(torch, "xpu") and torch.xpu.is_available())
        and importlib.util.find_spec("torch_npu") is None
    )


def _load_real_sgl_kernel(spec: importlib.machinery.ModuleSpec):
    """Load an installed sgl_kernel, or return None when it cannot load here.

    The CUDA wheel of sgl_kernel is importable by name but fails without a GPU driver; a CPU build made
    from SGLang's source tree loads and is then always preferred over our stand-in.
    """
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError, RuntimeError) as exc:
        logger.warning("sgl_kernel is installed but cannot load on this CPU (%s); using the torch stand-in.", exc)
        for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return None


def _define_torchvision_schemas_if_needed() -> None:
    """Let a CUDA-built torchvision import beside a CPU torch.

    SGLang imports torchvision at module level even for text models. PyPI's torchvision wheel links
    libtorch_cuda; its C++ ops then fail to load and its meta registrations die on the missing
    ``torchvision::nms`` schema. We try to load the real ops first and only declare the two schemas
    (no kernels: text models never call them) when that fails.
    """
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    import glob

    import torch

    libs = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "_C*.so"))
    try:
        if libs:
            torch.ops.load_library(libs[0])
            return
    except (OSError, RuntimeError):
        pass
    if hasattr(torch.ops.torchvision, "nms"):
        return
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    globals()["_torchvision_schema_lib"] = lib  # keep the registration alive


class _CpuPlatformFinder(importlib.abc.MetaPathFinder):
    """Redirects ``sgl_kernel`` to the torch stand-in and prepares torchvision, on the CPU platform only."""

    def __init__(self) -> None:
        self._torchvision_done = False
        self._sgl_kernel_is_standin: bool | None = None
        self._deciding_sgl_kernel = False

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root not in ("sglang", "sgl_kernel", "torchvision"):
            return None
        if not cpu_platform_active():
            return None
        if root == "torchvision" and not self._torchvision_done:
            self._torchvision_done = True
            _define_torchvision_schemas_if_needed()
            return None
        if root == "sgl_kernel":
            return self._sgl_kernel_spec(fullname)
        return None

    def _sgl_kernel_spec(self, fullname: str):
        if self._deciding_sgl_kernel:
            return None  # the real package is importing its own submodules
        if self._sgl_kernel_is_standin is None:
            real_spec = importlib.machinery.PathFinder.find_spec("sgl_kernel")
            real = None
            if real_spec is not None:
                self._deciding_sgl_kernel = True
                try:
                    real = _load_real_sgl_kernel(real_spec)
                finally:
                    self._deciding_sgl_kernel = False
            self._sgl_kernel_is_standin = real is None
            if real is not None:
                return importlib.machinery.ModuleSpec(fullname, _AliasLoader(lambda: real), is_package=True)
        if not self._sgl_kernel_is_standin:
            return None
        standin_name = STANDIN_PACKAGE + fullname[len("sgl_kernel"):]
        standin = importlib.util.find_spec(standin_name)
        if standin is None:
            return None
        is_package = standin.submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(lambda: importlib.import_module(standin_name)), is_package=is_package
        )


class _AliasLoader(importlib.abc.Loader):
    """Makes ``sgl_kernel.x`` the very module object ``sglang_dspark.cpu.sgl_kernel_standin.x``.

    One module object, not a second copy: the stand-in registers torch.library ops at import, which must
    happen once per process.
    """

    def __init__(self, provide) -> None:
        self._provide = provide

    def create_module(self, spec):
        return self._provide()

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    if not any(isinstance(f, _CpuPlatformFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CpuPlatformFinder())


install()


def import_transformers():
    """Import transformers offline (model conversion, training features, checks), also from a repository checkout.

    PyPI's torchvision (CUDA build) dies at import beside the CPU torch unless the CPU platform's start-up hook
    ran; importing this module runs it for interpreters started without the installed ``.pth`` line. (A checkout root on
    ``sys.path`` is harmless: ``kernels/__init__.py`` then poses as an unusable version-0 install.)
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    return transformers
