"""The on-device self-check that opens compact verify on SGLang's Triton and FlashInfer backends (issue #10).

Compact (ragged) verify on ``triton`` (eager and CUDA graphs) and on ``flashinfer`` inside CUDA graphs runs through
our patches (``patches/triton_ragged_verify.py``, ``patches/flashinfer_ragged_verify.py``), whose kernels and
graph replays were checked on the CPU only (``TRITON_INTERPRET=1``, a FlashInfer stand-in). So on a GPU the launcher
opens compact there only after the patched path passed on *this* GPU and software: it runs the parity harness
``python -m sglang_dspark.engine.ragged_verify_parity --device cuda`` in a child process (SGLang's real Triton
kernels and FlashInfer wrappers, captured in real CUDA graphs and replayed with ragged layouts, against the torch
reference), once, and keeps the verdict on disk keyed by everything it depends on (GPU, torch, triton, SGLang,
FlashInfer, our version, the harness itself). Any failure (a wrong row, an exception, a timeout, no GPU in the
child) keeps upstream's static verify, which is correct on every backend, with one log line saying why.

Why a child process: the harness allocates CUDA memory and compiles kernels the server never uses; a child gives it
all back when it exits, before the scheduler processes claim the GPU. ``SGLANG_DSPARK_RAGGED_SELF_CHECK=off`` skips
it (static on these backends), ``=force`` re-runs it ignoring the cached verdict.

The launcher exports the backends that passed in ``_SGLANG_DSPARK_RAGGED_PATCHES`` (internal: a leading underscore,
not a user switch; inherited by the scheduler processes), and ``plugin.register`` installs exactly those patches there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from sglang_dspark import envs

logger = logging.getLogger(__name__)

SELF_CHECKED_BACKENDS = ("triton", "flashinfer")
PATCHES_ENV = "_SGLANG_DSPARK_RAGGED_PATCHES"
HARNESS_MODULE = "sglang_dspark.engine.ragged_verify_parity"
TIMEOUT_SECONDS = 600.0
CACHE_SCHEMA = 1
_THIS_PROCESS: dict[str, "SelfCheckResult"] = {}


@dataclass(frozen=True)
class SelfCheckResult:
    backend: str
    passed: bool
    detail: str  # one clause for the log line and the verify-mode reason
    seconds: float = 0.0
    cached: bool = False


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _harness_digest() -> str:
    """The harness and the patches it checks: editing any of them invalidates cached verdicts."""
    import importlib.util

    digest = hashlib.sha256()
    for module in (HARNESS_MODULE, "sglang_dspark.patches.triton_ragged_verify",
                   "sglang_dspark.patches.flashinfer_ragged_verify"):
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        digest.update(origin.read_bytes() if origin is not None and origin.is_file() else module.encode())
    return digest.hexdigest()[:16]


def gpu_identity() -> str:
    """The first visible GPU's name and driver, from ``nvidia-smi``: the launcher must not create a CUDA context
    (it would hold GPU memory the scheduler processes then lack)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", visible],
                              capture_output=True, text=True, timeout=30)
        line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        line = ""
    return line or "unknown GPU"


def cache_key(backend: str, gpu_name: str) -> dict:
    """Everything the verdict depends on."""
    import torch

    return {
        "schema": CACHE_SCHEMA,
        "backend": backend,
        "gpu": gpu_name,
        "torch": torch.__version__,
        "cuda": str(getattr(torch.version, "cuda", None)),
        "triton": _version("triton"),
        "sglang": _version("sglang"),
        "flashinfer": _version("flashinfer-python") if backend == "flashinfer" else "-",
        "sglang_dspark": _version("sglang-dspark"),
        "harness": _harness_digest(),
    }


def _cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return envs.cache_root() / "ragged-self-check" / f"{key['backend']}-{digest}.json"


