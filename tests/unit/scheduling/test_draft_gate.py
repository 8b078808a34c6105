"""Draft only when it pays (scheduling/draft_gate.py): the pure draft/skip decision and its exploration."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_dspark import envs
from sglang_dspark.engine.draft_source import DraftSource
from sglang_dspark.scheduling.step_plan import StepPlan
from sglang_dspark.engine.step_record import StepRecorder
from sglang_dspark.scheduling.admission import capacity_from_survival
from sglang_dspark.scheduling.acceptance import RealizedSeconds, RealizedTokens, SurvivalPrior, sanitize_survival
from sglang_dspark.scheduling.draft_gate import (
    GateDecision,
    GATE_MODES, ComebackGate, DraftGate, DraftGateConfig, FlatCost, make_draft_gate, should_draft,
)
from sglang_dspark.scheduling.stats import AdmissionStats


class TableCost:
    """seconds(R, B) from a dict {B: seconds} (R ignored) plus a constant draft-side overhead."""

    def __init__(self, verify_seconds: dict[int, float], overhead: float = 0.0):
        self.verify_seconds = verify_seconds
        self.overhead = overhead

    def seconds(self, b: int) -> float:
        return self.verify_seconds[b] + self.overhead

    def steps_per_second(self, num_requests, verify_tokens):
        if isinstance(verify_tokens, torch.Tensor):
            return torch.tensor([1.0 / self.seconds(int(b)) for b in verify_tokens.reshape(-1)],
                                dtype=torch.float64).reshape(verify_tokens.shape)
        return 1.0 / self.seconds(int(verify_tokens))


# One request, γ = 3. Verify: 10 ms for B = 1, 11 ms for B = 2, 12 ms for B = 3, 13 ms for B = 4.
VERIFY = {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013}


def test_draft_pays_when_acceptance_covers_its_cost():
    # Drafted step: verify + 2 ms of rest + 4 ms of draft block = verify + 6 ms; skipped step: 10 + 2 = 12 ms.
    cost = TableCost(VERIFY, overhead=0.006)
    survival = torch.tensor([[0.9, 0.8, 0.7]])
    choice = should_draft(survival, cost, seconds_without_draft=0.012)
    # Θ_K = (1 + Σ a) / (verify(1 + K) + 6 ms): K=0 62.5, K=1 1.9/17 ms = 111.8, K=2 2.7/18 ms = 150, K=3 3.4/19 ms = 178.9
    assert choice.capacity == 3
    assert choice.theta_draft == pytest.approx(3.4 / 0.019)
    assert choice.theta_skip == pytest.approx(1 / 0.012)
    assert choice.draft


def test_no_draft_when_acceptance_is_low():
    cost = TableCost(VERIFY, overhead=0.006)
    survival = torch.tensor([[0.3, 0.15, 0.05]], dtype=torch.float64)
    choice = should_draft(survival, cost, seconds_without_draft=0.012)
    # Θ_K: K=0 1/16 ms = 62.5, K=1 1.3/17 ms = 76.5, K=2 1.45/18 ms = 80.6, K=3 1.5/19 ms = 78.9; all < 83.3.
    assert choice.capacity == 2 and choice.theta_draft == pytest.approx(1.45 / 0.018)
    assert choice.theta_skip == pytest.approx(83.333, rel=1e-4)
    assert not choice.draft


def test_the_draft_cost_is_what_tips_the_decision():
    survival = torch.tensor([[0.3, 0.15, 0.05]], dtype=torch.float64)
    # Same acceptance, draft block free (the drafted and the skipped step share a 2 ms rest): drafting pays,
    # K=2: 1.45 / 14 ms = 103.6 > 83.3.
    free = should_draft(survival, TableCost(VERIFY, overhead=0.002), seconds_without_draft=0.012)
    assert free.draft and free.capacity == 2 and free.theta_draft == pytest.approx(1.45 / 0.014)
    # The capacity search alone (what the admission policy does) admits two drafts whatever the draft costs: it
    # never compares with not drafting at all.
    assert int(capacity_from_survival(survival, TableCost(VERIFY, overhead=0.006), 1)) == 2


def test_ties_go_to_the_plain_step():
    # Draft free and nothing worth verifying: Θ(draft, K=0) == Θ(no draft).
    choice = should_draft(torch.zeros(2, 3), FlatCost(0.01), seconds_without_draft=0.01)
    assert choice.capacity == 0 and choice.theta_draft == pytest.approx(choice.theta_skip) and not choice.draft


def test_batch_level_decision_uses_every_request():
    # Two requests: one hopeless, one excellent; verify cost flat per token up to the table, draft 30 % of a step.
    cost = FlatCost(0.013)  # drafted step, any B
    low = should_draft(torch.tensor([[0.05, 0.0, 0.0], [0.1, 0.0, 0.0]]), cost, seconds_without_draft=0.010)
    high = should_draft(torch.tensor([[0.05, 0.0, 0.0], [0.95, 0.9, 0.85]]), cost, seconds_without_draft=0.010)
    assert not low.draft and high.draft and high.capacity == 4


def test_garbage_survival_is_sanitised():
    raw = torch.tensor([[float("nan"), 2.0, -1.0], [0.5, 0.9, 0.2]])
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.2]], dtype=torch.float64)
    assert torch.allclose(sanitize_survival(raw), expected)


def test_seed_article_example_with_and_without_draft_cost():
    # Seed article: c = 0.95, 0.92, 0.85, 0.30; SPS(1..5) = 1000, 520, 400, 340, 280 (verify only).
    sps = [1000, 520, 400, 340, 280]
    survival = torch.tensor([[0.95, 0.95 * 0.92, 0.95 * 0.92 * 0.85, 0.95 * 0.92 * 0.85 * 0.30]])
    verify = {b: 1 / s for b, s in enumerate(sps, start=1)}
    choice = should_draft(survival, TableCost(verify), seconds_without_draft=1 / 1000)
    assert choice.capacity == 3 and choice.theta_draft == pytest.approx(1212.7, abs=0.5) and choice.draft
    # A 1 ms draft block halves a 1 ms step: Θ(K=3) = 3.567 / (1/340 + 1 ms) = 904.6 < 1000: plain step.
    choice = should_draft(survival, TableCost(verify, overhead=0.001), seconds_without_draft=1 / 1000)
    assert not choice.draft and choice.theta_draft == pytest.approx(3.5673 / (1 / 340 + 0.001), rel=1e-3)


def _decide(gate, survival, *, cost=FlatCost(0.02), skip=0.01, samples=10):
    return gate.decide(lagged_survival=survival, cost_with_draft=cost, seconds_without_draft=skip,
                       skip_samples=samples, num_requests=survival.shape[0] if survival is not None else 1)


LOW = torch.tensor([[0.1, 0.0, 0.0]])  # drafted step 20 ms for 1.1 tokens vs 10 ms per token: skip
HIGH = torch.tensor([[0.99, 0.98, 0.97]])  # 3.94 tokens per 20 ms: draft


def test_pause_then_probes_with_doubling_interval_then_resume():
    # probe_share 1: the cost bound (tested below) allows a probe every step, so the doubling alone is seen here.
    gate = DraftGate(DraftGateConfig(probe_min=2, probe_max=8, probe_share=1.0, steady_spell=5))
    trace = [_decide(gate, LOW) for _ in range(20)]
    kinds = ["D" if d.draft else "s" for d in trace]
    # Paused: probe after 2 skipped steps, then 4, then 8 (capped).
    assert "".join(kinds) == "ssDssssDssssssssDsss"
    assert gate.paused and gate.pauses == 1 and gate.reasons["probe"] == 3 and gate.probe_interval == 8
    # A probe's confidences arrive and say drafting pays: drafting comes back at once.
    decision = _decide(gate, HIGH)
    assert decision.draft and decision.reason == "pays"
    assert not gate.paused and gate.resumes == 1
    # A comeback of one step keeps the back-off: the next pause probes after 8 skipped steps, not 2.
    trace = [_decide(gate, LOW) for _ in range(9)]
    assert "".join("D" if d.draft else "s" for d in trace) == "ssssssssD" and gate.pauses == 2
    # Drafting that holds for steady_spell steps resets it: the pause after that probes early again.
    assert all(_decide(gate, HIGH).draft for _ in range(5))
    trace = [_decide(gate, LOW) for _ in range(3)]
    assert "".join("D" if d.draft else "s" for d in trace) == "ssD" and gate.probe_interval == 4


def test_a_draft_that_pays_now_and_then_does_not_flap():
    """A probe that lands on an easy stretch resumes drafting for one step; restarting the probes at probe_min after
    each such comeback would draft every few steps. With the back-off kept, probes stay ~probe_max apart."""
    gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64))
    drafted = 0
    for step in range(2000):
        last = gate.last
        easy = last is not None and last.reason == "probe" and gate.reasons.get("probe", 0) % 2 == 0
        drafted += _decide(gate, HIGH if easy else LOW).draft
    assert gate.resumes >= 10  # it did come back, now and then
    assert drafted <= 2 * 2000 / 64 + 10  # a probe and a one-step comeback per probe_max steps, not more


def test_probe_cost_is_bounded():
    gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64))
    decisions = [_decide(gate, LOW) for _ in range(2000)]
    drafted = sum(d.draft for d in decisions)
    assert drafted <= 2000 / 64 + 5  # in the long run one draft block per probe_max + 1 steps


def test_probes_stay_within_their_share_of_the_time_when_a_drafted_step_is_costly():
    """Under load a probe costs several plain steps; the doubling alone (one per probe_max + 1 steps) would spend
    far more than probe_share of the time on them. Simulated 4000 paused steps, draft/skip cost ratio 1.5 and 6."""
    for ratio in (1.5, 6.0):
        gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64, probe_share=0.02))
        skip = 0.01
        drafted = sum(_decide(gate, LOW, cost=FlatCost(ratio * skip), skip=skip).draft for _ in range(4000))
        probes = gate.reasons.get("probe", 0)
        assert drafted == probes >= 1 and gate.resumes == 0
        extra_time = probes * (ratio - 1) * skip
        total_time = 4000 * skip + extra_time
        assert extra_time / total_time <= 0.02 + 1e-9  # within the share
        # ...and not starved either: the interval is the larger of the back-off (64) and the cost bound, not more
        bound = math.ceil((ratio - 1) / 0.02)  # 25 and 250 skipped steps per probe
        assert gate.cost_bounded_interval(gate.last.choice) == bound
        assert probes >= 4000 // (max(64, bound) + 1) - 1
    # A drafted step no costlier than a plain one adds no bound; unknown costs neither.
    assert gate.cost_bounded_interval(None) == 0
    assert DraftGate(DraftGateConfig(max_probe_interval=100)).cost_bounded_interval(
        should_draft(LOW, FlatCost(100.0), 0.01)) == 100  # capped


def test_far_from_break_even_probes_spend_half_the_share_they_spend_near_it():
    """Defaults: probes far from break-even (a probe costs 6 plain steps and predicts 1.1 tokens) stay within 1 % of
    4000 simulated paused steps; near break-even the bound is read at 2 % (a probe there may well flip the choice)."""
    gate = DraftGate()
    skip = 0.01
    drafted = sum(_decide(gate, LOW, cost=FlatCost(6 * skip), skip=skip).draft for _ in range(4000))
    extra_time = drafted * 5 * skip
    assert drafted >= 4 and extra_time / (4000 * skip + extra_time) <= 0.01 + 1e-9
    choice = gate.last.choice
    assert not gate._probe_near and gate.cost_bounded_interval(choice) == math.ceil(5 / 0.01)
    gate._probe_near = True
    assert gate.cost_bounded_interval(choice) == math.ceil(5 / 0.02)


def _held_or_decide(gate, survival, **kwargs):
    """What the planner does: a held pause when the gate has one, else a full decision."""
    held = gate.held_pause(survival.shape[0])
    return held if held is not None else _decide(gate, survival, **kwargs)


def test_a_held_pause_decides_what_the_full_decision_would():
    """Holding a pause (the planner asks ``held_pause`` before reading anything) must not change a single decision:
    the same 3000-step script (pauses, probes, a one-step comeback on every other probe, R changing every 250 steps,
    two drafted-step cost ratios) gives the same draft/skip sequence and reasons with and without holding, while
    most paused steps are held."""
    for ratio in (1.5, 6.0):
        decided = []
        for hold in (True, False):
            gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64, hold_pause_steps=8 if hold else 1))
            trace = []
            for step in range(3000):
                rows = 1 + (step // 250) % 3
                last = gate.last
                easy = last is not None and last.reason == "probe" and gate.reasons.get("probe", 0) % 2 == 0
                survival = (HIGH if easy else LOW).expand(rows, 3)
                decision = (_held_or_decide if hold else _decide)(gate, survival, cost=FlatCost(ratio * 0.01))
                trace.append((decision.draft, decision.reason))
            decided.append((trace, gate))
        (held_trace, held_gate), (full_trace, full_gate) = decided
        assert held_trace == full_trace
        assert full_gate.held == 0 and held_gate.reasons.get("probe", 0) >= 5
        # The easy reading pays at 1.5× (3.94 tokens per 15 ms > 1 per 10 ms), not at 6×: comebacks only there.
        assert (held_gate.resumes >= 5) if ratio == 1.5 else (held_gate.resumes == 0)
        paused_steps = held_gate.reasons["pause"]
        assert held_gate.held >= 0.6 * paused_steps  # at most one full decision per 8 paused steps, plus R changes


def test_a_held_pause_reads_nothing_and_gives_way_to_a_full_decision(monkeypatch):
    import sglang_dspark.scheduling.draft_gate as draft_gate

    calls = []
    real = draft_gate.should_draft
    monkeypatch.setattr(draft_gate, "should_draft", lambda *a, **k: calls.append(1) or real(*a, **k))
    gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64, hold_pause_steps=8, hold_after_draft=4))
    low = LOW.expand(2, 3)
    assert gate.held_pause(2) is None  # nothing decided yet
    for _ in range(40):
        _held_or_decide(gate, low)
    # The first decision is a full pause; probes follow after 4, 8 and 16 skipped steps, each with full decisions.
    assert gate.held > 0 and len(calls) == 40 - gate.held
    assert gate.held_pause(3) is None  # another R: a full decision
    gate._decisions_since_draft = 2
    assert gate.held_pause(2) is None  # a drafted step two decisions back: its confidences are due
    gate._decisions_since_draft = 10
    gate._skipped_since_probe = gate._probe_due
    assert gate.held_pause(2) is None  # a probe may be due
    for mode in ("off", "pause", "comeback"):
        assert make_draft_gate(mode).held_pause(1) is None


def test_realized_seconds_weigh_recent_steps_and_ignore_stalls():
    ratio = RealizedSeconds(half_life=4.0, min_steps=4, max_stall=4.0)
    for _ in range(3):
        ratio.observe(0.010, 0.020)  # steps take twice their prediction
    assert ratio.factor == 1.0  # fewer than min_steps: no correction yet
    ratio.observe(0.010, 0.020)
    assert ratio.factor == pytest.approx(2.0)
    # Recent steps weigh more: 8 more steps (2 half-lives) that take their prediction.
    for _ in range(8):
        ratio.observe(0.010, 0.010)
    w_new = sum(0.5 ** (k / 4) for k in range(8))
    w_old = sum(0.5 ** (k / 4) for k in range(8, 12))
    assert ratio.factor == pytest.approx((2 * w_old + w_new) / (w_old + w_new))
    # A stalled step (600 s for a 10 ms prediction) counts as 4 predictions, not 60 000.
    stalled = RealizedSeconds(min_steps=1, max_stall=4.0)
    stalled.observe(0.010, 600.0)
    assert stalled.factor == pytest.approx(4.0)
    assert not stalled.observe(0.0, 0.01) and not stalled.observe(math.nan, 0.01) and stalled.steps == 1
    capped = RealizedSeconds(min_steps=1, bounds=(0.5, 2.0))
    capped.observe(0.010, 0.001)
    assert capped.factor == 0.5
    with pytest.raises(ValueError, match="RealizedSeconds"):
        RealizedSeconds(bounds=(2.0, 4.0))


def test_realized_tokens_fit_the_conditional_mean_even_on_selected_steps():
    """Truth t ~ N(1.5, 0.3²) committed tokens per request, prediction x = t + N(0, 0.3²): E[t | x] = 1.5 + ½ (x − 1.5).
    Steps are drafted only where x > 1.5 (the gate's selection). The line fitted on those steps reads every x as
    E[t | x], low readings it never saw included; a ratio of sums over the same steps reads x = 1.3 at 1.13 where the
    truth's mean is 1.4. 4 000 simulated steps; tolerance 0.05 tokens, slope ± 0.06."""
    generator = torch.Generator().manual_seed(0)
    truth = 1.5 + 0.3 * torch.randn(4000, generator=generator, dtype=torch.float64)
    predicted = truth + 0.3 * torch.randn(4000, generator=generator, dtype=torch.float64)
    fit = RealizedTokens(half_life=10**6, shrink=1e-6)
    selected = predicted > 1.5
    for x, y in zip(predicted[selected].tolist(), truth[selected].tolist()):
        fit.observe(x, y)
    for x in (1.3, 1.6, 2.0):
        assert fit.expected(x) == pytest.approx(1.5 + 0.5 * (x - 1.5), abs=0.05)
    assert fit.line()[2] == pytest.approx(0.5, abs=0.06)
    ratio = float(truth[selected].sum() / predicted[selected].sum())
    assert ratio * 1.3 < 1.4 - 0.15  # the ratio misreads a low reading
    # With no step the prediction stands; with no spread in x the fit corrects the level only (β shrunk to 1), once
    # the pseudo-steps on y = x it starts from are forgotten.
    level = RealizedTokens()
    assert level.expected(1.7) == 1.7
    for _ in range(200):
        level.observe(1.7, 1.2)
    assert level.expected(1.7) == pytest.approx(1.2, abs=1e-3) and level.expected(1.9) == pytest.approx(1.4, abs=1e-3)
    assert level.expected(1.0) == 1.0  # never below the anchor
    assert not level.observe(0.0, 1.0) and not level.observe(1.0, math.inf)
    with pytest.raises(ValueError, match="RealizedTokens"):
        RealizedTokens(shrink=0.0)


def _serve(gate, steps, *, survival, cost, skip, realized_tokens, drafted_seconds):
    """Run the gate for ``steps`` one-request steps; a drafted step commits ``realized_tokens`` in
    ``drafted_seconds``, a plain one commits 1 token in ``skip`` seconds (``survival``: a tensor, or a callable
    giving one per step). Returns (drafted steps, tokens/s)."""
    drafted = tokens = seconds = 0.0
    for _ in range(steps):
        decision = _decide(gate, survival() if callable(survival) else survival, cost=cost, skip=skip)
        step_tokens, step_seconds = (realized_tokens, drafted_seconds) if decision.draft else (1, skip)
        gate.observe_outcome(decision.choice, decision.draft, step_tokens, step_seconds, 1)
        drafted += decision.draft
        tokens += step_tokens
        seconds += step_seconds
    return drafted, tokens / seconds


def _blind(gate):
    """The same gate with its realized corrections held off (predictions as they are)."""
    gate.expected_tokens = lambda choice, num_requests: choice.tokens_draft / num_requests
    return gate


def test_a_draft_that_realizes_less_than_predicted_is_paused():
    """The survivals promise 1 + 0.6 + 0.5 + 0.4 = 2.5 tokens per 15 ms drafted step (167 tokens/s against 100 for a
    10 ms plain step); the steps realize 1.2 tokens (80 tokens/s, a loss of 20 %). Predictions alone draft every step;
    the realized fit pauses the draft after its first few steps. 2 000 simulated steps."""
    promised = torch.tensor([[0.6, 0.5, 0.4]], dtype=torch.float64)
    serve = dict(survival=promised, cost=FlatCost(0.015), skip=0.010, realized_tokens=1.2, drafted_seconds=0.015)
    gate = DraftGate()
    drafted, throughput = _serve(gate, 2000, **serve)
    assert gate.realized_tokens.expected(2.5) == pytest.approx(1.2, abs=0.1)  # the probes' steps, pseudo-steps fading
    # The first steps, then probes: every 64 steps far from break-even, more often while the fit still reads the
    # draft within 15 % of it (a probe then costs little: 15 ms for 1.2 tokens against 12 ms for them plain).
    assert drafted <= 60
    assert throughput >= 0.98 * 100
    drafted, throughput = _serve(_blind(DraftGate()), 2000, **serve)
    assert drafted >= 0.9 * 2000 and throughput == pytest.approx(80, rel=0.05)


class FlatTable:
    """An SPS table whose verify takes ``seconds`` whatever R and B (for OverheadAdjustedCost)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_seconds(self, num_requests, verify_tokens):
        return self.seconds

    def step_seconds_tensor(self, num_requests, verify_tokens):
        return torch.full(verify_tokens.shape, self.seconds, dtype=torch.float64)


def _serve_learning(gate, steps, *, survival, plain_seconds, drafted_seconds, realized_tokens, table=0.008):
    """One user through the planner's cost loop: a flat verify table, the rest of each kind of step learned from the
    measured steps (DraftedAndPlainOverheads, as the planner does), the gate deciding on those predictions. A drafted
    step commits ``realized_tokens``; ``plain_seconds`` / ``drafted_seconds`` may be callables of the step index.
    Returns (drafted steps, tokens/s)."""
    from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads, OverheadAdjustedCost

    overheads = DraftedAndPlainOverheads()
    cost = OverheadAdjustedCost(FlatTable(table), overheads.drafted)
    drafted = tokens = seconds = 0.0
    for i in range(steps):
        rest = overheads.plain_seconds(1)
        decision = gate.decide(lagged_survival=survival, cost_with_draft=cost,
                               seconds_without_draft=None if rest is None else table + rest,
                               skip_samples=overheads.pairs(1), num_requests=1)
        measured = drafted_seconds if decision.draft else plain_seconds
        measured = measured(i) if callable(measured) else measured
        step_tokens = realized_tokens if decision.draft else 1
        overheads.observe(1, decision.draft, measured, table)
        gate.observe_outcome(decision.choice, decision.draft, step_tokens, measured, 1)
        drafted += decision.draft
        tokens += step_tokens
        seconds += measured
    return drafted, tokens / seconds


def test_a_draft_whose_steps_cost_more_than_predicted_is_paused():
    """Tokens as promised (2.5 per step) but each drafted step takes 30 ms where the table's verify reads 8 ms: 83
    tokens/s against 100 for a 10 ms plain step. The drafted-step overhead learned from the steps pauses it after
    the first (no-information) steps. 2 000 simulated steps."""
    promised = torch.tensor([[0.6, 0.5, 0.4]], dtype=torch.float64)
    drafted, throughput = _serve_learning(DraftGate(), 2000, survival=promised, plain_seconds=0.010,
                                          drafted_seconds=0.030, realized_tokens=2.5)
    assert drafted <= 20 + 2000 * 0.02 * 0.010 / 0.020 + 10  # the first steps, then probes within 2 % of the time
    assert throughput >= 0.97 * 100


def test_a_slow_spell_of_plain_steps_is_not_counted_twice():
    """The learned plain-step overhead already follows a slow spell; a measured ÷ predicted ratio on top of it would
    count the spell twice and, frozen through the drafting spell that follows (nothing re-measures a plain step
    then), predict the plain step at far more than it costs. The gate keeps that ratio as a diagnostic only."""
    gate = DraftGate()
    choice = should_draft(LOW, FlatCost(0.020), 0.016)
    for _ in range(8):  # plain steps at twice what was predicted for them
        gate.observe_outcome(choice, False, 1, 0.032, 1)
    assert gate.skip_seconds.factor == pytest.approx(2.0)
    assert gate.corrected_skip_throughput(choice, 1) == pytest.approx(1 / 0.016)
    for _ in range(8):
        gate.observe_outcome(choice, True, 2, 0.060, 1)
    assert gate.draft_seconds.factor == pytest.approx(3.0)
    assert gate.corrected_draft_throughput(choice, 1) == pytest.approx(
        gate.expected_tokens(choice, 1) / choice.seconds_draft)


def test_a_draft_that_realizes_its_prediction_keeps_drafting():
    """Same promise, realized (2.5 tokens per 15 ms: +67 %): the corrections stay neutral and drafting holds; a draft
    that realizes more than predicted (a promise of 0.8 tokens/step that turns out 1.6) comes back although the
    prediction alone says pause."""
    promised = torch.tensor([[0.6, 0.5, 0.4]], dtype=torch.float64)
    gate = DraftGate()
    drafted, throughput = _serve(gate, 500, survival=promised, cost=FlatCost(0.015), skip=0.010,
                                 realized_tokens=2.5, drafted_seconds=0.015)
    assert gate.realized_tokens.expected(2.5) == pytest.approx(2.5) and gate.draft_seconds.factor == 1.0
    assert drafted >= 0.9 * 500 and throughput >= 160
    modest = torch.tensor([[0.4, 0.3, 0.1]], dtype=torch.float64)  # promises 1.8 tokens per 20 ms: 90 vs 100/s
    gate = DraftGate()
    serve = dict(survival=modest, cost=FlatCost(0.02), skip=0.010, realized_tokens=3.0, drafted_seconds=0.02)
    # Predicted 90/s: paused; the probes (at most one per 50 steps: a probe costs twice a plain step, 2 % share)
    # learn the realized 150/s.
    _serve(gate, 400, **serve)
    assert gate.realized_tokens.expected(1.8) == pytest.approx(3.0, rel=1e-3) and gate.resumes >= 1
    drafted, _ = _serve(gate, 500, **serve)
    assert drafted >= 0.9 * 500


def test_noisy_readings_do_not_pause_a_draft_that_pays_on_average():
    """One user, every drafted step commits 1.45 tokens in 13 ms (112 tokens/s against 100 for a plain step), but
    the lagged survival the gate reads scatters around it (first position U(0, 0.6), Σ a from 0 to ~1.1): predictions
    alone pause on every low reading (a quarter of the steps here) although drafting pays on every step. The fit finds
    the readings uninformative (β ≈ 0 beyond the shrinkage) and drafts. 3 000 simulated steps."""
    generator = torch.Generator().manual_seed(1)

    def reading():
        first = 0.6 * float(torch.rand(1, generator=generator))
        return torch.tensor([[first, first * 0.6, first * 0.3]], dtype=torch.float64)

    serve = dict(survival=reading, cost=FlatCost(0.013), skip=0.010, realized_tokens=1.45, drafted_seconds=0.013)
    blind_drafted, blind_throughput = _serve(_blind(DraftGate()), 3000, **serve)
    drafted, throughput = _serve(DraftGate(), 3000, **serve)
    assert blind_drafted <= 0.8 * 3000
    assert drafted >= 0.95 * 3000 and throughput > blind_throughput * 1.015


def test_survival_prior_is_the_running_population_mean():
    prior = SurvivalPrior(weight=0.5)
    unknown_row = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.2, 0.1]])
    known = torch.tensor([False, True])
    assert torch.equal(prior.fill(unknown_row, known), unknown_row)  # nothing observed yet: upstream's 1 stays
    prior.observe(torch.tensor([[0.2, 0.1, 0.0], [0.4, 0.1, 0.0]]))
    prior.observe(torch.tensor([[0.5, 0.3, 0.1]]))
    # EMA of row means: [0.3, 0.1, 0.0] then halfway to [0.5, 0.3, 0.1].
    assert prior.mean.tolist() == pytest.approx([0.4, 0.2, 0.05])
    filled = prior.fill(unknown_row, known)
    assert filled[0].tolist() == pytest.approx([0.4, 0.2, 0.05]) and filled[1].tolist() == pytest.approx([0.5, 0.2, 0.1])
    assert torch.equal(prior.fill(unknown_row, None), unknown_row)
    with pytest.raises(ValueError, match="weight"):
        SurvivalPrior(weight=0.0)


def test_arriving_requests_do_not_restart_a_weak_draft():
    """A request that arrives while the gate is paused has no confidence yet (upstream: survival 1). Read as 1, every
    arrival drafts and resets the probe back-off; read through the population prior, the pause holds."""
    fresh_every = 8  # one arrival every 8 steps (c = 1, short answers)

    def run(prior):
        gate = DraftGate(DraftGateConfig(probe_min=4, probe_max=64))
        drafted = 0
        for step in range(512):
            arriving = step % fresh_every == 0
            survival = torch.ones(1, 3) if arriving else LOW
            if prior is not None:
                prior.observe(LOW)
                survival = prior.fill(survival, torch.tensor([not arriving]))
            drafted += _decide(gate, survival).draft
        return drafted, gate

    without_prior, gate = run(None)
    assert without_prior >= 512 / fresh_every and gate.resumes >= 60  # every arrival drafts
    with_prior, gate = run(SurvivalPrior())
    assert with_prior <= 512 / 64 + 5 and gate.resumes == 0  # only the probes of one pause


def test_a_batch_with_no_lagged_confidence_reads_the_prior_for_every_row():
    prior = SurvivalPrior()
    assert prior.rows(3) is None  # never drafted: no prior, the gate drafts ("no-info")
    gate = DraftGate()
    assert _decide(gate, prior.rows(3)).reason == "no-info"
    prior.observe(LOW)
    rows = prior.rows(3)
    assert rows.shape == (3, LOW.shape[1]) and torch.allclose(rows, sanitize_survival(LOW).mean(dim=0).expand(3, -1))
    # A weak draft's prior: the first steps of a batch of arrivals skip the draft instead of drafting blind.
    assert not _decide(gate, rows).draft
    assert prior.rows(0) is None


def test_no_information_drafts():
    gate = DraftGate()
    assert _decide(gate, None).reason == "no-info"
    assert gate.decide(lagged_survival=LOW, cost_with_draft=None, seconds_without_draft=0.01).draft


def test_skip_cost_is_learned_by_occasional_plain_steps():
    gate = DraftGate(DraftGateConfig(learn_skip_every=4, refresh_skip_every=10))
    # Skipped-step time unknown: draft, but skip one step in 5 to measure it.
    trace = [gate.decide(lagged_survival=HIGH, cost_with_draft=FlatCost(0.02), seconds_without_draft=None)
             for _ in range(10)]
    assert ["D" if d.draft else "s" for d in trace] == list("DDDDsDDDDs")
    assert {d.reason for d in trace if not d.draft} == {"learn-skip"}
    # Known and well sampled: drafting pays, one refresh skip every 10 drafted steps.
    trace = [_decide(gate, HIGH) for _ in range(22)]
    assert [i for i, d in enumerate(trace) if not d.draft] == [10, 21]
    assert trace[10].reason == "refresh-skip"


def test_forced_modes():
    assert all(_decide(make_draft_gate("off"), LOW).draft for _ in range(3))
    gate = make_draft_gate("pause")
    assert not any(_decide(gate, HIGH).draft for _ in range(5))
    gate = make_draft_gate("alternate")
    assert [_decide(gate, LOW).draft for _ in range(4)] == [True, False, True, False]


def test_comeback_mode_pauses_then_drafting_pays():
    gate = ComebackGate(DraftGateConfig(probe_min=2), comeback_steps=10)
    first = [_decide(gate, LOW) for _ in range(10)]
    assert not first[0].draft and any(d.reason == "probe" for d in first) and gate.paused
    after = _decide(gate, LOW)  # flat cost, free draft: any survivable candidate pays
    assert after.draft and after.reason == "pays" and gate.resumes == 1


def test_gate_modes_match_the_switch():
    assert envs.DRAFT_GATE.choices == GATE_MODES and envs.DRAFT_GATE.default == "auto"
    assert envs.DRAFT_GATE in envs.SWITCHES


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown draft gate mode"):
        make_draft_gate("sometimes")


def test_skipped_steps_are_recorded_as_such():
    recorder = StepRecorder("cpu")
    recorder.start()
    (record,) = recorder.finish(accept_lens=torch.tensor([1, 1]), cap_lens=torch.tensor([1, 1]), confidence=None,
                                default_verify_len=4, plan=StepPlan(draft=False))
    assert record.drafted is False and record.verify_lens == [1, 1]
    stats = AdmissionStats()
    stats.record_step(verify_lens=[1, 1], accepted_drafts=[0, 0], survival=None, step_seconds=0.01, drafted=False)
    stats.record_step(verify_lens=[3, 2], accepted_drafts=[2, 0], survival=None, step_seconds=0.02)
    summary = stats.summary()
    assert summary["steps"] == 2 and summary["drafted_steps"] == 1 and summary["drafted_step_share"] == 0.5
    stats.set_draft_gate({"mode": "auto", "draft_ms": {1: 4.0}})
    assert stats.summary()["draft_gate"] == {"mode": "auto", "draft_ms": {"1": 4.0}}


def test_the_draft_block_is_learned_from_adjacent_steps_and_a_slow_spell_moves_both_kinds():
    """Verify 12 ms (the table); the rest of a plain step 4 ms, the draft block 14 ms more. Drafted steps with a plain
    step every 8th teach the block from the pairs; then a slow spell (+10 ms on every step) while only drafted steps
    run moves the plain step's prediction too (a per-kind overhead would keep the 4 ms it had when plain steps
    stopped); a 600 s stalled plain step pairs with neither neighbour."""
    from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads

    costs = DraftedAndPlainOverheads()
    assert costs.plain_seconds(2) is None and costs.drafted_seconds(2) == 0.0
    for step in range(79):  # ends on a drafted step
        plain = step % 8 == 7
        costs.observe(2, not plain, 0.016 if plain else 0.030, 0.012)
    assert costs.pairs(2) == 18 and costs.pairs(8) == 0 and costs.has_block(2) and not costs.has_block(8)
    assert costs.plain_seconds(2) == pytest.approx(0.004, abs=1e-6)
    assert costs.drafted_seconds(2) == pytest.approx(0.018, abs=1e-6)
    assert costs.drafted.seconds(2) == costs.drafted_seconds(2)  # what OverheadAdjustedCost reads
    for _ in range(60):
        costs.observe(2, True, 0.040, 0.012)
    assert costs.plain_seconds(2) == pytest.approx(0.014, abs=5e-4)  # the plain step would take 26 ms now
    assert costs.drafted_seconds(2) == pytest.approx(0.028, abs=5e-4)
    block = costs.block.seconds(2)
    costs.observe(2, False, 600.0, 0.012)
    costs.observe(2, True, 0.040, 0.012)
    assert costs.block.seconds(2) == block and costs.pairs(2) == 18
    assert not costs.observe(2, True, math.nan, 0.012) and not costs.observe(0, True, 0.03, 0.012)


def test_the_first_pairs_start_the_block_at_their_median():
    """Pair differences are symmetric noise around the block (here 10 ms ± 6): the median of the first ones, not the
    lower quartile a whole step's overhead starts from (which would read the block 3-6 ms low)."""
    from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads

    costs = DraftedAndPlainOverheads(min_pairs=1, block_rate=0.1)  # the first 10 pairs start it
    for noise in (-0.006, 0.004, 0.0, -0.004, 0.006):  # each drafted step pairs with the plain steps on both sides
        costs.observe(1, False, 0.020, 0.010)
        costs.observe(1, True, 0.030 + noise, 0.010)
    costs.observe(1, False, 0.020, 0.010)
    assert costs.pairs(1) == 10 and costs.block.seconds(1) == pytest.approx(0.010, abs=1e-9)


