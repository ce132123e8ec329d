"""Tree verification (`engines/tree.py`) on a tiny target: the pure acceptance rules against brute
force, the tree forward against plain forwards of each root-to-node path, and an oracle tree drafter
through `SpecDecoder`: token-exact at temperature 0 (single, ragged batches, random depth limits) and
the target's exact distribution of the first two tokens at temperature > 0 (chi-square)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.generate import ar_generate
from engines.model import ForwardOut, KVCache, Transformer
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from engines.tree import accept_greedy, accept_walk, ancestors, path_to, tree_forward
from tests.engines.test_spec import GREEDY, CharTok, make_target, prompts
from tests.lossless import assert_lossless


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def random_tree(B: int, N: int, V: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """parents [B, N] (each node's parent is an earlier node or the root), tokens [B, N]."""
    parents = torch.stack([torch.tensor([int(torch.randint(-1, i, (1,), generator=g)) for i in range(N)])
                           for _ in range(B)])
    return parents, torch.randint(0, V, (B, N), generator=g)


def brute_path(top: list[int], tokens: list[int], parents: list[int], max_depth: int) -> int:
    """Deepest node (first among equals) whose whole root path matches the target's choices."""
    best, best_d = 0, 0
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = parents[j]
        path.reverse()
        prev, ok = 0, True
        for j in path:
            ok = ok and tokens[j] == top[prev]
            prev = j + 1
        if ok and best_d < len(path) <= max_depth:
            best, best_d = i + 1, len(path)
    return best


def test_ancestors_and_acceptance_match_brute_force():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        B, N, V = 3, int(torch.randint(1, 12, (1,), generator=g)), 3   # few tokens: many matches
        parents, tokens = random_tree(B, N, V, g)
        anc = ancestors(parents)
        depth = anc.sum(-1) - 1
        top = torch.randint(0, V, (B, N + 1), generator=g)
        limit = torch.randint(0, 5, (B,), generator=g)
        got = accept_greedy(top, tokens, parents, depth, limit)
        for b in range(B):
            want = brute_path(top[b].tolist(), tokens[b].tolist(), parents[b].tolist(), int(limit[b]))
            assert int(got[b]) == want, (trial, b)
            path = path_to(anc[b], depth[b], want)
            assert path[0] == 0 and len(path) == int(depth[b, want]) + 1
            assert all(parents[b, c - 1] + 1 == p for p, c in zip(path, path[1:], strict=False))
            # the lazy walk agrees whenever sibling tokens are distinct (always true of top-k trees)
            sib = [(int(parents[b, i]), int(tokens[b, i])) for i in range(N)]
            if len(set(sib)) == len(sib):
                last, y = accept_walk(lambda i, row=top[b]: int(row[i]), tokens[b].tolist(), parents[b].tolist(),
                                      depth[b].tolist(), int(limit[b]))
                assert last == want and y == int(top[b, want])


@torch.no_grad()
def test_tree_forward_equals_plain_forward_of_every_path():
    target = make_target()
    g = torch.Generator().manual_seed(1)
    ps = prompts(2, seed=4, lo=3, hi=12)
    N = 9
    parents, tokens = random_tree(2, N, target.config.vocab_size, g)
    cache = KVCache.for_model(target.config, 2, 64)
    for s, p in enumerate(ps):
        target(torch.tensor([p]), torch.arange(len(p))[None], cache, torch.tensor([s]))
    y0 = torch.tensor([[5], [7]])
    full = torch.cat([y0, tokens], 1)
    anc = ancestors(parents)
    depth = anc.sum(-1) - 1
    starts = torch.tensor([len(p) for p in ps])
    out, kvs = tree_forward(target, full, starts[:, None] + depth, anc, starts, cache, torch.tensor([0, 1]), (1, 0))
    assert len(kvs) == target.config.num_hidden_layers and len(out.captured) == 2
    for b, p in enumerate(ps):
        for node in range(N + 1):
            path = path_to(anc[b], depth[b], node)
            seq = torch.tensor([p + full[b, path].tolist()])
            ref = target(seq, torch.arange(seq.shape[1])[None], capture=(1, 0))
            torch.testing.assert_close(out.hidden[b, node], ref.hidden[0, -1], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.captured[0][b, node], ref.captured[0][0, -1], atol=1e-5, rtol=1e-4)


class OracleTree(Drafter):
    """Test double: a top-`width` tree of the target's own most likely tokens, `depth` deep, each token
    replaced by a random one with probability `corrupt` (node by node through plain forwards)."""

    kind = "oracle-tree"

    def __init__(self, target: Transformer, depth: int = 3, width: int = 2, corrupt: float = 0.2) -> None:
        super().__init__(target)
        self.depth, self.width, self.corrupt = depth, width, corrupt
        self.g = torch.Generator().manual_seed(0)
        self.text: dict[int, list[int]] = {}   # slot -> x_0..x_n (y0 last), grown from next_tokens

    def features(self, out: ForwardOut) -> Tensor:
        return out.hidden

    @property
    def max_draft(self) -> int:
        return self.depth

    def reset(self, slot: int) -> None:
        self.text.pop(slot, None)

    def set_prompt(self, slot: int, prompt: list[int]) -> None:
        self.text[slot] = list(prompt[:1])

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        rows_tok, rows_par = [], []
        for b in range(ctx.slots.shape[0]):
            s = int(ctx.slots[b])
            m = int(ctx.valid[b].sum())
            text = self.text[s]
            text += ctx.next_tokens[b, :m].tolist()      # the committed tokens after each new position
            assert len(text) == int(ctx.start[b]) + 1 and text[-1] == int(ctx.last_token[b])
            toks, pars, frontier = [], [], [(-1, text)]
            for _ in range(min(k, self.depth)):
                if not frontier:
                    break
                nxt = []
                seqs = torch.tensor([seq for _, seq in frontier])          # one forward per depth
                hidden = self.target(seqs, torch.arange(seqs.shape[1]).expand_as(seqs)).hidden[:, -1]
                tops = self.target.logits(hidden).topk(self.width).indices.tolist()
                for (parent, seq), top in zip(frontier, tops, strict=True):
                    for t in top:
                        if float(torch.rand(1, generator=self.g)) < self.corrupt:
                            t = int(torch.randint(0, self.target.config.vocab_size, (1,), generator=self.g))
                        if any(p == parent and x == t for p, x in zip(pars, toks, strict=True)):
                            continue   # siblings stay distinct, as in a top-k tree
                        toks.append(t)
                        pars.append(parent)
                        nxt.append((len(toks) - 1, seq + [t]))
                frontier = nxt
            rows_tok.append(toks)
            rows_par.append(pars)
        N = max(len(t) for t in rows_tok)
        tokens = torch.zeros(len(rows_tok), N, dtype=torch.long)
        parents = torch.full((len(rows_tok), N), -1, dtype=torch.long)
        for b, (t, p) in enumerate(zip(rows_tok, rows_par, strict=True)):   # pad: extra root children
            tokens[b, :len(t)], parents[b, :len(p)] = torch.tensor(t, dtype=torch.long), torch.tensor(p, dtype=torch.long)
            tokens[b, len(t):] = 3
        return Proposal(tokens, torch.full((len(rows_tok), N), 0.5), None, parents)


def _start(dec: SpecDecoder, drafter: OracleTree, slot: int, prompt: list[int], params: SamplingParams) -> int:
    y0 = dec.prefill(slot, prompt, params)   # (starting a slot resets the drafter's record of it)
    drafter.set_prompt(slot, prompt)
    return y0


@pytest.mark.parametrize(("corrupt", "random_depth"), [(0.0, False), (0.3, False), (0.3, True), (1.0, False)])
def test_oracle_tree_is_token_exact_single_and_batched(corrupt, random_depth):
    target = make_target()
    drafter = OracleTree(target, depth=3, width=2, corrupt=corrupt)
    dec = SpecDecoder(target, drafter, 3, 128)
    g = torch.Generator().manual_seed(2)
    ps = prompts(3, seed=7, lo=2, hi=25)
    outs = {s: [_start(dec, drafter, s, p, GREEDY)] for s, p in enumerate(ps)}
    live = [0, 1, 2]
    while live:
        keep = [int(torch.randint(0, 4, (1,), generator=g)) if random_depth else 3 for _ in live]
        for s, row in zip(live, dec.verify(live, dec.draft(live, 3), keep), strict=True):
            outs[s] += row
        live = [s for s in live if len(outs[s]) < 30]
    total = sum(dec.stats(s).accepted for s in range(3))
    for s, p in enumerate(ps):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=30, max_len=128).token_ids
        assert_lossless(target, p, outs[s][:30], ref, label=f"tree corrupt={corrupt} row {s}")
    if corrupt == 0.0:
        assert total >= 3 * 20   # the oracle's greedy branch is always accepted
    if corrupt == 1.0:
        assert total < 10


