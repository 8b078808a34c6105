"""Check that SGLang 0.5.23's own ``Qwen3DSparkModel`` builds from a draft checkpoint and loads every tensor.

Run in a fresh process (it initialises a one-rank gloo group on loopback and SGLang's global context):

    python -m sglang_dspark.engine.offline.check_sglang_load DRAFT_DIR [DRAFT_DIR ...] [--mode static|compact] ...

Prints one JSON object with SGLang's parse of the DSpark config keys (``parse_dspark_draft_config``,
``resolve_runtime_config``), then one per mode: the model's parameters, which checkpoint tensors fed which parameter, and
whether every parameter now equals the checkpoint (q/k/v and gate/up are fused by SGLang, so the expected
value is the concatenation). No kernel runs: only module construction and ``load_weights``.

Exit status: 0 every draft loaded in every requested mode; 1 a load/compare failure (the JSON says which); 2 SGLang's model
code could not be imported in this environment (e.g. an incomplete sgl_kernel stand-in), so nothing was
checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional


def _tolerate_missing_kernel_symbols() -> None:
    """Only module construction happens here, so symbols a CPU stand-in does not provide yet may be stubs."""
    import sgl_kernel

    if getattr(sgl_kernel, "__getattr__", None) is not None:
        return

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def stub(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel.{name} is a construction-only stub")

        return stub

    sgl_kernel.__getattr__ = missing


def prepare_sglang_model_process(port: int) -> Optional[str]:
    """Make this process able to build SGLang's DSpark draft modules on the CPU (one-rank gloo group on
    loopback ``port``). Returns an error text when SGLang's model code cannot be imported here, else None."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("MASTER_PORT", str(port))
    try:
        from sglang_dspark.cpu.startup import import_transformers

        import_transformers()
        _tolerate_missing_kernel_symbols()
        from sglang.test.layer_ut_utils import init_single_process_dist

        init_single_process_dist(master_port=port)
        import sglang.srt.models.dspark  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - reported to the caller as an environment error
        return f"{type(exc).__name__}: {exc}"
    return None


def _expected_param_values(ckpt: dict, param_names) -> dict:
    """Map SGLang parameter names to the value the checkpoint should have given them."""
    import torch

    expected = {}
    for name in param_names:
        if name.endswith("self_attn.qkv_proj.weight"):
            base = name[: -len("qkv_proj.weight")]
            expected[name] = torch.cat([ckpt[base + f"{p}_proj.weight"] for p in "qkv"], dim=0)
        elif name.endswith("mlp.gate_up_proj.weight"):
            base = name[: -len("gate_up_proj.weight")]
            expected[name] = torch.cat([ckpt[base + "gate_proj.weight"], ckpt[base + "up_proj.weight"]], dim=0)
        elif name in ckpt:
            expected[name] = ckpt[name]
    return expected


def check_config(draft_dir: Path, target_vocab_size: int) -> dict:
    """SGLang's DSpark config parse, on the transformers config object and on the raw JSON."""
    from transformers import AutoConfig

    from sglang.srt.speculative.dspark_components.dspark_config import (
        parse_dspark_draft_config,
        resolve_runtime_config,
    )

    hf_cfg = AutoConfig.from_pretrained(draft_dir)
    raw = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    parsed = parse_dspark_draft_config(draft_hf_config=hf_cfg)
    parsed_raw = parse_dspark_draft_config(draft_hf_config=raw)
    runtime = resolve_runtime_config(
        draft_hf_config=hf_cfg, speculative_num_draft_tokens=None, target_vocab_size=target_vocab_size
    )
    fields = lambda c: {k: getattr(c, k) for k in c.__struct_fields__}  # noqa: E731
    return {
        "kind": "config",
        "hf_config_class": type(hf_cfg).__name__,
        "parsed": fields(parsed),
        "parsed_equal_raw": fields(parsed) == fields(parsed_raw),
        "runtime": fields(runtime),
    }


def check_mode(draft_dir: Path, mode: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = mode
    from sglang.srt.models.dspark import Qwen3DSparkModel

    cfg = AutoConfig.from_pretrained(draft_dir)
    report = {"kind": "model", "mode": mode, "ok": False}
    model = Qwen3DSparkModel(cfg)
    params = dict(model.named_parameters())
    report["params"] = {n: list(p.shape) for n, p in params.items()}
    report["has_confidence_head"] = model.confidence_head is not None
    ckpt = {}
    for f in sorted(Path(draft_dir).glob("*.safetensors")):
        ckpt.update(load_file(str(f)))
    # Poison every parameter first, so "equal after load" proves the loader wrote it.
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    try:
        model.load_weights(iter(sorted(ckpt.items())))
    except Exception as exc:  # the message is the finding (e.g. the confidence-head check)
        report["load_error"] = f"{type(exc).__name__}: {exc}"
        return report
    expected = _expected_param_values(ckpt, params)
    report["params_without_source"] = sorted(set(params) - set(expected))
    report["params_mismatch"] = sorted(
        n for n, v in expected.items() if tuple(v.shape) != tuple(params[n].shape) or not torch.equal(v, params[n].detach())
    )
    report["gamma"] = int(model.gamma)
    report["block_size"] = int(model.block_size)
    report["num_context_features"] = int(model.num_context_features)
    report["sample_from_anchor"] = bool(model.sample_from_anchor)
    report["ok"] = not report["params_without_source"] and not report["params_mismatch"]
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("draft_dirs", type=Path, nargs="+", metavar="DRAFT_DIR")
    ap.add_argument("--mode", action="append", choices=("static", "compact", "cap-accept"))
    ap.add_argument("--port", type=int, default=29653)
    ap.add_argument("--target-vocab-size", type=int, help="default: the draft's vocab_size")
    args = ap.parse_args(argv)
    modes = args.mode or ["static", "compact"]

    error = prepare_sglang_model_process(args.port)
    if error:
        print(json.dumps({"environment_error": error}))
        return 2

    ok = True
    for draft_dir in args.draft_dirs:
        vocab = args.target_vocab_size
        if vocab is None:
            vocab = int(json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))["vocab_size"])
        print(json.dumps({"draft_dir": str(draft_dir), **check_config(draft_dir, vocab)}, sort_keys=True))
        for mode in modes:
            report = check_mode(draft_dir, mode)
            ok &= report["ok"]
            print(json.dumps({"draft_dir": str(draft_dir), **report}, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