def _serve_after_slow_plain_steps(shared_level: bool, steps: int = 600):
    """One user; a drafted step commits 1.2 tokens in 13 ms (92 tokens/s), a plain step 1 in 10 ms (100 tokens/s):
    drafting loses 8 %. Plain steps 60-71 hit a slow spell (25 ms), the kind of spell that in a real trace started
    a drafting spell. Per-kind overheads (``shared_level`` False: how the planner learned costs before) keep the slow
    plain cost through the drafting spell that follows; the shared level learns from the drafted steps that the
    spell is over. The survivals promise what the steps realize. Returns drafted steps after the spell."""
    from sglang_dspark.profiler.step_overhead import DraftedAndPlainOverheads, OverheadAdjustedCost, StepOverhead

    table = 0.008
    survival = torch.tensor([[0.2, 0.0, 0.0]], dtype=torch.float64)
    overheads = DraftedAndPlainOverheads()
    per_kind = {True: StepOverhead(signed=True, grows_with_requests=True), False: StepOverhead(signed=True)}
    cost = OverheadAdjustedCost(FlatTable(table), overheads.drafted if shared_level else per_kind[True])
    gate = DraftGate(DraftGateConfig(probe_close_margin=0.0))  # the back-off's probes only: what is measured is the spell
    plain_steps = drafted_after = 0
    for step in range(steps):
        if shared_level:
            rest, samples = overheads.plain_seconds(1), overheads.pairs(1)
        else:
            rest = per_kind[False].seconds(1) if per_kind[False].updates else None
            samples = per_kind[False].samples(1)
        decision = gate.decide(lagged_survival=survival, cost_with_draft=cost,
                               seconds_without_draft=None if rest is None else table + rest,
                               skip_samples=samples, num_requests=1)
        if decision.draft:
            measured = 0.013
            drafted_after += step >= 72
        else:
            measured = 0.025 if 60 <= step < 72 else 0.010
            plain_steps += 1
        overheads.observe(1, decision.draft, measured, table)
        per_kind[decision.draft].observe(1, measured, table)
        gate.observe_outcome(decision.choice, decision.draft, 1.2 if decision.draft else 1, measured, 1)
    return drafted_after


