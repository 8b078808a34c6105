"""On-disk cache of profiled SPS tables, keyed by everything that changes the timings.

A restart with the same model, dtype, hardware, parallelism, attention backend, KV pool, software versions, probe
grid, CUDA-graph mode, ragged verify mode and graph token tiers reuses the table instead of profiling again (an eager
table must never be reused under graphs, where the cost is a step function of the tier). Anything wrong with a cached
file (bad JSON, another schema version, a key that is not ours, non-positive or non-monotone times) is logged as a
WARNING and treated as a miss, so the caller simply re-profiles and overwrites it. Writes are atomic (temporary file
+ ``os.replace``), so a crash or a concurrent server never leaves a half-written table behind.

Folder: ``$SGLANG_DSPARK_CACHE/sps`` (the project-wide cache root, see ``sglang_dspark.embedded.defaults``), default
``~/.cache/sglang-dspark/sps``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from sglang_dspark.profiler.sps_table import SpsTable, SpsTableError
from sglang_dspark import envs

__all__ = [
    "CACHE_ENTRY_KIND",
    "CACHE_SCHEMA_VERSION",
    "RESERVED_EXTRA",
    "SpsCacheKey",
    "SpsTableCache",
    "default_cache_dir",
    "device_name",
    "make_cache_key",
    "model_config_fingerprint",
]

logger = logging.getLogger(__name__)

CACHE_ENTRY_KIND = "sglang-dspark-sps-cache-entry"
CACHE_SCHEMA_VERSION = 1


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SpsCacheKey:
    """Everything a profiled table depends on. Two keys are the same cache entry iff all fields are equal."""

    model_path: str
    model_config_fingerprint: str
    dtype: str
    device_name: str
    tp_size: int
    attention_backend: str
    max_total_tokens: int
    sglang_version: str
    sglang_dspark_version: str
    # Canonical JSON of the probe plan (ProbePlan.to_dict()): a string keeps the key hashable.
    probe_grid: str
    # Any other setting that changes step times (KV dtype, quantisation, ...), plus the reserved entries
    # make_cache_key always writes: cuda_graph, ragged_verify_mode, graph_token_tiers, graph_max_slots.
    extra: tuple[tuple[str, str], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["probe_grid"] = json.loads(self.probe_grid)
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpsCacheKey":
        values = dict(data)
        values["probe_grid"] = _canonical_json(values["probe_grid"])
        values["extra"] = tuple(sorted((str(k), str(v)) for k, v in values.get("extra", {}).items()))
        return cls(**values)

    def digest(self) -> str:
        return hashlib.sha256(_canonical_json(self.to_dict()).encode("utf-8")).hexdigest()


def model_config_fingerprint(model_path: "str | os.PathLike[str]") -> str:
    """SHA-256 of the model's config.json content (key order and whitespace do not matter).

    A hub id or a folder without config.json gives ``"no-config"``: the path alone then identifies the model.
    """
    config = Path(model_path) / "config.json"
    try:
        raw = config.read_bytes()
    except OSError:
        return "no-config"
    try:
        canonical = _canonical_json(json.loads(raw)).encode("utf-8")
    except (json.JSONDecodeError, UnicodeDecodeError):
        canonical = raw
    return hashlib.sha256(canonical).hexdigest()


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def device_name(device: str = "cpu") -> str:
    """A human-readable name of the hardware the timings come from.

    For a CPU the torch thread count is part of the name: it changes step times.
    """
    import torch

    kind, _, index = str(device).partition(":")
    if kind == "cpu":
        return f"{_cpu_model_name()} ({torch.get_num_threads()} threads)"
    if kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(int(index) if index else 0)
    return str(device)


# Written by make_cache_key from its own arguments; callers may not pass them through ``extra``.
RESERVED_EXTRA = ("cuda_graph", "ragged_verify_mode", "graph_token_tiers", "graph_max_slots")


def _graph_entries(
    grid: Mapping[str, Any],
    cuda_graph: Optional[bool],
    verify_mode: Optional[str],
    token_tiers: Optional[Sequence[int]],
    max_slots: Optional[int],
) -> dict[str, str]:
    """The graph part of the key. Always present ("unspecified" when the caller did not say), so a key made without
    it can never match a graph-aware one: tables cached before graph mode was part of the key are re-profiled."""
    grid_tiers, grid_slots = grid.get("token_tiers"), grid.get("max_slots")
    tiers = None if token_tiers is None else [int(t) for t in token_tiers]
    if tiers is not None and grid_tiers is not None and tiers != [int(t) for t in grid_tiers]:
        raise ValueError(f"token_tiers {tiers} differ from the probe grid's {list(grid_tiers)}")
    tiers = tiers if tiers is not None else grid_tiers
    slots = max_slots if max_slots is not None else grid_slots
    if tiers is not None and cuda_graph is False:
        raise ValueError("graph token tiers were given with cuda_graph=False")
    return {
        "cuda_graph": "unspecified" if cuda_graph is None else ("on" if cuda_graph else "off"),
        "ragged_verify_mode": "unspecified" if verify_mode is None else str(verify_mode),
        "graph_token_tiers": "none" if tiers is None else ",".join(str(int(t)) for t in tiers),
        "graph_max_slots": "none" if slots is None else str(int(slots)),
    }


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


def make_cache_key(
    *,
    model_path: "str | os.PathLike[str]",
    dtype: Any,
    device: str,
    tp_size: int,
    attention_backend: str,
    max_total_tokens: int,
    probe_grid: Union[Mapping[str, Any], Any],
    extra: Optional[Mapping[str, Any]] = None,
    sglang_version: Optional[str] = None,
    sglang_dspark_version: Optional[str] = None,
    cuda_graph: Optional[bool] = None,
    verify_mode: Optional[str] = None,
    token_tiers: Optional[Sequence[int]] = None,
    max_slots: Optional[int] = None,
) -> SpsCacheKey:
    """Build a key from server settings; fills in the config fingerprint, device name and installed versions.

    ``probe_grid``: a ``ProbePlan`` or its ``to_dict()``. ``dtype``: a string or a ``torch.dtype``.
    ``cuda_graph``: whether target verify forwards replay CUDA graphs; ``verify_mode``: SGLang's ragged verify mode
    (``static`` / ``compact`` / ...); ``token_tiers`` / ``max_slots``: the graph tiers and largest captured batch
    (default: the probe grid's, which a tier-aligned ``ProbePlan`` carries).
    """
    grid = probe_grid.to_dict() if hasattr(probe_grid, "to_dict") else dict(probe_grid)
    clashes = sorted(set(RESERVED_EXTRA) & set(extra or {}))
    if clashes:
        raise ValueError(f"extra may not set {clashes}: pass cuda_graph / verify_mode / token_tiers / max_slots")
    extra = {**(extra or {}), **_graph_entries(grid, cuda_graph, verify_mode, token_tiers, max_slots)}
    local = Path(model_path)
    return SpsCacheKey(
        model_path=str(local.resolve()) if local.exists() else str(model_path),
        model_config_fingerprint=model_config_fingerprint(model_path),
        dtype=str(dtype).removeprefix("torch."),
        device_name=device_name(device),
        tp_size=int(tp_size),
        attention_backend=str(attention_backend),
        max_total_tokens=int(max_total_tokens),
        sglang_version=sglang_version or _installed_version("sglang"),
        sglang_dspark_version=sglang_dspark_version or _installed_version("sglang-dspark"),
        probe_grid=_canonical_json(grid),
        extra=tuple(sorted((str(k), str(v)) for k, v in extra.items())),
    )


def default_cache_dir() -> Path:
    return envs.cache_root() / "sps"


class SpsTableCache:
    """``load(key)`` → cached table or ``None``; ``store(key, table)`` → path written."""

    def __init__(self, directory: "str | os.PathLike[str] | None" = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def path_for(self, key: SpsCacheKey) -> Path:
        return self.directory / f"sps-{key.digest()[:32]}.json"

    def load(self, key: SpsCacheKey) -> Optional[SpsTable]:
        path = self.path_for(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            logger.debug("No cached SPS table at %s", path)
            return None
        except OSError as exc:
            logger.warning("Ignoring cached SPS table %s: cannot read it (%s); profiling again", path, exc)
            return None
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict) or entry.get("kind") != CACHE_ENTRY_KIND:
                raise SpsTableError("not an SPS cache entry")
            if entry.get("schema_version") != CACHE_SCHEMA_VERSION:
                raise SpsTableError(
                    f"cache schema_version {entry.get('schema_version')!r}, this version reads {CACHE_SCHEMA_VERSION}"
                )
            if entry.get("key") != key.to_dict():
                raise SpsTableError("the key stored in the file is not the requested one (foreign or colliding file)")
            table = SpsTable.from_dict(entry.get("table"), source="cache", strict=True)
        except (ValueError, TypeError, AttributeError) as exc:  # JSONDecodeError and SpsTableError are ValueErrors
            logger.warning("Ignoring cached SPS table %s: %s; profiling again", path, exc)
            return None
        logger.info("Using cached SPS table %s (%r)", path, table)
        return table

    def store(self, key: SpsCacheKey, table: SpsTable) -> Path:
        path = self.path_for(key)
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {
            "kind": CACHE_ENTRY_KIND,
            "schema_version": CACHE_SCHEMA_VERSION,
            "key": key.to_dict(),
            "table": table.to_dict(),
        }
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, sort_keys=True, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        logger.info("Stored SPS table in %s", path)
        return path
