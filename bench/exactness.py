"""T > 0 exactness figures for the benchmarks: histograms of a prompt's first tokens drawn through a
speculative decoder against the same drawn by plain decoding, and a chi-square homogeneity p-value.

`first_tokens` samples `n` continuations of one prompt through any `SpecDecoder` (many slots at once;
every row unseeded: its own generator, drafts sampled from q where the decoder samples drafts), each
to `length` tokens; `homogeneity_p` compares two such histograms (a rare tuple is backed off to its
prefix, what is still rare is pooled). A p-value that is not small says nothing was detected at this sample size; a tiny
one (< 0.001) is a finding to chase with the exact tests (`pytest -m exactness`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from engines.sampling import SamplingParams
from engines.spec import SpecDecoder


@torch.no_grad()
def first_tokens(dec: SpecDecoder, ids: Sequence[int], params: SamplingParams, n: int, k: int, length: int = 3,
                 seed: int = 0) -> Counter[tuple[int, ...]]:
    """n continuations of `ids` to `length` tokens through `dec` (k drafts a step; 0: plain), in
    batches of every slot of `dec` -> tuple of tokens -> count. `params` must be unseeded (a seeded
    request's tokens are fixed by its seed)."""
    assert params.seed is None, "unseeded rows: each its own random stream"
    torch.manual_seed(seed)          # the rows' generators are drawn from the global stream
    counts: Counter[tuple[int, ...]] = Counter()
    done = 0
    while done < n:
        b = min(dec.num_slots, n - done)
        slots = list(range(b))
        outs = {s: [y] for s, y in zip(slots, dec.prefill_batch(slots, [list(ids)] * b, [params] * b), strict=True)}
        while any(len(o) < length for o in outs.values()):
            live = [s for s in slots if len(outs[s]) < length]
            kk = max(0, min(k, length - 1 - min(len(outs[s]) for s in live)))
            proposal = dec.draft(live, kk) if kk else None
            for s, row in zip(live, dec.verify(live, proposal, [kk] * len(live)), strict=True):
                outs[s] += row
        for s in slots:
            counts[tuple(outs[s][:length])] += 1
            dec.release(s)
        done += b
    return counts


def homogeneity_p(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]], min_expected: float = 5.0) -> float:
    """Chi-square test that two histograms of token tuples come from one distribution -> p-value.
    A tuple whose expected count is under `min_expected` in either sample is backed off to its
    prefix (the first two tokens, then the first), and what is still too rare is pooled into one
    cell, so a spread-out distribution is still tested on what it has enough draws of."""
    from scipy.stats import chi2_contingency

    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 1.0

    def enough(x: int, y: int) -> bool:
        return min((x + y) * na, (x + y) * nb) / (na + nb) >= min_expected

    cells: list[tuple[int, int]] = []
    rest = {key: (a.get(key, 0), b.get(key, 0)) for key in set(a) | set(b)}
    width = max((len(key) for key in rest), default=0)
    for n in range(width, 0, -1):
        grouped: dict[tuple[int, ...], tuple[int, int]] = {}
        for key, (x, y) in rest.items():
            gx, gy = grouped.get(key[:n], (0, 0))
            grouped[key[:n]] = (gx + x, gy + y)
        cells += [c for c in grouped.values() if enough(*c)]
        rest = {key: c for key, c in grouped.items() if not enough(*c)}
    if rest:
        cells.append((sum(x for x, _ in rest.values()), sum(y for _, y in rest.values())))
    if len(cells) < 2:
        return 1.0
    return float(chi2_contingency([[x for x, _ in cells], [y for _, y in cells]])[1])