def test_a_slow_spell_of_plain_steps_does_not_start_a_drafting_spell_that_holds():
    """The harness catches the stale plain cost (per-kind overheads draft ~a third of the 528 steps after the spell,
    each at an 8 % loss); the shared level drafts until the drafted steps have pulled the level back (its moving
    average, ~30 steps here), then probes within 2 % of the time."""
    stale = _serve_after_slow_plain_steps(shared_level=False)
    shared = _serve_after_slow_plain_steps(shared_level=True)
    assert stale >= 0.3 * 528
    assert shared <= 0.15 * 528 and shared <= stale / 2


def test_near_break_even_probes_often_enough_to_find_a_draft_that_pays():
    """One user; a drafted step takes 12 ms against 10 ms plain (break-even: 1.2 tokens); the survivals predict 1.15
    tokens. For 400 steps the draft realizes 1.0 (useless: paused, the back-off grows to 64 steps between probes),
    then 1.35 (112 tokens/s against 100). Far from break-even probes stay 64 steps apart; once the fit reads the draft
    within probe_close_margin of break-even they come every probe_min steps (the cost bound, on a probe's net cost,
    still applies), and the fit learns the new level in a few probes instead of a few hundred steps. 400 + 600
    simulated steps; in the second phase the near-break-even gate must draft most steps and beat the back-off alone by
    5 %."""
    modest = torch.tensor([[0.1, 0.05, 0.0]], dtype=torch.float64)
    results = {}
    for name, margin in (("near", 0.15), ("back-off", 0.0)):
        gate = DraftGate(DraftGateConfig(probe_close_margin=margin))
        common = dict(survival=modest, cost=FlatCost(0.012), skip=0.010, drafted_seconds=0.012)
        _serve(gate, 400, realized_tokens=1.0, **common)
        assert gate.probe_interval == 64
        results[name] = _serve(gate, 600, realized_tokens=1.35, **common)
    (near_drafted, near), (_, backoff) = results["near"], results["back-off"]
    assert near_drafted >= 0.7 * 600 and near >= 1.05 * backoff


