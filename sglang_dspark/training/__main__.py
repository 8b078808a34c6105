"""``python -m sglang_dspark.training {prompts,instructions,generate,features,train,export,calibrate,evaluate,curve}``: train a DSpark draft.

    prompts    --bigbench SDIST --out-dir DIR   BIG-bench inputs -> DIR/{train,heldout}_prompts.jsonl (split by task)
    instructions --out FILE [--count 800]      everyday requests (code, sums, writing, how-to) composed from templates
    generate   --target DIR --prompts FILE --out FILE.jsonl [--temperature 0.7 --deadline-minutes M]
               the target's answers through our SGLang CPU server (resumable)

    train      --target DIR --data FILE.jsonl --out RUN [--block-size 7 --layers 2 --markov-rank 64 --steps N ...]
               caches target features (RUN/features), trains (RUN/checkpoints, --resume), exports RUN/draft
    features   --target DIR --data FILE.jsonl --cache-dir DIR          (only the target pass)
    export     --run RUN --out DIR [--omit-shared] [--dtype bfloat16]  (latest checkpoint -> DeepSpec checkpoint)
    calibrate  --draft DIR (--target DIR --data FILE.jsonl | --cache-dir DIR | --sts-data GLOB) --out sts.json
    evaluate   (--draft DIR [DIR ...] | --run RUN) --cache-dir DIR [--whole-vocab --no-markov]   held-out replay: tau, ECE
    curve      --run RUN [RUN ...] --out PNG                    loss and held-out tau against training hours
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from sglang_dspark.draft.model import DSparkDraft, default_target_layer_ids, init_std, num_params
from sglang_dspark.draft.checkpoint import build_draft_config, load_draft, save_draft
from .features import DTYPES, FeatureCache, build_feature_cache, validate_layer_ids
from .trainer import CKPT_PREFIX, TrainConfig, Trainer


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.replace(" ", "").split(",") if x]


def _target_config(target: Path) -> dict:
    return json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))


def _tokenizer(target: Path):
    from .features import _transformers

    return _transformers().AutoTokenizer.from_pretrained(str(target))


def resolve_mask_token_id(target: Path, vocab_size: int, explicit: Optional[int], tokenizer=None) -> int:
    """Explicit id, else the tokenizer's mask token, else the first embedding row past the tokenizer (Qwen3's
    choice: an unused, frozen row). Targets whose vocab has no spare row must name a rarely used token."""
    if explicit is not None:
        return int(explicit)
    tok = tokenizer if tokenizer is not None else _tokenizer(target)
    if getattr(tok, "mask_token_id", None) is not None:
        return int(tok.mask_token_id)
    if len(tok) < vocab_size:
        return len(tok)
    raise SystemExit(
        f"the target's vocab ({vocab_size}) has no unused row and its tokenizer no mask token: pass "
        "--mask-token-id with the id of a token the data never contains (e.g. an unused special token)"
    )


def _dtype_of(cfg: dict) -> str:
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def _load_sequences(args, tokenizer):
    from .data import load_sequences

    return load_sequences(Path(args.data), tokenizer, max_length=args.max_length,
                          min_loss_tokens=args.min_loss_tokens, limit=args.limit)


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--min-loss-tokens", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="use only the first N sequences")
    p.add_argument("--feature-dtype", default="bfloat16", choices=sorted(DTYPES), help="cache storage dtype")
    p.add_argument("--target-dtype", default="float32", choices=sorted(DTYPES), help="dtype the target runs in")
    p.add_argument("--feature-batch-tokens", type=int, default=8192)


def _build_cache(args, target: Path, layer_ids, cache_dir: Path, tokenizer) -> FeatureCache:
    seqs = _load_sequences(args, tokenizer)
    if not seqs:
        raise SystemExit(f"no usable sequences in {args.data}")
    return build_feature_cache(target, seqs, cache_dir, layer_ids, store_dtype=DTYPES[args.feature_dtype],
                               target_dtype=DTYPES[args.target_dtype], batch_tokens=args.feature_batch_tokens,
                               progress=not args.quiet)


# --------------------------------------------------------------------------------------------- data


def cmd_prompts(args) -> int:
    from .corpus import bigbench_prompts, split_prompts, write_prompts

    prompts = bigbench_prompts(Path(args.bigbench), per_task=args.per_task, seed=args.seed)
    train, held = split_prompts(prompts, held_out_percent=args.held_out_percent, seed=args.seed)
    out = Path(args.out_dir)
    write_prompts(out / "train_prompts.jsonl", train)
    write_prompts(out / "heldout_prompts.jsonl", held)
    print(f"{len(train)} train prompts ({len({p.task for p in train})} tasks), {len(held)} held-out "
          f"({len({p.task for p in held})} tasks) -> {out}")
    return 0


def cmd_instructions(args) -> int:
    from .corpus import write_prompts
    from .instructions import instruction_prompts

    prompts = instruction_prompts(args.count, seed=args.seed)
    write_prompts(Path(args.out), prompts)
    print(f"{len(prompts)} instruction prompts -> {args.out}")
    return 0


def cmd_generate(args) -> int:
    from .corpus import read_prompts
    from .generate import generate_answers

    prompts = read_prompts(Path(args.prompts))[args.skip:]
    prompts = prompts[: args.limit] if args.limit is not None else prompts
    n = generate_answers(Path(args.target), prompts, Path(args.out), temperature=args.temperature,
                         max_new_tokens=args.max_new_tokens, concurrency=args.concurrency, seed=args.seed,
                         deadline_minutes=args.deadline_minutes, progress=not args.quiet)
    print(f"{n} answers appended to {args.out}")
    return 0


# --------------------------------------------------------------------------------------------- train


def cmd_train(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    target = Path(args.target)
    out = Path(args.out)
    tcfg = _target_config(target)
    n_layers = int(tcfg["num_hidden_layers"])
    run_path = out / "run.json"
    if not (args.resume or args.extend) and any((out / "checkpoints").glob(f"{CKPT_PREFIX}*.pt")):
        raise SystemExit(f"{out} already has checkpoints: pass --resume, or choose another --out")
    if (args.resume or args.extend) and run_path.is_file():
        run = json.loads(run_path.read_text())
        dcfg = run["draft_config"]
    elif args.init_from:
        # Warm start: the trained draft's geometry, a block size of this run's choosing (no weight depends on it)
        dcfg = json.loads((Path(args.init_from) / "config.json").read_text(encoding="utf-8"))
        dcfg["block_size"] = int(args.block_size or dcfg["block_size"])
        dcfg["num_anchors"] = int(args.num_anchors)
        run = {"target": str(target.resolve()), "data": str(Path(args.data).resolve()), "draft_config": dcfg,
               "init_from": str(Path(args.init_from).resolve())}
        out.mkdir(parents=True, exist_ok=True)
        run_path.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    else:
        tok = _tokenizer(target)
        ids = _ints(args.target_layer_ids) if args.target_layer_ids else default_target_layer_ids(
            n_layers, args.num_context_features or min(max(args.layers, 3), n_layers - 1))
        validate_layer_ids(ids, n_layers)
        dcfg = build_draft_config(
            tcfg, num_draft_layers=args.layers, block_size=args.block_size or 7,
            mask_token_id=resolve_mask_token_id(target, int(tcfg["vocab_size"]), args.mask_token_id, tok),
            target_layer_ids=ids, markov_rank=args.markov_rank, confidence_head=not args.no_confidence_head,
            num_anchors=args.num_anchors, dtype=args.export_dtype or _dtype_of(tcfg),
        )
        if args.intermediate_size:
            dcfg["intermediate_size"] = int(args.intermediate_size)
        run = {"target": str(target.resolve()), "data": str(Path(args.data).resolve()), "draft_config": dcfg}
        out.mkdir(parents=True, exist_ok=True)
        run_path.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    cache_dir = Path(args.cache_dir) if args.cache_dir else out / "features"
    tok = None if _jsonl_is_tokenized(Path(args.data)) else _tokenizer(target)
    cache = _build_cache(args, target, dcfg["target_layer_ids"], cache_dir, tok)

    model = DSparkDraft(dcfg)
    model.init_trainable(torch.Generator().manual_seed(args.seed), init_std(dcfg))
    shared = cache.shared_weights()
    model.set_shared(shared["embed_tokens.weight"].float(), shared["lm_head.weight"].float())
    if run.get("init_from") and not any((out / "checkpoints").glob(f"{CKPT_PREFIX}*.pt")):
        start = load_draft(Path(run["init_from"]), shared=shared)
        model.load_state_dict(start.state_dict())
    hot = _hot_vocab(args.hot_vocab, int(dcfg["vocab_size"]))
    if hot is not None:
        model.set_hot_vocab(hot.token_ids)
        if run.get("hot_vocab") != str(Path(args.hot_vocab).resolve()):
            run["hot_vocab"] = str(Path(args.hot_vocab).resolve())  # `evaluate --run` drafts over it too
            run_path.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    cfg = TrainConfig(
        out_dir=str(out), steps=args.steps, batch_size=args.batch_size, num_anchors=args.num_anchors,
        micro_tokens=args.micro_tokens, head_chunk=args.head_chunk, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, loss_decay=args.loss_decay,
        alpha_ce=args.alpha_ce, alpha_l1=args.alpha_l1, alpha_conf=args.alpha_conf, seed=args.seed,
        save_every=args.save_every, keep_checkpoints=args.keep_checkpoints, log_every=args.log_every, threads=args.threads, device=args.device,
        progress=not args.quiet, precision=args.precision, loss_on_prompts=args.loss_on_prompts,
    )
    if not args.quiet:
        print(f"draft: {num_params(model)/1e6:.2f}M trainable params, {len(cache)} sequences, "
              f"target_layer_ids={dcfg['target_layer_ids']}, mask_token_id={dcfg['mask_token_id']}", file=sys.stderr)
    trainer = Trainer(model, cache, cfg)
    t0 = time.perf_counter()
    trainer.train(resume=args.resume, extend=args.extend,
                  stop_after_seconds=None if args.stop_after_minutes is None else 60.0 * args.stop_after_minutes)
    export_dir = Path(args.export_dir) if args.export_dir else out / "draft"
    save_draft(model, export_dir, include_shared=not args.omit_shared, dtype=DTYPES[_dtype_of(dcfg)],
               tokenizer_dir=target)
    if hot is not None:  # the draft was trained for this hot set: it ships with it
        from sglang_dspark.draft.hot_vocab import HOT_VOCAB_FILE

        (export_dir / HOT_VOCAB_FILE).write_text(json.dumps(hot.to_json()) + "\n", encoding="utf-8")
    if not args.quiet:
        print(f"trained to step {trainer.step} in {time.perf_counter() - t0:.1f}s; draft -> {export_dir}",
              file=sys.stderr)
    print(export_dir)
    return 0


def _hot_vocab(path: Optional[str], vocab_size: int):
    """The hot set of ``--hot-vocab`` (a draft folder holding one, or the JSON file itself), or None."""
    if not path:
        return None
    from sglang_dspark.draft.hot_vocab import HOT_VOCAB_FILE, load_hot_vocab

    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not p.exists():
        raise SystemExit(f"--hot-vocab {path}: no such file or folder")
    if p.is_file() and p.name != HOT_VOCAB_FILE:
        raise SystemExit(f"--hot-vocab {path}: expected a folder holding {HOT_VOCAB_FILE} or that file itself")
    hot = load_hot_vocab(folder, vocab_size)
    if hot is None:
        raise SystemExit(f"--hot-vocab {path}: no {HOT_VOCAB_FILE} there (build one with "
                         "`python -m sglang_dspark.draft.hot_vocab build`)")
    return hot


def _jsonl_is_tokenized(path: Path) -> bool:
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return "input_ids" in json.loads(line)
    return True


def cmd_features(args) -> int:
    target = Path(args.target)
    n_layers = int(_target_config(target)["num_hidden_layers"])
    ids = _ints(args.target_layer_ids) if args.target_layer_ids else default_target_layer_ids(n_layers, 3)
    tok = None if _jsonl_is_tokenized(Path(args.data)) else _tokenizer(target)
    cache = _build_cache(args, target, ids, Path(args.cache_dir), tok)
    print(f"{len(cache)} sequences cached in {cache.dir}")
    return 0


# --------------------------------------------------------------------------------------------- export


def _model_from_run(run_dir: Path, checkpoint: Optional[Path]) -> DSparkDraft:
    run = json.loads((run_dir / "run.json").read_text())
    ck = checkpoint or max((run_dir / "checkpoints").glob(f"{CKPT_PREFIX}*.pt"), default=None)
    if ck is None:
        raise SystemExit(f"no checkpoint under {run_dir / 'checkpoints'}")
    st = torch.load(ck, map_location="cpu", weights_only=False)
    model = DSparkDraft(run["draft_config"])
    shared = FeatureCache(run_dir / "features").shared_weights() if (run_dir / "features" / "manifest.json").is_file() \
        else _shared_from_target(Path(run["target"]))
    model.set_shared(shared["embed_tokens.weight"].float(), shared["lm_head.weight"].float())
    model.load_state_dict(st["model"], strict=False)
    return model


def _shared_from_target(target: Path):
    from .features import TargetRunner

    return TargetRunner(target, None).shared_weights()


def cmd_export(args) -> int:
    run_dir = Path(args.run)
    model = _model_from_run(run_dir, Path(args.checkpoint) if args.checkpoint else None)
    run = json.loads((run_dir / "run.json").read_text())
    dtype = DTYPES[args.dtype] if args.dtype else DTYPES[_dtype_of(model.config)]
    save_draft(model, Path(args.out), include_shared=not args.omit_shared, dtype=dtype,
               tokenizer_dir=Path(run["target"]))
    print(args.out)
    return 0


# --------------------------------------------------------------------------------------------- calibrate


def cmd_calibrate(args) -> int:
    from .sts import collect_observations, fit_sts, format_report, load_sglang_shards, write_sts

    if args.sts_data:
        logits, prefix = load_sglang_shards(args.sts_data)
        valid = None
        dataset = args.sts_data
    else:
        draft = Path(args.draft)
        dcfg = json.loads((draft / "config.json").read_text())
        if args.cache_dir and (Path(args.cache_dir) / "manifest.json").is_file() and not args.data:
            cache = FeatureCache(Path(args.cache_dir))
        else:
            if not (args.target and args.data):
                raise SystemExit("calibrate needs --sts-data, or --cache-dir, or --target with --data")
            tok = None if _jsonl_is_tokenized(Path(args.data)) else _tokenizer(Path(args.target))
            cache_dir = Path(args.cache_dir) if args.cache_dir else Path(args.out).with_suffix(".features")
            cache = _build_cache(args, Path(args.target), dcfg["target_layer_ids"], cache_dir, tok)
        if cache.layer_ids != list(dcfg["target_layer_ids"]):
            raise SystemExit(f"cache layers {cache.layer_ids} != draft target_layer_ids {dcfg['target_layer_ids']}")
        model = load_draft(draft, shared=cache.shared_weights())
        if args.threads:
            torch.set_num_threads(args.threads)
        logits, prefix, valid = collect_observations(model, cache, anchors_per_seq=args.anchors_per_seq,
                                                     seed=args.seed, progress=not args.quiet)
        dataset = str(args.data or args.cache_dir)
    fit = fit_sts(logits, prefix, valid, num_bins=args.num_bins)
    write_sts(Path(args.out), fit, dataset)
    print(format_report(fit))
    print(f"{fit.num_samples} rounds; STS calibration -> {args.out}")
    return 0


def cmd_evaluate(args) -> int:
    """Greedy drafting rounds replayed on a feature cache of held-out target answers (``collect_observations``):
    acceptance by slot, tau, confidence ECE with the draft's STS file. The draft runs as served: over its shipped hot
    vocabulary unless ``--whole-vocab``; ``--no-markov`` zeroes the Markov head (the paper's DFlash-mode ablation)."""
    from sglang_dspark.draft.hot_vocab import load_hot_vocab
    from .sts import collect_observations, replay_quality

    if args.threads:
        torch.set_num_threads(args.threads)
    cache = FeatureCache(Path(args.cache_dir))
    jobs = []  # (label, model loader, hot vocabulary, STS temperatures, extra fields)
    for draft in args.draft or []:
        draft = Path(draft)
        sts_path = draft / "dspark_sts.json"
        temps = json.loads(sts_path.read_text())["temperatures"] if sts_path.is_file() else None
        load = lambda d=draft: load_draft(d, shared=cache.shared_weights())  # noqa: E731
        vocab = int(json.loads((draft / "config.json").read_text())["vocab_size"])
        jobs.append((str(draft), load, None if args.whole_vocab else load_hot_vocab(draft, vocab), temps, {}))
    log_path = None
    if args.run:  # every checkpoint of a run not yet evaluated on this cache: the tau-per-training-hour curve
        run_dir = Path(args.run)
        run = json.loads((run_dir / "run.json").read_text())
        hot = None if args.whole_vocab or not run.get("hot_vocab") else _hot_vocab(
            run["hot_vocab"], int(run["draft_config"]["vocab_size"]))
        log_path = run_dir / "evaluations.jsonl"
        done = set()
        if log_path.is_file():
            done = {(r["checkpoint"], r["cache"], r["markov"], r["hot_vocab"])
                    for r in map(json.loads, log_path.read_text().splitlines())}
        checkpoints = sorted((run_dir / "checkpoints").glob(f"{CKPT_PREFIX}*.pt"))
        for ck in checkpoints:
            if (ck.name, str(cache.dir), not args.no_markov, None if hot is None else hot.size) in done:
                continue
            st = torch.load(ck, map_location="cpu", weights_only=False)
            if args.every and st["step"] % args.every and ck != checkpoints[-1]:
                continue
            jobs.append((str(ck), lambda c=ck: _model_from_run(run_dir, c), hot, None,
                         {"checkpoint": ck.name, "step": st["step"], "train_seconds": st.get("train_seconds"),
                          "cache": str(cache.dir)}))
    if not jobs:
        raise SystemExit("nothing to evaluate: pass --draft and/or --run (whose checkpoints are all evaluated)")
    for label, load, hot, temps, extra in jobs:
        model = load()
        if list(model.config["target_layer_ids"]) != cache.layer_ids:
            raise SystemExit(f"{label}: target_layer_ids {model.config['target_layer_ids']} != cache {cache.layer_ids}")
        model.set_hot_vocab(None if hot is None else hot.token_ids)
        if args.no_markov:
            with torch.no_grad():
                model.markov_head.markov_w2.weight.zero_()
        z, y, v = collect_observations(model, cache, anchors_per_seq=args.anchors_per_seq, seed=args.seed,
                                       progress=not args.quiet)
        q = replay_quality(z, y, v, temps)
        q.update(draft=label, hot_vocab=None if hot is None else hot.size, markov=not args.no_markov,
                 block_size=model.gamma, **extra)
        print(json.dumps(q), flush=True)
        if extra and log_path is not None:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(q) + "\n")
    return 0