def _load_cached(key: dict) -> Optional[SelfCheckResult]:
    path = _cache_path(key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        return SelfCheckResult(key["backend"], bool(data["passed"]), str(data["detail"]), float(data["seconds"]), True)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged verdict is a miss: run the check again
        logger.warning("sglang-dspark: ignoring the unreadable ragged-verify self-check verdict %s (%r)", path, exc)
        return None


def _store(key: dict, result: SelfCheckResult) -> None:
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump({"key": key, **asdict(result)}, tmp)
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only cache only costs a re-run next start
        logger.warning("sglang-dspark: could not keep the ragged-verify self-check verdict in %s (%r)", path, exc)


def harness_command(backend: str, report_path: str) -> list[str]:
    command = [sys.executable, "-m", HARNESS_MODULE, "--device", "cuda", "--out", report_path]
    if backend != "flashinfer":
        command.append("--no-flashinfer")  # the triton check needs no FlashInfer installed
    return command


def verdict_from_report(backend: str, returncode: int, report_text: str, tail: str) -> tuple[bool, str]:
    """(passed, detail) from the harness's exit status and JSON report."""
    try:
        report = json.loads(report_text) if report_text else None
    except json.JSONDecodeError:
        report = None
    if report is None:
        last = " ".join(tail.strip().splitlines()[-1:])[:300] or f"exit status {returncode}"
        return False, f"the {backend} self-check did not finish ({last})"
    cases = list(report.get("cases", [])) + (list(report.get("flashinfer", [])) if backend == "flashinfer" else [])
    failed_checks = [name for name, ok in report.get("checks", {}).items() if not ok]
    worst = max((float(c.get("max_abs_err", 0.0)) for c in cases), default=0.0)
    if returncode == 0 and report.get("ok") is True and (backend != "flashinfer" or report.get("flashinfer")):
        return True, f"{len(cases)} ragged cases in real CUDA graphs and eager mode matched the reference " \
                     f"(worst error {worst:.1e})"
    what = failed_checks[:2] or [f"worst error {worst:.1e}"]
    return False, f"the {backend} self-check failed ({'; '.join(what)})"


Runner = Callable[[list[str], float], tuple[int, str, str]]  # (command, timeout) -> (returncode, report json, log tail)


def run_harness(command: list[str], timeout: float) -> tuple[int, str, str]:
    report_path = command[command.index("--out") + 1]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        returncode, tail = proc.returncode, (proc.stdout or "")[-2000:] + (proc.stderr or "")[-2000:]
    except subprocess.TimeoutExpired:
        returncode, tail = -1, f"timed out after {timeout:.0f} s"
    try:
        report = Path(report_path).read_text()
    except OSError:
        report = ""
    return returncode, report, tail


def self_check(backend: str, gpu_name: str, *, runner: Runner = run_harness,
               timeout: float = TIMEOUT_SECONDS) -> SelfCheckResult:
    """The verdict for ``backend`` on this GPU: cached, or measured now in a child process (and cached)."""
    if backend not in SELF_CHECKED_BACKENDS:
        raise ValueError(f"no ragged-verify self-check for backend {backend!r}")
    mode = envs.RAGGED_SELF_CHECK.get()
    if mode == "off":
        return SelfCheckResult(backend, False, f"{envs.RAGGED_SELF_CHECK.name}=off skips it")
    key = cache_key(backend, gpu_name)
    memo_key = json.dumps(key, sort_keys=True)
    if memo_key in _THIS_PROCESS:  # the launcher may decide twice (a bundled draft found late): check once
        return _THIS_PROCESS[memo_key]
    if mode != "force":
        cached = _load_cached(key)
        if cached is not None:
            return cached
    logger.info("sglang-dspark: checking ragged verify on %s with the %s backend before opening compact verify "
                "(first start with this GPU and software; up to %.0f s, kept for later starts)",
                gpu_name, backend, timeout)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dspark-ragged-check-") as folder:
        returncode, report, tail = runner(harness_command(backend, os.path.join(folder, "report.json")), timeout)
    passed, detail = verdict_from_report(backend, returncode, report, tail)
    result = SelfCheckResult(backend, passed, detail, time.monotonic() - started)
    if returncode != -1:  # a timeout (a busy GPU) is not a verdict on the kernels: ask again next start
        _store(key, result)
    _THIS_PROCESS[memo_key] = result
    return result


def export_patched_backends(backends: Iterable[str]) -> None:
    """Tell the scheduler processes (they inherit the environment) which ragged-verify patches to install."""
    names = sorted(set(backends) & set(SELF_CHECKED_BACKENDS))
    if names:
        os.environ[PATCHES_ENV] = ",".join(names)
    else:
        os.environ.pop(PATCHES_ENV, None)


def patched_backends() -> frozenset[str]:
    """The backends whose ragged-verify patch this process must install (set by the launcher)."""
    raw = os.environ.get(PATCHES_ENV, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip() in SELF_CHECKED_BACKENDS)


__all__ = [
    "PATCHES_ENV",
    "SELF_CHECKED_BACKENDS",
    "SelfCheckResult",
    "cache_key",
    "export_patched_backends",
    "gpu_identity",
    "harness_command",
    "patched_backends",
    "run_harness",
    "self_check",
    "verdict_from_report",
]
