"""Tests for the pure-torch chain speculative sampler (``sglang_dspark.kernels.rejection_sampling``).

Parity (exact equality of predicts, accept_index, accept_token_num, untouched elements included):
  * against SGLang 0.5.23's ``chain_speculative_sampling_triton`` run on CPU under the Triton interpreter
    (``TRITON_INTERPRET=1``, in a subprocess so the flag never leaks into this process): 30 random cases per mode
    (classic chain and block verification) plus the hand-made edge cases. Skips where triton or sglang is missing,
    or where the interpreter cannot run the kernel;
  * against an independent scalar-loop reference written here (always runs): 150 random cases per mode plus the
    edge cases.

Statistics (losslessness): V = 6; Markov target and draft tables (row k depends on draft token k); sparse rows (some
p > 0 where q = 0 and some q > 0 where p = 0); chains of 1..4 draft tokens mixed in one fixed-width batch of S = 5
slots (draft rows past a chain's length are all zero, i.e. always rejected). Each configuration (classic chain with
zero-row padding, classic chain with DSpark's CapCorrectLen truncation, block verification with padding) draws
120 000 requests, 30 000 per chain length. Each request's output is completed to 1 + its chain length tokens with
target samples (what the next rounds would do). Per chain length L, ``scipy.stats.chisquare`` tests (i) the first
emitted token against p of row 0 (6 cells) and (ii) every consecutive pair (y_j, y_j+1), j = 1..L, against the
target chain's joint law (36 cells), i.e. 14 tests per configuration. An outcome of probability zero counts as
p = 0. A configuration fails if any p-value is below ALPHA = 1e-3.

Negative controls, same data: accepting with min(1, q/p), resampling the rejection from p instead of max(p - q, 0)
(both must give p < 1e-6 on the first token for every L), and drawing the final token from the stale row n - 1
(first token still right; some pair test must give p < 1e-6 for every L).

Everything is seeded (torch.Generator), so the results are deterministic.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sglang_dspark.kernels.rejection_sampling import (
    chain_speculative_sampling_torch,
    single_step_output_distribution,
)

ALPHA = 1e-3  # losslessness: reject if p < ALPHA
CONTROL_ALPHA = 1e-6  # negative controls must reach p < CONTROL_ALPHA


# ----------------------------------------------------------------------------------------------------------------------
# Shared driver
# ----------------------------------------------------------------------------------------------------------------------


def _run(fn, inputs, *, block=False, sentinel=-7):
    """Call a sampler with fresh sentinel-filled outputs; returns (predicts, accept_index, accept_token_num)."""
    cand = inputs["candidates"]
    bs, slots = cand.shape
    pred_len = inputs.get("predicts_len", bs * slots)
    predicts = torch.full((pred_len,), sentinel, dtype=torch.int32)
    accept_index = torch.full((bs, slots), sentinel, dtype=torch.int32)
    accept_token_num = torch.full((bs,), sentinel, dtype=torch.int32)
    kwargs = {"block_verification": True} if block else {}
    ret = fn(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=cand,
        retrive_index=inputs["retrive_index"],
        retrive_next_token=inputs.get("retrive_next_token"),
        retrive_next_sibling=inputs.get("retrive_next_sibling"),
        uniform_samples=inputs["uniform_samples"],
        uniform_samples_for_final_sampling=inputs["uniform_final"],
        target_probs=inputs["target_probs"],
        draft_probs=inputs["draft_probs"],
        threshold_single=1.0,
        threshold_acc=1.0,
        deterministic=True,
        **kwargs,
    )
    assert ret is None
    return predicts, accept_index, accept_token_num


def _random_inputs(gen, bs, slots, vocab, *, draft_equals_target=False, sharp=2.0):
    cand = torch.randint(0, vocab, (bs, slots), generator=gen)
    target = torch.softmax(torch.randn(bs, slots, vocab, generator=gen) * sharp, -1)
    if draft_equals_target:
        draft = target[:, : slots - 1].clone()
    else:
        draft = torch.softmax(torch.randn(bs, slots - 1, vocab, generator=gen) * sharp, -1)
    # Draw the drafts from q, as the real draft does, so that chains of acceptances happen.
    for k in range(1, slots):
        cand[:, k] = torch.multinomial(draft[:, k - 1], 1, generator=gen).squeeze(1)
    return {
        "candidates": cand,
        "retrive_index": torch.arange(bs * slots).view(bs, slots),
        "retrive_next_token": None,
        "retrive_next_sibling": None,
        "uniform_samples": torch.rand(bs, slots - 1, generator=gen),
        "uniform_final": torch.rand(bs, generator=gen),
        "target_probs": target,
        "draft_probs": draft,
    }


def _assert_same(a, b, msg=""):
    for name, x, y in zip(("predicts", "accept_index", "accept_token_num"), a, b):
        assert torch.equal(x, y), f"{msg} {name} differs:\n{x}\n{y}"


# ----------------------------------------------------------------------------------------------------------------------
# Independent scalar-loop reference (follows the algorithm description, one request at a time)
# ----------------------------------------------------------------------------------------------------------------------


def scalar_reference(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    draft_probs,
    threshold_single,
    threshold_acc,
    deterministic,
    *,
    block_verification=False,
):
    f32 = np.float32
    cand = candidates.numpy()
    ridx = retrive_index.numpy()
    coins = uniform_samples.numpy().astype(f32)
    final = uniform_samples_for_final_sampling.numpy().astype(f32)
    tp = target_probs.float().numpy()
    dp = draft_probs.float().numpy()
    bs, slots = cand.shape
    vocab = tp.shape[-1]
    nd = slots - 1
    for b in range(bs):
        n, scale = 0, f32(1.0)
        if not block_verification:
            for k in range(1, slots):
                t = cand[b, k]
                p, q = tp[b, k - 1, t], dp[b, k - 1, t]
                if 0 < q <= 1 and f32(coins[b, k - 1] * q) < p:
                    n += 1
                else:
                    break
        else:
            h, hs = f32(1.0), []
            for k in range(1, slots):
                t = cand[b, k]
                p, q = tp[b, k - 1, t], dp[b, k - 1, t]
                h = min(f32(f32(h * p) / q), f32(1.0)) if 0 < q <= 1 else f32(0.0)
                hs.append(h)
            for k in range(nd, 0, -1):
                h, coin = hs[k - 1], coins[b, k - 1]
                if coin < h:
                    acc = h
                    if k < nd and 0 < h < 1:
                        m = f32(sum(max(f32(h * tp[b, k, v]) - dp[b, k, v], f32(0)) for v in range(vocab)))
                        acc = f32(m / f32(f32(m + 1.0) - h))
                    if coin < acc:
                        n, scale = k, h
                        break
        row = tp[b, n].astype(np.float64)
        if n == nd:
            w = row
        else:
            q = dp[b, n].astype(np.float64)
            q = np.where((q >= 0) & (q <= 1), q, 0.0)
            w = np.maximum(float(scale) * row - q, 0.0)
        total = w.sum()
        target = float(final[b]) * total
        tok, c = vocab - 1, 0.0
        for v in range(vocab):
            c += w[v]
            if c > target:
                tok = v
                break
        emitted = [int(x) for x in cand[b, 1 : n + 1]] + [tok]
        for j in range(n + 1):
            predicts[int(ridx[b, j])] = emitted[j]
            accept_index[b, j] = int(ridx[b, j])
        accept_token_num[b] = n


# ----------------------------------------------------------------------------------------------------------------------
# Parity
# ----------------------------------------------------------------------------------------------------------------------


def _random_cases(seed, count):
    gen = torch.Generator().manual_seed(seed)
    for i in range(count):
        bs = int(torch.randint(1, 9, (1,), generator=gen))
        slots = int(torch.randint(1, 9, (1,), generator=gen))
        vocab = int(torch.randint(1, 50, (1,), generator=gen))
        yield i, _random_inputs(gen, bs, slots, vocab, draft_equals_target=(i % 4 == 0), sharp=float(1 + i % 3))


def _edge_cases():
    """Hand-made inputs for the corner cases of the contract."""
    gen = torch.Generator().manual_seed(123)
    cases = {}

    base = _random_inputs(gen, 4, 4, 7)
    q = base["draft_probs"].clone()
    t = base["candidates"][:, 1]
    q[torch.arange(4), 0, t] = 0.0  # q == 0 at the first draft token: certain rejection, residual keeps p(t)
    cases["q_zero_at_token"] = {**base, "draft_probs": q}

    base = _random_inputs(gen, 6, 5, 9)
    q = base["draft_probs"].clone()
    q[0, 0, :] = float("nan")
    q[1, 0, 3] = float("inf")
    q[2, 1, :4] = -0.25
    q[3, 0, base["candidates"][3, 1]] = 1.5  # q > 1 at the token: not a probability, rejected
    q[4, :, :] = 0.0  # all-zero draft rows: always rejected, resample from p row 0
    cases["invalid_q_values"] = {**base, "draft_probs": q}

    base = _random_inputs(gen, 3, 3, 6)
    p = base["target_probs"].clone()
    q = base["draft_probs"].clone()
    cand = base["candidates"].clone()
    cand[:, 1] = 2
    p[:, 0] = 0.0
    q[:, 0] = 0.0  # degenerate residual on rejection: token V - 1
    p[2, 0, 1] = 0.5
    q[2, 0, 1] = 0.5  # still degenerate (p == q)
    cases["degenerate_residual"] = {**base, "candidates": cand, "target_probs": p, "draft_probs": q}

    base = _random_inputs(gen, 5, 3, 8, draft_equals_target=True)
    p = base["target_probs"].clone()
    p[0, 2] = 0.0  # all drafts accepted (q == p) into an all-zero bonus row: token V - 1
    coins = base["uniform_samples"].clone()
    coins[1] = 0.0
    final = base["uniform_final"].clone()
    final[1] = 0.0
    final[2] = 1.0 - 2.0**-24
    final[3] = 0.5
    cases["extreme_coins"] = {**base, "target_probs": p, "uniform_samples": coins, "uniform_final": final}

    base = _random_inputs(gen, 4, 4, 10)
    draft_tokens = base["candidates"][:, 1:]
    one_hot = torch.zeros_like(base["draft_probs"]).scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    cases["greedy_one_hot_draft"] = {**base, "draft_probs": one_hot}

    base = _random_inputs(gen, 5, 1, 11)  # S == 1: no drafts, draft_probs has zero rows
    cases["no_drafts"] = base

    base = _random_inputs(gen, 3, 5, 7)
    wide = torch.rand(3, 5, generator=gen)  # EAGLE passes coins as wide as candidates
    wide[:, :4] = base["uniform_samples"]
    target_t = base["target_probs"].transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous strides
    draft_big = torch.zeros(3, 6, 7)
    draft_big[:, :4] = base["draft_probs"]
    cases["strided_and_wide_inputs"] = {
        **base,
        "candidates": base["candidates"].to(torch.int32),
        "retrive_index": torch.arange(3 * 5).view(3, 5) * 2 + 3,  # sparse positions inside a larger predicts
        "predicts_len": 40,
        "retrive_next_token": torch.arange(1, 6).repeat(3, 1),
        "retrive_next_sibling": torch.full((3, 5), -1),
        "uniform_samples": wide,
        "target_probs": target_t,
        "draft_probs": draft_big[:, :4],
    }

    base = _random_inputs(gen, 3, 3, 5000, sharp=4.0)  # V > 4096: two CDF tiles in the kernel
    cases["two_vocab_tiles"] = base

    base = _random_inputs(gen, 4, 3, 16)
    cases["bf16_probs"] = {
        **base,
        "target_probs": base["target_probs"].to(torch.bfloat16),
        "draft_probs": base["draft_probs"].to(torch.bfloat16),
    }
    return cases


# Block mode differs from the kernel by design for out-of-range q after the accepted prefix (see the docstring).
_BLOCK_SKIP = {"invalid_q_values"}
# bf16 probabilities: the kernel builds the all-accepted bonus CDF in the input dtype (this triton keeps bf16 for
# tl.sum/tl.cumsum) and the interpreter stores bf16 as raw uint16 bits, so it cannot be a reference there. Real
# callers pass fp32 (softmax in fp32); this sampler upcasts, and the scalar reference checks that.
_INTERPRETER_SKIP = {"bf16_probs"}


@pytest.mark.parametrize("block", [False, True], ids=["chain", "block"])
def test_parity_random_vs_scalar_reference(block):
    for i, inputs in _random_cases(seed=11 + block, count=150):
        _assert_same(
            _run(chain_speculative_sampling_torch, inputs, block=block),
            _run(scalar_reference, inputs, block=block),
            f"case {i}",
        )


@pytest.mark.parametrize("block", [False, True], ids=["chain", "block"])
def test_parity_edge_cases_vs_scalar_reference(block):
    for name, inputs in _edge_cases().items():
        if block and name in _BLOCK_SKIP:
            continue
        _assert_same(
            _run(chain_speculative_sampling_torch, inputs, block=block),
            _run(scalar_reference, inputs, block=block),
            name,
        )


# ----------------------------------------------------------------------------------------------------------------------
# The Triton kernel under the interpreter
# ----------------------------------------------------------------------------------------------------------------------


_INTERPRETER_SCRIPT = r"""
import importlib.util, os, sys
import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
workdir = sys.argv[1]
spec = importlib.util.find_spec("sglang")
path = os.path.join(list(spec.submodule_search_locations)[0], "kernels", "ops", "speculative", "reject_sampling.py")
mod_spec = importlib.util.spec_from_file_location("_sglang_reject_sampling_interpreted", path)
module = importlib.util.module_from_spec(mod_spec)
mod_spec.loader.exec_module(module)
kernel = module.speculative_sampling_classic_kernel
assert "Interpret" in type(kernel).__name__, type(kernel)


