"""The verification rule (engines/verify.py): greedy prefix/bonus, keep truncation, and the output
distribution of speculative sampling against the exact target distribution on a small vocabulary."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from engines.sampling import logits_to_probs
from engines.verify import verify_greedy, verify_sample


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _logits_with_argmax(top: list[list[int]], V: int = 7) -> torch.Tensor:
    """[B, K+1, V] logits whose argmax at each position is `top[b][i]`."""
    t = torch.tensor(top)
    return torch.nn.functional.one_hot(t, V).float() * 5.0 + torch.randn(*t.shape, V) * 0.1


def test_greedy_accepts_longest_matching_prefix_then_corrects():
    logits = _logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 0], [5, 2, 3], [1, 2, 3]])
    acc, nxt = verify_greedy(logits, drafts, torch.tensor([3, 3, 3]))
    assert acc.tolist() == [2, 0, 3]
    assert nxt.tolist() == [3, 1, 4]   # correction at the mismatch; bonus when all accepted


def test_greedy_keep_truncates_and_bonus_comes_from_first_unverified_position():
    logits = _logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    acc, nxt = verify_greedy(logits, drafts, torch.tensor([0, 1, 2]))
    assert acc.tolist() == [0, 1, 2]
    assert nxt.tolist() == [1, 2, 3]   # a verified prefix gives exactly what plain decoding gives


def test_greedy_with_no_drafts_is_plain_decoding():
    logits = _logits_with_argmax([[6], [2]])
    acc, nxt = verify_greedy(logits, torch.zeros(2, 0, dtype=torch.long), torch.tensor([0, 0]))
    assert acc.tolist() == [0, 0] and nxt.tolist() == [6, 2]


def test_sample_rejects_drafts_the_draft_distribution_cannot_produce():
    V = 4
    p = torch.full((1, 2, V), 0.25)
    q = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        acc, nxt = verify_sample(p, torch.tensor([[2]]), q, torch.tensor([1]), g)
        assert acc.item() == 0
        assert nxt.item() in (2, 3)    # residual max(0, p - q) lives on tokens 2 and 3


def test_sample_with_matching_certain_target_always_accepts():
    V = 5
    p = torch.nn.functional.one_hot(torch.tensor([[3, 1, 4]]), V).float()
    g = torch.Generator().manual_seed(1)
    acc, nxt = verify_sample(p, torch.tensor([[3, 1]]), None, torch.tensor([2]), g)
    assert acc.item() == 2 and nxt.item() == 4


def test_sample_per_row_generators_are_reproducible():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(3, 4, 9), -1)
    drafts = torch.randint(0, 9, (3, 3))
    keep = torch.tensor([3, 1, 2])
    out = [verify_sample(p, drafts, None, keep, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
           for _ in range(2)]
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


# --- distribution test -------------------------------------------------------------------------
# A toy "language model" on V tokens: the target's next-token distribution depends only on the previous
# token (rows of a random logit table), processed with temperature / top-p exactly as plain sampling does;
# the drafter is another Markov chain (an autoregressive drafter: q_i depends on the previous draft), or a
# block drafter (q_i depends only on y0 and the slot i, every slot sampled independently, as DFlash samples
# a parallel block). Exact enumeration of every length-m continuation gives the target's
# true distribution; many independent speculative decodes (vectorised over rows) give the empirical one.

V, K, M = 5, 3, 3   # vocabulary, drafts per step, tokens compared


def _chain_probs(table: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    return logits_to_probs(table, temperature, top_p)          # [V, V]: row = previous token


def _exact(p: torch.Tensor, y0: int) -> torch.Tensor:
    """Exact distribution of the next M tokens after y0, enumerated: [V**M]."""
    out = torch.zeros(V ** M, dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=M):
        prob, prev = 1.0, y0
        for x in seq:
            prob *= float(p[prev, x])
            prev = x
        out[sum(x * V ** (M - 1 - i) for i, x in enumerate(seq))] = prob
    return out


def _speculative(p: torch.Tensor, q: torch.Tensor, y0: int, n: int, sampled_drafts: bool,
                 random_keep: bool, seed: int, block: torch.Tensor | None = None) -> torch.Tensor:
    """n independent speculative decodes of M tokens each -> counts [V**M]. `block` [K, V, V]: a block
    drafter whose slot i draws from block[i, y0] whatever the earlier slots drew (else the chain q)."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.full((n, M), -1, dtype=torch.long)
    filled = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), y0, dtype=torch.long)
    while bool((filled < M).any()):
        rows = (filled < M).nonzero().squeeze(1)
        B = rows.numel()
        drafts = torch.empty(B, K, dtype=torch.long)
        qd = torch.empty(B, K, V)
        prev = last[rows]
        for i in range(K):
            qi = q[prev] if block is None else block[i, last[rows]]   # [B, V]
            qd[:, i] = qi
            drafts[:, i] = torch.multinomial(qi, 1, generator=g).squeeze(1) if sampled_drafts \
                else qi.argmax(-1)
            prev = drafts[:, i]
        # target distributions along the drafted path: p_1 after y0, p_i after d_{i-1}
        path = torch.cat([last[rows, None], drafts], dim=1)     # [B, K+1]
        tp = p[path]                                            # [B, K+1, V]
        keep = torch.randint(0, K + 1, (B,), generator=g) if random_keep else torch.full((B,), K)
        acc, nxt = verify_sample(tp, drafts, qd if sampled_drafts else None, keep, g)
        out = torch.cat([drafts, torch.zeros(B, 1, dtype=torch.long)], dim=1)   # [B, K+1]
        out[torch.arange(B), acc] = nxt                     # accepted drafts, then correction/bonus
        for i in range(K + 1):                              # append emitted tokens up to M per row
            take = (i <= acc) & (filled[rows] < M)
            r = rows[take]
            seqs[r, filled[r]] = out[take, i]
            filled[r] += 1
        last[rows] = seqs[rows, filled[rows] - 1]
    idx = sum(seqs[:, i] * V ** (M - 1 - i) for i in range(M))
    return torch.bincount(idx, minlength=V ** M).double()


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit (cells with expected < 5 pooled)."""
    n = float(counts.sum())
    exp = probs * n
    small = exp < 5
    obs_c = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp_c = torch.cat([exp[~small], exp[small].sum()[None]]) if small.any() else exp
    keep = exp_c > 0
    stat = float(((obs_c[keep] - exp_c[keep]) ** 2 / exp_c[keep]).sum())
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty approximation of the chi-square upper tail
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize(
    ("temperature", "top_p", "sampled_drafts", "random_keep", "drafter"),
    [
        (1.0, 1.0, False, False, "chain"),   # greedy drafts: q one-hot
        (1.0, 1.0, True, False, "chain"),    # sampled drafts: q a real distribution (ratio test + residual)
        (0.7, 0.8, True, True, "chain"),     # temperature + top-p on p, verifying random prefixes (D-Cut)
        (1.3, 0.9, False, True, "chain"),
        (1.0, 1.0, True, False, "block"),    # a parallel block, each slot sampled from its own q_i
        (0.7, 0.8, True, True, "block"),
        (1.0, 1.0, False, True, "block"),
    ],
)
def test_speculative_sampling_output_distribution_equals_target(temperature, top_p, sampled_drafts,
                                                                random_keep, drafter):
    g = torch.Generator().manual_seed(7)
    target_table = torch.randn(V, V, generator=g) * 1.5
    draft_table = target_table + torch.randn(V, V, generator=g)   # a correlated but wrong drafter
    p = _chain_probs(target_table, temperature, top_p)
    q = logits_to_probs(draft_table, 1.0)
    # the block drafter: slot i guesses from y0 alone (a wrong, position-dependent distribution), at the
    # same temperature / top-p as the target as the engine samples drafts
    block = logits_to_probs(torch.randn(K, V, V, generator=g) * 1.5, temperature, top_p) \
        if drafter == "block" else None
    exact = _exact(p, y0=0)
    assert abs(float(exact.sum()) - 1) < 1e-6
    counts = _speculative(p, q, y0=0, n=60_000, sampled_drafts=sampled_drafts, random_keep=random_keep,
                          seed=11, block=block)
    assert float(counts[exact == 0].sum()) == 0, "emitted a continuation the target cannot produce"
    pval = _chi2_pvalue(counts, exact)
    assert pval > 1e-3, f"speculative output distribution differs from the target's (p={pval:.2e})"


def test_distribution_test_has_power():
    """Sanity check of the harness: the same samples must clearly reject the drafter's own chain
    (what a lossy "accept whatever the drafter says" rule would produce)."""
    g = torch.Generator().manual_seed(7)
    target_table = torch.randn(V, V, generator=g) * 1.5
    p = _chain_probs(target_table, 1.0, 1.0)
    q = logits_to_probs(target_table + torch.randn(V, V, generator=g), 1.0)
    counts = _speculative(p, q, y0=0, n=20_000, sampled_drafts=True, random_keep=False, seed=3)
    exact_q = _exact(q, y0=0)
    assert _chi2_pvalue(counts, _exact(p, y0=0)) > 1e-3
    assert _chi2_pvalue(counts, exact_q) < 1e-6
