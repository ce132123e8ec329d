"""The one drafter interface: given the target's features for the committed prefix, propose up to k
tokens with a per-token confidence (and, when sampling drafts, the draft distributions).

Position convention (per cache slot): the target cache holds committed tokens x_0..x_{n-1};
y0 = x_n is the last emitted token, not yet fed to the target. One speculative step verifies
[y0, d_1..d_k] at positions n..n+k. After acceptance, the target forward has produced features for
the newly committed positions, and the drafter receives them in the next `propose` call
(`DraftContext`), together with the token that follows each of those positions.

Drafters are batched from the start: one `propose` call drafts for every running request.
Rows are ragged (different numbers of new positions); padding entries continue the positions
past the last valid one and are marked invalid, so writing them into a positional cache only
touches the speculative zone that later steps overwrite.

A new method is one new file with a `Drafter` subclass and one line in `registry.py`: the engine,
the CLIs, training and benchmarks read everything they need from the traits declared below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.drafters.config import DraftConfig
from engines.drafters.head import DraftHead
from engines.model import ForwardOut, Transformer
from engines.sampling import RowParam


class DraftMasks(Protocol):
    """Grammar masks for drafting (`engines.grammar.DraftingMasks`): which tokens each row's next draft
    may be, given its drafts so far. A drafter that picks its drafts one after another masks each
    pick's logits with it, so q is the masked distribution it actually samples from."""

    def after(self, drafted: Tensor | None) -> Tensor:
        """[B, V] bool: the tokens allowed for each row's next draft, once `drafted` ([B], the picks of
        the previous position; None before the first) is appended to its drafts (all True on
        unconstrained rows)."""
        ...


@dataclass
class DraftContext:
    slots: Tensor        # [B]     drafter cache slot of each row (same as the target's)
    feats: Tensor        # [B, T, F] drafter.features() of newly committed positions (right-padded)
    positions: Tensor    # [B, T]  absolute positions of those features (pads continue upward)
    valid: Tensor        # [B, T]  bool, False on padding
    next_tokens: Tensor  # [B, T]  committed token at position+1 (the last valid one is y0)
    last_token: Tensor   # [B]     y0, the first token of the block to draft after
    start: Tensor        # [B]     n, the position of y0
    masks: DraftMasks | None = None   # grammar masks of constrained rows (None: no row is constrained)

    def subset(self, rows: Sequence[int]) -> DraftContext:
        """The context of `rows` only (in that order), its padding cut to their longest new context."""
        idx = torch.tensor(list(rows), dtype=torch.long)
        T = int(self.valid[idx].sum(1).max()) if len(rows) else 0   # valid positions are a prefix of each row
        return DraftContext(self.slots[idx], self.feats[idx, :T], self.positions[idx, :T], self.valid[idx, :T],
                            self.next_tokens[idx, :T], self.last_token[idx], self.start[idx])


@dataclass
class Proposal:
    tokens: Tensor              # [B, k] drafted token ids
    conf: Tensor                # [B, k] D-Cut's score of each position: known before its draft is drawn
                                # (the largest probability of q_j; `engines.drafters.head.pick_tokens`)
    probs: Tensor | None = None  # [B, k, V] draft distributions if drafts were sampled, else None
                                 # (None means greedy drafting: q is one-hot at `tokens`)
    parents: Tensor | None = None  # [B, k] tree drafts (`engines/tree.py`): parent of each node
                                   # (-1: y0; parents precede children); None: a chain
    widths: Tensor | None = None   # [B] drafts row b really has (the rest is padding: a batch whose rows
                                   # draft with different drafters, or not at all); None: k for every row
    conditioned: Tensor | None = None  # [B] bool: row b's q_j (so conf[b, j]) depends on its drafts before
                                       # j (sampled rows of a chain or predecessor-conditioned drafter):
                                       # D-Cut may read conf[b, j] to decide position j and later ones
                                       # only; None: no such row

    def limits(self) -> list[int]:
        """Drafts each row may verify at most."""
        k = int(self.tokens.shape[1])
        return [k] * int(self.tokens.shape[0]) if self.widths is None else [min(k, int(w)) for w in self.widths]

    @staticmethod
    def merge(parts: Sequence[tuple[Sequence[int], Proposal]], batch: int) -> Proposal:
        """Chain proposals for disjoint row sets -> one for `batch` rows (row r of part (rows, p) goes
        to rows[r]), as wide as the widest part; narrower parts and rows in no part (nothing drafted)
        are padded, and `widths` says how far each row's drafts go. Rows drafted greedily get the
        one-hot q of their token when another part sampled, which is what `probs=None` means for them."""
        k = max((int(p.tokens.shape[1]) for _, p in parts), default=0)
        tokens = torch.zeros(batch, k, dtype=torch.long)
        conf = torch.zeros(batch, k)
        widths = torch.zeros(batch, dtype=torch.long)
        conditioned = torch.zeros(batch, dtype=torch.bool)
        sampled = [p.probs for _, p in parts if p.probs is not None]
        probs = torch.zeros(batch, k, sampled[0].shape[-1]) if sampled else None
        for rows, p in parts:
            assert p.parents is None, "tree proposals are never split"
            idx = torch.tensor(list(rows), dtype=torch.long)
            w = int(p.tokens.shape[1])
            tokens[idx, :w], conf[idx, :w] = p.tokens.long(), p.conf.float()
            widths[idx] = torch.tensor(p.limits(), dtype=torch.long)
            if p.conditioned is not None:
                conditioned[idx] = p.conditioned
            if probs is not None:
                probs[idx, :w] = p.probs.float() if p.probs is not None else \
                    torch.nn.functional.one_hot(p.tokens.long(), probs.shape[-1]).float()
        return Proposal(tokens, conf, probs, widths=None if bool((widths == k).all()) else widths,
                        conditioned=conditioned if bool(conditioned.any()) else None)

    def rows(self, rows: Sequence[int]) -> Proposal:
        """The proposal restricted to some rows, in that order."""
        idx = torch.tensor(list(rows), dtype=torch.long)
        return Proposal(self.tokens[idx], self.conf[idx], self.probs[idx] if self.probs is not None else None,
                        self.parents[idx] if self.parents is not None else None,
                        self.widths[idx] if self.widths is not None else None,
                        self.conditioned[idx] if self.conditioned is not None else None)


