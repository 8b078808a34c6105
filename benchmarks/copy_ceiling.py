"""The most copy-and-draft speculation could give on the load test's copy workloads, from measured step costs.

    SGLANG_DSPARK_GATE_TRACE=/tmp/trace.jsonl .venv/bin/python -m sglang_dspark.loadtest --configs dspark \\
        --dataset code-edit --max-tokens 256 --concurrency 1 4 --prompts-per-level 8 --max-total-tokens 32768 --seed 11
    .venv/bin/python benchmarks/copy_ceiling.py --trace /tmp/trace.jsonl --seed 11          # ~8 min, one server

What it measures. A no-spec server (stock launcher, embedded pair, fp32, T = 0, ``ignore_eos``) answers the prompts
of the load test's levels (same seed, same slices of the same set, the same chat message), a wave of c prompts
at a time at concurrency c. Per wave: the answers' token ids, the prefill time (the wave with one token each, then
``/flush_cache`` so that the full wave prefills again) and the decode time (the full wave minus that).

The oracle replays each wave's answers in lock step. At every step each unfinished row verifies a run of its
answer's next tokens, at most ``--max-chain`` tokens (the lookup's ``max_chain_tokens``), and commits that run plus
the target's bonus token; where the draft's measured rate beats the step's, the step's tokens come at the draft's
rate instead. Four bounds, each a row's run: ``anchor_1`` the longest run that follows an earlier occurrence of its
last token in its context so far (prompt + answer up to there), ``anchor_0`` the longest run wherever it occurs
(looser), ``served`` what the served lookup proposes there (``lookup/index.py``: the latest occurrence of the
longest recurring tail) taken at exactly the length the answer accepts: the most any choice of chain lengths can get
from the served proposals; and ``served_rule`` that proposal at a length fixed per match-length bucket (the served
calibration's buckets), verified whole, so the tokens past the accepted ones are paid for: the best such rule a
coordinate search finds for the level, chosen in hindsight on its own answers (``search_rule``). It is what a
chooser that does not know the accepted length, reading only the match length, can reach; the served chooser reads
the same buckets (and, under load, the batch it plans). Step costs come from a gate trace of the DSPARK server on
the same workload and levels (``SGLANG_DSPARK_GATE_TRACE``, ``--trace``): for R rows and v verify tokens in all, the
least median of its steps without the draft at R' >= R rows and v' >= v tokens (a step cannot cost less with more
rows or tokens; past the most rows measured, those rows' steps), past the widest measured step that one plus the
fitted cost of a verify token; a drafted step costs its median at R rows and commits its mean. Oracle seconds are
trace seconds scaled by the no-spec server's decode step over the trace's plain step at the level's concurrency.

Why it is a ceiling. No real lookup beats the anchored bounds: the oracle knows which occurrence continues correctly
(``served`` does not: it reads the served occurrence), never proposes a wrong token and never pays for one, takes
each chain's full length, and pays no draft prefill; the cost of a step is the lowest the trace allows, and the
draft is credited with its mean rate on every token it takes. It leaves out the shared suffix cache (each row copies
from its own context only).

Prints, per level, the ceiling of output tok/s × no-spec (what the load test reports): (prefill + no-spec decode)
over (prefill + oracle decode), summed over the level's waves, and writes the replay as JSON with ``--output``.
``--dataset`` picks the load test's set (``code-edit``, ``grounded``, ``grounded-recurring``); ``--save-waves`` keeps
the measured answers and ``--waves`` replays them again without a server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import requests

from sglang_dspark.loadtest import prompts as prompt_sets
from sglang_dspark.loadtest.prompts import split_for_levels
from sglang_dspark.local_server import start_server
from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.lookup.index import ContextIndex


@dataclass(frozen=True)
class TraceStepCosts:
    """Seconds of a decode step as a gate trace measured them (see the module docstring for how they are read)."""

    medians: dict[tuple[int, int], float]  # (rows, verify tokens) -> median seconds of steps without the draft
    token_seconds: float  # fitted cost of one more verify token
    drafts: dict[int, tuple[float, float]]  # rows -> (median seconds, mean tokens committed per row)

    @classmethod
    def from_trace(cls, rows: list[dict]) -> "TraceStepCosts":
        plain, drafted = defaultdict(list), defaultdict(list)
        for row in rows:
            (drafted if row["drafted"] else plain)[row["R"]].append(row)
        medians = {(r, v): statistics.median(row["seconds"] for row in steps)
                   for r, by_rows in plain.items()
                   for v, steps in _group(by_rows, "verify_tokens").items()}
        drafts = {r: (statistics.median(row["seconds"] for row in steps),
                      statistics.mean(row["committed"] for row in steps) / r) for r, steps in drafted.items()}
        if (1, 1) not in medians:
            raise SystemExit("the trace has no plain step at one row: record it with the load test at c = 1")
        return cls(medians, _slope(medians), drafts)

    def seconds(self, rows: int, tokens: int) -> float:
        # More rows than the trace ever ran (a KV pool that held fewer): read the widest steps, which cost no more.
        rows = min(rows, max(r for r, _ in self.medians))
        covering = [s for (r, v), s in self.medians.items() if r >= rows and v >= tokens]
        if covering:
            return min(covering)
        widest = max(v for (r, v) in self.medians if r >= rows)
        return self.seconds(rows, widest) + self.token_seconds * (tokens - widest)


def _group(rows: list[dict], key: str) -> dict:
    groups = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return groups


def _slope(medians: dict[tuple[int, int], float]) -> float:
    """Least-squares seconds per verify token over the medians, one intercept per row count (never below 0)."""
    by_rows = defaultdict(list)
    for (r, v), seconds in medians.items():
        by_rows[r].append((v, seconds))
    numerator = denominator = 0.0
    for points in by_rows.values():
        mean_v = statistics.mean(v for v, _ in points)
        mean_s = statistics.mean(s for _, s in points)
        numerator += sum((v - mean_v) * (s - mean_s) for v, s in points)
        denominator += sum((v - mean_v) ** 2 for v, _ in points)
    return max(0.0, numerator / denominator) if denominator else 0.0


def longest_copy(context: str, answer: str, start: int, limit: int, anchor: int = 1) -> int:
    """The longest l <= limit such that answer[start:start + l] occurs in context right after an occurrence of the
    context's last ``anchor`` tokens (tokens as characters; anchor 0: anywhere). The context ends with those tokens,
    so every match found is an earlier occurrence: what a lookup matching that suffix could propose at best."""
    suffix = context[len(context) - anchor:] if anchor else ""
    low, high = 0, min(limit, len(answer) - start)
    while low < high:  # a run that occurs has every prefix occurring: binary search on the length
        mid = (low + high + 1) // 2
        if suffix + answer[start:start + mid] in context:
            low = mid
        else:
            high = mid - 1
    return low


def _as_text(ids: list[int]) -> str:
    return "".join(chr(0x100 + token) for token in ids)


class ServedProposals:
    """The served lookup's proposals for one row (``lookup/index.ContextIndex``: the latest occurrence of the longest
    recurring tail of ``min_ngram``..``max_ngram`` tokens), over its context as the answer is committed."""

    def __init__(self, prompt: list[int], config: LookupConfig) -> None:
        self.index = ContextIndex(min_ngram=config.min_ngram, max_ngram=config.max_ngram)
        self.index.extend(prompt)

    def run(self, answer: list[int], start: int, limit: int, rule: "LengthRule | None" = None) -> tuple[int, int]:
        """(verified, accepted) tokens of the proposal here, at most ``limit``: with no ``rule`` the proposal is
        verified at exactly the length the answer from ``start`` on accepts; with one, at the rule's length for the
        proposal's match length. (0, 0): no proposal."""
        proposal = self.index.propose(limit)
        if proposal is None:
            return 0, 0
        tokens = proposal.tokens if rule is None else proposal.tokens[:rule.length(proposal.match_len)]
        accepted = 0
        for proposed, actual in zip(tokens, answer[start:]):
            if proposed != actual:
                break
            accepted += 1
        return (accepted if rule is None else len(tokens)), accepted

    def commit(self, tokens: list[int]) -> None:
        self.index.extend(tokens)


