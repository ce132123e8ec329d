"""Which floating-point format this CPU multiplies fast.

bf16 matrix products are native where the CPU has AVX512-BF16 or AMX. Elsewhere (AVX2) PyTorch
emulates them: a matrix-vector product still gains from reading half the bytes, but a product over
several rows runs several times slower than fp32. Callers that choose a precision for speed ask here.
"""

from __future__ import annotations

import functools
from pathlib import Path

# rows at or under which an emulated bf16 product (memory-bound) still beats fp32
EMULATED_BF16_MAX_ROWS = 2


@functools.cache
def bf16_is_native() -> bool:
    """Whether this CPU multiplies bf16 in hardware (the avx512_bf16 or amx_bf16 flag; Linux)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_pays(rows: int) -> bool:
    """Whether a product of `rows` input rows with a bf16 copy of a weight beats the fp32 weight."""
    return bf16_is_native() or rows <= EMULATED_BF16_MAX_ROWS