def test_a_stale_reading_gives_way_to_the_population_prior():
    """While paused, the lagged survival is the reading of the last drafted step, the low one that paused it, and it
    stays that for as long as no step drafts. Past ``fresh_steps`` decisions without a drafted step the gate reads
    the population prior instead: here the prior says drafting pays, so the draft resumes two steps after a pause
    on one low reading; a fresh reading still decides (the pause and the step after it: the overlap path reads
    confidences two steps back), and without a prior the pause holds."""
    prior = HIGH.to(torch.float64)
    gate = DraftGate(DraftGateConfig(probe_min=64, probe_max=64))
    assert gate.decide(lagged_survival=HIGH, cost_with_draft=FlatCost(0.02), seconds_without_draft=0.01,
                       skip_samples=10, num_requests=1, prior_survival=prior).reason == "pays"
    trace = [gate.decide(lagged_survival=LOW, cost_with_draft=FlatCost(0.02), seconds_without_draft=0.01,
                         skip_samples=10, num_requests=1, prior_survival=prior).reason for _ in range(5)]
    assert trace == ["pause", "pause", "pays", "pause", "pause"]  # the resumed step's reading is fresh (and low)
    gate = DraftGate(DraftGateConfig(probe_min=64, probe_max=64))
    trace = [_decide(gate, LOW).reason for _ in range(5)]
    assert trace == ["pause"] * 5


