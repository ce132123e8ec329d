"""EAGLE-3 (SafeAILab/EAGLE `eagle/traineagle3/`): an autoregressive feature-level head over fused low,
middle and high target layers, trained with training-time test, drafting a token tree.

Module: the captured target layers (low/mid/high, `target_layer_ids`) are concatenated and fused by
`fc` (3H -> H); one MTP-style step `eh_proj([enorm(E[t]) ; hnorm(g)])` + decoder layer + the target's
final norm and LM head. Step 0 reads the fused target features g, later steps the head's own output
(EAGLE's recurrence), which is what training-time test unrolls on the head's own predictions
(`objective = "eagle"`, `engines/training/losses/eagle.py`). The positional cache follows MTP's
convention (`engines/drafters/mtp.py`): entry i is built from (g_i, x_{i+1}) and predicts x_{i+2}.

Tree drafting (EAGLE-2's dynamic tree): the root's children are the top-k tokens of the head at n-1;
at each further depth the k frontier nodes with the highest path score (sum of draft log-probs) are
expanded, each by its top-k tokens, in ONE step over the k nodes (a tree mask over the per-call node
K/V: a node sees the committed cache and its own ancestors). After `depth` levels the `tree_nodes`
best nodes by path score (an ancestor-closed set: scores only fall along a path; ties keep the
shallower node first) form the proposal, verified by `engines/tree.py` in one target pass.
`--block-size N` / the engine's k bound the depth; `tree_topk = 1` drafts a plain chain.

Shapes: B rows, K top-k, P pool of candidate nodes, H hidden, N draft vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engines.drafters.base import DraftContext, Proposal
from engines.drafters.config import DraftConfig, default_target_layers
from engines.drafters.layers import KVFn, empty_proposal
from engines.drafters.mtp import MTPDrafter
from engines.model import ForwardOut, Transformer
from engines.sampling import RowParam


class Eagle3Drafter(MTPDrafter):
    kind = "eagle3"
    objective = "eagle"
    objective_note = "fused low/mid/high target layers; tree drafting (top-k per node)"
    supports_dcut = False   # D-Cut's cost model and calibration are per chain position; a tree is verified whole
    samples_drafts = False  # a deterministic tree: the same proposal at every temperature

    @classmethod
    def label(cls, draft_len: int) -> str:
        return f"{cls.kind} tree d{draft_len}"

    @classmethod
    def config_overrides(cls, target: Transformer) -> dict[str, object]:
        """Low/mid/high target layers, depth 6, top-4 expansion, 24 verified nodes."""
        return dict(target_layer_ids=default_target_layers(target.config.num_hidden_layers, 3),
                    num_draft=6, tree_topk=4, tree_nodes=24)

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        if not cfg.target_layer_ids or cfg.tree_topk < 1 or cfg.tree_nodes < 1:
            raise ValueError("eagle3 needs target_layer_ids, tree_topk >= 1 and tree_nodes >= 1")
        super().__init__(target, cfg)
        H = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * H, H, bias=False)

    # --- target interface ------------------------------------------------------------------------
    @property
    def capture_layers(self) -> list[int]:
        return list(self.cfg.target_layer_ids)

    def features(self, out: ForwardOut) -> Tensor:
        return torch.cat(out.captured, dim=-1)  # [B, T, n*H] low/mid/high, fused by `fc` in `step`

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor, kv_fn: KVFn) -> Tensor:
        """As MTP's; `hidden` is either the target's captured layers [B, T, n*H] (fused by fc first)
        or the head's own previous output [B, T, H]."""
        if hidden.shape[-1] != self.cfg.hidden_size:
            hidden = self.fc(hidden)
        return super().step(hidden, tokens, positions, kv_fn)

    # --- tree drafting ---------------------------------------------------------------------------
    def _top(self, out: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
        """Head output [.., H] -> top-K (token ids, log-probs, probs) [.., K] of the drafting head."""
        head = self.draft_head
        logp = torch.log_softmax(head.logits(self.target.model.norm(out)), -1)
        lp, idx = logp.topk(K, dim=-1)
        return head.tokens(idx), lp, lp.exp()

    def _tree_kv(self, ctx: DraftContext, anc: Tensor, keys: list[Tensor], values: list[Tensor]) -> KVFn:
        """Node queries [B, K] see the committed cache below n, their ancestors among the expanded nodes
        (anc [B, K, M]) and themselves; their own K/V join `keys`/`values` for the next depth."""
        cache = self.cache
        assert cache is not None, "call allocate() first"
        upto = int(ctx.start.max())
        ck, cv = cache.read(0, ctx.slots, upto)
        seen = torch.arange(upto)[None, None, :] < ctx.start[:, None, None]          # [B, 1, upto]

        def kv_fn(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            B, K = k.shape[:2]
            mask = torch.cat([seen.expand(B, K, upto), anc, torch.eye(K, dtype=torch.bool).expand(B, K, K)], -1)
            out_k, out_v = torch.cat([ck.to(k.dtype), *keys, k], 1), torch.cat([cv.to(v.dtype), *values, v], 1)
            keys.append(k)
            values.append(v)
            return out_k, out_v, mask[:, None]

        return kv_fn

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int, temperature: RowParam = 0.0, top_p: RowParam = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        """A top-k tree of depth min(k, num_draft) (deterministic: lossless at any temperature through
        the tree rule; `conf` = each node's own draft probability)."""
        D, K = min(k, self.max_draft), self.cfg.tree_topk
        B = ctx.slots.shape[0]
        if D <= 0:
            return empty_proposal(B)
        root = self.ingest(ctx)                                       # [B, H] output at n-1
        P = K + (D - 1) * K * K                                       # every candidate node
        M = (D - 1) * K                                               # every expanded node
        tok = torch.zeros(B, P, dtype=torch.long)
        parent = torch.full((B, P), -1, dtype=torch.long)
        score = torch.full((B, P), -float("inf"))
        conf = torch.zeros(B, P)
        src = root.new_zeros(B, P, root.shape[-1])                   # output that predicted the node
        anc = torch.zeros(B, P, M, dtype=torch.bool)                  # expanded ancestors of the node
        tok[:, :K], score[:, :K], conf[:, :K] = self._top(root, K)
        src[:, :K] = root[:, None]
        rows = torch.arange(B)[:, None]
        frontier, used = torch.arange(K).expand(B, K), K
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for d in range(1, D):
            beam = frontier.gather(1, score.gather(1, frontier).topk(K, dim=1).indices)   # [B, K]
            a = anc[rows, beam]                                                          # [B, K, M]
            pos = (ctx.start - 1 + d)[:, None].expand(B, K)
            out = self.step(src[rows, beam], tok[rows, beam], pos, self._tree_kv(ctx, a[..., :(d - 1) * K], keys, values))
            a[..., (d - 1) * K:d * K] |= torch.eye(K, dtype=torch.bool)                   # + the beam node
            t, lp, p = self._top(out, K)                                                  # [B, K, K]
            new = slice(used, used + K * K)
            tok[:, new], conf[:, new] = t.reshape(B, -1), p.reshape(B, -1)
            score[:, new] = (score[rows, beam][..., None] + lp).reshape(B, -1)
            parent[:, new] = beam[..., None].expand(B, K, K).reshape(B, -1)
            src[:, new] = out[:, :, None].expand(B, K, K, -1).reshape(B, K * K, -1)
            anc[:, new] = a[:, :, None].expand(B, K, K, M).reshape(B, K * K, M)
            frontier, used = torch.arange(used, used + K * K).expand(B, K * K), used + K * K
        n = min(self.cfg.tree_nodes, P)
        keep = torch.sort(torch.argsort(-score, dim=1, stable=True)[:, :n], dim=1).values   # [B, n] pool ids
        remap = torch.full((B, P + 1), -1, dtype=torch.long)                 # pool id + 1 -> node (-1: root)
        remap[rows, keep + 1] = torch.arange(n).expand(B, n)
        parents = remap.gather(1, parent.gather(1, keep) + 1)
        return Proposal(tok.gather(1, keep), conf.gather(1, keep), None, parents)
