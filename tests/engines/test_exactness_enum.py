"""Exact enumeration on a toy vocabulary: one decode step (`engines.step.decode_step`, with D-Cut or
without) over every drafter shape, for a single row and for mixed batches of greedy and hot rows,
gives each row exactly the target's distribution of its next tokens.

The toy decoder is V = 3 tokens: the target's logits depend on the last token, and each row's
drafter is one of the shapes the engine serves (a chain, an independent block, a predecessor-
conditioned block; the tree is checked through `engines.tree.accept_walk`). Its drafts come from
the real `engines.drafters.head.pick_tokens` with the sampler pinned to each possible outcome in
turn, so every joint draft outcome of the batch is enumerated with its probability under q, and the
real step and D-Cut decide what is verified. Given the drafts and the kept prefix, the law of the
emitted tokens is the speculative-sampling rule (`engines.verify`: accept d_j with min(1, p/q),
else emit from the residual, else the bonus from p). Each emitted prefix is continued by the target
to N = K + 1 tokens; the sum over outcomes must be the target's law of N tokens.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from unittest import mock

import numpy as np
import pytest
import torch

from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.drafters import head as head_module
from engines.drafters.base import Proposal
from engines.drafters.head import pick_tokens
from engines.sampling import logits_to_probs
from engines.step import decode_step
from engines.tree import accept_walk

pytestmark = pytest.mark.exactness

V, K = 3, 3
N = K + 1
SHAPES = ("chain", "block", "pred_block")
_rng = np.random.default_rng(7)
TARGET = torch.tensor(_rng.normal(0.0, 1.5, (V, V)), dtype=torch.float32)       # logits of x | last token
CHAIN = TARGET + torch.tensor(_rng.normal(0.0, 1.0, (V, V)), dtype=torch.float32)  # drafter: x | last draft
BLOCK = torch.tensor(_rng.normal(0.0, 1.5, (V, K, V)), dtype=torch.float32)       # drafter: slot j | y0


class ToyDecoder:
    """A toy-vocabulary decoder for `decode_step`: rows (y0, temperature, top_p, width) draft with
    `shape`; `outcome[b][j]` is the token row b's sampled draft j draws (greedy rows take the argmax
    whatever it says). `verify` records the keep it is asked for and emits nothing of interest."""

    def __init__(self, shape: str, rows: Sequence[tuple[int, float, float, int]],
                 target: torch.Tensor = TARGET, chain: torch.Tensor = CHAIN, block: torch.Tensor = BLOCK) -> None:
        self.shape, self.rows = shape, list(rows)
        self.target, self.chain, self.block = target, chain, block
        self.outcome: list[list[int]] = [[0] * K for _ in rows]
        self.last_ingest = 0
        self.proposal: Proposal | None = None
        self.keep: dict[int, int] = {}     # slot -> drafts verified

    def logits(self, j: int, prev: torch.Tensor) -> torch.Tensor:
        """[B, V] drafter logits of slot j given each row's previous token (y0 for j = 0)."""
        y0 = torch.tensor([r[0] for r in self.rows])
        if self.shape == "chain":
            return self.chain[prev]
        if self.shape == "block":
            return self.block[y0, j]
        return self.block[y0, j] + self.chain[prev]

    def draft(self, slots: Sequence[int], k: int) -> Proposal:
        B = len(self.rows)
        temperature = torch.tensor([r[1] for r in self.rows])
        top_p = torch.tensor([r[2] for r in self.rows])
        prev = torch.tensor([r[0] for r in self.rows])
        toks, confs, probs = [], [], []
        for j in range(k):
            forced = torch.tensor([self.outcome[b][j] for b in range(B)])
            with mock.patch.object(head_module, "sample", lambda p, g, f=forced: f):
                t, c, q = pick_tokens(self.logits(j, prev), temperature, top_p, True, None)
            toks.append(t)
            confs.append(c)
            probs.append(q)
            prev = t
        hot = [r[1] > 0 for r in self.rows]
        widths = torch.tensor([min(k, r[3]) for r in self.rows])
        extra = {}
        if self.shape != "block" and any(hot):   # q_j reads the drafts before j
            extra["conditioned"] = torch.tensor(hot)
        self.proposal = Proposal(torch.stack(toks, 1), torch.stack(confs, 1), torch.stack(probs, 1),  # type: ignore[arg-type]
                                 widths=None if bool((widths == k).all()) else widths, **extra)
        return self.proposal

    def verify(self, slots: Sequence[int], proposal: Proposal | None, keep: Sequence[int]) -> list[list[int]]:
        assert proposal is not None
        self.keep.update(zip(slots, keep, strict=True))
        return [[0] for _ in slots]