def test_sync_path_reads_the_newest_carried_confidences_without_shifting():
    """Without overlap the host carry ring holds the confidences; the gate peeks at the newest slot (any past
    confidence may decide a skip: the step's draft does not exist yet) and must not move the ring."""
    from sglang_dspark.engine.planner import AdmissionBudgetPlanner

    planner = AdmissionBudgetPlanner.__new__(AdmissionBudgetPlanner)
    planner.carry_steps = 2
    planner._carry_confidence = None
    planner._carry_pos = 0
    rows = torch.tensor([3, 1])
    generation = torch.tensor([5, 7])
    assert planner.latest_survival(req_pool_indices_cpu=rows, current_generation=generation) is None
    planner._carry_confidence = torch.zeros(2, 4, 2)
    planner._carry_generation = torch.zeros(2, 4, dtype=torch.int64)
    planner._carry_confidence[1, 3] = torch.tensor([0.5, 0.5])  # newest slot: (pos - 1) % 2 == 1
    planner._carry_generation[1, 3] = 5
    planner._carry_confidence[1, 1] = torch.tensor([0.9, 0.9])
    planner._carry_generation[1, 1] = 6  # slot reused by a newer request since: counts as fresh (survival 1)
    planner._carry_pos = 2
    survival = planner.latest_survival(req_pool_indices_cpu=rows, current_generation=generation)
    assert torch.allclose(survival, torch.tensor([[0.5, 0.25], [1.0, 1.0]]))
    assert planner._carry_pos == 2
    planner.carry_steps = 0  # overlap: the relay supplies the lag, no ring
    assert planner.latest_survival(req_pool_indices_cpu=rows, current_generation=generation) is None


