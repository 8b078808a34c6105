"""Tests for the pure-torch target-only tree sampler (``sglang_dspark.kernels.tree_sampling``).

Greedy parity (exact equality of predicts, accept_index, accept_token_num, untouched elements included): with
one-hot target rows the sampler must walk every tree exactly as the greedy tree verify does (our CPU
``verify_tree_greedy_cpu``, itself checked against an independent walk in ``tests/unit/cpu/test_cpu_standin.py``):
40 random trees of 8 nodes, a 5-token vocabulary (frequent matches and sibling scans), random coins.

Losslessness (the Appendix-A check for the NGRAM / EAGLE verify on the CPU): one fixed tree of 7 nodes over V = 6
(siblings at two levels, a child whose token has zero target probability, a leaf before the depth limit, a chain
reaching the depth limit so the bonus row is used), sparse random target rows. N = 100 000 requests in one batch,
each with fresh coins. Every emitted sequence (1 to 4 tokens) is one category; its expected probability is the
product of the target's conditionals along it (what decoding without speculation emits). Pearson's chi-square
goodness of fit (``scipy.stats.chisquare``; categories with an expected count below 5 pooled) must give
p > ALPHA = 1e-3. Power: the same test on the same tree, with 20 000 requests, must reject (p < 1e-6) two biased
samplers, the kernel's
own lossy modes (``threshold_acc = 0.5``: children accepted twice as often; ``threshold_single = 0.2``: any child
above 0.2 accepted outright). Everything is seeded, so the results are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_dspark.cpu.sgl_kernel_standin.speculative_ops import verify_tree_greedy_cpu
from sglang_dspark.kernels.tree_sampling import tree_speculative_sampling_target_only_torch

ALPHA = 1e-3
CONTROL_ALPHA = 1e-6
N = 100_000
CONTROL_N = 20_000
SENTINEL = -7


def tree_links(parents: list[int]) -> tuple[list[int], list[int]]:
    """(first child, next sibling) per node from parent pointers (node 0 is the root; children in index order)."""
    first_child, next_sibling = [-1] * len(parents), [-1] * len(parents)
    last_child: dict[int, int] = {}
    for node, parent in enumerate(parents):
        if node == 0:
            continue
        if parent in last_child:
            next_sibling[last_child[parent]] = node
        else:
            first_child[parent] = node
        last_child[parent] = node
    return first_child, next_sibling


def run_sampler(candidates, parents_per_request, target_probs, coins, final_coins, depth, **thresholds):
    bs, nodes = candidates.shape
    links = [tree_links(parents) for parents in parents_per_request]
    next_token = torch.tensor([first for first, _ in links], dtype=torch.int64)
    next_sibling = torch.tensor([sibling for _, sibling in links], dtype=torch.int64)
    retrive_index = torch.arange(bs * nodes, dtype=torch.int64).view(bs, nodes)
    predicts = torch.full((bs * nodes,), SENTINEL, dtype=torch.int32)
    accept_index = torch.full((bs, depth + 1), SENTINEL, dtype=torch.int32)
    accept_token_num = torch.full((bs,), SENTINEL, dtype=torch.int32)
    tree_speculative_sampling_target_only_torch(
        predicts, accept_index, accept_token_num, candidates, retrive_index, next_token, next_sibling, coins,
        final_coins, target_probs, torch.zeros_like(target_probs), **thresholds)
    return predicts, accept_index, accept_token_num, (retrive_index, next_token, next_sibling)


def random_parents(gen, nodes: int) -> list[int]:
    return [0] + [int(torch.randint(0, node, (1,), generator=gen)) for node in range(1, nodes)]


def tree_depth(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for node in range(1, len(parents)):
        depth[node] = depth[parents[node]] + 1
    return max(depth)


def test_one_hot_targets_walk_the_tree_as_the_greedy_verify_does():
    gen = torch.Generator().manual_seed(3)
    bs, nodes, vocab = 40, 8, 5
    parents = [random_parents(gen, nodes) for _ in range(bs)]
    depth = max(tree_depth(p) for p in parents)
    candidates = torch.randint(0, vocab, (bs, nodes), generator=gen)
    argmax = torch.randint(0, vocab, (bs, nodes), generator=gen)
    one_hot = torch.nn.functional.one_hot(argmax, vocab).to(torch.float32)
    coins = torch.rand((bs, nodes), generator=gen)
    final_coins = torch.rand((bs,), generator=gen)
    predicts, accept_index, accept_num, (ridx, next_token, next_sibling) = run_sampler(
        candidates, parents, one_hot, coins, final_coins, depth)

    greedy_predicts = torch.full((bs * nodes,), SENTINEL, dtype=torch.int32)
    greedy_index = torch.full((bs, depth + 1), SENTINEL, dtype=torch.int32)
    greedy_num = torch.full((bs,), SENTINEL, dtype=torch.int32)
    verify_tree_greedy_cpu(predicts=greedy_predicts, accept_index=greedy_index, accept_token_num=greedy_num,
                           candidates=candidates, retrive_index=ridx, retrive_next_token=next_token,
                           retrive_next_sibling=next_sibling, target_predict=argmax)
    assert torch.equal(accept_num, greedy_num)
    assert torch.equal(accept_index, greedy_index)
    assert torch.equal(predicts, greedy_predicts)
    assert int(accept_num.max()) >= 2  # the seed exercises real acceptances past the first level


# The fixed tree of the law test: node -> parent, and each node's token.
#        root(0)
#      /    |     \
#   1:t2  2:t3   3:t5 (p = 0 under the root: never accepted)
#    |  \
#  4:t1 5:t0 (5 is a leaf before the depth limit)
#    |
#  6:t4  (depth 3 = the limit: its row is the bonus row)
LAW_PARENTS = [0, 0, 0, 0, 1, 1, 4]
LAW_TOKENS = [0, 2, 3, 5, 1, 0, 4]
LAW_DEPTH = 3
VOCAB = 6


def law_rows(gen) -> torch.Tensor:
    rows = torch.distributions.Dirichlet(torch.full((VOCAB,), 0.7, dtype=torch.float64)).sample((len(LAW_PARENTS),))
    rows[0, 5] = 0.0  # node 3's token is impossible under the root
    rows[1, 2] = 0.0  # a zero the residual must keep at zero
    return rows / rows.sum(dim=-1, keepdim=True)


def expected_law(rows: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Every emitted sequence with the target's probability of it (product of its conditionals)."""
    first_child, next_sibling = tree_links(LAW_PARENTS)

    def walk(node: int, levels_left: int) -> dict[tuple[int, ...], float]:
        p = rows[node].tolist()
        children = []
        child = first_child[node] if levels_left > 0 else -1
        while child != -1:
            children.append(child)
            child = next_sibling[child]
        law: dict[tuple[int, ...], float] = {}
        child_tokens = {LAW_TOKENS[c] for c in children}
        for token in range(VOCAB):
            if token not in child_tokens and p[token] > 0:
                law[(token,)] = p[token]
        for child in children:
            for rest, prob in walk(child, levels_left - 1).items():
                law[(LAW_TOKENS[child], *rest)] = p[LAW_TOKENS[child]] * prob
        return {seq: prob for seq, prob in law.items() if prob > 0}

    return walk(0, LAW_DEPTH)


