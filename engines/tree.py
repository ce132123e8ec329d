"""Tree verification (EAGLE-2/3 style): a drafter proposes a token tree instead of a chain, the target
checks every node in ONE forward with a tree attention mask, the longest accepted root-to-node path is
kept and the slot's cache is compacted to it.

A tree proposal (`Proposal.parents` set) holds N nodes per row, `parents[b, i]` in -1..i-1 (-1: the
root y0; parents precede children). With the root as node 0 the row is `[y0, node_1..node_N]`; node j
sits at position n + depth(j) and attends to the committed cache (positions < n) and to its own
ancestors (itself included), which is exactly what the target would see on that path alone.

Acceptance, lossless for deterministic drafts (the tree is top-k, q one-hot per node):

- temperature 0: node j is accepted iff its parent is and its token is the target's argmax at the
  parent; the deepest accepted node (ties: the first) ends the kept path; emit the target's argmax there.
- temperature > 0: walk from the root: sample y ~ p at the current node (the request's own generator);
  if a child carries y, move there, else stop and emit y. Every emitted token is a sample of the
  target's distribution given the emitted prefix, so the output distribution is the target's. A
  seeded request's y is its Gumbel-max at that position (`engines.sampling.seeded_scores`).

The forward writes nothing into the cache; the K/V of the kept path (root included) are then written
at positions n..n+a, the same entries a chain verify would leave, and the length pointer moves to n+a+1.

Shapes: B rows, N nodes, M = N + 1 (with the root), V vocabulary, L target layers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engines.grammar import commit_rows, mask_drafted
from engines.logprobs import record as record_logprobs
from engines.model import ForwardOut, KVCache, Transformer, rope_cos_sin
from engines.sampling import logits_to_probs, sample, seeded_scores

if TYPE_CHECKING:
    from engines.drafters.base import Proposal
    from engines.slots import SlotState
    from engines.spec import SpecDecoder


def ancestors(parents: Tensor) -> Tensor:
    """parents [B, N] -> [B, M, M] bool: [b, i, j] iff node j is node i or one of its ancestors
    (index 0 is the root y0, node i of the proposal is index i + 1)."""
    B, N = parents.shape
    anc = torch.eye(N + 1, dtype=torch.bool).repeat(B, 1, 1)
    rows = torch.arange(B)
    for i in range(N):
        anc[:, i + 1] |= anc[rows, parents[:, i] + 1]
    return anc


def accept_greedy(top: Tensor, tokens: Tensor, parents: Tensor, depth: Tensor, max_depth: Tensor) -> Tensor:
    """top [B, M] target argmax at every node, tokens/parents [B, N], depth [B, M], max_depth [B]
    -> [B] index (0..N) of the deepest accepted node (the root when nothing is accepted)."""
    B, N = tokens.shape
    rows = torch.arange(B)
    ok = torch.zeros(B, N + 1, dtype=torch.bool)
    ok[:, 0] = True
    for i in range(N):
        p = parents[:, i] + 1
        ok[:, i + 1] = ok[rows, p] & (tokens[:, i] == top[rows, p]) & (depth[:, i + 1] <= max_depth)
    return (depth * ok).argmax(-1)   # first maximum: the earliest of equally deep nodes


def accept_walk(pick: Callable[[int], int], tokens: Sequence[int], parents: Sequence[int],
                depth: Sequence[int], max_depth: int) -> tuple[int, int]:
    """One row, lazily: `pick(node)` -> the target's token at that node (a sample at T > 0). Walks from
    the root while a child within `max_depth` carries the picked token -> (last node index, token)."""
    cur = 0
    while True:
        y = pick(cur)
        nxt = next((i + 1 for i in range(len(tokens)) if parents[i] + 1 == cur and tokens[i] == y
                    and depth[i + 1] <= max_depth), None)
        if nxt is None:
            return cur, y
        cur = nxt


def path_to(anc: Tensor, depth: Tensor, node: int) -> list[int]:
    """anc [M, M], depth [M] of one row -> the nodes root..node in depth order."""
    nodes = anc[node].nonzero().flatten()
    return nodes[depth[nodes].argsort()].tolist()


def tree_forward(target: Transformer, tokens: Tensor, positions: Tensor, anc: Tensor, starts: Tensor,
                 cache: KVCache, slots: Tensor, capture: Sequence[int] = ()
                 ) -> tuple[ForwardOut, list[tuple[Tensor, Tensor]]]:
    """tokens/positions [B, M], anc [B, M, M], starts [B] (committed length n per row): every node
    attends to its row's cache below n and to its ancestors. Writes nothing into the cache.
    -> (ForwardOut as `Transformer.forward`, per layer the nodes' roped (k, v) [B, M, nkv, hd])."""
    x = target.embed(tokens)
    cfg = target.config
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, x.dtype)
    upto = int(starts.max())
    seen = torch.arange(upto)[None, None, :] < starts[:, None, None]                 # [B, 1, upto]
    mask = torch.cat([seen.expand(-1, tokens.shape[1], -1), anc], -1)[:, None]      # [B, 1, M, upto+M]
    kvs: list[tuple[Tensor, Tensor]] = []
    captured: list[Tensor] = []
    for i, layer in enumerate(target.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        k, v = a.kv(h, cos, sin)
        ck, cv = cache.read(i, slots, upto)
        keys, values = torch.cat([ck.to(k.dtype), k], 1), torch.cat([cv.to(v.dtype), v], 1)
        x = x + a.attend(a.query(h, cos, sin), keys, values, mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        kvs.append((k, v))
        if i in capture:
            captured.append(x)
    order = sorted(set(capture))
    return ForwardOut(target.model.norm(x), [captured[order.index(i)] for i in capture]), kvs


def verify_tree(dec: SpecDecoder, slots: Sequence[int], states: Sequence[SlotState], proposal: Proposal,
                max_depth: Sequence[int], t0: float) -> list[list[int]]:
    """`SpecDecoder.verify` for a tree proposal; `max_depth[b]` (keep, clamped to the room left) bounds
    the accepted path. Returns the tokens emitted per row, as `verify`."""
    assert proposal.parents is not None
    B, N = proposal.tokens.shape
    parents = proposal.parents.long()
    tokens = torch.cat([torch.tensor([st.y0 for st in states])[:, None], proposal.tokens.long()], 1)  # [B, M]
    anc = ancestors(parents)
    depth = anc.sum(-1) - 1                                                          # [B, M]
    starts = torch.tensor([dec.length(s) for s in slots])
    slot_t = torch.tensor(list(slots))
    out, kvs = tree_forward(dec.target, tokens, starts[:, None] + depth, anc, starts, dec.cache, slot_t, dec.capture)
    logits = dec.target.logits(out.hidden)                                           # [B, M, V]
    cons = [st.constraint for st in states]   # a grammar-constrained row verifies no drafts: a plain step
    limit = torch.tensor([0 if c is not None else d for c, d in zip(cons, max_depth, strict=True)], dtype=torch.long)
    logits = mask_drafted(cons, logits, tokens[:, 1:], [0] * B)
    last = torch.zeros(B, dtype=torch.long)
    nxt = torch.zeros(B, dtype=torch.long)
    greedy = [b for b, st in enumerate(states) if st.params.greedy]
    if greedy:
        g = torch.tensor(greedy)
        top = logits[g].argmax(-1)
        last[g] = accept_greedy(top, tokens[g, 1:], parents[g], depth[g], limit[g])
        nxt[g] = top[torch.arange(len(greedy)), last[g]]
    for b, st in enumerate(states):
        if st.params.greedy:
            continue
        probs = logits_to_probs(logits[b], st.params.temperature, st.params.top_p)  # [M, V]
        n, seed = int(starts[b]), st.params.seed

        def pick(i: int, pr: Tensor = probs, g: torch.Generator = st.generator, n: int = n, seed: int | None = seed,
                 dp: Tensor = depth[b]) -> int:   # the token after node i: at position n + depth + 1
            if seed is not None:
                return int(seeded_scores(pr[i:i + 1], seed, n + int(dp[i]) + 1)[0].argmax())
            return int(sample(pr[i], g))
        last[b], nxt[b] = accept_walk(pick, tokens[b, 1:].tolist(), parents[b].tolist(), depth[b].tolist(),
                                      int(limit[b]))
    commit_rows(cons, [0] * B, nxt.tolist())
    feats = dec.features(dec.drafter, out) if dec.drafter is not None else None
    emitted: list[list[int]] = []
    for b, (s, st) in enumerate(zip(slots, states, strict=True)):
        path = path_to(anc[b], depth[b], int(last[b]))         # root .. last, a + 1 nodes
        a, n = len(path) - 1, int(starts[b])
        idx = torch.tensor(path)
        for layer, (k, v) in enumerate(kvs):                    # compact the kept path into the cache
            dec.cache.k[layer, s, n:n + a + 1] = k[b, idx].to(dec.cache.k.dtype)
            dec.cache.v[layer, s, n:n + a + 1] = v[b, idx].to(dec.cache.v.dtype)
        dec.cache.lengths[s] = n + a + 1
        row = tokens[b, idx[1:]].tolist() + [int(nxt[b])]
        record_logprobs(st.logprobs, logits[b, idx], row, st.params)   # node path[j]'s logits sampled row[j]
        if feats is not None:
            st.pending_for(dec.drafter).append(feats[b, idx], n, row)
        st.y0 = row[-1]
        st.stats.record_step(int((depth[b, 1:] <= limit[b]).sum()), a, dec.drafter.kind if dec.drafter else None)
        emitted.append(row)
    dec.timing.verify_s += time.perf_counter() - t0
    dec.timing.verify_calls += 1
    return emitted