def test_admission_reads_the_prior_for_rows_without_a_confidence():
    """The budget of a drafted step (a probe after a pause, under load) must not verify every unknown row in full:
    rows with no lagged confidence read the population prior in the capacity search too, as they do in the gate."""
    from sglang_dspark.engine.planner import AdmissionBudgetPlanner
    from sglang_dspark.scheduling.policy import AdmissionPolicy

    def budget(prior):
        planner = AdmissionBudgetPlanner.__new__(AdmissionBudgetPlanner)
        planner.carry_steps = 0  # overlap: the relay supplies the lagged confidences as given
        planner.forced_budget_frac = None
        planner.policy = AdmissionPolicy("async")
        planner.survival_prior = prior
        # Verify cost: 10 ms + 1 ms per verified token (R ignored): a token pays only if it survives with p > ~0.1.
        planner.cost = TableCost({b: 0.010 + 0.001 * b for b in range(1, 64)})
        requests, gamma = 8, 3
        confidence = torch.full((requests, gamma), 0.05)
        generation = torch.tensor([5] + [0] * (requests - 1))  # only row 0 drafted for this request generation
        current = torch.full((requests,), 5)
        survival = planner.lagged_survival(confidence=confidence, generation=generation, current_generation=current,
                                           req_pool_indices_cpu=torch.arange(requests))
        return planner.budget_for(survival), survival

    k_upstream, survival = budget(None)
    assert k_upstream == 7 * 3 and torch.equal(survival[1:], torch.ones(7, 3))  # unknown rows verified in full
    prior = SurvivalPrior()
    prior.observe(torch.full((4, 3), 0.05).cumprod(dim=1))
    k_prior, survival = budget(prior)
    assert k_prior == 0  # the population says this draft's tokens do not survive: verify the anchors only
    assert torch.allclose(survival[1:], prior.mean.expand(7, -1))


