"""One request through the speculative decoder's draft/verify steps (`specroute generate`, tests):
the single-request loop on top of `SpecDecoder`."""

from __future__ import annotations

import time

import torch

from engines.drafters.base import Drafter
from engines.errors import EngineError, check_room
from engines.generate import GenerationResult
from engines.grammar import Constraint
from engines.model import Transformer
from engines.requests import RequestStats
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from engines.stopping import StopState
from engines.tokenizer import Tokenizer


@torch.no_grad()
def spec_generate(target: Transformer, drafter: Drafter | None, tok: Tokenizer, prompt_ids: list[int],
                  params: SamplingParams, max_tokens: int = 128, stop: tuple[str, ...] = (), k: int = 3,
                  max_len: int | None = None, decoder: SpecDecoder | None = None,
                  slot: int = 0, constraint: Constraint | None = None) -> GenerationResult:
    """One request through draft/verify steps (drafter None: plain decoding through the same path),
    held to `constraint`'s grammar when given. Stop strings, EOS and max_tokens are applied token by
    token, so an accepted block is cut exactly where plain decoding would stop."""
    max_len = max_len or (decoder.max_len if decoder else target.config.max_position_embeddings)
    check_room(len(prompt_ids), max_len)
    max_tokens = min(max_tokens, max_len - len(prompt_ids))
    if max_tokens <= 0:
        raise EngineError("max_tokens must be positive")
    dec = decoder or SpecDecoder(target, drafter, 1, max_len)
    state = StopState(tok.decode, frozenset(target.config.eos_ids), stop, max_tokens)
    t0 = time.perf_counter()
    y0 = dec.prefill(slot, prompt_ids, params, constraint)
    ttft = time.perf_counter() - t0
    emitted = [y0]
    state.push(y0)
    while not state.done:
        kk = max(0, min(k, max_tokens - len(emitted) - 1))   # never draft past max_tokens
        proposal = dec.draft([slot], kk)
        row = dec.verify([slot], proposal, [kk])[0]
        _, used = state.push_many(row)
        emitted += row[:used]
    stats = RequestStats(prompt_tokens=len(prompt_ids), completion_tokens=len(emitted), ttft_s=ttft,
                         wall_s=time.perf_counter() - t0, acceptance=dec.stats(slot))
    dec.release(slot)
    return GenerationResult(state.text, emitted, state.finish_reason, stats)