def target_probs(prev: int, temperature: float, top_p: float, target: torch.Tensor = TARGET) -> np.ndarray:
    return logits_to_probs(target[prev], temperature, top_p).double().numpy()


def target_law(y0: int, temperature: float, top_p: float, n: int = N, target: torch.Tensor = TARGET
               ) -> dict[tuple[int, ...], float]:
    """The target's law of its next n tokens after y0 (greedy: one sequence)."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = defaultdict(float)
        for seq, w in law.items():
            prev = seq[-1] if seq else y0
            if temperature <= 0:
                nxt[seq + (int(target[prev].argmax()),)] += w
            else:
                for x, px in enumerate(target_probs(prev, temperature, top_p, target)):
                    nxt[seq + (x,)] += w * px
        law = nxt
    return law


def continue_law(seq: tuple[int, ...], y0: int, temperature: float, top_p: float, target: torch.Tensor,
                 n: int = N) -> dict[tuple[int, ...], float]:
    """`seq` continued by the target to n tokens."""
    if len(seq) >= n:
        return {seq[:n]: 1.0}
    rest = target_law(seq[-1] if seq else y0, temperature, top_p, n - len(seq), target)
    return {seq + r: w for r, w in rest.items()}


def step_law(y0: int, drafts: Sequence[int], q: np.ndarray, keep: int, temperature: float, top_p: float,
             target: torch.Tensor) -> dict[tuple[int, ...], float]:
    """The emitted tokens of one verify of `drafts` (q [K, V] their draft distributions) keeping `keep`."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    alive, prev = 1.0, y0
    for j in range(keep):
        p, d = target_probs(prev, temperature, top_p, target), int(drafts[j])
        if temperature <= 0:
            if d != int(p.argmax()):
                law[tuple(drafts[:j]) + (int(p.argmax()),)] += alive
                return law
        else:
            a = min(1.0, p[d] / q[j, d])
            residual = np.maximum(p - q[j], 0.0)
            if a < 1.0:
                for x, r in enumerate(residual / residual.sum()):
                    law[tuple(int(t) for t in drafts[:j]) + (x,)] += alive * (1.0 - a) * r
            alive *= a
        prev = d
    p = target_probs(prev, temperature, top_p, target)
    for x, px in enumerate(p):
        if temperature > 0 or x == int(p.argmax()):
            law[tuple(int(t) for t in drafts[:keep]) + (x,)] += alive * (px if temperature > 0 else 1.0)
    return law


def controller(dcut: bool, K_: int = K, base_ms: float = 1.0, per_token_ms: float = 2.0) -> DcutController | None:
    """A D-Cut controller whose cost table makes cutting pay (every verified token costs as much as the
    forward's base), drafting on every step (no plain steps: their keep is 0, trivially exact)."""
    if not dcut:
        return None
    table = CostTable.linear(K_, base_ms=base_ms, per_token_ms=per_token_ms, batch_sizes=(1, 2, 4, 8))
    return DcutController(table, K_, skip_drafting=False)


def enumerate_step(dec: ToyDecoder, dcut: bool, K_: int = K, **table: float
                   ) -> tuple[list[dict[tuple[int, ...], float]], list[list[int]]]:
    """Every joint outcome of the hot rows' drafts through one `decode_step` -> (each row's law of
    its next N tokens, the keep each outcome got)."""
    rows = dec.rows
    hot = [b for b, r in enumerate(rows) if r[1] > 0]
    laws: list[dict[tuple[int, ...], float]] = [defaultdict(float) for _ in rows]
    keeps = []
    for joint in itertools.product(itertools.product(range(V), repeat=K_), repeat=len(hot)):
        outcome = [[0] * K_ for _ in rows]
        for b, drafts in zip(hot, joint, strict=True):
            outcome[b] = list(drafts)
        dec.outcome = outcome
        dec.keep.clear()
        decode_step(dec, list(range(len(rows))), [100] * len(rows), K_, controller(dcut, K_, **table),  # type: ignore[arg-type]
                    [False] * len(rows), [(0, 0)] * len(rows))
        proposal, keep = dec.proposal, [dec.keep[b] for b in range(len(rows))]
        assert proposal is not None
        keeps.append(keep)
        q = proposal.probs.double().numpy()   # type: ignore[union-attr]
        drafts = proposal.tokens.tolist()
        weight = 1.0
        for b in hot:   # the probability of this outcome under each hot row's q
            weight *= float(np.prod([q[b, j, drafts[b][j]] for j in range(K_)]))
        if weight == 0.0:
            continue
        for b, (y0, t, tp, _) in enumerate(rows):
            for seq, w in step_law(y0, drafts[b], q[b], keep[b], t, tp, dec.target).items():
                for full, c in continue_law(seq, y0, t, tp, dec.target, K_ + 1).items():
                    laws[b][full] += weight * w * c
    return laws, keeps