def test_a_step_the_gate_skips_runs_no_capacity_search():
    """The gate decides from the budget's own survivals, before the capacity search: a skipped step gets budget 0
    without a search; a drafted one whose decision searched these survivals with the served cost takes that search's
    budget (one search per step); a decision that read something else (the prior) leaves the search to the policy."""
    from sglang_dspark.engine.planner import AdmissionBudgetPlanner
    from sglang_dspark.scheduling.draft_gate import GateDecision
    from sglang_dspark.scheduling.policy import AdmissionPolicy

    class CountingPolicy(AdmissionPolicy):
        searches = 0

        def capacity(self, *args):
            CountingPolicy.searches += 1
            return 5

    planner = AdmissionBudgetPlanner.__new__(AdmissionBudgetPlanner)
    planner.carry_steps = 0
    planner.forced_budget_frac = None
    planner.policy = CountingPolicy("async")
    planner.cost = FlatCost(0.01)
    survival = planner.lagged_survival(confidence=torch.full((2, 3), 0.5), generation=torch.tensor([4, 4]),
                                       current_generation=torch.tensor([4, 4]), req_pool_indices_cpu=torch.arange(2))
    assert planner.budget_for(survival, GateDecision(False, "pause")) == 0 and CountingPolicy.searches == 0
    assert planner.budget_for(survival, GateDecision(True, "pays", budget=3)) == 3 and CountingPolicy.searches == 0
    assert planner.budget_for(survival, GateDecision(True, "probe")) == 5 and CountingPolicy.searches == 1
    assert planner.budget_for(survival) == 5 and CountingPolicy.searches == 2  # not a gated step
    gate = DraftGate()  # the gate's own search is the policy's: same survivals, same cost, same first maximum
    decision = gate.decide(lagged_survival=HIGH, cost_with_draft=FlatCost(0.02), seconds_without_draft=0.01,
                           skip_samples=10, num_requests=1)
    assert decision.draft and decision.budget == int(capacity_from_survival(HIGH, FlatCost(0.02), 1))


def test_each_step_outcome_reaches_the_gate_with_the_choice_it_was_decided_with():
    """Worker → StepRecorder → planner.observe_step → DraftGate.observe_outcome: the record carries the step's
    DraftChoice, and the gate holds the committed tokens and measured seconds against that choice's prediction."""
    from sglang_dspark.engine.planner import AdmissionVerifyPlanner

    choice = should_draft(HIGH, FlatCost(0.02), 0.01)  # predicts 3.94 tokens in 20 ms drafted, 1 in 10 ms plain
    recorder = StepRecorder("cpu", clock=iter([0.0, 0.040]).__next__)
    recorder.start()
    (record,) = recorder.finish(accept_lens=torch.tensor([2]), cap_lens=torch.tensor([4]), confidence=None,
                                default_verify_len=4, plan=StepPlan(decision=GateDecision(True, "pays", choice)))
    assert record.gate_choice is choice and record.seconds == pytest.approx(0.040)
    planner = AdmissionVerifyPlanner.__new__(AdmissionVerifyPlanner)
    planner.step_costs = None
    planner.draft = DraftSource(SurvivalPrior(), DraftGate())
    planner.draft.gate.draft_seconds.min_steps = 1
    planner.observe_step(record)
    # Realized 2 tokens in 40 ms against a predicted 3.94 tokens in 20 ms.
    gate = planner.draft.gate
    assert gate.realized_tokens.steps == 1 and gate.realized_tokens.line()[:2] == pytest.approx((3.94, 2.0), abs=0.01)
    assert 2.0 < gate.realized_tokens.expected(3.94) < 3.94 and gate.draft_seconds.factor == pytest.approx(2)
    assert gate.skip_seconds.steps == 0
    assert gate.summary()["realized_vs_predicted"] == {
        "drafted_seconds": 2.0, "plain_seconds": 1.0, "drafted_steps": 1, "predicted_tokens_per_request": 3.94,
        "committed_tokens_per_request": 2.0, "slope": 1.0}


class _PooledOnly(dict):
    """The per-load fits kept but never read: the gate as it was with one fit for every R."""

    def get(self, key, default=None):
        return default


def _serve_load(gate, steps, *, num_requests, survival_row, drafted_seconds, realized_per_request, skip=0.010):
    """``steps`` steps of ``num_requests`` requests; a drafted step commits ``realized_per_request`` tokens per
    request in ``drafted_seconds`` (also the cost model's flat prediction), a plain one 1 per request in ``skip``."""
    survival = torch.tensor([survival_row] * num_requests, dtype=torch.float64)
    drafted = tokens = seconds = 0.0
    for _ in range(steps):
        decision = gate.decide(lagged_survival=survival, cost_with_draft=FlatCost(drafted_seconds),
                               seconds_without_draft=skip, skip_samples=10, num_requests=num_requests)
        per_request, step_seconds = (realized_per_request, drafted_seconds) if decision.draft else (1.0, skip)
        gate.observe_outcome(decision.choice, decision.draft, per_request * num_requests, step_seconds, num_requests)
        drafted += decision.draft
        tokens += per_request * num_requests
        seconds += step_seconds
    return drafted, tokens / seconds


