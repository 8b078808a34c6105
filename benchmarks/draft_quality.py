"""The trained draft on held-out prompts, all configurations measured in ONE run (issue #4's table).

    .venv/bin/python benchmarks/draft_quality.py                 # SmolLM2 + the shipped draft, 100 held-out prompts
    .venv/bin/python benchmarks/draft_quality.py --configs DSpark "DSpark, whole vocab"     # only those (+ no-spec)
    .venv/bin/python benchmarks/draft_quality.py --draft-model-path NEW --baseline-draft-path OLD   # new vs old draft

Servers run one after another on 127.0.0.1 (fp32, the stock launcher):
  * no-spec                       greedy reference ids; tokens/s at concurrency 1 (T = 0 and T = 1)
  * DSpark  (verify-all)          tau, per-position acceptance, ECE of the calibrated confidence (T = 0 and T = 1)
  * DSpark  (verify-all, whole vocab)  when the draft ships a hot vocabulary (dspark_hot_vocab.json): the same draft
                                  over all tokens (SGLANG_DSPARK_HOT_VOCAB=off), for the hot set's coverage, tau change
                                  and drafted-step time change (concurrency 1, server-timed), side by side
  * DSpark  (verify-all, no STS)  ECE of the raw confidence (the same draft without its dspark_sts.json)
  * DFlash-mode (verify-all)      the same checkpoint with the Markov head zeroed: independent per-position drafts
  * previous draft (verify-all)   with --baseline-draft-path: another draft (e.g. the one shipped before), same runs
  * NGRAM                         SGLang's n-gram speculation with the same verify width
  * DSPARK (default)              what users get (scheduler on): tokens/s at concurrency 1 (T = 0 and 1), ratio

tau = generated tokens / verify steps (the bonus token included; SGLang's spec_verify_ct per request). Acceptance and ECE come from the server's own
counters (``/server_info`` -> ``dspark_admission``): snapshots before and after each workload, differenced.
With verify-all every draft position is verified, so position k's acceptance P(accepted drafts >= k) is unbiased.
Greedy identity is checked on every prompt of every T = 0 run against the no-spec ids.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.scheduling.stats import ece_from_bins
from sglang_dspark.draft.hot_vocab import HOT_VOCAB_FILE
from sglang_dspark.engine.arg_resolution import SHIPPED_STS_NAME
from sglang_dspark.local_server import start_server

HELD_OUT = Path(__file__).resolve().parent / "data" / "bigbench_heldout_prompts.jsonl"


def dflash_mode_copy(draft: Path, out: Path) -> Path:
    """The same checkpoint with ``markov_w2`` zeroed: the Markov bias is 0, so position k samples from the
    backbone's logits alone, independently of the drafted prefix (DFlash). Its STS file is dropped (it was fitted
    with the Markov head)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(draft, out, ignore=shutil.ignore_patterns(SHIPPED_STS_NAME))
    for path in out.glob("*.safetensors"):
        tensors = load_file(str(path))
        key = "markov_head.markov_w2.weight"
        if key in tensors:
            tensors[key] = tensors[key] * 0
            save_file(tensors, str(path), metadata={"format": "pt"})
    return out


def copy_without_sts(draft: Path, out: Path) -> Path:
    return Path(shutil.copytree(draft, out, ignore=shutil.ignore_patterns(SHIPPED_STS_NAME)))


def render_prompts(target: Path, texts: list[str]) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def admission(server) -> dict:
    try:
        return server.get("/server_info").json()["internal_states"][0].get("dspark_admission") or {}
    except Exception:  # noqa: BLE001 - non-DSPARK servers have no such key
        return {}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _diff(after: list, before: list) -> list:
    n = max(len(after), len(before))
    after, before = after + [0] * (n - len(after)), before + [0] * (n - len(before))
    return [a - b for a, b in zip(after, before)]


