"""Log-probabilities of emitted tokens (OpenAI's `logprobs` / `top_logprobs`), from the target's logits.

The rule: a token's logprob is the log of its probability under the distribution it was sampled
from, the processed target distribution `engines.sampling.logits_to_probs` (temperature and top-p)
at the token's position, so tokens outside the nucleus have -inf (sent as `FLOOR`). At temperature 0
(greedy: that distribution is one-hot) it is the raw target distribution's: log_softmax(logits).

They are computed where the target's logits of every emitted token exist: the prefill forward for
the first token and the verify forward for the rest, where an accepted draft's position has the same
logits a plain step would have computed. So a token's logprobs do not depend on whether it was drafted
(tests/engines/test_logprobs.py). Only rows that ask for them (`SamplingParams.logprobs` not None) pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.sampling import SamplingParams, logits_to_probs

MAX_TOP_LOGPROBS = 20
FLOOR = -9999.0   # stands for -inf (a token the processed distribution cannot sample): JSON has no -inf


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One emitted token's logprob and the `top` most likely tokens at its position (id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def processed_logprobs(logits: Tensor, params: SamplingParams) -> Tensor:
    """[T, V] logits -> [T, V] fp32 log-probabilities of the distribution each position samples from
    (raw log_softmax at temperature 0), floored at `FLOOR`."""
    logits = logits.float()
    if params.greedy:
        lp = torch.log_softmax(logits, dim=-1)
    elif params.top_p >= 1.0:
        lp = torch.log_softmax(logits / params.temperature, dim=-1)
    else:
        lp = torch.log(logits_to_probs(logits, params.temperature, params.top_p))
    return lp.clamp_min(FLOOR)


def token_logprobs(logits: Tensor, tokens: Sequence[int], params: SamplingParams, top_n: int) -> list[TokenLogprob]:
    """logits [T, V] at the positions of `tokens` (T of them) -> each token's `TokenLogprob` with the
    `top_n` (0..20) most likely tokens of its position."""
    if not tokens:
        return []
    lp = processed_logprobs(logits[:len(tokens)], params)
    ids = torch.tensor(list(tokens), dtype=torch.long)
    chosen = lp.gather(1, ids[:, None]).squeeze(1).tolist()
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(tokens)
    if top_n > 0:
        vals, idx = lp.topk(min(top_n, lp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]
    return [TokenLogprob(int(t), float(c), top) for t, c, top in zip(tokens, chosen, tops, strict=True)]


def record(queue: list[TokenLogprob], logits: Tensor, tokens: Sequence[int], params: SamplingParams) -> None:
    """Append the logprobs of `tokens` (emitted in this order; logits [T, V] at their positions) to a
    slot's queue when its request asks for them (`params.logprobs` not None); else nothing."""
    if params.logprobs is not None:
        queue.extend(token_logprobs(logits, tokens, params, params.logprobs))


def take(queue: list[TokenLogprob], n: int) -> list[TokenLogprob]:
    """The first `n` entries of a slot's queue, removed from it."""
    out = queue[:n]
    del queue[:n]
    return out
