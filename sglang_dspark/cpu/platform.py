"""The CPU platform's SGLang plugin (entry point ``dspark_cpu_platform``).

The start-up hook (``sglang_dspark.cpu.startup``) already provides ``sgl_kernel`` and fixes torchvision. What is left
needs SGLang itself: argument resolution rewrites ``--attention-backend intel_amx`` to ``torch_native`` unless the
platform declares AMX, and ``torch_native`` has no speculative-verify path. The intel_amx backend's attention ops
are our torch stand-ins, so declaring it usable is true on any x86/arm CPU. We register no
``convert_weight_packed`` op, so SGLang's per-layer ``cpu_has_amx_support()`` stays False and every layer keeps its
torch-native code whatever the CPU.
"""

from __future__ import annotations

import logging

from sglang_dspark.cpu.startup import cpu_platform_active

logger = logging.getLogger(__name__)
_platform_override = None


def register() -> None:
    global _platform_override
    if not cpu_platform_active() or _platform_override is not None:
        return
    from sglang.srt.runtime_context import override_platform

    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    _platform_override = override_platform(has_amx=True)
    _platform_override.install()
    logger.info("sglang-dspark CPU platform: torch sgl_kernel stand-in, intel_amx attention backend enabled.")
