"""Splitting a draft call by sampling mode: `DraftContext.subset` and `Proposal.merge`."""

from __future__ import annotations

import torch

from engines.drafters.base import DraftContext, Proposal


def test_subset_keeps_the_rows_in_order() -> None:
    B, T, F = 4, 3, 2
    ctx = DraftContext(slots=torch.tensor([7, 5, 3, 1]), feats=torch.arange(B * T * F).float().view(B, T, F),
                       positions=torch.arange(B * T).view(B, T), valid=torch.ones(B, T, dtype=torch.bool),
                       next_tokens=torch.arange(B * T).view(B, T) + 100, last_token=torch.tensor([9, 8, 7, 6]),
                       start=torch.tensor([10, 20, 30, 40]))
    sub = ctx.subset([2, 0])
    assert sub.slots.tolist() == [3, 7] and sub.last_token.tolist() == [7, 9] and sub.start.tolist() == [30, 10]
    assert torch.equal(sub.feats, ctx.feats[[2, 0]]) and torch.equal(sub.next_tokens, ctx.next_tokens[[2, 0]])


def test_merge_puts_rows_back_and_gives_greedy_rows_a_one_hot_q() -> None:
    V = 5
    q = torch.softmax(torch.randn(2, 3, V), -1)
    sampled = Proposal(torch.tensor([[1, 2, 3], [4, 0, 1]]), torch.full((2, 3), 0.5), q)
    greedy = Proposal(torch.tensor([[2, 2, 2]]), torch.full((1, 3), 0.9))
    m = Proposal.merge([([0, 2], sampled), ([1], greedy)], 3)
    assert m.tokens.tolist() == [[1, 2, 3], [2, 2, 2], [4, 0, 1]]
    assert torch.allclose(m.conf[1], torch.full((3,), 0.9)) and m.probs is not None
    assert torch.equal(m.probs[0], q[0]) and torch.equal(m.probs[2], q[1])
    assert m.probs[1].argmax(-1).tolist() == [2, 2, 2] and m.probs[1].sum().item() == 3.0
    # every part greedy: still "q one-hot" (probs None)
    assert Proposal.merge([([1], greedy), ([0], greedy)], 2).probs is None
