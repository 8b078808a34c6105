"""The frequency-ranked draft vocabulary (``sglang_dspark/draft/hot_vocab.py``, ``patches/hot_vocab.py``).

* Maths: hot logits / Markov bias equal the full products on the hot columns, ``-inf`` / 0 elsewhere; the drafted
  token is always hot; the hooks on SGLang's real ``VanillaMarkov`` give the same bias.
* Lossless under sampling (the claim the module docstring proves): N = 30 000 requests with one draft token each,
  drafted at T = 0.7 from the hot-restricted step logits and accepted by upstream's own ``accept_draft_tokens``
  (sglang-dspark's torch chain sampler, as on the CPU platform) with those logits as the draft distribution. The first
  emitted token passes Pearson's chi-square goodness of fit against the target law at p > 1e-3. The hot set leaves out
  the target's second most likely token, so the residual must carry it. Control: the same drafts declared with the
  unrestricted logits (q > 0 outside H, never proposed) must fail with p < 1e-6. Seeded, so deterministic.
* The CPU's hot-space Markov loop (``sample_draft_block_in_hot_space``) drafts the same tokens and keeps the same step
  logits, bit for bit, as upstream's wide loop with the hot hooks: greedy and sampled blocks, one and several rows,
  mixed temperatures, over consecutive blocks (the noise offset advances alike); it stands aside off the CPU's Markov
  step and for a draft without a hot set.
* Files: every way a shipped file can be wrong raises a ``HotVocabError`` that names the file and the fix.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from scipy import stats

from sglang.kernels.ops.speculative.dspark import dspark_accept
from sglang.srt.models.dspark import VanillaMarkov
from sglang.srt.speculative.dspark_components import dspark_draft
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult, DraftNoise
from sglang.srt.speculative.dspark_components.dspark_verify import accept_draft_tokens
from sglang_dspark.cpu.packed_linear import pack_weight, packing_available
from sglang_dspark.draft.hot_vocab import (
    HOT_VOCAB_FILE,
    HotVocab,
    HotVocabError,
    build_hot_vocab,
    hot_coverage,
    hot_logits,
    hot_markov_bias,
    hot_markov_bias_columns,
    load_hot_vocab,
)
from sglang_dspark.kernels.rejection_sampling import chain_speculative_sampling_torch
from sglang_dspark.patches import hot_vocab as hot_patch

V = 10
N = 30_000
ALPHA = 1e-3
TEMPERATURE = 0.7
TARGET_LOGITS = torch.tensor([2.0, 1.6, 1.1, 0.9, 0.5, 0.0, -0.4, -1.0, -1.5, -3.0])
HOT = torch.tensor([0, 2, 3, 6, 8])  # token 1 (the target's second choice) is cold


def _draft_weights(seed=0, d=16, r=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, d, generator=g), torch.randn(V, r, generator=g), torch.randn(3, d, generator=g)


def test_hot_products_equal_full_products_on_hot_columns():
    lm, w2, hidden = _draft_weights()
    latent = torch.randn(3, w2.shape[1])
    logits = hot_logits(hidden, lm[HOT], HOT, V)
    bias = hot_markov_bias(latent, w2[HOT], HOT, V)
    cold = torch.ones(V, dtype=torch.bool)
    cold[HOT] = False
    assert torch.allclose(logits[:, HOT], hidden @ lm[HOT].T) and torch.isneginf(logits[:, cold]).all()
    assert torch.allclose(bias[:, HOT], latent @ w2[HOT].T) and (bias[:, cold] == 0).all()
    step = logits + bias
    assert torch.isin(step.argmax(dim=1), HOT).all()  # greedy drafts are hot
    assert torch.equal(step.argmax(dim=1), HOT[(hidden @ lm[HOT].T + latent @ w2[HOT].T).argmax(dim=1)])
    sampled = torch.multinomial(torch.softmax(step / TEMPERATURE, dim=-1), 200, replacement=True)
    assert torch.isin(sampled, HOT).all()  # and so are sampled ones


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN linear")
def test_hot_products_through_packed_rows_match():
    """The CPU platform packs the hot rows for oneDNN (patches/hot_vocab.py); same products, -inf / 0 elsewhere."""
    lm, w2, hidden = _draft_weights(seed=5)
    latent = torch.randn(3, w2.shape[1])
    plain = hot_logits(hidden, lm[HOT], HOT, V), hot_markov_bias(latent, w2[HOT], HOT, V)
    packed = (hot_logits(hidden, lm[HOT], HOT, V, pack_weight(lm[HOT].contiguous())),
              hot_markov_bias(latent, w2[HOT], HOT, V, pack_weight(w2[HOT].contiguous())))
    for got, want in zip(packed, plain):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_row_markov_bias_reads_the_transposed_rows():
    """One user's Markov slots multiply a single row: that product goes through ``hot_w2ᵀ`` stored contiguous (a
    plain GEMV, faster than oneDNN's blocked layout for the rank-64 latent); two rows or more keep the packed path."""
    _, w2, _ = _draft_weights(seed=9)
    rows = w2[HOT].contiguous()
    for n in (1, 2, 5):
        latent = torch.randn(n, w2.shape[1])
        got = hot_markov_bias(latent, rows, HOT, V, hot_w2_t=rows.T.contiguous())
        torch.testing.assert_close(got, hot_markov_bias(latent, rows, HOT, V), rtol=1e-5, atol=1e-5)
    # Routing: a stand-in transposed weight (twice the true one) shows which product ran.
    doubled = 2 * rows.T.contiguous()
    one, two = torch.randn(1, w2.shape[1]), torch.randn(2, w2.shape[1])
    torch.testing.assert_close(hot_markov_bias_columns(one, rows, hot_w2_t=doubled), 2 * (one @ rows.T))
    torch.testing.assert_close(hot_markov_bias_columns(two, rows, hot_w2_t=doubled), two @ rows.T)
    # Kept only where the CPU's loop reads it, and only when asked for (the LM head's rows are 7 at a time).
    assert hot_patch._hot_rows(HOT, w2, V).transposed is None
    kept = hot_patch._hot_rows(HOT, w2, V, one_row_layout=True)
    assert torch.equal(kept.transposed, kept.weight.T) and kept.transposed.is_contiguous()


