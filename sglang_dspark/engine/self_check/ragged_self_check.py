"""The on-device self-check that opens compact verify on SGLang's Triton and FlashInfer backends: the launcher's
verdict and its on-disk cache.

Compact (ragged) verify on ``triton`` (eager and CUDA graphs) and on ``flashinfer`` inside CUDA graphs runs through
our patches (``patches/triton_ragged_verify.py``, ``patches/flashinfer_ragged_verify.py``). On a GPU the launcher opens
compact there only after the patched path passed on *this* GPU and software: it runs the parity harness
``python -m sglang_dspark.engine.self_check.ragged_verify_parity --device cuda --backend <backend>`` in a child process (what it
runs, at which precision and tolerance: that module's docstring) and keeps the verdict on disk, keyed by everything it
depends on (GPU, torch, CUDA, triton, SGLang, FlashInfer, our version, the harness, its case lists and the patches).
Anything but a pass (a case out of tolerance, a failed check, an exception, a crash, a timeout) keeps upstream's
static verify, which is correct on every backend, and the log line names the reason: the first exception, or the
worst case (name, kernel, dtype, error and tolerance), or the failed check.

Time bound and retries: the child gets ``TIMEOUT_SECONDS`` (its whole process group is killed after that, FlashInfer
JIT compilers included). A pass or a failure is kept until the key changes. A timeout is kept too (static, without
paying the bound again at the next starts) and is retried at the first start ``TIMEOUT_RETRY_HOURS`` after it; a
busy or slow GPU so costs at most one bound per that period. ``SGLANG_DSPARK_RAGGED_SELF_CHECK=force`` re-runs the
check at once whatever is kept; ``=off`` skips it (static on these backends).

Why a child process: the harness allocates CUDA memory and compiles kernels the server never uses; a child gives it
all back when it exits, before the scheduler processes claim the GPU.

The launcher exports the backends that passed in ``_SGLANG_DSPARK_RAGGED_PATCHES`` (internal: a leading underscore,
not a user switch; inherited by the scheduler processes), and ``plugin.register`` installs exactly those patches there.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional

from sglang_dspark import envs

logger = logging.getLogger(__name__)

SELF_CHECKED_BACKENDS = ("triton", "flashinfer")
PATCHES_ENV = "_SGLANG_DSPARK_RAGGED_PATCHES"
HARNESS_MODULE = "sglang_dspark.engine.self_check.ragged_verify_parity"
CASES_MODULE = "sglang_dspark.engine.self_check.ragged_verify_cases"
TIMEOUT_SECONDS = 600.0
TIMEOUT_RETRY_HOURS = 24.0
CACHE_SCHEMA = 2

PASSED, FAILED, TIMED_OUT, SKIPPED = "passed", "failed", "timed out", "skipped"
_THIS_PROCESS: dict[str, "SelfCheckResult"] = {}


@dataclass(frozen=True)
class SelfCheckResult:
    backend: str
    passed: bool
    detail: str  # one clause for the log line and the verify-mode reason
    seconds: float = 0.0
    cached: bool = False
    outcome: str = ""  # PASSED, FAILED, TIMED_OUT or SKIPPED
    checked_at: float = 0.0  # wall-clock time of the run (time.time())
    retry_after: Optional[float] = None  # a timeout: the wall-clock time from which a start runs the check again


class HarnessRun(NamedTuple):
    returncode: Optional[int]  # None: still running at the time bound (killed)
    report: str  # the JSON report ("" when none was written)
    tail: str  # the end of its output


Runner = Callable[[list[str], float], HarnessRun]  # (command, time bound in seconds) -> HarnessRun


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _harness_digest() -> str:
    """The harness, its cases and the patches it checks: editing any of them invalidates kept verdicts."""
    import importlib.util

    digest = hashlib.sha256()
    for module in (HARNESS_MODULE, CASES_MODULE, "sglang_dspark.patches.triton_ragged_verify",
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
        retry_after = data.get("retry_after")
        return SelfCheckResult(key["backend"], bool(data["passed"]), str(data["detail"]), float(data["seconds"]), True,
                               str(data["outcome"]), float(data["checked_at"]),
                               None if retry_after is None else float(retry_after))
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
    """The child's command: only ``backend``'s part (the triton check needs no FlashInfer installed)."""
    return [sys.executable, "-m", HARNESS_MODULE, "--device", "cuda", "--backend", backend, "--out", report_path]


# ---------------------------------------------------------------------------------------------------------------------
# Reading the report
# ---------------------------------------------------------------------------------------------------------------------


def _case_clause(case: dict) -> str:
    basis = " of rho" if case.get("dtype") == "bfloat16" else ""
    error, tol = float(case.get("error", float("nan"))), float(case.get("tolerance", 0.0))
    clause = (f"case {case.get('name')!r} ({case.get('kernel')}, {case.get('dtype')}) error {error:.1e} > tolerance "
              f"{tol:.1e}{basis}")
    if case.get("host_plan_matches_device") is False:
        clause += ", host plan != device layout"
    return clause


def failure_reasons(section: dict) -> list[str]:
    """Why a report section failed, most telling first: exceptions (in order), the worst failing case (error over
    tolerance), failed checks, controls the check could not tell from a correct run, no case at all."""
    reasons = [f"case {e.get('case')!r} raised {e.get('error')} ({e.get('where')})"
               for e in section.get("exceptions", [])]
    failing = [c for c in section.get("cases", []) if not c.get("ok")]

    def excess(case: dict) -> float:
        tol = float(case.get("tolerance") or 0.0)
        error = float(case.get("error", float("inf")))
        return error / tol if tol > 0 else float("inf")

    reasons += [_case_clause(c) for c in sorted(failing, key=excess, reverse=True)]
    reasons += [f"check {name!r} failed" for name, ok in section.get("checks", {}).items() if not ok]
    reasons += [f"control {c.get('name')!r} passed its tolerance (error {float(c.get('error', 0.0)):.1e}): the check "
                f"cannot tell a wrong layout" for c in section.get("controls", []) if not c.get("ok")]
    return reasons


def _pass_detail(section: dict, precision: dict) -> str:
    cases = section.get("cases", [])
    fp32 = sum(c.get("dtype") == "float32" for c in cases)
    worst = max((float(c["error"]) / float(c["tolerance"]) for c in cases if c.get("tolerance")), default=0.0)
    parts = []
    if fp32:
        parts.append(f"{fp32} fp32 at {precision.get('fp32_dot')} dot precision within "
                     f"{precision.get('fp32_abs_tol'):.0e}")
    if len(cases) - fp32:
        parts.append(f"{len(cases) - fp32} bf16 within {precision.get('bf16_rel_tol'):.2e} of rho")
    return (f"{len(cases)} ragged cases in real CUDA graphs and eager mode matched the reference "
            f"({', '.join(parts)}; worst at {worst:.0%} of its tolerance)")


def verdict_from_report(backend: str, run: HarnessRun, timeout: float = TIMEOUT_SECONDS) -> tuple[str, str]:
    """(outcome, detail) from the harness's exit status and JSON report: PASSED only when it exited 0 and both the
    shared part and ``backend``'s part of the report passed."""
    if run.returncode is None:
        return TIMED_OUT, f"the {backend} self-check timed out after {timeout:.0f} s"
    try:
        report = json.loads(run.report) if run.report else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        last = " ".join(run.tail.strip().splitlines()[-1:])[:300] or f"exit status {run.returncode}"
        return FAILED, f"the {backend} self-check did not finish ({last})"
    section, shared = report.get(backend), report.get("shared") or {}
    if not isinstance(section, dict):
        return FAILED, f"the {backend} self-check failed (its report has no {backend} part)"
    reasons = failure_reasons(shared) + failure_reasons(section)
    if not section.get("cases"):
        reasons.append(f"no {backend} case ran")
    if not reasons and run.returncode == 0:
        return PASSED, _pass_detail(section, report.get("precision") or {})
    if not reasons:
        reasons.append(f"exit status {run.returncode}")
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return FAILED, f"the {backend} self-check failed: {reasons[0][:400]}{more}"


