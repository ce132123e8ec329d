"""The held-out split every wing agrees on: an item is held out when a stable hash of its id falls
in the last `HOLDOUT_PCT` percent.

The engines' training (target and drafters) and the final classifier never see held-out items; the
benchmarks (acceptance, served, routing) draw their prompts from them, so every figure is measured
on traffic no model of the system was trained on.
"""

from __future__ import annotations

import hashlib

HOLDOUT_PCT = 10


def is_heldout(item_id: str) -> bool:
    h = int(hashlib.sha1(item_id.encode()).hexdigest()[:8], 16)
    return h % 100 >= 100 - HOLDOUT_PCT