def test_hook_on_sglang_markov_head_gives_the_hot_bias():
    head = VanillaMarkov(vocab_size=V, markov_rank=4)
    torch.nn.init.normal_(head.markov_w1.weight)
    torch.nn.init.normal_(head.markov_w2.weight)
    prev = torch.tensor([1, 4, 9])
    full, _ = VanillaMarkov.step_bias(head, prev, hidden_states=None, state=None)
    original = VanillaMarkov.step_bias
    unmarked, _ = hot_patch.step_bias_over_hot_vocab(original, head, prev, hidden_states=None, state=None)
    assert torch.equal(unmarked, full)  # an unmarked head is untouched
    assert hot_patch.greedy_w2_weight_unless_hot(VanillaMarkov.greedy_w2_weight, head) is head.markov_w2.weight
    head._dspark_hot = hot_patch._HotRows(HOT, head.markov_w2.weight[HOT].detach(), V)
    hot, state = hot_patch.step_bias_over_hot_vocab(original, head, prev, hidden_states=None, state="s")
    assert state == "s" and torch.allclose(hot[:, HOT], full[:, HOT].detach()) and (hot[:, 1] == 0).all()
    assert hot_patch.greedy_w2_weight_unless_hot(VanillaMarkov.greedy_w2_weight, head) is None


class _NoTpSync:
    def sync(self, site, tokens):
        return tokens


def _wide_markov_step(cls, **kwargs):
    """Upstream's ``MarkovSampleStep`` as the CPU platform runs it (``cpu_dspark.markov_step_on_cpu``)."""
    from sglang_dspark.patches import cpu_dspark

    return cpu_dspark.markov_step_on_cpu(None, cls, **kwargs)


