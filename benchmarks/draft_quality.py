"""The trained draft on held-out prompts, all configurations measured in ONE run (issue #4's table).

    .venv/bin/python benchmarks/draft_quality.py                 # SmolLM2 + the shipped draft, 100 held-out prompts

Servers run one after another on 127.0.0.1 (fp32, the stock launcher):
  * no-spec                       greedy reference ids; tokens/s at concurrency 1 (T = 0 and T = 1)
  * DSpark  (verify-all)          tau, per-position acceptance, ECE of the calibrated confidence (T = 0 and T = 1)
  * DSpark  (verify-all, no STS)  ECE of the raw confidence (the same draft without its dspark_sts.json)
  * DFlash-mode (verify-all)      the same checkpoint with the Markov head zeroed: independent per-position drafts
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
from sglang_dspark.engine.arg_resolution import SHIPPED_STS_NAME
from sglang_dspark.testing.server import start_server

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
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", help="default: the embedded SmolLM2 (fp32)")
    ap.add_argument("--draft-model-path", help="default: the shipped draft")
    ap.add_argument("--prompts", default=str(HELD_OUT), help="JSONL with a 'text' field per line")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=24, help="for the acceptance runs")
    ap.add_argument("--speed-prompts", type=int, default=12, help="prompts for the concurrency-1 speed runs")
    ap.add_argument("--speed-max-new-tokens", type=int, default=128)
    ap.add_argument("--ngram-draft-tokens", type=int, default=8, help="NGRAM verify width (DSpark's: block + 1)")
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    ap.add_argument("--json-out", default=None, help="also write the raw rows here")
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
    configs = [
        ("no-spec", [], {}, ("greedy", "speed", "speed T1")),
        ("DSpark", [*dspark, "--speculative-draft-model-path", str(draft)], verify_all, ("T0", "T1")),
        ("DSpark, no STS", [*dspark, "--speculative-draft-model-path", str(raw)], verify_all, ("T0", "T1")),
        ("DFlash-mode", [*dspark, "--speculative-draft-model-path", str(dflash)], verify_all, ("T0", "T1")),
        ("NGRAM", ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens",
                   str(args.ngram_draft_tokens)], {}, ("T0", "T1")),
        ("DSPARK default", [*dspark, "--speculative-draft-model-path", str(draft)], {}, ("speed", "speed T1")),
    ]
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
                                            args.concurrency, gamma)
        finally:
            server.stop()
        rows[label] = row

    reference = rows["no-spec"]["greedy"]["output_ids"]
    speed_reference = rows["no-spec"]["speed"]["output_ids"]
    print(f"\ntarget {target}\ndraft  {draft}\n{len(prompts)} held-out prompts ({args.prompts}), "
          f"max_new_tokens {args.max_new_tokens}, acceptance runs at concurrency {args.concurrency}\n")
    print(f"{'configuration':16s} {'tau T=0':>8s} {'tau T=1':>8s} {'ECE T=0':>8s} {'ECE T=1':>8s} "
          f"{'greedy = no-spec':>17s}  acceptance by draft position (T=0 | T=1)")
    for label in ("DSpark", "DSpark, no STS", "DFlash-mode", "NGRAM"):
        r = rows[label]
        same = sum(a == b for a, b in zip(r["T0"]["output_ids"], reference))
        ece = [r[t].get("ece") for t in ("T0", "T1")]
        pos = " | ".join(" ".join(f"{p:.2f}" for p in r[t].get("position_acceptance", [])) or "-" for t in ("T0", "T1"))
        print(f"{label:16s} {r['T0']['tau']:8.2f} {r['T1']['tau']:8.2f} "
              + " ".join(f"{e * 100:7.1f}%" if e is not None else f"{'-':>8s}" for e in ece)
              + f" {same:>8d}/{len(reference):<8d}  {pos}")
    ratio = [rows["DSpark"][t]["tau"] / rows["DFlash-mode"][t]["tau"] for t in ("T0", "T1")]
    print(f"\ntau(DSpark) / tau(DFlash-mode): T=0 {ratio[0]:.3f}, T=1 {ratio[1]:.3f}")
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
