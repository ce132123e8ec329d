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


def homogeneity(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]],
                min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of the test that two histograms of token tuples
    come from one distribution ((0.0, 0): nothing to test). A tuple whose expected count is under
    `min_expected` in either sample is backed off to its prefix (the first two tokens, then the
    first), and what is still too rare is pooled into one cell, so a spread-out distribution is
    still tested on what it has enough draws of."""
    from scipy.stats import chi2_contingency

    cells = _cells(a, b, min_expected)
    if len(cells) < 2:
        return 0.0, 0
    res = chi2_contingency([[x for x, _ in cells], [y for _, y in cells]], correction=False)
    return float(res[0]), int(res[2])


def homogeneity_p(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]], min_expected: float = 5.0) -> float:
    """The p-value of `homogeneity` (1.0 where there is nothing to test)."""
    from scipy.stats import chi2

    stat, dof = homogeneity(a, b, min_expected)
    return float(chi2.sf(stat, dof)) if dof else 1.0


def combined_p(tests: Sequence[tuple[float, int]]) -> float:
    """One p-value for several independent chi-square tests (statistic, degrees of freedom): their
    sum is chi-square with the summed degrees of freedom under the joint null."""
    from scipy.stats import chi2

    stat, dof = sum(t for t, _ in tests), sum(d for _, d in tests)
    return float(chi2.sf(stat, dof)) if dof else 1.0


def shift_second(p: Counter[tuple[int, ...]], delta: float) -> dict[tuple[int, ...], float]:
    """The distribution of `p` (counts, normalised) with, after every first token, `delta` of the
    second token's conditional probability moved onto its commonest second token (taken from the
    others in proportion; at most what they have), the rest kept: the shape of the bias that a
    verification decision reading the draft makes at the first drafted position (issue #30's
    counterexample: P(token 0) 0.50 -> 0.55)."""
    n = sum(p.values())
    by_first: dict[int, Counter[int]] = {}
    for key, c in p.items():
        if len(key) > 1:
            by_first.setdefault(key[0], Counter())[key[1]] += c
    out: dict[tuple[int, ...], float] = {}
    for key, c in p.items():
        cond = by_first.get(key[0])
        if cond is None or len(key) < 2:
            out[key] = c / n
            continue
        tot = sum(cond.values())
        top, top_c = cond.most_common(1)[0]
        gain = min(delta, (tot - top_c) / tot)
        w = (top_c / tot + gain) / (top_c / tot) if key[1] == top else \
            ((tot - top_c) / tot - gain) / ((tot - top_c) / tot)
        out[key] = c / n * w
    return out


def power(refs: Sequence[Counter[tuple[int, ...]]], n: int, alpha: float, delta: float,
          min_expected: float = 5.0) -> float:
    """Power of the combined homogeneity test (`combined_p` over one `homogeneity` per reference),
    `n` draws a side, at level `alpha`, against `shift_second(ref, delta)` for every reference
    taken as the truth: the noncentral chi-square approximation, on the cells the test would form
    from two samples like the reference (noncentrality n/2 * sum((p - q)^2 / ((p + q) / 2)))."""
    from scipy.stats import chi2, ncx2

    lam, dof = 0.0, 0
    for ref in refs:
        tot = sum(ref.values())
        q = shift_second(ref, delta)
        scaled = Counter({k: round(c * n / tot) for k, c in ref.items()})
        cells = _cell_keys(scaled, scaled, min_expected)
        for keys in cells:
            pa = sum(ref[k] for k in keys) / tot
            pb = sum(q[k] for k in keys)
            if pa + pb > 0:
                lam += n / 2 * (pa - pb) ** 2 / ((pa + pb) / 2)
        dof += max(len(cells) - 1, 0)
    if not dof:
        return 0.0
    return float(ncx2.sf(chi2.isf(alpha, dof), dof, lam))


def detectable_shift(refs: Sequence[Counter[tuple[int, ...]]], n: int, alpha: float, target: float = 0.9,
                     min_expected: float = 5.0) -> float:
    """The smallest `shift_second` delta (to 0.005) that the combined test detects with probability
    `target` at `n` draws a side and level `alpha` (`power`); 1.0 where none up to 0.5 is."""
    lo, hi = 0.0, 0.5
    if power(refs, n, alpha, hi, min_expected) < target:
        return 1.0
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power(refs, n, alpha, mid, min_expected) >= target else (mid, hi)
    return hi


def _cells(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]], min_expected: float) -> list[tuple[int, int]]:
    return [(sum(a.get(k, 0) for k in keys), sum(b.get(k, 0) for k in keys)) for keys in _cell_keys(a, b, min_expected)]


def _cell_keys(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]], min_expected: float) -> list[list[tuple[int, ...]]]:
    """The test's cells, each as the tuples it holds (see `homogeneity`)."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return []

    def enough(x: int, y: int) -> bool:
        return min((x + y) * na, (x + y) * nb) / (na + nb) >= min_expected

    cells: list[list[tuple[int, ...]]] = []
    rest = {key: ((a.get(key, 0), b.get(key, 0)), [key]) for key in set(a) | set(b)}
    width = max((len(key) for key in rest), default=0)
    for n in range(width, 0, -1):
        grouped: dict[tuple[int, ...], tuple[tuple[int, int], list[tuple[int, ...]]]] = {}
        for key, ((x, y), members) in rest.items():
            (gx, gy), gm = grouped.get(key[:n], ((0, 0), []))
            grouped[key[:n]] = ((gx + x, gy + y), gm + members)
        cells += [m for c, m in grouped.values() if enough(*c)]
        rest = {key: (c, m) for key, (c, m) in grouped.items() if not enough(*c)}
    if rest:
        cells.append([k for _, m in rest.values() for k in m])
    return sorted(cells)