def _blocks(sample, head, draft, hidden, anchors, sampling_info, greedy_draft, keep_columns=True, blocks=3):
    """Consecutive draft blocks as ``propose`` runs them: base logits through the hot hook, then the Markov loop."""
    noise = DraftNoise(key=1234, offset=torch.zeros(1, dtype=torch.int64))
    out = []
    for b in range(blocks):
        wide, _ = hot_patch.compute_base_logits_over_hot_vocab(None, draft, hidden[b])
        if not keep_columns:
            head.__dict__.pop(hot_patch._BLOCK_COLUMNS)
        out.append(sample(base_logits=wide.view(anchors[b].shape[0], -1, wide.shape[-1]), anchor_tokens=anchors[b],
                          draft_hidden=None, sampling_info=sampling_info, markov_head=head, noise=noise, device="cpu",
                          tp_sync=_NoTpSync(), greedy_draft=greedy_draft))
    return out, int(noise.offset)


@pytest.mark.parametrize("bs, temperatures, greedy_draft", [
    (1, [0.0], True), (4, [0.0] * 4, True), (1, [0.8], False), (5, [0.0, 0.7, 1.0, 0.0, 1.3], False),
])
def test_hot_space_loop_drafts_what_the_wide_loop_drafts(monkeypatch, bs, temperatures, greedy_draft):
    from sglang.kernels.ops.speculative.dspark.markov_sample import MarkovSampleStep
    from sglang_dspark.patches import cpu_dspark

    vocab, gamma, d = 200, 6, 12
    gen = torch.Generator().manual_seed(bs)
    hot_ids = torch.randperm(vocab, generator=gen)[:37]  # frequency order: not sorted
    head = VanillaMarkov(vocab_size=vocab, markov_rank=8)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.randn(head.markov_w1.weight.shape, generator=gen))
        head.markov_w2.weight.copy_(torch.randn(head.markov_w2.weight.shape, generator=gen))
    head._dspark_hot = hot_patch._hot_rows(hot_ids, head.markov_w2.weight.detach(), vocab, one_row_layout=True)
    assert head._dspark_hot.transposed is not None  # as served: one-row Markov products over the transposed rows
    draft = SimpleNamespace(markov_head=head, logits_mup_width_multiplier=None,
                            _dspark_hot=hot_patch._hot_rows(hot_ids, 3 * torch.randn(vocab, d, generator=gen), vocab))
    hidden = [torch.randn(bs * gamma, d, generator=gen) for _ in range(3)]
    anchors = [torch.randint(vocab, (bs,), generator=gen) for _ in range(3)]
    sampling_info = SimpleNamespace(temperatures=torch.tensor(temperatures).view(-1, 1),
                                    top_ks=torch.tensor([1 if t == 0 else 50 for t in temperatures]))
    monkeypatch.setattr(MarkovSampleStep, "torch", classmethod(_wide_markov_step))
    monkeypatch.setattr(VanillaMarkov, "step_bias", lambda self, prev, *, hidden_states, state:
                        hot_patch.step_bias_over_hot_vocab(None, self, prev, hidden_states=hidden_states, state=state))
    monkeypatch.setattr(VanillaMarkov, "greedy_w2_weight", lambda self: None)
    wide_loop = inspect.unwrap(dspark_draft.sample_draft_block)
    want, want_offset = _blocks(wide_loop, head, draft, hidden, anchors, sampling_info, greedy_draft)

    monkeypatch.setattr(cpu_dspark.apply, "ran", lambda: True)
    hot_loop = lambda **kw: hot_patch.sample_draft_block_in_hot_space(wide_loop, **kw)  # noqa: E731
    for keep_columns in (True, False):  # the base logits' hot columns as kept, or gathered from the wide tensor
        got, got_offset = _blocks(hot_loop, head, draft, hidden, anchors, sampling_info, greedy_draft, keep_columns)
        assert got_offset == want_offset == (0 if greedy_draft else 3)
        for g, w in zip(got, want):
            assert torch.equal(g.draft_tokens, w.draft_tokens) and torch.isin(g.draft_tokens, hot_ids).all()
            assert torch.equal(g.greedy_mask, w.greedy_mask) and torch.equal(g.temperatures, w.temperatures)
            if greedy_draft:
                assert g.corrected_logits is None and w.corrected_logits is None
            else:
                assert g.corrected_logits.shape == w.corrected_logits.shape == (bs, gamma, vocab)
                assert torch.equal(g.corrected_logits, w.corrected_logits)
    if not greedy_draft:  # sampled rows really sampled: not every token is the row's argmax
        argmax = torch.stack([w.corrected_logits.argmax(-1) for w in want])
        drafted = torch.stack([w.draft_tokens for w in want])
        sampled_rows = torch.tensor(temperatures) != 0
        assert (argmax != drafted)[:, sampled_rows].any()

    # Stands aside: off the CPU's Markov step (upstream's wide loop runs), and for a head without a hot set.
    monkeypatch.setattr(cpu_dspark.apply, "ran", lambda: False)
    calls = []
    passthrough = lambda **kw: calls.append(kw) or "wide"  # noqa: E731
    stand_aside = lambda **kw: hot_patch.sample_draft_block_in_hot_space(passthrough, **kw)  # noqa: E731
    assert _blocks(stand_aside, head, draft, hidden, anchors, sampling_info, greedy_draft, blocks=1)[0] == ["wide"]
    monkeypatch.setattr(cpu_dspark.apply, "ran", lambda: True)
    del head._dspark_hot
    assert _blocks(stand_aside, head, draft, hidden, anchors, sampling_info, greedy_draft, blocks=1)[0] == ["wide"]
    assert len(calls) == 2


