"""T > 0 exactness figures for the benchmarks: histograms of a prompt's first tokens drawn through a
speculative decoder against the same drawn by plain decoding, and a chi-square homogeneity p-value.

`first_tokens` samples `n` continuations of one prompt through any `SpecDecoder` (many slots at once;
every row unseeded: its own generator, drafts sampled from q where the decoder samples drafts), each
to `length` tokens; `homogeneity_p` compares two such histograms (cells with few expected counts are
pooled into one). A p-value that is not small says nothing was detected at this sample size; a tiny
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
    """Chi-square test that two histograms come from one distribution -> p-value. Cells whose expected
    count is under `min_expected` in either sample are pooled into one."""
    from scipy.stats import chi2_contingency

    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b))
    big, small_a, small_b = [], 0, 0
    for key in keys:
        tot = a.get(key, 0) + b.get(key, 0)
        if min(tot * na, tot * nb) / (na + nb) >= min_expected:
            big.append((a.get(key, 0), b.get(key, 0)))
        else:
            small_a, small_b = small_a + a.get(key, 0), small_b + b.get(key, 0)
    if small_a + small_b:
        big.append((small_a, small_b))
    if len(big) < 2:
        return 1.0
    return float(chi2_contingency([[x for x, _ in big], [y for _, y in big]])[1])