def run_workload(server, prompts: list[str], temperature: float, max_new_tokens: int, concurrency: int,
                 gamma: int = 0) -> dict:
    params = {"max_new_tokens": max_new_tokens, "temperature": temperature}
    before = admission(server)
    started = time.perf_counter()

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda prompt: server.generate(prompt, dict(params)), prompts))
    seconds = time.perf_counter() - started
    after = admission(server)
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    verify = sum(r["meta_info"].get("spec_verify_ct") or 0 for r in results)
    row = {
        "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
        "tau": tokens / verify if verify else None, "verify_steps": verify,
        "mean_spec_accept_length": _mean([r["meta_info"].get("spec_accept_length") for r in results]),
        "output_ids": [r["output_ids"] for r in results],
    }
    if after:
        hist = _diff(after.get("accepted_len_histogram", []), before.get("accepted_len_histogram", []))
        total = sum(hist)
        hist += [0] * (gamma + 1 - len(hist))
        row["position_acceptance"] = [sum(hist[k:]) / total for k in range(1, len(hist))] if total else []
        bins_after, bins_before = after["calibration_bins"], before["calibration_bins"]
        row["ece"] = ece_from_bins(*(_diff(bins_after[k], bins_before[k])
                                     for k in ("count", "prediction_sum", "label_sum")))
        row["server_tau"] = (sum((k + 1) * c for k, c in enumerate(hist)) / total) if total else None
        drafted = (after.get("timed_drafted_steps") or 0) - (before.get("timed_drafted_steps") or 0)
        seconds_drafted = (after.get("drafted_step_seconds_sum") or 0) - (before.get("drafted_step_seconds_sum") or 0)
        row["drafted_step_ms"] = 1000.0 * seconds_drafted / drafted if drafted else None
    return row


