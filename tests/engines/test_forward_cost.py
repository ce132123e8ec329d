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


def test_measure_on_a_real_model_times_both_forwards_and_fits_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real forwards of the real model, timed on a clock that advances by a known cost per token
    (7.5 + 0.5 n ms, as above): the measurement must time each forward by its own token count and
    recover the fit's 15 tokens, and must run the 8-row forward it claims."""
    model = Transformer(TINY)
    init_weights(model)
    model.eval()
    seen: list[int] = []
    real_forward = model.forward

    def forward(toks, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(int(toks.numel()))
        return real_forward(toks, *args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    clock = {"now": 0.0, "calls": 0}

    def perf_counter() -> float:
        clock["calls"] += 1
        if clock["calls"] % 2 == 0:   # the end of a timed forward: its cost by the tokens it carried
            clock["now"] += (7.5 + 0.5 * seen[-1]) / 1000.0
        return clock["now"]

    monkeypatch.setattr("engines.forward_cost.time.perf_counter", perf_counter)
    c = measure_compute_bound(model, tokens=16, context=8, reps=2)
    assert sorted(set(seen)) == [1, 16]            # a 1-token forward and 8 rows x 2 tokens
    assert len(seen) == 2 * 3                       # warm-up round + 2 timed rounds, both shapes each
    assert c == pytest.approx(15.0)
    assert c < NEVER
