"""benchmarks/copy_ceiling.py's oracle: the step costs it reads from a gate trace and its replay of answers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "copy_ceiling.py"
spec = importlib.util.spec_from_file_location("copy_ceiling", SCRIPT)
copy_ceiling = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = copy_ceiling  # dataclasses resolve the module's annotations through sys.modules
spec.loader.exec_module(copy_ceiling)


def row(rows, drafted, width, seconds, committed=1):
    return {"R": rows, "drafted": drafted, "verify_tokens": width, "seconds": seconds, "committed": committed}


def test_step_costs_are_the_least_the_trace_allows():
    costs = copy_ceiling.TraceStepCosts.from_trace([
        row(1, False, 1, 0.060), row(1, False, 1, 0.062), row(1, False, 4, 0.090), row(1, False, 8, 0.072),
        row(2, False, 2, 0.065), row(2, False, 10, 0.085), row(1, True, 5, 0.070, 2), row(1, True, 5, 0.070, 1)])
    assert costs.seconds(1, 1) == pytest.approx(0.061)
    # Width 4 measured slower than width 8 (and than two rows of 10): a step costs no more than a wider one.
    assert costs.seconds(1, 4) == costs.seconds(1, 8) == pytest.approx(0.072)
    assert costs.seconds(1, 10) == pytest.approx(0.085)  # two rows of 10 tokens bound one row of 10
    # Past the widest measured step: that step plus the fitted cost of each further token.
    assert costs.token_seconds > 0
    assert costs.seconds(2, 14) == pytest.approx(0.085 + 4 * costs.token_seconds)
    assert costs.drafts == {1: (0.070, 1.5)}
    assert costs.seconds(3, 3) == costs.seconds(2, 3) == pytest.approx(0.085)  # more rows than measured: the widest


def test_longest_copy_continues_an_earlier_occurrence_of_the_last_token():
    assert copy_ceiling.longest_copy("xabcdyx", "abcdz", 0, 10) == 4  # "x" then "abcd" earlier in the context
    assert copy_ceiling.longest_copy("xabcdyx", "abcdz", 0, 2) == 2  # capped
    assert copy_ceiling.longest_copy("xabcdy", "abcdz", 0, 10) == 0  # "abcd" occurs, but not after a "y"
    assert copy_ceiling.longest_copy("xabcdy", "abcdz", 0, 10, anchor=0) == 4  # the looser bound: anywhere
    assert copy_ceiling.longest_copy("xabcdyx", "zzz", 0, 10) == 0


def linear_costs(drafts=None):
    medians = {(r, v): 1.0 + 0.1 * (v - r) + 0.5 * (r - 1) for r in (1, 2) for v in range(r, 17)}
    return copy_ceiling.TraceStepCosts(medians, 0.1, drafts or {})


def test_oracle_copies_what_the_context_holds_and_pays_plain_steps_for_the_rest():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    answer = prompt + [90, 91, 92, 93]  # re-emits the prompt, then four tokens seen nowhere
    replay = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="anchor_0")
    # Step 1 copies 1..7 and commits the bonus 90; the other three tokens are plain steps.
    assert replay["chain_steps"] == 4 and replay["copied_tokens"] == 7 and replay["drafted_tokens"] == 0
    assert replay["oracle_trace_seconds"] == pytest.approx((1.0 + 0.1 * 7) + 3 * 1.0)
    # Anchored, nothing before 1 matches the prompt's last token 7: a plain step emits 1, then 2..7 follow a 1.
    anchored = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7)
    assert anchored["chain_steps"] == 5 and anchored["copied_tokens"] == 6
    assert anchored["oracle_trace_seconds"] == pytest.approx(1.0 + (1.0 + 0.1 * 6) + 3 * 1.0)


def test_oracle_takes_the_draft_where_its_rate_is_higher_and_runs_rows_in_lock_step():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    answer = prompt + [90, 91, 92, 93]
    drafting = copy_ceiling.oracle_wave([prompt], [answer], linear_costs({1: (1.2, 2.4)}), max_chain=7,
                                        bound="anchor_0")
    assert drafting["drafted_tokens"] == 3
    assert drafting["oracle_trace_seconds"] == pytest.approx(1.7 + 3 * 0.5)
    # Two rows: the copy row's chain and the other row's plain token share steps, at the two-row costs.
    wave = copy_ceiling.oracle_wave([prompt, [50]], [prompt[:4], [60, 61, 62, 63]], linear_costs(), max_chain=7,
                                    bound="anchor_0")
    assert wave["chain_steps"] == 4 and wave["copied_tokens"] == 3
    assert wave["oracle_trace_seconds"] == pytest.approx((1.5 + 0.1 * 3) + 3 * 1.0)


def test_served_bound_copies_from_the_occurrence_the_lookup_proposes():
    # The tail (1, 2) recurs twice; the served lookup proposes what followed the latest one (5, 6, ...), the answer
    # continues the earlier one (3, 4): the anchored oracle copies 3, 4 at once, the served bound emits 3 plainly,
    # then its proposal (4, 1, ...) is accepted for one token.
    prompt, answer = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2], [3, 4, 7]
    anchored = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7)
    assert anchored["chain_steps"] == 1 and anchored["copied_tokens"] == 2
    served = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="served")
    assert served["chain_steps"] == 2 and served["copied_tokens"] == 1
    assert served["oracle_trace_seconds"] == pytest.approx(1.0 + 1.1)
    with pytest.raises(ValueError, match="bound must be one of"):
        copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="anchor_2")


def test_saved_waves_replay_under_every_bound_without_a_server(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(row(1, False, v, 0.05 + 0.005 * v)) for v in range(1, 9)))
    waves = tmp_path / "waves.json"
    waves.write_text(json.dumps({"1": [{"prompts": [[1, 2, 3, 4, 1, 2, 5, 6, 1, 2]], "answers": [[3, 4, 7, 8]],
                                        "prefill_s": 0.1, "decode_s": 0.2}]}))
    output = tmp_path / "ceiling.json"
    assert copy_ceiling.main(["--trace", str(trace), "--waves", str(waves), "--max-tokens", "4",
                              "--output", str(output)]) == 0
    level = json.loads(output.read_text())["levels"]["1"]
    assert set(level) == set(copy_ceiling.BOUNDS)
    # The oracle's bounds nest: anywhere >= after the last token >= the served proposal's occurrence >= a length
    # rule that does not know where the answer leaves the proposal.
    assert level["anchor_0"]["ceiling"] >= level["anchor_1"]["ceiling"] > level["served"]["ceiling"] > 1.0
    assert level["served"]["ceiling"] >= level["served_rule"]["ceiling"]
    assert set(level["served_rule"]["rule"]) == {str(b) for b in copy_ceiling.DEFAULT.match_buckets}


def test_a_length_rule_pays_for_the_tokens_past_the_accepted_ones():
    # The tail (1, 2) recurs; its proposal (3, 4, 9, 9, ...) matches the answer for two tokens (3, 4, then 7); the
    # rest of the answer (5, 6, 0) recurs nowhere, so it comes one plain step (1.0) a token.
    prompt, answer = [1, 2, 3, 4, 9, 9, 1, 2], [3, 4, 7, 5, 6, 0]
    four = copy_ceiling.LengthRule((4, 4, 4, 4))
    wave = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="served_rule", rule=four)
    # The first step verifies four proposed tokens + the bonus (1.0 + 0.1 * 4) and commits 3, 4 and the bonus 7.
    assert wave["chain_steps"] == 4 and wave["copied_tokens"] == 2
    assert wave["oracle_trace_seconds"] == pytest.approx(1.4 + 3.0)
    ideal = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="served")
    assert ideal["oracle_trace_seconds"] == pytest.approx(1.2 + 3.0)  # only the accepted two verified
    none = copy_ceiling.LengthRule((0, 0, 0, 0))
    plain = copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="served_rule", rule=none)
    assert plain["chain_steps"] == 6 and plain["copied_tokens"] == 0
    assert four.length(2) == 4 and copy_ceiling.LengthRule((1, 2, 3, 5)).length(5) == 3
    with pytest.raises(ValueError, match="length rule"):
        copy_ceiling.oracle_wave([prompt], [answer], linear_costs(), max_chain=7, bound="served", rule=four)
