"""The compact accept of a gate-skipped step (``sglang_dspark/engine/plain_step/anchor_only_verify.py``) against upstream's.

On a step the draft gate skipped, upstream accepts from strided logits (R × verify width rows, row 0 of each request
the anchor's, the rest zero) and a one-hot placeholder draft, capped at verify length 1; ours accepts from the R anchor
rows alone. Both run in this process on CPU tensors (the chain sampler is sglang-dspark's torch kernel, as on the CPU
platform), from the same logits:

* greedy: bonus, commit lengths, new sequence lengths and out tokens equal upstream's exactly;
* sampled (temperature only, top-k, top-p, a mixed greedy/sampled batch): N = 30 000 requests per configuration, all
  with the same anchor logits over V = 10 tokens. The compact sampler's bonus counts pass Pearson's chi-square test
  of homogeneity against upstream's, and goodness of fit against the target law computed here independently, at
  p > 1e-3 each. Control: a sampler at the wrong temperature (1.0 instead of 0.7) must fail the goodness of fit with
  p < 1e-6 (the test can see a biased sampler). Seeded, so deterministic.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy import stats

from sglang.kernels.ops.speculative.dspark import dspark_accept
from sglang_dspark.engine.plain_step.anchor_only_verify import AnchorOnlyVerifyExecutor
from sglang_dspark.engine.current_step import CurrentStep
from sglang_dspark.scheduling.step_plan import StepPlan
from sglang_dspark.kernels.rejection_sampling import chain_speculative_sampling_torch
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult

GAMMA = 7
WIDTH = GAMMA + 1
VOCAB = 10
N = 30_000
ALPHA = 1e-3
LOGITS = torch.tensor([2.0, 1.6, 1.1, 0.9, 0.5, 0.0, -0.4, -1.0, -1.5, -3.0])


@pytest.fixture(autouse=True)
def cpu_chain_sampler(monkeypatch):
    # The CPU platform's patch, scoped to this test (upstream's name points at a Triton kernel).
    monkeypatch.setattr(dspark_accept, "chain_speculative_sampling_triton", chain_speculative_sampling_torch)


def _executor() -> AnchorOnlyVerifyExecutor:
    executor = object.__new__(AnchorOnlyVerifyExecutor)  # the accept reads only these fields
    executor.gamma, executor.verify_num_draft_tokens = GAMMA, WIDTH
    executor._fused_argmax = False
    executor._tp_sync = SimpleNamespace(sync=lambda site, tensor: None)
    executor._simulated_correct_len = None
    executor._block_verification = False
    executor._rejection_noise = None
    executor.verify_epilogue = None
    return executor


def _sampling_info(bs, temperature, top_k=VOCAB, top_p=1.0, greedy_rows=None):
    temperatures = torch.full((bs, 1), float(temperature))
    top_ks = torch.full((bs,), top_k, dtype=torch.int32)
    if greedy_rows is not None:
        top_ks[greedy_rows] = 1
    return SimpleNamespace(
        is_all_greedy=False,
        is_any_greedy=greedy_rows is not None,
        temperatures=temperatures,
        top_ks=top_ks,
        top_ps=torch.full((bs,), float(top_p)),
        min_ps=torch.zeros(bs),
        need_top_k_sampling=top_k < VOCAB or greedy_rows is not None,
        need_top_p_sampling=top_p < 1.0,
        need_min_p_sampling=False,
    )


def _accept(compact: bool, bs: int, sampling_info, greedy_mask: torch.Tensor):
    """One skipped step of ``bs`` requests, every anchor row carrying LOGITS; returns AcceptOuts."""
    executor = _executor()
    executor.step = CurrentStep()
    executor.step.plan = StepPlan(draft=False, compact_anchor=compact)
    anchors = torch.full((bs,), 3, dtype=torch.int64)
    draft_tokens = anchors[:, None].expand(bs, GAMMA).contiguous()  # GatedDraftBlockProposer's placeholder
    verify_ids = torch.cat([anchors[:, None], draft_tokens], dim=1)
    if compact:
        target_logits = LOGITS.expand(bs, VOCAB).contiguous()
    else:  # upstream's ScatterCompactToStrided: the anchor row, then zero rows
        target_logits = torch.zeros(bs, WIDTH, VOCAB)
        target_logits[:, 0] = LOGITS
        target_logits = target_logits.view(bs * WIDTH, VOCAB)
    draft_block = DraftBlockResult(
        draft_tokens=draft_tokens,
        corrected_logits=None,
        greedy_mask=greedy_mask,
        temperatures=sampling_info.temperatures if sampling_info is not None else torch.ones(bs, 1),
        greedy_draft=True,
    )
    return executor.accept_and_finalize(
        folded_accept=False,
        bs=bs,
        verify_ids_2d=verify_ids,
        target_logits=target_logits,
        draft_block=draft_block,
        sampling_info=sampling_info,
        draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None),
        layout=SimpleNamespace(verify_lens=torch.ones(bs, dtype=torch.int32)),
        prefix_lens=torch.arange(bs, dtype=torch.int64) + 5,
        draft_tokens=draft_tokens,
    )


def _target_law(temperature, top_k=VOCAB, top_p=1.0) -> torch.Tensor:
    """Softmax at the temperature, top-k, then top-p on the renormalised top-k (as the sampled verify forms it)."""
    probs = torch.softmax(LOGITS.double() / temperature, dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[order[:top_k]] = True
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    sorted_probs = probs[order]
    outside = (torch.cumsum(sorted_probs, 0) - sorted_probs) > top_p
    probs[order[outside]] = 0.0
    return probs / probs.sum()


def _counts(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens.reshape(-1), minlength=VOCAB).double()


def _fit_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    if bool(((law == 0) & (counts > 0)).any()):
        return 0.0
    live = law > 0
    return float(stats.chisquare(counts[live].numpy(), (law[live] * counts.sum()).numpy()).pvalue)


def _homogeneity_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    live = (a + b) > 0
    return float(stats.chi2_contingency(torch.stack([a[live], b[live]]).numpy())[1])


def test_greedy_skipped_step_equals_upstream():
    bs = 6
    greedy_mask = torch.ones(bs, dtype=torch.bool)
    ours, upstream = _accept(True, bs, None, greedy_mask), _accept(False, bs, None, greedy_mask)
    argmax = int(torch.argmax(LOGITS))
    assert ours.bonus.tolist() == upstream.bonus.tolist() == [argmax] * bs
    assert ours.commit_lens.tolist() == upstream.commit_lens.tolist() == [1] * bs
    assert torch.equal(ours.new_seq_lens, upstream.new_seq_lens)
    assert torch.equal(ours.out_tokens, upstream.out_tokens) and ours.out_tokens.shape == (bs, WIDTH)


CONFIGS = {
    "T=0.7": dict(temperature=0.7),
    "top_k=4": dict(temperature=1.0, top_k=4),
    "top_p=0.8": dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampled_skipped_step_follows_upstream_law(name):
    config = CONFIGS[name]
    no_greedy = torch.zeros(N, dtype=torch.bool)
    torch.manual_seed(1)
    ours = _accept(True, N, _sampling_info(N, **config), no_greedy)
    theirs = _accept(False, N, _sampling_info(N, **config), no_greedy)
    assert ours.commit_lens.eq(1).all() and ours.out_tokens.shape == (N, WIDTH)
    ours_counts, their_counts = _counts(ours.bonus), _counts(theirs.bonus)
    law = _target_law(**config)
    assert _homogeneity_pvalue(ours_counts, their_counts) > ALPHA, (ours_counts, their_counts)
    assert _fit_pvalue(ours_counts, law) > ALPHA, (ours_counts, law * N)
    assert _fit_pvalue(their_counts, law) > ALPHA  # the reference itself
    # Control: the same counts against the law at the wrong temperature.
    if name == "T=0.7":
        assert _fit_pvalue(ours_counts, _target_law(temperature=1.0)) < 1e-6


def test_mixed_batch_greedy_rows_stay_argmax():
    greedy_rows = torch.arange(N) % 2 == 0
    torch.manual_seed(2)
    ours = _accept(True, N, _sampling_info(N, 1.0, greedy_rows=greedy_rows), greedy_rows)
    assert ours.bonus[greedy_rows].eq(int(torch.argmax(LOGITS))).all()
    assert _fit_pvalue(_counts(ours.bonus[~greedy_rows]), _target_law(1.0)) > ALPHA