# ---------------------------------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------------------------------


def run_harness(command: list[str], timeout: float) -> HarnessRun:
    """Run the harness in its own process group; past ``timeout`` kill the whole group (compilers it spawned too)."""
    report_path = command[command.index("--out") + 1]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        returncode = None
    try:
        report = Path(report_path).read_text()
    except OSError:
        report = ""
    return HarnessRun(returncode, report, (output or "")[-4000:])


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def self_check(backend: str, gpu_name: str, *, runner: Runner = run_harness, timeout: float = TIMEOUT_SECONDS,
               clock: Callable[[], float] = time.time) -> SelfCheckResult:
    """The verdict for ``backend`` on this GPU: kept from an earlier start, or measured now in a child process and
    kept (a timeout too, until its retry time: module docstring)."""
    if backend not in SELF_CHECKED_BACKENDS:
        raise ValueError(f"no ragged-verify self-check for backend {backend!r}")
    mode = envs.RAGGED_SELF_CHECK.get()
    if mode == "off":
        return SelfCheckResult(backend, False, f"{envs.RAGGED_SELF_CHECK.name}=off skips it", outcome=SKIPPED)
    key = cache_key(backend, gpu_name)
    memo_key = json.dumps(key, sort_keys=True)
    if memo_key in _THIS_PROCESS:  # the launcher may decide twice (a bundled draft found late): check once
        return _THIS_PROCESS[memo_key]
    why = f"{envs.RAGGED_SELF_CHECK.name}=force"
    if mode != "force":
        cached = _load_cached(key)
        if cached is not None and not (cached.outcome == TIMED_OUT and clock() >= (cached.retry_after or 0.0)):
            return cached
        why = ("first start with this GPU and software" if cached is None else
               f"it timed out at {_timestamp(cached.checked_at)}: retrying")
    logger.info("sglang-dspark: checking ragged verify on %s with the %s backend before opening compact verify "
                "(%s; up to %.0f s, kept for later starts)", gpu_name, backend, why, timeout)
    started, checked_at = time.monotonic(), clock()
    with tempfile.TemporaryDirectory(prefix="dspark-ragged-check-") as folder:
        run = runner(harness_command(backend, os.path.join(folder, "report.json")), timeout)
    outcome, detail = verdict_from_report(backend, run, timeout)
    retry_after = None
    if outcome == TIMED_OUT:
        retry_after = checked_at + TIMEOUT_RETRY_HOURS * 3600.0
        detail += f"; static until a start after {_timestamp(retry_after)} retries it"
    result = SelfCheckResult(backend, outcome == PASSED, detail, time.monotonic() - started, False, outcome,
                             checked_at, retry_after)
    _store(key, result)
    _THIS_PROCESS[memo_key] = result
    return result


