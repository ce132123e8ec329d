"""Training batches: length-bucketed sampling keeps every sequence's draw probability and pads little."""

from __future__ import annotations

from collections import Counter

import torch

from engines.training.batch import bucketed_batch


def test_bucketed_batch_draws_every_sequence_about_uniformly_and_pads_to_similar_lengths() -> None:
    lengths = [int(x) for x in torch.randint(20, 500, (101,), generator=torch.Generator().manual_seed(0))]
    gen = torch.Generator().manual_seed(1)
    counts: Counter[int] = Counter()
    waste, uniform = [], []
    for _ in range(3000):
        idx = bucketed_batch(lengths, 8, gen)
        assert len(idx) == 8
        counts.update(idx)
        L = [lengths[i] for i in idx]
        waste.append(1 - sum(L) / (len(L) * max(L)))
        U = [lengths[i] for i in torch.randint(0, len(lengths), (8,), generator=gen).tolist()]
        uniform.append(1 - sum(U) / (len(U) * max(U)))
    expected = 3000 * 8 / len(lengths)
    assert set(counts) == set(range(len(lengths)))
    # within 30% of uniform for every sequence (binomial sd ~ 7% at this count)
    assert all(abs(c - expected) < 0.3 * expected for c in counts.values())
    assert sum(waste) < 0.6 * sum(uniform)   # padding: about half of what uniform batches waste


def test_bucketed_batch_on_fewer_sequences_than_a_bucket() -> None:
    idx = bucketed_batch([5, 9, 7], 4, torch.Generator().manual_seed(0))
    assert len(idx) == 4 and set(idx) <= {0, 1, 2}