def print_hot_vocab_change(draft: Path, target: Path, rows: dict, reference: list) -> None:
    """The hot set's coverage of the target's greedy answers, and τ / drafted-step time with it vs without it."""
    from sglang_dspark.draft.hot_vocab import hot_coverage, load_hot_vocab

    vocab_size = int(json.loads((target / "config.json").read_text())["vocab_size"])
    hot = load_hot_vocab(draft, vocab_size)
    coverage = hot_coverage(hot, [t for ids in reference for t in ids])
    hot_row, whole = rows["DSpark"], rows["DSpark, whole vocab"]
    print(f"\nhot vocabulary: {hot.size} of {vocab_size} tokens, coverage of the no-spec greedy answers {coverage:.4f}")
    for t in ("T0", "T1"):
        print(f"  tau {t}: hot {hot_row[t]['tau']:.3f}, whole {whole[t]['tau']:.3f} "
              f"-> {hot_row[t]['tau'] / whole[t]['tau']:.3f}x")
    a, b = hot_row["speed"].get("drafted_step_ms"), whole["speed"].get("drafted_step_ms")
    if a and b:
        print(f"  drafted step at concurrency 1 (verify-all, server-timed): hot {a:.1f} ms, whole {b:.1f} ms "
              f"-> {a / b:.3f}x; tok/s hot {hot_row['speed']['tokens_per_second']:.1f}, "
              f"whole {whole['speed']['tokens_per_second']:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", help="default: the embedded SmolLM2 (fp32)")
    ap.add_argument("--draft-model-path", help="default: the shipped draft")
    ap.add_argument("--baseline-draft-path", help="also measure this draft (row 'previous draft'), e.g. the old one")
    ap.add_argument("--prompts", default=str(HELD_OUT), help="JSONL with a 'text' field per line")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=24, help="for the acceptance runs")
    ap.add_argument("--speed-prompts", type=int, default=12, help="prompts for the concurrency-1 speed runs")
    ap.add_argument("--speed-max-new-tokens", type=int, default=128)
    ap.add_argument("--ngram-draft-tokens", type=int, default=8, help="NGRAM verify width (DSpark's: block + 1)")
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    ap.add_argument("--json-out", default=None, help="also write the raw rows here")
    ap.add_argument("--configs", nargs="+", help="run only these configurations (labels as printed; no-spec always)")
    args = ap.parse_args(argv)

    if args.model_path:
        target, draft = Path(args.model_path), Path(args.draft_model_path)
    else:
        from sglang_dspark.embedded.defaults import ensure_default_pair

        target, draft = ensure_default_pair()
        draft = Path(args.draft_model_path) if args.draft_model_path else draft
    with open(args.prompts, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()][: args.num_prompts]
    prompts = render_prompts(target, texts)
    speed_prompts = prompts[: args.speed_prompts]

    work = Path(tempfile.mkdtemp(prefix="sglang-dspark-quality-"))
    dflash = dflash_mode_copy(draft, work / "dflash-mode")
    raw = copy_without_sts(draft, work / "no-sts")
    dspark = ["--speculative-algorithm", "DSPARK"]
    # verify-all in SGLang's compact mode: every draft position is verified AND the confidence head runs (in the
    # static mode verify-all would pick, the head is not even built, so there would be nothing to calibrate).
    verify_all = {"SGLANG_DSPARK_ADMISSION": "verify-all", "SGLANG_RAGGED_VERIFY_MODE": "compact"}
    gamma = int(json.loads((draft / "config.json").read_text())["block_size"])
    baseline_gamma = int(json.loads((Path(args.baseline_draft_path) / "config.json").read_text())["block_size"]) \
        if args.baseline_draft_path else gamma
    configs = [
        ("no-spec", [], {}, ("greedy", "speed", "speed T1")),
        ("DSpark", [*dspark, "--speculative-draft-model-path", str(draft)], verify_all, ("T0", "T1")),
        ("DSpark, no STS", [*dspark, "--speculative-draft-model-path", str(raw)], verify_all, ("T0", "T1")),
        ("DFlash-mode", [*dspark, "--speculative-draft-model-path", str(dflash)], verify_all, ("T0", "T1")),
        *([("previous draft", [*dspark, "--speculative-draft-model-path", str(args.baseline_draft_path)], verify_all,
             ("T0", "T1"))] if args.baseline_draft_path else []),
        ("NGRAM", ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens",
                   str(args.ngram_draft_tokens)], {}, ("T0", "T1")),
        ("DSPARK default", [*dspark, "--speculative-draft-model-path", str(draft)], {}, ("speed", "speed T1")),
    ]
    has_hot_vocab = (draft / HOT_VOCAB_FILE).is_file()
    if has_hot_vocab:  # the same draft over the whole vocabulary: the hot set's τ and step-time change, side by side
        configs[1] = (*configs[1][:3], ("T0", "T1", "speed"))
        configs.insert(2, ("DSpark, whole vocab", [*dspark, "--speculative-draft-model-path", str(draft)],
                           {**verify_all, "SGLANG_DSPARK_HOT_VOCAB": "off"}, ("T0", "T1", "speed")))
    if args.configs:
        unknown = set(args.configs) - {c[0] for c in configs}
        if unknown:
            ap.error(f"unknown --configs {sorted(unknown)}; choose from {[c[0] for c in configs]}")
        configs = [c for c in configs if c[0] == "no-spec" or c[0] in args.configs]
    rows: dict = {}
    for label, extra, env, jobs in tqdm(configs, desc="servers", unit="server"):
        server = start_server(target, ["--dtype", "float32", *extra], env=env,
                              max_total_tokens=args.max_total_tokens, log_dir=work / "logs", timeout=600)
        try:
            row = {"startup_s": server.startup_seconds}
            server.generate(prompts[0], {"max_new_tokens": 4, "temperature": 0})  # warm-up
            for job in jobs:
                if job.startswith("speed"):
                    row[job] = run_workload(server, speed_prompts, 1.0 if job.endswith("T1") else 0.0,
                                            args.speed_max_new_tokens, 1)
                elif job == "greedy":
                    row[job] = run_workload(server, prompts, 0.0, args.max_new_tokens, args.concurrency)
                else:
                    row[job] = run_workload(server, prompts, 0.0 if job == "T0" else 1.0, args.max_new_tokens,
                                            args.concurrency, baseline_gamma if label == "previous draft" else gamma)
        finally:
            server.stop()
        rows[label] = row

    reference = rows["no-spec"]["greedy"]["output_ids"]
    speed_reference = rows["no-spec"]["speed"]["output_ids"]
    print(f"\ntarget {target}\ndraft  {draft}\n{len(prompts)} held-out prompts ({args.prompts}), "
          f"max_new_tokens {args.max_new_tokens}, acceptance runs at concurrency {args.concurrency}\n")
    print(f"{'configuration':16s} {'tau T=0':>8s} {'tau T=1':>8s} {'ECE T=0':>8s} {'ECE T=1':>8s} "
          f"{'greedy = no-spec':>17s}  acceptance by draft position (T=0 | T=1)")
    for label in ("DSpark", "DSpark, whole vocab", "DSpark, no STS", "DFlash-mode", "previous draft", "NGRAM"):
        if label not in rows:
            continue
        r = rows[label]
        same = sum(a == b for a, b in zip(r["T0"]["output_ids"], reference))
        ece = [r[t].get("ece") for t in ("T0", "T1")]
        pos = " | ".join(" ".join(f"{p:.2f}" for p in r[t].get("position_acceptance", [])) or "-" for t in ("T0", "T1"))
        print(f"{label:16s} {r['T0']['tau']:8.2f} {r['T1']['tau']:8.2f} "
              + " ".join(f"{e * 100:7.1f}%" if e is not None else f"{'-':>8s}" for e in ece)
              + f" {same:>8d}/{len(reference):<8d}  {pos}")
    if "DSpark" in rows and "DFlash-mode" in rows:
        ratio = [rows["DSpark"][t]["tau"] / rows["DFlash-mode"][t]["tau"] for t in ("T0", "T1")]
        print(f"\ntau(DSpark) / tau(DFlash-mode): T=0 {ratio[0]:.3f}, T=1 {ratio[1]:.3f}")
    for other in ("NGRAM", "previous draft"):
        if "DSpark" in rows and other in rows:
            ratio = [rows["DSpark"][t]["tau"] / rows[other][t]["tau"] for t in ("T0", "T1")]
            print(f"tau(DSpark) / tau({other}): T=0 {ratio[0]:.3f}, T=1 {ratio[1]:.3f}")
    if "DSpark" in rows and "DSpark, whole vocab" in rows:
        print_hot_vocab_change(draft, target, rows, reference)
    if "DSPARK default" not in rows:
        return 0
    base = rows["no-spec"]["speed"]["tokens_per_second"]
    fast = rows["DSPARK default"]["speed"]
    same = sum(a == b for a, b in zip(fast["output_ids"], speed_reference))
    print(f"concurrency 1, {len(speed_prompts)} prompts x {args.speed_max_new_tokens} tokens, greedy: "
          f"no-spec {base:.1f} tok/s, DSPARK {fast['tokens_per_second']:.1f} tok/s "
          f"(tau {fast['tau']:.2f}) -> {fast['tokens_per_second'] / base:.2f}x; greedy identical {same}/{len(speed_prompts)}")
    base_t1 = rows["no-spec"]["speed T1"]["tokens_per_second"]
    fast_t1 = rows["DSPARK default"]["speed T1"]
    print(f"concurrency 1, same prompts, T=1: no-spec {base_t1:.1f} tok/s, DSPARK {fast_t1['tokens_per_second']:.1f} tok/s "
          f"(tau {fast_t1['tau']:.2f}) -> {fast_t1['tokens_per_second'] / base_t1:.2f}x")
    if args.json_out:
        for r in rows.values():
            for job in r.values():
                if isinstance(job, dict):
                    job.pop("output_ids", None)
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
