"""A seeded request gets the same tokens whatever shares its batch, on every engine: alone, and in a
busy batch of greedy, hot and other seeded rows decoded by `engines.step.decode_step` with D-Cut
cutting (so its drafts, what is verified and the number of random draws all change with the batch).
The seeded rule (`engines.sampling.seeded_scores`) makes the tokens a function of (seed, position),
so every engine also gives plain decoding's tokens (`ar_generate` with the same seed)."""

from __future__ import annotations

import pytest
import torch

from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.generate import ar_generate
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from engines.step import decode_step
from tests.engines.test_spec import CharTok, _real_drafter, make_target, prompts

pytestmark = pytest.mark.exactness

N = 16
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
BUSY = [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, 0.9, seed=7), SamplingParams(1.0),
        SamplingParams()]


def run(dec: SpecDecoder, ps: list[list[int]], params: list[SamplingParams], dcut: DcutController | None, k: int
        ) -> list[list[int]]:
    """Every request to N tokens through `decode_step` (D-Cut as given), rows leaving as they finish."""
    outs = {s: [y] for s, y in enumerate(dec.prefill_batch(list(range(len(ps))), ps, params))}
    live = list(range(len(ps)))
    while live:
        res = decode_step(dec, live, [N - len(outs[s]) for s in live], k, dcut, [False] * len(live),
                          [(0, 0)] * len(live))
        for s, row in zip(live, res.out, strict=True):
            outs[s] += row
        for s in [s for s in live if len(outs[s]) >= N]:
            dec.release(s)
        live = [s for s in live if len(outs[s]) < N]
    return [outs[s][:N] for s in range(len(ps))]


@pytest.mark.parametrize(("kind", "block"), [("ar", 0), ("mtp", 0), ("dflash", 6), ("dfly", 6), ("dflare", 6), ("dspark", 6),
                                           ("eagle3", 0)])
def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_busy_batch(kind: str, block: int):
    torch.manual_seed(0)
    target = make_target()
    drafter = None if kind == "ar" else _real_drafter(kind, target, block).eval()
    k = drafter.max_draft if drafter is not None else 0
    table = CostTable.linear(max(k, 1), base_ms=1.0, per_token_ms=0.5, batch_sizes=(1, 2, 4, 8))
    dcut = DcutController(table, max(k, 1), skip_drafting=False) if drafter is not None and drafter.supports_dcut \
        else None
    p, *others = prompts(1 + len(BUSY), seed=31, lo=4, hi=12)
    alone = run(SpecDecoder(target, drafter, 1, 64), [p], [SEEDED], dcut, k)[0]
    busy = run(SpecDecoder(target, drafter, 1 + len(BUSY), 64), [*others[:2], p, *others[2:]],
               [*BUSY[:2], SEEDED, *BUSY[2:]], dcut, k)[2]
    assert busy == alone, kind
    plain = ar_generate(target, CharTok(), p, SEEDED, max_tokens=N, max_len=64).token_ids
    assert alone == plain, kind