BOUNDS = ("anchor_1", "anchor_0", "served", "served_rule")  # what a row's chain may copy (module docstring)
RULE_LENGTHS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 31)  # the lengths the rule search tries per bucket


@dataclass(frozen=True)
class LengthRule:
    """A chain length per match-length bucket (the served calibration's ``match_buckets``); 0: no chain."""

    lengths: tuple[int, ...]
    buckets: tuple[int, ...] = DEFAULT.match_buckets

    def length(self, match_len: int) -> int:
        index = max([i for i, lower in enumerate(self.buckets) if match_len >= lower] or [0])
        return self.lengths[index]


def oracle_wave(prompts: list[list[int]], answers: list[list[int]], costs: TraceStepCosts, max_chain: int,
                bound: str = "anchor_1", config: LookupConfig = DEFAULT, rule: LengthRule | None = None) -> dict:
    """Replay one wave's answers in lock step under the oracle; seconds are the trace's. ``bound``: ``anchor_1`` /
    ``anchor_0`` (the run after an earlier occurrence of the last token / anywhere), ``served`` (the served
    lookup's proposal, taken at the length the answer accepts) or ``served_rule`` (that proposal at ``rule``'s
    length: the tokens past the accepted ones are verified and paid for)."""
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if (bound == "served_rule") != (rule is not None):
        raise ValueError("a length rule goes with bound='served_rule', and only with it")
    served = [ServedProposals(p, config) for p in prompts] if bound.startswith("served") else None
    texts, answer_texts = ([], []) if served else ([_as_text(p) for p in prompts], [_as_text(a) for a in answers])
    positions = [0] * len(answers)
    seconds, steps, copied, drafted = 0.0, 0, 0, 0

    def chain(i: int) -> tuple[int, int]:
        """(verified, accepted) chain tokens of row ``i`` this step."""
        left = len(answers[i]) - positions[i] - 1
        if served is not None:
            verified, accepted = served[i].run(answers[i], positions[i], max_chain, rule)
            return min(verified, left), min(accepted, left)
        context = texts[i] + answer_texts[i][:positions[i]]
        copy = min(longest_copy(context, answer_texts[i], positions[i], max_chain, int(bound[-1])), left)
        return copy, copy

    def advance(i: int, count: int) -> None:
        if served is not None:
            served[i].commit(answers[i][positions[i]:positions[i] + count])
        positions[i] += count

    while True:
        active = [i for i, answer in enumerate(answers) if positions[i] < len(answer)]
        if not active:
            break
        rows = len(active)
        chains = {i: chain(i) for i in active}
        commit = sum(accepted + 1 for _, accepted in chains.values())
        step = costs.seconds(rows, sum(verified + 1 for verified, _ in chains.values()))
        draft = costs.drafts.get(rows)
        if draft is not None and rows * draft[1] / draft[0] > commit / step:
            seconds += draft[0] / draft[1]  # one token for every row, at the draft's mean rate
            drafted += rows
            for i in active:
                advance(i, 1)
            continue
        seconds += step
        steps += 1
        for i, (_, accepted) in chains.items():
            advance(i, accepted + 1)
            copied += accepted
    return {"oracle_trace_seconds": seconds, "chain_steps": steps, "copied_tokens": copied,
            "drafted_tokens": drafted}


