"""Plain autoregressive decoding: the baseline every speculative path must reproduce.

Pure phase functions over a static slot cache (gpt-fast style): `prefill` (chunked) and
`decode_one`, and `next_token` (greedy or sampled, as every path picks a token from logits).
`ar_generate` strings them together for one request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.errors import check_room
from engines.grammar import Constraint, first_token_logits
from engines.model import ForwardOut, KVCache, Transformer
from engines.requests import RequestStats
from engines.sampling import SamplingParams, logits_to_probs, make_generator, sample, seeded_scores
from engines.stopping import StopState
from engines.tokenizer import Tokenizer
from specroute.contracts.stats import PLAIN, AcceptanceStats


@dataclass
class GenerationResult:
    """One request's output; `stats.acceptance.steps` counts target forwards after prefill."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: RequestStats


@torch.no_grad()
def prefill(model: Transformer, cache: KVCache, slot: int, tokens: list[int], start: int = 0,
            chunk: int = 256, capture: tuple[int, ...] = ()) -> ForwardOut:
    """Feed `tokens` at positions start.. into `slot`, `chunk` tokens per forward. Returns the
    concatenated outputs (hidden [1, T, H] and captures) and commits the slot's length."""
    slots = torch.tensor([slot])
    hidden, captured = [], []
    for i in range(0, len(tokens), chunk):
        part = torch.tensor([tokens[i:i + chunk]])
        pos = torch.arange(start + i, start + i + part.shape[1])[None]
        out = model(part, pos, cache, slots, capture)
        hidden.append(out.hidden)
        captured.append(out.captured)
    cache.lengths[slot] = start + len(tokens)
    caps = [torch.cat([c[j] for c in captured], dim=1) for j in range(len(capture))]
    return ForwardOut(torch.cat(hidden, dim=1), caps)


@torch.no_grad()
def decode_one(model: Transformer, cache: KVCache, slot: int, token: int) -> Tensor:
    """Feed one token at the slot's length; commit it; return next-token logits [V]."""
    pos = int(cache.lengths[slot])
    out = model(torch.tensor([[token]]), torch.tensor([[pos]]), cache, torch.tensor([slot]))
    cache.lengths[slot] = pos + 1
    return model.logits(out.hidden[0, -1])


def next_token(logits: Tensor, params: SamplingParams, generator: torch.Generator | None, position: int,
               constraint: Constraint | None = None) -> int:
    """The token at absolute `position` from its logits [V] (masked by `constraint`'s grammar, which then
    advances past it): the argmax (greedy), a seeded request's Gumbel-max
    (`engines.sampling.seeded_scores`), else a sample from `generator`."""
    logits = first_token_logits(constraint, logits)
    if params.greedy:
        y = int(logits.argmax(-1))
    else:
        probs = logits_to_probs(logits, params.temperature, params.top_p)
        y = int(seeded_scores(probs[None], params.seed, position)[0].argmax()) if params.seed is not None \
            else int(sample(probs, generator))
    if constraint is not None:
        constraint.consume(y)
    return y


@torch.no_grad()
def ar_generate(model: Transformer, tok: Tokenizer, prompt_ids: list[int], params: SamplingParams,
                max_tokens: int = 128, stop: tuple[str, ...] = (), max_len: int | None = None,
                cache: KVCache | None = None, constraint: Constraint | None = None) -> GenerationResult:
    max_len = max_len or model.config.max_position_embeddings
    check_room(len(prompt_ids), max_len)
    max_tokens = min(max_tokens, max_len - len(prompt_ids))
    cache = cache or KVCache.for_model(model.config, 1, max_len)
    gen = make_generator(params.seed)
    state = StopState(tok.decode, frozenset(model.config.eos_ids), stop, max_tokens)
    t0 = time.perf_counter()
    out = prefill(model, cache, 0, prompt_ids)
    logits = model.logits(out.hidden[0, -1])
    ttft = 0.0
    steps = 0
    emitted: list[int] = []
    while True:
        y = next_token(logits, params, gen, len(prompt_ids) + len(emitted), constraint)
        emitted.append(y)
        state.push(y)
        if not ttft:
            ttft = time.perf_counter() - t0
        if state.done:
            break
        logits = decode_one(model, cache, 0, y)
        steps += 1
    acceptance = AcceptanceStats(steps=steps, steps_by={PLAIN: steps} if steps else {})
    stats = RequestStats(prompt_tokens=len(prompt_ids), completion_tokens=len(emitted), ttft_s=ttft,
                         wall_s=time.perf_counter() - t0, acceptance=acceptance)
    return GenerationResult(state.text, emitted, state.finish_reason, stats)