class Drafter(nn.Module):
    """Base class. Subclasses hold their own weights; the target's embedding and LM head are
    shared (frozen, passed in at construction, never saved in the drafter's files).

    `draft_vocab` ([N] token ids, saved with the drafter; empty = full vocabulary) restricts what
    drafting proposes to the target's frequent tokens; `head_dtype` is the precision of the drafting
    LM head (None: the target's). Both only change drafting speed and acceptance, never the output.
    Training and `draft_logits` use the exact head, over the full vocabulary or, once
    `set_train_vocab` names the draft vocabulary, over those rows only (logits [.., N], index i is
    token `train_vocab[i]`; `vocab_index` / `vocab_token` translate labels and predictions)."""

    # --- traits: what the engine, CLI, training and benchmarks need to know about a kind ---------
    kind: ClassVar[str] = ""
    # True: drafts one token per call, k calls a step (MTP, EAGLE); `--block-size N` means k = N.
    # False: one parallel pass drafts a whole block (DFlash, DFly); `--block-size N` drafts N - 1.
    autoregressive: ClassVar[bool] = False
    # training loss family (engines/training/losses): "chain" unrolls the drafter's own chain
    # (training-time test; needs `step` and `head`), "block" scores anchored blocks (needs
    # `context_kv`, `backbone`, `draft_logits`)
    objective: ClassVar[str] = ""
    objective_note: ClassVar[str] = ""   # appended to the family's description in the training report
    # D-Cut applies: proposals are chains whose per-position confidences D-Cut can cut (a tree is not)
    supports_dcut: ClassVar[bool] = True
    # at T > 0 drafts are sampled from q at the request's temperature; False: proposals ignore the
    # sampling settings (a deterministic tree, verified exactly at any temperature)
    samples_drafts: ClassVar[bool] = True
    # q_j depends on the drafts before j (a chain, or a block whose slots read their predecessor); False:
    # an independent block (every q_j is known before any draft is drawn). D-Cut reads the confidences
    # of a sampled conditioned row only as a stopping rule (`engines.dcut.selection.cut_conditioned`)
    conditioned_drafts: ClassVar[bool] = True

    cfg: DraftConfig

    @classmethod
    def label(cls, draft_len: int) -> str:
        """Human label for a configuration drafting `draft_len` tokens a step ("mtp k=3", "dfly b16")."""
        return f"{cls.kind} k={draft_len}" if cls.autoregressive else f"{cls.kind} b{draft_len + 1}"

    @classmethod
    def config_overrides(cls, target: Transformer) -> dict[str, object]:
        """This kind's defaults on top of `DraftConfig.for_target` (depth, captured layers, block...)."""
        return {}

    @classmethod
    def default_config(cls, target: Transformer, **overrides: object) -> DraftConfig:
        """Defaults for a drafter of this kind for `target`; `overrides` win."""
        return DraftConfig.for_target(target, kind=cls.kind, **{**cls.config_overrides(target), **overrides})

    def __init__(self, target: Transformer, cfg: DraftConfig | None = None) -> None:
        super().__init__()
        # kept out of the module tree so state_dict() never includes target weights
        object.__setattr__(self, "target", target)
        if cfg is not None:   # test doubles may run without a config
            self.cfg = cfg
        n_vocab = cfg.draft_vocab_size if cfg is not None else 0
        self.register_buffer("draft_vocab", torch.zeros(n_vocab, dtype=torch.long))
        self.head_dtype: torch.dtype | None = None
        self._head: DraftHead | None = None
        self.train_vocab: Tensor | None = None   # [N] token ids training logits range over (None: all V)
        # at T > 0: sample drafts from q (True) or draft greedily, q one-hot (False); set by the engine
        self.sample_drafts: bool = False

    def reset_parameters(self) -> None:
        """Fresh training initialisation of the drafter's own weights."""
        raise NotImplementedError

    def set_block_size(self, block_size: int) -> None:
        """Run at `--block-size N`. Autoregressive drafters draft k = N a step, which the engine
        passes to `propose`: nothing to store. Block drafters override this (blocks of N)."""
        if block_size < 1:
            raise ValueError(f"{self.kind}: draft length must be >= 1, got {block_size}")

    # --- what the drafter needs from the target -------------------------------------------------
    @property
    def capture_layers(self) -> Sequence[int]:
        """Target decoder layers whose outputs the drafter reads (passed to Transformer.forward)."""
        return ()

    def features(self, out: ForwardOut) -> Tensor:
        """Target forward output -> per-position features [B, T, F] stored by the drafter."""
        raise NotImplementedError

    @property
    def max_draft(self) -> int:
        """Largest k this drafter proposes in one step."""
        raise NotImplementedError

    # --- state ---------------------------------------------------------------------------------
    def allocate(self, num_slots: int, max_len: int) -> None:
        """Create per-slot caches (called once by the engine)."""

    def reset(self, slot: int) -> None:
        """Forget a slot (request finished)."""

    # --- drafting ------------------------------------------------------------------------------
    def propose(self, ctx: DraftContext, k: int, temperature: RowParam = 0.0, top_p: RowParam = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        raise NotImplementedError

    # --- helpers shared by subclasses -----------------------------------------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        return self.target.embed(tokens)

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """The exact LM head (training, teacher-forced evaluation): [.., H] -> [.., V] fp32, or
        [.., N] over the training vocabulary when one is set."""
        if self.train_vocab is None:
            return self.target.logits(hidden)
        return self.vocab_rows(self.target.lm_head, hidden).float()

    def vocab_rows(self, layer: nn.Linear, x: Tensor) -> Tensor:
        """`layer(x)` for an output layer over the vocabulary ([out V, in]), restricted to the
        training vocabulary's rows when one is set: [.., V] or [.., N]."""
        if self.train_vocab is None:
            return layer(x)
        return F.linear(x, layer.weight[self.train_vocab])

    def set_train_vocab(self, ids: Tensor | None) -> None:
        """Train over these token ids only ([N]; None, empty or all V: the full vocabulary): the
        draft vocabulary the drafter will serve with, so the LM head costs N rows instead of V. The
        target's distribution restricted to the set and renormalised is then the teacher, which is
        what drafting from the set can best match (tokens outside it are never drafted)."""
        full = ids is None or ids.numel() == 0 or ids.numel() >= self.target.config.vocab_size
        self.train_vocab = None if full else ids.long().flatten()

    def vocab_index(self, tokens: Tensor) -> Tensor:
        """Token ids -> indices into the training logits (-100, cross-entropy's ignore index, for a
        token outside the training vocabulary)."""
        if self.train_vocab is None:
            return tokens
        lookup = torch.full((self.target.config.vocab_size,), -100, dtype=torch.long)
        lookup[self.train_vocab] = torch.arange(self.train_vocab.numel())
        return lookup[tokens]

    def vocab_token(self, index: Tensor) -> Tensor:
        """Indices into the training logits -> token ids."""
        return index if self.train_vocab is None else self.train_vocab[index]

    def set_draft_vocab(self, ids: Tensor) -> None:
        """Replace the draft vocabulary ([N] token ids; empty or all V ids: full vocabulary)."""
        ids = ids.long().flatten()
        if ids.numel() >= self.target.config.vocab_size:
            ids = ids[:0]
        self.draft_vocab = ids.to(self.draft_vocab.device)
        if hasattr(self, "cfg"):   # every drafter's DraftConfig records the size
            self.cfg = self.cfg.model_copy(update={"draft_vocab_size": int(ids.numel())})
        self._head = None

    def configure_head(self, dtype: torch.dtype | None = None) -> None:
        """Precision of the drafting LM head (None: the target's, exact)."""
        self.head_dtype = dtype
        self._head = None

    @property
    def draft_head(self) -> DraftHead:
        """The drafting LM head (built lazily from the target; dropped by train()/eval())."""
        if self._head is None:
            dtype = self.head_dtype or self.target.lm_head.weight.dtype
            self._head = DraftHead.build(self.target.lm_head.weight, self.draft_vocab, dtype)
        return self._head

    def train(self, mode: bool = True) -> Drafter:
        self._head = None   # the weights may change: rebuild lazily
        return super().train(mode)