def sample_sequences(rows, seed, n, **thresholds) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    candidates = torch.tensor([LAW_TOKENS] * n, dtype=torch.int64)
    target = rows.unsqueeze(0).expand(n, -1, -1)
    coins = torch.rand((n, len(LAW_PARENTS)), generator=gen)
    final_coins = torch.rand((n,), generator=gen)
    predicts, accept_index, accept_num, _ = run_sampler(
        candidates, [LAW_PARENTS] * n, target, coins, final_coins, LAW_DEPTH, **thresholds)
    flat = predicts.tolist()
    return [tuple(flat[i] for i in accept_index[b, : n + 1].tolist()) for b, n in enumerate(accept_num.tolist())]


def goodness_of_fit(sequences, law) -> float:
    from scipy.stats import chisquare

    observed: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        observed[seq] = observed.get(seq, 0) + 1
    assert set(observed) <= set(law), set(observed) - set(law)  # never a sequence the target cannot emit
    cells = sorted(law, key=law.get, reverse=True)
    expected = np.array([law[c] * len(sequences) for c in cells])
    counts = np.array([observed.get(c, 0) for c in cells], dtype=float)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        counts = np.append(counts[~small], counts[small].sum())
    return float(chisquare(counts, expected * counts.sum() / expected.sum()).pvalue)


@pytest.fixture(scope="module")
def rows():
    return law_rows(torch.Generator().manual_seed(11))


def test_emitted_sequences_follow_the_target_law(rows):
    law = expected_law(rows)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    sequences = sample_sequences(rows, seed=5, n=N)
    lengths = {len(s) for s in sequences}
    assert lengths == {1, 2, 3, 4}  # rejections at the root, accepted leaves, and the bonus row all occur
    p_value = goodness_of_fit(sequences, law)
    print(f"tree sampler against the target law: p = {p_value:.3g} (N = {N})")
    assert p_value > ALPHA, p_value


@pytest.mark.parametrize("thresholds", [{"threshold_acc": 0.5}, {"threshold_single": 0.2}])
def test_the_law_test_rejects_a_biased_sampler(rows, thresholds):
    p_value = goodness_of_fit(sample_sequences(rows, seed=5, n=CONTROL_N, **thresholds), expected_law(rows))
    print(f"biased sampler {thresholds}: p = {p_value:.3g}")
    assert p_value < CONTROL_ALPHA, p_value


def test_empty_batch_and_a_root_without_children_draw_from_the_root_row():
    candidates = torch.zeros((0, 3), dtype=torch.int64)
    empty = torch.zeros((0, 3, 4))
    run_sampler(candidates, [], empty, torch.zeros((0, 3)), torch.zeros((0,)), 2)
    rows = torch.tensor([[[0.0, 0.25, 0.75, 0.0]] * 3])
    predicts, accept_index, accept_num, _ = run_sampler(
        torch.tensor([[0, 1, 2]]), [[0, 0, 0]], rows, torch.zeros((1, 3)), torch.tensor([0.5]), 0)
    assert accept_num.tolist() == [0] and accept_index.tolist() == [[0]]
    assert predicts.tolist()[0] == 2  # 0.5 of the mass lies past token 1's 0.25
