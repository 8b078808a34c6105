"""Which source each request verifies and how many lookup tokens: Algorithm 1 over the lookup's estimates."""

import torch

from sglang_dspark.lookup.calibration import LookupCalibration
from sglang_dspark.scheduling.draft_gate import FlatCost
from sglang_dspark.scheduling.step_choice import lookup_conditionals, lookup_lengths, prefers_lookup


class LinearCost:
    """Step seconds = base + per_token * B."""

    def __init__(self, base, per_token):
        self.base, self.per_token = base, per_token

    def steps_per_second(self, num_requests, verify_tokens):
        if isinstance(verify_tokens, torch.Tensor):
            return 1.0 / (self.base + self.per_token * verify_tokens.to(torch.float64))
        return 1.0 / (self.base + self.per_token * verify_tokens)


def test_conditionals_fill_the_proposed_positions_only():
    calibration = LookupCalibration(max_tokens=4)
    conditional = lookup_conditionals(torch.tensor([3, 0, 1]), torch.tensor([2, 0, 4]), 4, calibration.conditional)
    assert conditional.shape == (3, 4)
    assert (conditional[0, :3] == 0.5).all() and conditional[0, 3] == 0  # the Beta(1, 1) prior
    assert (conditional[1] == 0).all() and conditional[2, 0] == 0.5 and (conditional[2, 1:] == 0).all()