def _wave(server, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    requests.post(f"{server.url}/flush_cache", timeout=60)
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": max_tokens}
    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda ids: server.generate(input_ids=ids, sampling_params=params), prompts))
    return time.perf_counter() - started, [list(out["output_ids"]) for out in outs]


def _chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt's token ids as SGLang's chat endpoint builds them (the load test's one user message)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # newer transformers return a BatchEncoding


def measure_waves(levels: dict[int, list[str]], max_tokens: int, max_total_tokens: int) -> dict[int, list[dict]]:
    from transformers import AutoTokenizer

    from sglang_dspark.embedded.defaults import ensure_default_pair

    target, _ = ensure_default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    log_dir = Path(tempfile.mkdtemp(prefix="sglang-dspark-copy-ceiling-"))
    measured: dict[int, list[dict]] = {}
    with start_server(target, ["--dtype", "float32"], max_total_tokens=max_total_tokens, log_dir=log_dir,
                      timeout=600) as server:
        for concurrency, texts in levels.items():
            ids = [_chat_ids(tokenizer, text) for text in texts]
            measured[concurrency] = []
            for start in range(0, len(ids), concurrency):
                wave = [list(prompt) for prompt in ids[start:start + concurrency]]
                prefill, _ = _wave(server, wave, 1)
                total, answers = _wave(server, wave, max_tokens)
                if any(len(answer) != max_tokens for answer in answers):
                    raise SystemExit(f"c = {concurrency}: an answer came back shorter than {max_tokens} tokens")
                measured[concurrency].append({"prompts": wave, "answers": answers, "prefill_s": prefill,
                                              "decode_s": max(total - prefill, 1e-9)})
                print(f"[copy-ceiling] c = {concurrency}, wave {start // concurrency + 1}: prefill {prefill:.2f} s, "
                      f"decode {total - prefill:.1f} s", file=sys.stderr)
    return measured


def replay_level(waves: list[dict], costs: TraceStepCosts, max_tokens: int, max_chain: int, bound: str,
                 rule: LengthRule | None = None) -> dict:
    """One level's ceiling: its waves' prefill and no-spec decode against prefill and the oracle's decode. For
    ``served_rule`` without a ``rule``, the best rule :func:`search_rule` finds for the level (kept as ``rule``)."""
    if bound == "served_rule" and rule is None:
        rule = search_rule(waves, costs, max_tokens, max_chain)
    prefill = decode_before = decode_after = 0.0
    copied = drafted = tokens = 0
    replays = []
    for wave in waves:
        rows = len(wave["answers"])
        # Trace seconds to this run's: the no-spec decode step of this wave over the trace's plain step.
        scale = (wave["decode_s"] / max_tokens) / costs.seconds(rows, rows)
        replay = oracle_wave(wave["prompts"], wave["answers"], costs, max_chain, bound, rule=rule)
        replay.update(prefill_s=wave["prefill_s"], decode_s=wave["decode_s"], trace_to_run_scale=scale,
                      oracle_decode_s=replay["oracle_trace_seconds"] * scale)
        replays.append(replay)
        prefill += wave["prefill_s"]
        decode_before += wave["decode_s"]
        decode_after += replay["oracle_decode_s"]
        copied += replay["copied_tokens"]
        drafted += replay["drafted_tokens"]
        tokens += rows * max_tokens
    before, after = prefill + decode_before, prefill + decode_after
    return {"no_spec_tok_s": tokens / before, "oracle_tok_s": tokens / after, "ceiling": before / after,
            "decode_ceiling": decode_before / decode_after, "prefill_share": prefill / before,
            "copied_share": copied / tokens, "drafted_share": drafted / tokens, "waves": replays,
            **({"rule": dict(zip(rule.buckets, rule.lengths))} if rule else {})}


def search_rule(waves: list[dict], costs: TraceStepCosts, max_tokens: int, max_chain: int,
                sweeps: int = 3) -> LengthRule:
    """The length rule with the highest ceiling on these waves that a coordinate search finds: each bucket in turn
    tries every length of :data:`RULE_LENGTHS` (up to ``max_chain``) with the others fixed, for ``sweeps`` passes
    or until one changes nothing. Chosen in hindsight on the level's own answers, so no rule fixed in advance
    does better on them (up to the search not being exhaustive)."""
    choices = [length for length in RULE_LENGTHS if length <= max_chain]
    best = LengthRule(tuple([min(8, max_chain)] * len(DEFAULT.match_buckets)))

    def ceiling(rule: LengthRule) -> float:
        return replay_level(waves, costs, max_tokens, max_chain, "served_rule", rule)["ceiling"]

    best_ceiling = ceiling(best)
    for _ in range(sweeps):
        changed = False
        for bucket in range(len(best.lengths)):
            for length in choices:
                lengths = list(best.lengths)
                lengths[bucket] = length
                candidate = LengthRule(tuple(lengths))
                if candidate != best and (value := ceiling(candidate)) > best_ceiling + 1e-12:
                    best, best_ceiling, changed = candidate, value, True
        if not changed:
            break
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="a gate trace of DSPARK on the same levels")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompts-per-level", type=int, nargs="+", default=[8],
                        help="one count for every level, or one per level")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-chain", type=int, default=LookupConfig().max_chain_tokens)
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    parser.add_argument("--dataset", choices=prompt_sets.PASSAGE_SETS, default="code-edit", help="the load test's set")
    parser.add_argument("--output", type=Path, help="write the replay and the ceilings as JSON here")
    parser.add_argument("--save-waves", type=Path, help="write the measured waves (prompts, answers, times) here")
    parser.add_argument("--waves", type=Path, help="replay waves saved by --save-waves instead of measuring them")
    args = parser.parse_args(argv)
    costs = TraceStepCosts.from_trace([json.loads(line) for line in args.trace.open()])
    if args.waves:
        measured = {int(c): waves for c, waves in json.loads(args.waves.read_text()).items()}
    else:
        counts = args.prompts_per_level
        if len(counts) not in (1, len(args.concurrency)):
            parser.error("--prompts-per-level takes one count, or one per --concurrency level")
        counts = counts * len(args.concurrency) if len(counts) == 1 else counts
        pool = prompt_sets.BUILTIN_SETS[args.dataset](args.seed)
        levels = dict(zip(args.concurrency, split_for_levels(pool, counts)))
        measured = measure_waves(levels, args.max_tokens, args.max_total_tokens)
    if args.save_waves:
        args.save_waves.write_text(json.dumps(measured))
    report = {"tool": "benchmarks/copy_ceiling.py", "command": " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dataset": args.dataset,
              "seed": args.seed, "max_tokens": args.max_tokens, "max_chain": args.max_chain, "trace": str(args.trace),
              "token_seconds": costs.token_seconds, "levels": {}}
    print("| c | bound | no-spec tok/s | oracle tok/s | ceiling × no-spec | decode alone | prefill share | copied "
          "| drafted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for concurrency, waves in measured.items():
        for bound in BOUNDS:
            level = replay_level(waves, costs, args.max_tokens, args.max_chain, bound)
            report["levels"].setdefault(concurrency, {})[bound] = level
            print(f"| {concurrency} | {bound} | {level['no_spec_tok_s']:.1f} | {level['oracle_tok_s']:.1f} "
                  f"| {level['ceiling']:.2f} | {level['decode_ceiling']:.2f} | {level['prefill_share']:.0%} "
                  f"| {level['copied_share']:.0%} | {level['drafted_share']:.0%} |"
                  + (f" lengths by match length: {level['rule']}" if "rule" in level else ""))
    print(f"\nfitted cost of a verify token: {1000 * costs.token_seconds:.2f} ms; drafted steps (rows: s, tokens a "
          "row): " + ", ".join(f"{r}: {s:.3f}, {c:.2f}" for r, (s, c) in sorted(costs.drafts.items())))
    if args.output:
        args.output.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