def assert_exact(law: dict[tuple[int, ...], float], want: dict[tuple[int, ...], float], tol: float = 2e-6) -> None:
    keys = set(law) | set(want)
    worst = max(abs(law.get(s, 0.0) - want.get(s, 0.0)) for s in keys)
    assert worst < tol, f"largest difference from the target's law: {worst:.3g}"


ROWS = {
    "single": [(1, 1.0, 1.0, K)],
    "mixed": [(0, 0.0, 1.0, 1), (1, 1.0, 1.0, K), (2, 0.7, 0.9, K)],   # greedy (a narrow mode), T=1, T=0.7 top-p
}


@pytest.mark.parametrize("dcut", [False, True], ids=["dcut_off", "dcut_on"])
@pytest.mark.parametrize("batch", list(ROWS))
@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_gives_the_target_distribution(shape: str, batch: str, dcut: bool):
    dec = ToyDecoder(shape, ROWS[batch])
    laws, keeps = enumerate_step(dec, dcut)
    for law, (y0, t, tp, _) in zip(laws, dec.rows, strict=True):
        assert_exact(law, target_law(y0, t, tp))
    hot_keeps = {tuple(k[b] for b, r in enumerate(dec.rows) if r[1] > 0) for k in keeps}
    if dcut:   # D-Cut really cut, and (for conditioned drafts) by what the earlier drafts made of q
        assert any(k < K for ks in hot_keeps for k in ks)
        if shape != "block" and batch == "mixed":
            assert len(hot_keeps) > 1
    else:
        assert hot_keeps == {tuple(min(K, r[3]) for r in dec.rows if r[1] > 0)}


def test_counterexample_a_cut_that_reads_the_draft_is_not_exact():
    """The issue's counterexample: target p = (0.5, 0.5), drafter q = (0.9, 0.1) at every position, one
    row at T = 1, a cost table where D-Cut verifies the second draft only when the first two look
    likely. Scored by q(d) (what a draft's own probability says), the second token is 0 with
    probability above 0.5; scored by what is known before each draft is drawn, exactly 0.5."""
    target = torch.log(torch.tensor([[0.5, 0.5]] * 2))
    q = torch.log(torch.tensor([0.9, 0.1]))
    block = q.expand(2, 2, 2).clone()
    global V
    saved = V
    V = 2
    try:
        dec = ToyDecoder("block", [(0, 1.0, 1.0, 2)], target=target, block=block)
        laws, keeps = enumerate_step(dec, True, K_=2)
    finally:
        V = saved
    second = sum(w for seq, w in laws[0].items() if seq[1] == 0)
    assert second == pytest.approx(0.5, abs=1e-6), f"P(second token = 0) = {second:.4f}, target 0.5 (keeps {keeps})"


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
@pytest.mark.parametrize("max_depth", [0, 1, 2])
def test_tree_walk_gives_the_target_distribution(temperature: float, top_p: float, max_depth: int):
    """A deterministic top-2 tree of depth 2 (each root child with its top-1 child), verified by the
    real `accept_walk` under every sequence of the target's samples, at every depth bound."""
    y0 = 1
    first = torch.softmax(CHAIN[y0], -1).topk(2).indices.tolist()
    tokens = first + [int(CHAIN[t].argmax()) for t in first]
    parents = [-1, -1, 0, 1]
    depth = [0, 1, 1, 2, 2]
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for picks in itertools.product(range(V), repeat=3):
        used: list[int] = []
        weight = [1.0]

        def pick(node: int, picks: tuple[int, ...] = picks, used: list[int] = used, weight: list[float] = weight) -> int:
            prev = y0 if node == 0 else tokens[node - 1]
            y = picks[len(used)]
            used.append(y)
            weight[0] *= target_probs(prev, temperature, top_p)[y]
            return y

        last, y = accept_walk(pick, tokens, parents, depth, max_depth)
        weight[0] *= (1.0 / V) ** (len(picks) - len(used))   # the picks the walk never read: summed out
        path: list[int] = []
        node = last
        while node > 0:
            path.insert(0, tokens[node - 1])
            node = parents[node - 1] + 1
        for full, c in continue_law(tuple(path) + (y,), y0, temperature, top_p, TARGET).items():
            law[full] += weight[0] * c
    assert_exact(law, target_law(y0, temperature, top_p))
