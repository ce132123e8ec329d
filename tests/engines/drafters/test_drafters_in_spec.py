"""The drafters inside spec-core's SpecDecoder: at every step, the batched proposal equals a fresh
drafter's proposal computed from scratch on the committed text (context hand-over is exact), and
greedy output equals plain decoding."""

from __future__ import annotations

import pytest
import torch

from engines.drafters.registry import DRAFTERS
from engines.sampling import SamplingParams

from .test_drafters import KINDS, MAX_LEN, context, make_drafter, make_target, sequences

spec = pytest.importorskip("engines.spec")


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_proposals_match_from_scratch_inside_spec_decoder(kind):
    target = make_target()
    d = make_drafter(kind, target)
    dec = spec.SpecDecoder(target, d, num_slots=3, max_len=MAX_LEN)
    prompts = sequences([11, 6])
    slots = [2, 0]
    seqs = [p + [dec.prefill(s, p, SamplingParams())] for p, s in zip(prompts, slots, strict=True)]
    for _ in range(5):
        prop = dec.draft(slots, 3)
        for b, seq in enumerate(seqs):
            ref_d = DRAFTERS[kind](target, d.cfg)
            ref_d.load_state_dict(d.state_dict())
            ref_d.eval().allocate(1, MAX_LEN)
            ref = ref_d.propose(context(target, ref_d, [seq], [0], [len(seq) - 1], [0]), 3)
            assert torch.equal(prop.tokens[b], ref.tokens[0])
            torch.testing.assert_close(prop.conf[b], ref.conf[0], atol=1e-4, rtol=1e-3)
        rows = dec.verify(slots, prop, [3, 3])
        for seq, row in zip(seqs, rows, strict=True):
            seq += row
