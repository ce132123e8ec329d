"""The forward-cost fit a worker reports as `compute_bound_tokens` (engines/forward_cost.py)."""

from __future__ import annotations

import pytest

from engines.forward_cost import NEVER, fit_compute_bound, measure_compute_bound
from engines.model import ModelConfig, Transformer, init_weights

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   tie_word_embeddings=True)


def test_fit_is_where_a_forward_costs_twice_a_one_token_forward() -> None:
    # cost(n) = 7.5 + 0.5 n: 8 ms for 1 token, 39.5 for 64 -> doubles at 15 tokens
    assert fit_compute_bound(8.0, 39.5, 64) == pytest.approx(15.0)
    # a memory-bound GPU-like forward: 64 tokens cost 1% more than one
    assert fit_compute_bound(10.0, 10.1, 64) > 500.0


def test_fit_without_a_measurable_slope_is_never_compute_bound() -> None:
    assert fit_compute_bound(8.0, 8.0, 64) == NEVER
    assert fit_compute_bound(8.0, 7.0, 64) == NEVER     # noise: the big forward measured cheaper
    assert fit_compute_bound(0.0, 7.0, 64) == NEVER
    assert fit_compute_bound(1.0, 1e9, 64) == 1.0       # floor: a token can't cost more than a forward


def test_measure_on_a_real_model() -> None:
    model = Transformer(TINY)
    init_weights(model)
    c = measure_compute_bound(model.eval(), tokens=16, context=8, reps=2)
    assert 1.0 <= c <= NEVER