def test_a_free_verify_takes_every_proposed_token_and_a_costly_one_none():
    conditional = torch.tensor([[0.9, 0.9, 0.9, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert lookup_lengths(conditional, FlatCost(1.0)).tolist() == [3, 0]
    # Each verified token costs as much as a whole plain step: 0.9 expected tokens never pay for it.
    assert lookup_lengths(conditional, LinearCost(0.0, 1.0)).tolist() == [0, 0]


def test_the_length_stops_where_the_estimates_stop_paying():
    # A token costs 10 % of a plain step of 2 rows (base 1.8 + 0.1 per token): positions past survival ~0.1 do not pay.
    conditional = torch.tensor([[0.95, 0.9, 0.3, 0.3], [0.5, 0.1, 0.1, 0.1]], dtype=torch.float64)
    lengths = lookup_lengths(conditional, LinearCost(1.8, 0.1))
    assert lengths.tolist() == [3, 1]


class CliffCost:
    """A verify of one token per request is far cheaper than any wider one (the CPU table's B = R cliff)."""

    def steps_per_second(self, num_requests, verify_tokens):
        def seconds(b):
            return 1.0 if b <= num_requests else 1.3 + 0.01 * (b - num_requests)

        if isinstance(verify_tokens, torch.Tensor):
            return torch.tensor([1.0 / seconds(int(b)) for b in verify_tokens.flatten()],
                                dtype=torch.float64).view(verify_tokens.shape)
        return 1.0 / seconds(int(verify_tokens))


def test_the_search_climbs_a_cost_cliff_that_no_single_token_pays_for():
    # 4 rows: the first lookup token alone gains 0.9 / 4 = 22 % for a 31 % dearer step (Algorithm 1 would stop there);
    # eight together pay.
    conditional = torch.tensor([[0.9] * 4, [0.9] * 4, [0.0] * 4, [0.0] * 4], dtype=torch.float64)
    lengths = lookup_lengths(conditional, CliffCost())
    assert lengths.tolist() == [4, 4, 0, 0]
    # A weak proposal does not pay for the cliff at all.
    assert lookup_lengths(conditional * 0.2, CliffCost()).tolist() == [0, 0, 0, 0]


def test_forced_verifies_every_proposed_token():
    conditional = torch.tensor([[0.01, 0.01, 0.0]], dtype=torch.float64)
    assert lookup_lengths(conditional, LinearCost(0.0, 1.0), forced=True, proposed=torch.tensor([2])).tolist() == [2]
    assert lookup_lengths(conditional, None).tolist() == [2]  # no cost known yet: every proposed token


def test_a_row_takes_the_lookup_when_it_expects_at_least_the_draft_s_tokens():
    lookup = torch.tensor([[0.9, 0.9, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    draft = torch.tensor([[0.8, 0.6, 0.4], [0.8, 0.6, 0.4], [0.9, 0.9, 0.9]])
    # Row 0: 0.9 + 0.81 = 1.71 >= 1.8? no. Row 1: 0.5 < 1.8. Row 2: no proposal.
    assert prefers_lookup(lookup, draft).tolist() == [False, False, False]
    weak_draft = torch.tensor([[0.5, 0.2, 0.1]] * 3)
    assert prefers_lookup(lookup, weak_draft).tolist() == [True, False, False]  # 1.71 >= 0.8; 0.5 < 0.8
    assert prefers_lookup(lookup, None).tolist() == [True, True, False]


def test_the_draft_runs_beside_lookup_chains_only_where_it_beats_the_step_without_it():
    from sglang_dspark.scheduling.step_choice import draft_pays_beside_lookup

    lookup = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.0] * 4], dtype=torch.float64)
    strong_draft = torch.tensor([[0.0] * 4, [0.95, 0.9, 0.85, 0.8]])
    weak_draft = torch.tensor([[0.0] * 4, [0.3, 0.1, 0.0, 0.0]])
    # The draft block costs half a step on top of the same verify.
    drafted, undrafted = LinearCost(1.5, 0.05), LinearCost(1.0, 0.05)
    assert draft_pays_beside_lookup(lookup, strong_draft, drafted, undrafted)
    assert not draft_pays_beside_lookup(lookup, weak_draft, drafted, undrafted)
    assert draft_pays_beside_lookup(lookup, None, drafted, undrafted)  # nothing known of the draft: the gate's call
    # A free draft block never loses to the step without it (ties go to the step without the draft).
    assert draft_pays_beside_lookup(lookup, weak_draft, undrafted, undrafted)


def test_chains_that_gain_less_than_the_margin_are_not_verified():
    from sglang_dspark.scheduling.step_choice import CHAIN_MIN_GAIN

    # 16 rows, a plain step of 1 s, each verified token 1 % of it: one row's chain of 3 at 0.8 a position expects
    # 0.8 + 0.64 + 0.512 = 1.95 tokens for 3 % more time, (16 + 1.95) / 16 / 1.03 = 1.089: a 9 % gain clears 5 %.
    cost = LinearCost(0.84, 0.01)
    strong = torch.zeros(16, 4, dtype=torch.float64)
    strong[0, :3] = 0.8
    assert lookup_lengths(strong, cost).tolist() == [3] + [0] * 15
    # At 0.45 a position the best is two tokens, (16 + 0.45 + 0.2025) / 16 / 1.02 = 1.020: below the margin, while the
    # search without one (min_gain 0) verifies them.
    weak = strong * (0.45 / 0.8)
    assert CHAIN_MIN_GAIN > 0.021
    assert lookup_lengths(weak, cost).tolist() == [0] * 16
    assert lookup_lengths(weak, cost, min_gain=0.0).tolist() == [2] + [0] * 15


def test_a_chain_below_the_margin_does_not_stop_the_draft():
    from sglang_dspark.scheduling.step_choice import draft_pays_beside_lookup

    # Row 0's chain gains 2 %, under the margin: the step without the draft would verify no chain, Θ = 16. A draft
    # block of 5 % with four rows at 0.3 gives Θ = 16.08: the draft runs, though the chain alone (16.33) beats it.
    cost_undrafted, cost_drafted = LinearCost(0.84, 0.01), LinearCost(0.89, 0.01)
    lookup = torch.zeros(16, 4, dtype=torch.float64)
    lookup[0, :3] = 0.45
    draft = torch.zeros(16, 4, dtype=torch.float64)
    draft[1:5, 0] = 0.3
    assert draft_pays_beside_lookup(lookup, draft, cost_drafted, cost_undrafted)
    # A chain that clears the margin (0.8 a position, 9 %) is what the step without the draft verifies: it wins.
    lookup[0, :3] = 0.8
    assert not draft_pays_beside_lookup(lookup, draft, cost_drafted, cost_undrafted)


# ---------------------------------------------------------------------------------------------- choose_step


class _LinearCost:
    """``1 / SPS(R, B) = base + per_request·R + per_token·B`` seconds (works on tensors of B, as the search asks)."""

    def __init__(self, base, per_token, per_request=0.0):
        self.base, self.per_token, self.per_request = base, per_token, per_request

    def steps_per_second(self, num_requests, verify_tokens):
        return 1.0 / (self.base + self.per_request * num_requests + self.per_token * verify_tokens)


def _chains(lengths, conditional, gamma=4):
    from sglang_dspark.scheduling.step_plan import LookupChains

    rows = len(lengths)
    return LookupChains(tokens=torch.arange(rows * gamma).reshape(rows, gamma), lengths=torch.tensor(lengths),
                        match_lens=torch.tensor([4 if n else 0 for n in lengths]),
                        conditional=torch.tensor(conditional, dtype=torch.float64))


def _facts(gate, lookup=None, survival=None, **overrides):
    from sglang_dspark.scheduling.step_choice import StepFacts

    known = survival
    if survival is not None:
        survival = torch.tensor(survival, dtype=torch.float64)
        known = survival
    fields = dict(gate=gate, lookup=lookup, draft_survival=survival, known_draft_survival=known,
                  cost_drafted=_LinearCost(0.020, 0.001), cost_undrafted=_LinearCost(0.010, 0.001))
    fields.update(overrides)
    return StepFacts(**fields)


def _pays():
    from sglang_dspark.scheduling.draft_gate import GateDecision

    return GateDecision(True, "pays")


def _pause():
    from sglang_dspark.scheduling.draft_gate import GateDecision

    return GateDecision(False, "pause")


GOOD_CHAIN = [0.95, 0.95, 0.95, 0.95]
NO_CHAIN = [0.0, 0.0, 0.0, 0.0]


def test_choose_step_without_advice_drafts_every_step_and_verifies_no_chain():
    """No gate (off, or a server where it cannot run: TP, static verify) and a step it does not decide: the plan is
    upstream's drafted step, whatever the lookup proposed."""
    from sglang_dspark.scheduling.step_choice import choose_step
    from sglang_dspark.scheduling.step_plan import DRAFTED

    assert choose_step(_facts(None)) is DRAFTED
    assert choose_step(_facts(None, lookup=_chains([4, 0], [GOOD_CHAIN, NO_CHAIN]))) is DRAFTED


def test_choose_step_draft_only_and_neither():
    """No lookup proposal: the gate's advice is the plan; a paused step verifies the anchors only, on the compact or
    plain path where the batch qualifies."""
    from sglang_dspark.scheduling.step_choice import choose_step

    drafted = choose_step(_facts(_pays(), survival=[[0.9] * 4]))
    assert (drafted.draft, drafted.kind, drafted.lookup, drafted.decision.reason) == (True, "drafted", None, "pays")
    plain = choose_step(_facts(_pause(), compact_ok=True, plain_ok=True))
    assert (plain.draft, plain.kind, plain.compact_anchor, plain.plain_decode) == (False, "plain", True, True)
    assert choose_step(_facts(_pause(), compact_ok=True, plain_ok=False)).plain_decode is False


def test_choose_step_lookup_only():
    """The gate paused; a chain that pays is verified without the draft forward, with its lengths from the capacity
    search (the row without a proposal verifies its anchor)."""
    from sglang_dspark.scheduling.step_choice import choose_step

    plan = choose_step(_facts(_pause(), lookup=_chains([4, 0], [GOOD_CHAIN, NO_CHAIN])))
    assert (plan.draft, plan.kind, plan.decision.reason) == (False, "lookup", "pause")
    assert plan.lookup.lengths.tolist() == [4, 0] and plan.lookup.total == 4 and not plan.compact_anchor


def test_choose_step_both_sources_per_row():
    """The gate advises the draft; a row whose chain expects at least the draft's tokens takes the chain, the other
    row the draft: one mixed step."""
    from sglang_dspark.scheduling.step_choice import choose_step

    plan = choose_step(_facts(_pays(), lookup=_chains([4, 0], [GOOD_CHAIN, NO_CHAIN]),
                              survival=[[0.5, 0.2, 0.1, 0.0], [0.9, 0.8, 0.7, 0.6]],
                              cost_drafted=_LinearCost(0.011, 0.0005)))
    assert (plan.draft, plan.kind, plan.decision.reason) == (True, "mixed", "pays")
    assert plan.lookup.rows.tolist() == [True, False]


def test_choose_step_turns_a_draft_the_chains_beat_into_a_lookup_step():
    """Beside chains that carry the step, a draft that adds little (weak survivals, a costly block) is dropped: the
    decision becomes ``lookup`` (reason) without the draft; the forced test gates are obeyed as they are."""
    from sglang_dspark.scheduling.step_choice import choose_step

    weak = [[0.1, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]]
    facts = dict(lookup=_chains([4, 4], [GOOD_CHAIN, GOOD_CHAIN]), survival=weak,
                 cost_drafted=_LinearCost(0.030, 0.001))
    plan = choose_step(_facts(_pays(), **facts))
    assert (plan.draft, plan.kind, plan.decision.reason) == (False, "lookup", "lookup")
    obeyed = choose_step(_facts(_pays(), weigh_draft=False, lookup=_chains([4, 0], [GOOD_CHAIN, NO_CHAIN]),
                                survival=weak, cost_drafted=_LinearCost(0.030, 0.001)))
    assert obeyed.draft and obeyed.decision.reason == "pays"


def test_choose_step_is_pure():
    """The same facts give the same plan, and the facts are not changed."""
    from sglang_dspark.scheduling.step_choice import choose_step

    facts = _facts(_pays(), lookup=_chains([4, 2], [GOOD_CHAIN, [0.9, 0.9, 0.0, 0.0]]),
                   survival=[[0.5, 0.2, 0.1, 0.0], [0.9, 0.8, 0.7, 0.6]])
    before = facts.lookup.conditional.clone()
    first, second = choose_step(facts), choose_step(facts)
    assert first.kind == second.kind and first.decision == second.decision
    assert torch.equal(first.lookup.lengths, second.lookup.lengths)
    assert torch.equal(facts.lookup.conditional, before)


def test_forced_lookup_verifies_every_proposed_token_even_where_it_cannot_pay():
    from sglang_dspark.scheduling.step_choice import choose_step

    costly = _LinearCost(0.010, 1.0)  # a chain token costs a second: never pays
    plan = choose_step(_facts(_pause(), lookup=_chains([3, 0], [[0.2, 0.2, 0.2, 0.0], NO_CHAIN]),
                              cost_undrafted=costly, forced_lookup=True))
    assert plan.lookup.lengths.tolist() == [3, 0]
    assert choose_step(_facts(_pause(), lookup=_chains([3, 0], [[0.2, 0.2, 0.2, 0.0], NO_CHAIN]),
                              cost_undrafted=costly)).lookup is None


def test_a_step_without_the_draft_verifies_chains_past_the_block_only_where_allowed():
    """Proposals 10 wide, a block of 4: a step without the draft may verify past the block where the batch allows
    it (``long_chains``); the chosen chains are then as wide as the longest, else cut to the block (and a step with
    no long row stays the block wide, the ordinary verify's width)."""
    from sglang_dspark.scheduling.step_choice import choose_step

    sure = [[0.97] * 10, [0.97] * 3 + [0.0] * 7]
    proposals = _chains([10, 3], sure, gamma=10)
    long = choose_step(_facts(_pause(), proposals, block=4, long_chains=True))
    assert long.lookup.lengths.tolist() == [10, 3] and long.lookup.width == 10
    assert long.verifies_past(4) and not long.draft
    assert (long.lookup.conditional[1, 3:] == 0).all()
    short = choose_step(_facts(_pause(), proposals, block=4, long_chains=False))
    assert short.lookup.lengths.tolist() == [4, 3] and short.lookup.width == 4 and not short.verifies_past(4)
    within = choose_step(_facts(_pause(), _chains([3, 3], [[0.97] * 3 + [0.0] * 7] * 2, gamma=10), block=4,
                                long_chains=True))
    assert within.lookup.width == 4 and not within.verifies_past(4)


def test_a_drafted_step_never_verifies_past_the_block():
    from sglang_dspark.scheduling.step_choice import choose_step

    proposals = _chains([10, 0], [[0.97] * 10, [0.0] * 10], gamma=10)
    plan = choose_step(_facts(_pays(), proposals, survival=[[0.9] * 4, [0.9] * 4], block=4, long_chains=True,
                              weigh_draft=False))
    assert plan.draft and plan.lookup.width == 4 and plan.lookup.lengths.tolist() == [4, 0]


def test_the_draft_is_weighed_against_the_long_chains_it_would_replace():
    """Beside a long chain the alternative to drafting verifies the whole chain: with long chains allowed the drafted
    step loses to it where, cut to the block, it would have won."""
    from sglang_dspark.scheduling.step_choice import draft_pays_beside_lookup

    conditional = torch.tensor([[0.99] * 12, [0.0] * 12], dtype=torch.float64)
    draft = torch.tensor([[0.0] * 4, [0.99, 0.99, 0.99, 0.99]], dtype=torch.float64)
    drafted, undrafted = _LinearCost(0.012, 0.001), _LinearCost(0.010, 0.001)
    assert draft_pays_beside_lookup(conditional[:, :4], draft, drafted, undrafted, 0.05)
    assert not draft_pays_beside_lookup(conditional[:, :4], draft, drafted, undrafted, 0.05,
                                        undrafted_conditional=conditional)


def test_chains_clip_to_a_width():
    chains = _chains([10, 3], [[0.9] * 10, [0.9] * 3 + [0.0] * 7], gamma=10)
    cut = chains.clipped(4)
    assert cut.width == 4 and cut.lengths.tolist() == [4, 3] and cut.total == 7
    assert chains.clipped(10) is chains and chains.clipped(12) is chains