def run(inputs, block):
    cand = inputs["candidates"]
    bs, slots = cand.shape
    outs = (
        torch.full((inputs.get("predicts_len", bs * slots),), -7, dtype=torch.int32),
        torch.full((bs, slots), -7, dtype=torch.int32),
        torch.full((bs,), -7, dtype=torch.int32),
    )
    module.chain_speculative_sampling_triton(
        *outs, cand, inputs["retrive_index"], inputs.get("retrive_next_token"), inputs.get("retrive_next_sibling"),
        inputs["uniform_samples"], inputs["uniform_final"], inputs["target_probs"], inputs["draft_probs"],
        1.0, 1.0, True, block_verification=block,
    )
    return outs


cases = torch.load(os.path.join(workdir, "cases.pt"), weights_only=False)
try:
    run(cases[0][1], False)
except Exception as exc:
    print(f"SMOKE FAILED: {exc!r}", file=sys.stderr)
    sys.exit(3)
torch.save({name: run(inputs, block) for name, inputs, block in cases}, os.path.join(workdir, "outputs.pt"))
"""


def _parity_case_list():
    cases = []
    for block in (False, True):
        tag = "block" if block else "chain"
        # The interpreter runs ~0.05 s per call, so fewer random cases than against the scalar reference.
        for i, inputs in _random_cases(seed=21 + block, count=30):
            cases.append((f"random-{tag}-{i}", inputs, block))
        for name, inputs in _edge_cases().items():
            if name in _INTERPRETER_SKIP or (block and name in _BLOCK_SKIP):
                continue
            cases.append((f"edge-{tag}-{name}", inputs, block))
    return cases


@pytest.fixture(scope="module")
def interpreter_parity(tmp_path_factory):
    """Run SGLang's chain_speculative_sampling_triton under TRITON_INTERPRET=1 on every parity case.

    A subprocess keeps the interpreter flag (which triton reads both when @triton.jit runs and lazily at launch)
    away from this process. Returns [(name, inputs, block, kernel_outputs)].
    """
    # triton and sglang are part of the test install (scripts/install.sh): their absence is a failure, not a skip.
    assert importlib.util.find_spec("triton") is not None, "triton is not installed"
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    path = os.path.join(
        list(spec.submodule_search_locations)[0], "kernels", "ops", "speculative", "reject_sampling.py"
    )
    assert os.path.exists(path), f"kernel source not found at {path}"
    workdir = tmp_path_factory.mktemp("interpreter_parity")
    cases = _parity_case_list()
    torch.save(cases, workdir / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _INTERPRETER_SCRIPT, str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stderr[-3000:]}"
    outputs = torch.load(workdir / "outputs.pt", weights_only=False)
    return [(name, inputs, block, outputs[name]) for name, inputs, block in cases]


@pytest.mark.parametrize("kind", ["random-chain", "random-block", "edge-chain", "edge-block"])
def test_parity_vs_triton_interpreter(interpreter_parity, kind):
    checked = 0
    for name, inputs, block, kernel_out in interpreter_parity:
        if name.startswith(kind + "-"):
            _assert_same(_run(chain_speculative_sampling_torch, inputs, block=block), kernel_out, name)
            checked += 1
    assert checked > 0


def test_edge_case_outcomes():
    """The documented corner-case behaviour, checked directly (not only by parity)."""
    cases = _edge_cases()
    pred, ai, n = _run(chain_speculative_sampling_torch, cases["degenerate_residual"])
    assert n.tolist() == [0, 0, 0]
    assert pred.view(3, 3)[:, 0].tolist() == [5, 5, 5]  # V - 1
    assert (pred.view(3, 3)[:, 1:] == -7).all() and (ai[:, 1:] == -7).all()  # untouched beyond n

    pred, ai, n = _run(chain_speculative_sampling_torch, cases["invalid_q_values"])
    assert n[0] == 0 and n[3] == 0 and n[4] == 0

    pred, ai, n = _run(chain_speculative_sampling_torch, cases["extreme_coins"])
    assert n[0] == 2 and pred[2] == 7  # all accepted into a zero bonus row -> V - 1
    assert n[1] == 2  # coin 0 accepts any token with p > 0

    pred, ai, n = _run(chain_speculative_sampling_torch, cases["no_drafts"])
    assert (n == 0).all() and torch.equal(ai[:, 0], torch.arange(5, dtype=torch.int32))

    inputs = cases["strided_and_wide_inputs"]
    pred, ai, n = _run(chain_speculative_sampling_torch, inputs)
    for b in range(3):
        assert ai[b, : n[b] + 1].tolist() == inputs["retrive_index"][b, : n[b] + 1].tolist()


def test_bad_retrive_index_raises():
    inputs = _random_inputs(torch.Generator().manual_seed(5), 2, 3, 4)
    inputs["retrive_index"] = torch.full((2, 3), -1)
    with pytest.raises(IndexError):
        _run(chain_speculative_sampling_torch, inputs)


def test_single_step_output_distribution_is_target():
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(50, 9, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(50, 9, generator=gen, dtype=torch.float64) * 2, -1)
    q[:, 0] = 0.0
    q = q / q.sum(-1, keepdim=True)
    dist, acc = single_step_output_distribution(p, q)
    torch.testing.assert_close(dist, p, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc, torch.minimum(p, q).sum(-1), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# Statistical losslessness
# ----------------------------------------------------------------------------------------------------------------------

VOCAB = 6
SLOTS = 5  # up to 4 draft tokens
LENGTHS = (1, 2, 3, 4)
PER_LENGTH = 30_000  # 120 000 requests per configuration


def _sparse_rows(gen, shape, zero_frac=0.25, sharp=1.5):
    rows = torch.softmax(torch.randn(*shape, generator=gen) * sharp, -1).double()
    zero = torch.rand(*shape, generator=gen) < zero_frac
    zero[..., 0] = False  # keep every row non-empty
    rows = rows.masked_fill(zero, 0.0)
    return rows / rows.sum(-1, keepdim=True)


def _make_tables(gen, num_drafts):
    """Markov target/draft: row 0 is fixed, row k depends on draft token k."""
    return {
        "p0": _sparse_rows(gen, (VOCAB,)),
        "P": _sparse_rows(gen, (num_drafts, VOCAB, VOCAB)),  # P[k-1][x_k] = target row k
        "q0": _sparse_rows(gen, (VOCAB,)),
        "Q": _sparse_rows(gen, (max(num_drafts - 1, 0), VOCAB, VOCAB)),  # Q[k-1][x_k] = draft row k
    }


def _sample_rows(rows, gen):
    """One inverse-CDF draw per row (faster than torch.multinomial for many tiny rows)."""
    cdf = rows.cumsum(-1)
    u = torch.rand(rows.shape[0], 1, generator=gen, dtype=cdf.dtype) * cdf[:, -1:]
    return (cdf <= u).sum(-1).clamp(max=rows.shape[-1] - 1)


def _build_batch(gen, tables_by_len, lengths):
    """One fixed-width batch; request r drafts lengths[r] tokens with the tables of that length.

    Draft rows past a request's chain length stay all zero: such a row is always rejected and the final token is
    drawn from the target row itself, so chains of different lengths share one call of the fixed-width sampler.
    """
    n = lengths.numel()
    target = torch.full((n, SLOTS, VOCAB), 1.0 / VOCAB)
    draft = torch.zeros((n, SLOTS - 1, VOCAB))
    cand = torch.zeros((n, SLOTS), dtype=torch.int64)
    for L, tab in tables_by_len.items():
        idx = (lengths == L).nonzero().squeeze(1)
        target[idx, 0] = tab["p0"].float()
        q_row = tab["q0"].expand(idx.numel(), VOCAB)
        for k in range(1, L + 1):
            draft[idx, k - 1] = q_row.float()
            x = _sample_rows(q_row, gen)
            cand[idx, k] = x
            target[idx, k] = tab["P"][k - 1][x].float()
            if k < L:
                q_row = tab["Q"][k - 1][x]
    return {
        "candidates": cand,
        "retrive_index": torch.arange(n * SLOTS).view(n, SLOTS),
        "uniform_samples": torch.rand(n, SLOTS - 1, generator=gen),
        "uniform_final": torch.rand(n, generator=gen),
        "target_probs": target,
        "draft_probs": draft,
    }


def _completed_sequences(gen, tables_by_len, lengths, predicts, accept_index, accept_num, cap=None):
    """(N, 1 + max length) tokens: the emitted ones, then target samples up to 1 + lengths[r] (as later rounds would).

    cap: DSpark's CapCorrectLen (compact verify); keep at most cap[r] drafts, the token after them is the bonus.
    Entries past 1 + lengths[r] are -1.
    """
    n = accept_num.long()
    if cap is not None:
        n = torch.minimum(n, cap)
    ai = accept_index.long()
    seq = torch.full((lengths.numel(), SLOTS), -1, dtype=torch.long)
    for j in range(SLOTS):
        emitted = j <= n
        seq[emitted, j] = predicts[ai[emitted, j]].long()
    for L, tab in tables_by_len.items():
        for j in range(1, L + 1):
            idx = ((lengths == L) & (j > n)).nonzero().squeeze(1)
            if idx.numel():
                seq[idx, j] = _sample_rows(tab["P"][j - 1][seq[idx, j - 1]], gen)
    return seq


def _chisq(samples, probs):
    """Pearson chi-square p-value of integer samples against a probability vector.

    An outcome of probability 0 that occurs at all is a certain rejection: p-value 0.
    """
    from scipy.stats import chisquare
    probs = probs.double().flatten()
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    zero = probs <= 0
    if counts[zero].sum() > 0:
        return 0.0
    f_obs = counts[~zero].numpy()
    f_exp = (probs[~zero] / probs[~zero].sum() * counts.sum()).numpy()
    return chisquare(f_obs, f_exp).pvalue


def _lossless_pvalues(sampler, *, block=False, mode="pad", seed=0):
    """Returns {(chain length, test): p-value}; test is "first" (y1 vs p0) or "pair j" ((y_j, y_j+1) vs target)."""
    gen = torch.Generator().manual_seed(seed)
    if mode == "pad":
        tables = {L: _make_tables(gen, L) for L in LENGTHS}
        lengths = torch.tensor(LENGTHS).repeat_interleave(PER_LENGTH)
        lengths = lengths[torch.randperm(lengths.numel(), generator=gen)]  # lengths vary inside the batch
        cap = None
        groups = lengths
    else:  # "cap": every request drafts 4 tokens; a per-request cap of 1..4 drafts truncates afterwards
        tables = {max(LENGTHS): _make_tables(gen, max(LENGTHS))}
        lengths = torch.full((len(LENGTHS) * PER_LENGTH,), max(LENGTHS))
        cap = torch.tensor(LENGTHS).repeat_interleave(PER_LENGTH)
        cap = cap[torch.randperm(cap.numel(), generator=gen)]
        groups = cap
    batch = _build_batch(gen, tables, lengths)
    predicts, accept_index, accept_num = _run(sampler, batch, block=block, sentinel=0)
    seq = _completed_sequences(gen, tables, lengths, predicts, accept_index, accept_num, cap)
    out = {}
    for L in LENGTHS:
        tab = tables[L] if mode == "pad" else tables[max(LENGTHS)]
        sel = (groups == L).nonzero().squeeze(1)
        out[(L, "first")] = _chisq(seq[sel, 0], tab["p0"])
        marginal = tab["p0"]  # law of y_j under the target chain
        for j in range(1, L + 1):
            joint = marginal.unsqueeze(1) * tab["P"][j - 1]  # P(y_j = a, y_j+1 = b)
            out[(L, f"pair {j}")] = _chisq(seq[sel, j - 1] * VOCAB + seq[sel, j], joint)
            marginal = joint.sum(0)
    return out


@pytest.mark.parametrize(
    "block,mode",
    [(False, "pad"), (False, "cap"), (True, "pad")],
    ids=["chain-padded", "chain-capped", "block-padded"],
)
def test_lossless_statistics(block, mode):
    pvalues = _lossless_pvalues(chain_speculative_sampling_torch, block=block, mode=mode, seed=100 + 7 * block)
    print(f"\n[{'block' if block else 'chain'}/{mode}] n={PER_LENGTH} per length:", _fmt(pvalues))
    bad = {k: v for k, v in pvalues.items() if not v >= ALPHA}
    assert not bad, f"losslessness rejected at p < {ALPHA}: {bad}"


def _fmt(pvalues):
    return ", ".join(f"L{L}/{kind}={p:.3g}" for (L, kind), p in sorted(pvalues.items()))


def biased_chain_sampler(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    draft_probs,
    threshold_single,
    threshold_acc,
    deterministic,
    *,
    block_verification=False,
    rule="q_over_p",
):
    """A deliberately wrong vectorised chain sampler (negative control).

    rule="q_over_p": accept with probability min(1, q/p) instead of min(1, p/q);
    rule="residual_from_p": correct acceptance, but the rejection resample is drawn from p instead of max(p - q, 0).
    rule="stale_row": correct acceptance, but the final token uses the rows of the last accepted draft (n - 1)
    instead of row n: the first token is still right, only the pair tests can catch it.
    """
    bs, slots = candidates.shape
    rows = torch.arange(bs)
    tokens = candidates[:, 1:].long()
    p_tok = target_probs[:, : slots - 1].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q_tok = draft_probs[:, : slots - 1].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    coins = uniform_samples[:, : slots - 1]
    if rule == "q_over_p":
        ok = (p_tok > 0) & (coins * p_tok < q_tok)
    else:
        ok = (q_tok > 0) & (coins * q_tok < p_tok)
    n = ok.int().cumprod(1).sum(1).long()
    row = (n - 1).clamp(min=0) if rule == "stale_row" else n
    p_row = target_probs[rows, row]
    q_row = draft_probs[rows, row.clamp(max=slots - 2)]
    resid = p_row if rule == "residual_from_p" else (p_row - q_row).clamp_min(0)
    weights = torch.where((n == slots - 1).unsqueeze(1), p_row, resid)
    cdf = weights.cumsum(-1)
    final = (cdf > (uniform_samples_for_final_sampling * cdf[:, -1]).unsqueeze(1)).int().argmax(-1)
    values = torch.cat([tokens, torch.zeros(bs, 1, dtype=torch.long)], 1)
    values[rows, n] = final
    keep = torch.arange(slots).unsqueeze(0) <= n.unsqueeze(1)
    predicts[retrive_index[keep]] = values[keep].to(predicts.dtype)
    accept_index[keep] = retrive_index[keep].to(accept_index.dtype)
    accept_token_num[:] = n.to(accept_token_num.dtype)


@pytest.mark.parametrize("rule", ["q_over_p", "residual_from_p", "stale_row"])
def test_negative_control_detected(rule):
    def sampler(**kw):
        return biased_chain_sampler(**kw, rule=rule)

    pvalues = _lossless_pvalues(sampler, mode="pad", seed=100)
    print(f"\n[control {rule}] n={PER_LENGTH} per length:", _fmt(pvalues))
    if rule == "stale_row":
        # Row 0 is never stale, so the first token is right; some later pair must expose the bug.
        worst = {L: min(v for (l, kind), v in pvalues.items() if l == L and kind != "first") for L in LENGTHS}
        assert max(worst.values()) < CONTROL_ALPHA, f"stale-row sampler not detected on every chain length: {worst}"
    else:
        first = {k: v for k, v in pvalues.items() if k[1] == "first"}
        assert max(first.values()) < CONTROL_ALPHA, f"biased sampler not detected on every chain length: {first}"