def _exact_pairs(target: Transformer, ids: list[int], temperature: float) -> dict[tuple[int, int], float]:
    with torch.no_grad():
        p1 = logits_to_probs(target.logits(target(torch.tensor([ids]), torch.arange(len(ids))[None]).hidden[0, -1]),
                             temperature)
        V = p1.shape[0]
        seqs = torch.cat([torch.tensor(ids)[None].expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = logits_to_probs(target.logits(target(seqs, torch.arange(seqs.shape[1]).expand_as(seqs)).hidden[:, -1]),
                             temperature)
    joint = p1[:, None].double() * p2.double()
    return {(a, b): float(joint[a, b]) for a, b in itertools.product(range(V), range(V)) if joint[a, b] > 0}


def test_oracle_tree_samples_follow_the_target_distribution():
    from tests.engines.drafters.test_new_families import chi2_pvalue

    target = make_target()
    temperature, n, slots = 0.7, 1000, 50
    ids = prompts(1, seed=9, lo=5, hi=9)[0]
    cells = _exact_pairs(target, ids, temperature)
    drafter = OracleTree(target, depth=2, width=2, corrupt=0.1)
    dec = SpecDecoder(target, drafter, slots, len(ids) + 16)
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    for base in range(0, n, slots):
        outs = {s: [_start(dec, drafter, s, ids, SamplingParams(temperature, seed=base + s))] for s in range(slots)}
        for s, row in zip(range(slots), dec.verify(list(range(slots)), dec.draft(list(range(slots)), 2), [2] * slots),
                          strict=True):
            outs[s] += row
        for s in range(slots):
            accepted += dec.stats(s).accepted
            counts[(outs[s][0], outs[s][1])] = counts.get((outs[s][0], outs[s][1]), 0) + 1
            dec.release(s)
    assert accepted > n // 5, "the tree should accept often enough for the test to mean something"
    assert all(key in cells for key in counts)
    big = [key for key, p in cells.items() if p * n >= 5]
    obs = [counts.get(key, 0) for key in big] + [n - sum(counts.get(key, 0) for key in big)]
    exp = [cells[key] * n for key in big] + [n - sum(cells[key] * n for key in big)]
    assert chi2_pvalue(obs, exp) > 1e-3
