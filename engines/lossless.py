"""The losslessness check shared by tests and benchmarks: a speculative output against plain greedy
decoding, tolerating only a genuine near-tie of the target's logits at the first difference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.model import Transformer


@dataclass(frozen=True)
class LosslessCheck:
    identical: bool           # token lists equal
    ok: bool                  # identical, or the first difference is a tolerated near-tie
    position: int | None      # first differing output position
    gap: float | None         # |logit(a) - logit(b)| of the two candidates there (fp32)
    reason: str = ""


@torch.no_grad()
def check_lossless(target: Transformer, prompt_ids: Sequence[int], got: Sequence[int], ref: Sequence[int],
                   tol: float = 1e-4) -> LosslessCheck:
    """Compare a speculative output with plain greedy decoding. At the first differing position the
    target's logits for the shared prefix (plain forward, no cache, fp32) must show a near-tie: the two
    candidate tokens are both within `tol` of the maximum logit. Anything else is a bug."""
    got, ref = list(got), list(ref)
    if got == ref:
        return LosslessCheck(True, True, None, None)
    i = next((j for j, (x, y) in enumerate(zip(got, ref, strict=False)) if x != y), None)
    if i is None:
        return LosslessCheck(False, False, min(len(got), len(ref)), None,
                             f"outputs have different lengths ({len(got)} vs {len(ref)}) with equal prefix")
    seq = list(prompt_ids) + ref[:i]
    hidden = target(torch.tensor([seq]), torch.arange(len(seq))[None]).hidden
    logits = target.logits(hidden[0, -1]).float()
    top = float(logits.max())
    a, b = float(logits[got[i]]), float(logits[ref[i]])
    gap = abs(a - b)
    ok = gap < tol and top - a < tol and top - b < tol
    reason = "" if ok else (f"first difference at output position {i}: got {got[i]} (logit {a:.6f}), "
                            f"expected {ref[i]} (logit {b:.6f}), max logit {top:.6f}")
    return LosslessCheck(False, ok, i, gap, reason)