def test_hot_loop_reads_the_kept_columns_only_for_their_own_block():
    hot = hot_patch._hot_rows(torch.tensor([7, 2, 5]), torch.randn(10, 4), 10)
    columns = torch.randn(6, 3)
    wide = hot_patch.widen(columns, hot.ids, 10, float("-inf"))
    kept = hot_patch._hot_base_columns(wide.view(2, 3, 10), hot, (wide, columns))
    assert kept.data_ptr() == columns.data_ptr() and kept.shape == (2, 3, 3)  # no gather
    other = wide.clone()  # another block's wide tensor: gathered from it, not the stale columns
    gathered = hot_patch._hot_base_columns(other.view(2, 3, 10), hot, (wide, columns))
    assert gathered.data_ptr() != columns.data_ptr() and torch.equal(gathered, columns.view(2, 3, 3))
    assert torch.equal(hot_patch._hot_base_columns(other.view(2, 3, 10), hot, None), columns.view(2, 3, 3))


def _first_tokens(declared_logits: torch.Tensor, proposal_logits: torch.Tensor, seed: int) -> torch.Tensor:
    """One draft token per request, sampled from softmax(proposal / T); accepted by upstream with ``declared`` as the
    draft's step logits; returns each request's first emitted token."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the chain sampler's uniforms
    draft = torch.multinomial(torch.softmax(proposal_logits / TEMPERATURE, -1), N, replacement=True,
                              generator=gen).view(N, 1)
    sampling = SimpleNamespace(
        is_all_greedy=False, is_any_greedy=False, temperatures=torch.full((N, 1), TEMPERATURE),
        top_ks=torch.full((N,), V, dtype=torch.int32), top_ps=torch.ones(N), min_ps=torch.zeros(N),
        need_top_k_sampling=False, need_top_p_sampling=False, need_min_p_sampling=False,
    )
    block = DraftBlockResult(
        draft_tokens=draft, corrected_logits=declared_logits.expand(N, 1, V).contiguous(),
        greedy_mask=torch.zeros(N, dtype=torch.bool), temperatures=sampling.temperatures, greedy_draft=False,
    )
    # Row 0: the anchor's target logits (the law checked); row 1: the next position's (any law).
    target = torch.stack([TARGET_LOGITS, TARGET_LOGITS.flip(0)]).repeat(N, 1)
    accepted, bonus, _ = accept_draft_tokens(
        candidates=torch.cat([torch.full((N, 1), 3), draft], dim=1), target_logits=target, draft_block=block,
        sampling_info=sampling, draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None), gamma=1,
        verify_num_draft_tokens=2,
    )
    return torch.where(accepted > 0, draft.view(-1), bonus)


def _fit_pvalue(tokens: torch.Tensor) -> float:
    law = torch.softmax(TARGET_LOGITS.double() / TEMPERATURE, -1)
    counts = torch.bincount(tokens, minlength=V).double()
    return float(stats.chisquare(counts.numpy(), (law * N).numpy()).pvalue)


def test_sampled_verify_with_hot_drafts_is_lossless(monkeypatch):
    monkeypatch.setattr(dspark_accept, "chain_speculative_sampling_triton", chain_speculative_sampling_torch)
    lm, w2, hidden = _draft_weights(seed=3)
    latent = torch.randn(1, w2.shape[1], generator=torch.Generator().manual_seed(4))
    step = (hot_logits(hidden[:1], lm[HOT], HOT, V) + hot_markov_bias(latent, w2[HOT], HOT, V))[0]
    tokens = _first_tokens(step, step, seed=5)
    assert _fit_pvalue(tokens) > ALPHA
    assert (tokens == 1).sum() > 0.1 * N  # the cold second choice comes out of the residual
    # Control: declaring the unrestricted logits (q > 0 on cold tokens that are never proposed) biases the output.
    full = (hidden[:1] @ lm.T + latent @ w2.T)[0]
    full_hot_part = torch.full((V,), float("-inf"))
    full_hot_part[HOT] = full[HOT]
    assert _fit_pvalue(_first_tokens(full, full_hot_part, seed=5)) < 1e-6


def test_build_ranks_by_frequency_with_special_tokens_first():
    counts = Counter({5: 10, 7: 30, 2: 10, 9: 1})
    hot = build_hot_vocab(counts, 4, V, always=[0])
    assert hot.token_ids.tolist() == [0, 7, 2, 5]  # ties: lower id first
    assert hot_coverage(hot, [7, 7, 9, 5]) == pytest.approx(0.75)
    assert build_hot_vocab(Counter({3: 1}), 3, V).token_ids.tolist() == [3, 0, 1]  # filled with unseen ids
    with pytest.raises(HotVocabError, match="size"):
        build_hot_vocab(counts, V + 1, V)


def _write(tmp_path, payload) -> None:
    (tmp_path / HOT_VOCAB_FILE).write_text(payload if isinstance(payload, str) else json.dumps(payload))


def test_load_round_trip_and_absence(tmp_path):
    assert load_hot_vocab(tmp_path, V) is None  # a draft without a hot set runs as before
    hot = HotVocab(HOT, V, {"source": ["x.jsonl"]})
    _write(tmp_path, hot.to_json())
    loaded = load_hot_vocab(tmp_path, V)
    assert torch.equal(loaded.token_ids, HOT) and loaded.meta == {"source": ["x.jsonl"]}


@pytest.mark.parametrize("payload, message", [
    ("{not json", "not a hot-vocabulary file"),
    ({"vocab_size": V}, "not a hot-vocabulary file"),
    ({"vocab_size": V + 1, "token_ids": [1, 2]}, "made for a 11-token vocabulary"),
    ({"vocab_size": V, "token_ids": [1, 10]}, "another tokenizer"),
    ({"vocab_size": V, "token_ids": [1, 1]}, "distinct"),
    ({"vocab_size": V, "token_ids": []}, "non-empty"),
])
def test_bad_files_name_the_file_and_the_fix(tmp_path, payload, message):
    _write(tmp_path, payload)
    with pytest.raises(HotVocabError, match=message) as err:
        load_hot_vocab(tmp_path, V)
    assert HOT_VOCAB_FILE in str(err.value)