def check_summary() -> str:
    """What the check runs, at which precision and tolerance, and its time bound and retry policy (for ``explain``;
    imports the harness, hence torch)."""
    from sglang_dspark.engine.self_check import ragged_verify_parity as parity
    from sglang_dspark.engine.self_check.ragged_verify_cases import GPU_COVERAGE_REQUIRED as need

    dims = "/".join(str(d) for d in sorted(need["bf16_head_dims"]))
    groups = "/".join(f"{g}:1" for g in sorted(need["bf16_gqa_groups"]))
    return (f"fp32 cases with Triton's fp32 dot at {parity.FP32_DOT_PRECISION} precision (TRITON_F32_DEFAULT) within "
            f"{parity.FP32_IEEE_ABS_TOL:.0e} absolute; bf16 cases at serving shapes (head dim {dims}, GQA {groups}, "
            f"prefixes up to {need['longest_prefix']}, up to {need['max_slots']} slots / {need['max_tier']} tokens "
            f"per graph) within {parity.BF16_REL_TOL:.2e} of the reference attention of |V|; time bound "
            f"{TIMEOUT_SECONDS:.0f} s, a timeout is kept as static and retried at the first start "
            f"{TIMEOUT_RETRY_HOURS:.0f} h later ({envs.RAGGED_SELF_CHECK.name}=force: at once)")


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
    "CACHE_SCHEMA",
    "FAILED",
    "PASSED",
    "PATCHES_ENV",
    "SELF_CHECKED_BACKENDS",
    "SKIPPED",
    "TIMED_OUT",
    "TIMEOUT_RETRY_HOURS",
    "TIMEOUT_SECONDS",
    "HarnessRun",
    "SelfCheckResult",
    "cache_key",
    "check_summary",
    "export_patched_backends",
    "failure_reasons",
    "gpu_identity",
    "harness_command",
    "patched_backends",
    "run_harness",
    "self_check",
    "verdict_from_report",
]