def cmd_curve(args) -> int:
    from .curve import plot_runs

    print(plot_runs([Path(r) for r in args.run], Path(args.out), args.offset_hours))
    return 0


# --------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_dspark.training", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    pr = sub.add_parser("prompts", help="extract the BIG-bench prompt corpus and split it by task")
    pr.add_argument("--bigbench", required=True, help="path of bigbench-1.0.0.tar.gz (pip download --no-deps bigbench==1.0.0)")
    pr.add_argument("--out-dir", required=True)
    pr.add_argument("--per-task", type=int, default=24)
    pr.add_argument("--held-out-percent", type=int, default=15)
    pr.add_argument("--seed", type=int, default=0)
    pr.set_defaults(func=cmd_prompts)

    ins = sub.add_parser("instructions", help="everyday instruction prompts (code, sums, writing, how-to) to answer")
    ins.add_argument("--out", required=True)
    ins.add_argument("--count", type=int, default=800)
    ins.add_argument("--seed", type=int, default=0)
    ins.set_defaults(func=cmd_instructions)

    g = sub.add_parser("generate", help="the target's answers to prompts, through our SGLang CPU server")
    g.add_argument("--target", required=True)
    g.add_argument("--prompts", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--skip", type=int, default=0, help="start at this prompt (e.g. a calibration slice)")
    g.add_argument("--limit", type=int, default=None)
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--max-new-tokens", type=int, default=192)
    g.add_argument("--concurrency", type=int, default=32)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--deadline-minutes", type=float, default=None)
    g.add_argument("--quiet", action="store_true")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("train", help="cache target features, train, export")
    t.add_argument("--target", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--cache-dir", default=None)
    t.add_argument("--export-dir", default=None)
    t.add_argument("--block-size", type=int, default=None, help="default 7, or --init-from's")
    t.add_argument("--init-from", default=None, help="start from this exported draft's weights (warm start)")
    t.add_argument("--hot-vocab", default=None,
                   help="train over this hot vocabulary (a folder with dspark_hot_vocab.json, or the file): the "
                        "draft as served with it, and ~|V|/|H| times less vocabulary work per step")
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--markov-rank", type=int, default=64)
    t.add_argument("--target-layer-ids", default=None, help="comma list; default evenly spaced")
    t.add_argument("--num-context-features", type=int, default=None)
    t.add_argument("--mask-token-id", type=int, default=None)
    t.add_argument("--intermediate-size", type=int, default=None, help="default: the target's")
    t.add_argument("--no-confidence-head", action="store_true",
                   help="SGLang 0.5.23 then serves it only with SGLANG_RAGGED_VERIFY_MODE=static")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    t.add_argument("--num-anchors", type=int, default=64, help="anchors per sequence")
    t.add_argument("--micro-tokens", type=int, default=4096, help="packed context tokens per forward")
    t.add_argument("--head-chunk", type=int, default=32, help="anchors per vocab-sized loss chunk (memory bound)")
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--min-lr-ratio", type=float, default=0.0)
    t.add_argument("--warmup-ratio", type=float, default=0.04)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--loss-decay", type=float, default=4.0)
    t.add_argument("--alpha-ce", type=float, default=0.1)
    t.add_argument("--alpha-l1", type=float, default=0.9)
    t.add_argument("--alpha-conf", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--save-every", type=int, default=200)
    t.add_argument("--keep-checkpoints", type=int, default=2, help="older checkpoints are deleted")
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--device", default="cpu", help="cpu (default) or e.g. cuda")
    t.add_argument("--loss-on-prompts", action="store_true",
                   help="anchors and labels over every token, prompts included (default: the answers only)")
    t.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="bf16: the draft's forward under bf16 autocast (master weights, loss and targets stay fp32)")
    t.add_argument("--resume", action="store_true")
    t.add_argument("--stop-after-minutes", type=float, default=None,
                   help="stop (with a checkpoint) after this much wall time; --resume goes on later")
    t.add_argument("--extend", action="store_true",
                   help="resume a run with another --steps total (its cosine schedule is recomputed for it)")
    t.add_argument("--omit-shared", action="store_true", help="export without embed_tokens/lm_head copies")
    t.add_argument("--export-dtype", default=None, help="default: the target's dtype")
    t.add_argument("--quiet", action="store_true")
    _add_data_args(t)
    t.set_defaults(func=cmd_train)

    f = sub.add_parser("features", help="only cache the target's features")
    f.add_argument("--target", required=True)
    f.add_argument("--data", required=True)
    f.add_argument("--cache-dir", required=True)
    f.add_argument("--target-layer-ids", default=None)
    f.add_argument("--quiet", action="store_true")
    _add_data_args(f)
    f.set_defaults(func=cmd_features)

    e = sub.add_parser("export", help="export a run's checkpoint in DeepSpec's format")
    e.add_argument("--run", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--checkpoint", default=None)
    e.add_argument("--omit-shared", action="store_true")
    e.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    e.set_defaults(func=cmd_export)

    c = sub.add_parser("calibrate", help="fit STS temperatures for the confidence head")
    c.add_argument("--draft", default=None)
    c.add_argument("--target", default=None)
    c.add_argument("--data", default=None, help="held-out JSONL (target continuations)")
    c.add_argument("--cache-dir", default=None)
    c.add_argument("--sts-data", default=None, help="glob of SGLang STS shards (SGLANG_DSPARK_STS_COLLECT_PATH)")
    c.add_argument("--out", required=True)
    c.add_argument("--anchors-per-seq", type=int, default=64)
    c.add_argument("--num-bins", type=int, default=15)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--quiet", action="store_true")
    _add_data_args(c)
    c.set_defaults(func=cmd_calibrate)

    ev = sub.add_parser("evaluate", help="held-out greedy replay: acceptance by slot, tau, confidence ECE")
    ev.add_argument("--draft", nargs="+", help="exported draft folder(s)")
    ev.add_argument("--run", default=None, help="a training run: its checkpoints not yet evaluated on this cache, "
                                                "appended to RUN/evaluations.jsonl (the tau-per-hour curve)")
    ev.add_argument("--every", type=int, default=None, help="with --run: only checkpoints at multiples of this step "
                                                             "(and the last)")
    ev.add_argument("--cache-dir", required=True, help="feature cache of held-out target answers (`features`)")
    ev.add_argument("--whole-vocab", action="store_true", help="ignore the draft's hot vocabulary")
    ev.add_argument("--no-markov", action="store_true", help="zero the Markov head (DFlash-mode ablation)")
    ev.add_argument("--anchors-per-seq", type=int, default=64)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--threads", type=int, default=None)
    ev.add_argument("--quiet", action="store_true")
    ev.set_defaults(func=cmd_evaluate)

    cu = sub.add_parser("curve", help="PNG of training loss and held-out tau against training hours")
    cu.add_argument("--run", required=True, nargs="+")
    cu.add_argument("--out", required=True)
    cu.add_argument("--offset-hours", type=float, nargs="*", default=None,
                    help="per run: hours of training before it (a warm start's own training time)")
    cu.set_defaults(func=cmd_curve)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
