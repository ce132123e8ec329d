"""Shared losslessness assertion for every speculative-decoding test.

    from tests.lossless import assert_lossless
    assert_lossless(target, prompt_ids, spec_tokens, ar_tokens)

Token lists must be identical; the only tolerated difference is a near-tie at the first differing
position (the target's two candidate logits, recomputed with a plain no-cache fp32 forward over the
shared prefix, differ by less than 1e-4 and both are the maximum within 1e-4). See
`engines.lossless.check_lossless`.
"""

from __future__ import annotations

from collections.abc import Sequence

from engines.lossless import LosslessCheck, check_lossless
from engines.model import Transformer


def assert_lossless(target: Transformer, prompt_ids: Sequence[int], got: Sequence[int], ref: Sequence[int],
                    tol: float = 1e-4, label: str = "") -> LosslessCheck:
    res = check_lossless(target, prompt_ids, got, ref, tol)
    assert res.ok, f"{label + ': ' if label else ''}not lossless: {res.reason}"
    return res