def test_each_load_learns_what_its_own_drafted_steps_commit():
    """One user first: drafted steps commit 2.0 tokens in 13 ms (154 tokens/s against 100; drafting pays). Then four
    users with the same survivals per request, whose drafted steps commit 1.15 tokens per request in 12 ms (383
    tokens/s against 400 for a plain step: a 4 % loss). The one-user steps read at four users promise 1.4 and keep
    a pooled fit drafting; the four-user bucket's own fit (starting from the pooled one) pauses after its first ~20
    steps. 300 + 600 simulated steps; the bucketed gate must serve the second phase within 2 % of always-plain and
    draft at most its first steps and the probes, the pooled one drafts at least twice as many of its steps."""
    row = [0.7, 0.5, 0.3]
    one_user = dict(num_requests=1, survival_row=row, drafted_seconds=0.013, realized_per_request=2.0)
    four_users = dict(num_requests=4, survival_row=row, drafted_seconds=0.012, realized_per_request=1.15)
    results = {}
    for name in ("bucketed", "pooled"):
        gate = DraftGate(DraftGateConfig(probe_close_margin=0.0))  # the back-off's probes only: what is measured is the fit
        if name == "pooled":
            gate.realized.by_load = _PooledOnly()
        drafted_first, _ = _serve_load(gate, 300, **one_user)
        assert drafted_first >= 0.9 * 300  # drafting pays at one user either way
        results[name] = _serve_load(gate, 600, **four_users)
    drafted, throughput = results["bucketed"]
    assert drafted <= 25 + 600 / 64 + 10 and throughput >= 0.98 * 400
    assert results["pooled"][0] >= 2 * drafted


def test_a_step_never_commits_more_than_its_verified_drafts():
    """A fit that reads every prediction high (drafted steps realized 3 tokens where 1.5 were predicted) cannot make a
    drafted step that verifies no draft (K = 0) look better than a plain one: it commits the anchors only."""
    gate = DraftGate()
    for _ in range(8):
        gate.realized_tokens.observe(1.5, 3.0)
    choice = should_draft(torch.zeros(2, 3, dtype=torch.float64), FlatCost(0.010), 0.010, 2)
    assert choice.capacity == 0
    assert gate.expected_tokens(choice, 2) == 1.0
    assert gate.corrected_draft_throughput(choice, 2) <= gate.corrected_skip_throughput(choice, 2)


def test_a_stale_plain_step_cost_is_remeasured_sooner_near_break_even():
    """While drafting, the plain-step cost is the one measured before the spell began. Near break-even (corrected
    throughputs within close_margin) a plain step re-measures it every refresh_close_every drafted steps; far from
    it, every refresh_skip_every."""
    gate = DraftGate(DraftGateConfig(refresh_close_every=8, refresh_skip_every=40, close_margin=0.25))
    thin = torch.tensor([[0.15, 0.05, 0.0]], dtype=torch.float64)  # 1.2 tokens per 11 ms drafted step: +9 %
    wide = torch.tensor([[0.9, 0.8, 0.7]], dtype=torch.float64)  # 3.4 tokens per 11 ms: +209 %
    for survival, interval in ((thin, 8), (wide, 40)):
        trace = [_decide(gate, survival, cost=FlatCost(0.011), skip=0.010) for _ in range(2 * interval + 2)]
        skipped = [i for i, d in enumerate(trace) if not d.draft]
        assert {trace[i].reason for i in skipped} == {"refresh-skip"}
        assert skipped[1] - skipped[0] == interval + 1
    assert gate.refresh_interval(109.0, 100.0) == 8 and gate.refresh_interval(126.0, 100.0) == 40


def test_the_gate_trace_writes_what_the_gate_predicted_and_what_the_step_did(tmp_path, monkeypatch, caplog):
    """SGLANG_DSPARK_GATE_TRACE: one JSON line per observed decode step, with the prediction the step was decided
    with; a path that cannot be written logs once and never stops a step."""
    import json

    from sglang_dspark.engine.gate_trace import GateTrace
    from sglang_dspark.engine.planner import AdmissionVerifyPlanner

    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SGLANG_DSPARK_GATE_TRACE", str(path))
    trace = GateTrace.from_env()
    assert trace is not None and trace.path == str(path)
    choice = should_draft(HIGH, FlatCost(0.02), 0.01)  # 3.94 tokens in 20 ms drafted, 1 in 10 ms plain
    recorder = StepRecorder("cpu", clock=iter([0.0, 0.040, 1.0, 1.012]).__next__)
    planner = AdmissionVerifyPlanner.__new__(AdmissionVerifyPlanner)
    planner.step_costs = None
    planner.draft = DraftSource(SurvivalPrior(), DraftGate())
    planner.draft.gate.decide(lagged_survival=HIGH, cost_with_draft=FlatCost(0.02), seconds_without_draft=0.01,
                              skip_samples=10, num_requests=1)
    planner.gate_trace = trace
    for drafted, accept in ((True, 2), (False, 1)):
        recorder.start()
        (record,) = recorder.finish(accept_lens=torch.tensor([accept]), cap_lens=torch.tensor([4 if drafted else 1]),
                                    confidence=None, default_verify_len=4,
                                    plan=StepPlan(draft=drafted, decision=GateDecision(drafted, "test", choice)))
        planner.observe_step(record)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["R"] == 1 and first["drafted"] is True and first["committed"] == 2 and first["verify_tokens"] == 4
    assert first["seconds"] == pytest.approx(0.040) and first["reason"] == "pays"
    assert first["predicted_tokens"] == pytest.approx(3.94) and first["predicted_draft_seconds"] == pytest.approx(0.02)
    assert first["predicted_plain_seconds"] == pytest.approx(0.01) and first["capacity"] == choice.capacity
    assert second["drafted"] is False and second["seconds"] == pytest.approx(0.012) and second["pid"] == first["pid"]
    unwritable = GateTrace(str(tmp_path / "missing-folder" / "trace.jsonl"))
    with caplog.at_level("WARNING"):
        unwritable.write({"R": 1})
        unwritable.write({"R": 2})
    assert sum("gate trace" in r.getMessage() for r in caplog.records) == 1


def test_a_decision_the_chooser_replaced_is_counted_as_what_the_step_did():
    """The chooser turns the gate's "draft" into a step with lookup chains and no draft when the chains alone pay more
    (scheduling/step_choice.py): the gate advises, the step's final decision is tallied, so the counts say "skipped"
    with the chooser's reason, not "drafted"; the gate's own state keeps its advice."""
    from sglang_dspark.scheduling.draft_gate import GateDecision

    gate = make_draft_gate("off")
    gate.decide()
    second = gate.advise()
    assert (gate.decisions, gate.drafted, gate.skipped, gate.reasons) == (1, 1, 0, {"off": 1})  # advice counts nothing
    replaced = GateDecision(False, "lookup", second.choice)
    gate.tally(replaced)
    assert (gate.decisions, gate.drafted, gate.skipped) == (2, 1, 1)
    assert gate.reasons == {"off": 1, "lookup": 1} and gate.last is replaced
