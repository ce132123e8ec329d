"""The drafting LM head: the target's LM head as drafters use it at inference.

Drafters share the target's (frozen) LM head, but drafting does not need it exact: whatever the
drafter proposes, verification keeps the output the target's. Two cheap approximations are allowed:

- a reduced **draft vocabulary** (FR-Spec / EAGLE-3's draft vocab): only the rows of the N most
  frequent tokens of the target's own outputs, so each drafted position reads N x H weights instead
  of V x H; a token outside the set is simply never drafted (its draft probability q is 0, which
  speculative sampling handles exactly);
- a lower-precision copy (bf16 by default when serving), halving the bytes each draft position reads.
  It is used where it is faster (`engines.precision.bf16_pays`): always on a CPU with native bf16,
  else only for products of a row or two (an emulated bf16 product over more rows is slower than fp32,
  so wider drafting, a DFly block or a busy batch, reads the rows in the target's precision).

`DraftHead` holds those rows (never saved: rebuilt from the target) and maps draft-vocabulary
indices back to token ids. Shapes: N draft vocabulary, V full vocabulary, H hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.precision import bf16_is_native, bf16_pays
from engines.sampling import RowParam, logits_to_probs, sample


@dataclass
class DraftHead:
    weight: Tensor          # [N, H] the target's LM-head rows for the draft vocabulary, its dtype
    ids: Tensor | None      # [N] token id of row i (None: the full vocabulary, row i is token i)
    vocab_size: int         # V
    narrow: Tensor | None = None   # [N, H] the same rows in the drafting dtype, where it differs

    @classmethod
    def build(cls, lm_head: Tensor, draft_vocab: Tensor | None, dtype: torch.dtype) -> DraftHead:
        """lm_head [V, H]; draft_vocab [N] token ids (None or empty: full vocabulary); `dtype` the
        drafting precision (the target's: exact)."""
        V = lm_head.shape[0]
        full = draft_vocab is None or draft_vocab.numel() == 0
        ids = None if full else draft_vocab.long()   # type: ignore[union-attr]
        rows = lm_head.detach() if ids is None else lm_head.detach()[ids].contiguous()
        narrow = rows.to(dtype).contiguous() if dtype != rows.dtype else None
        if narrow is not None and bf16_is_native():
            rows = narrow    # never read in the target's precision: keep one copy
        return cls(rows, ids, V, narrow)

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def logits(self, hidden: Tensor) -> Tensor:
        """[.., H] -> [.., N] fp32, through the drafting copy where it is the faster product."""
        w = self.narrow if self.narrow is not None and bf16_pays(hidden.numel() // hidden.shape[-1]) else self.weight
        return F.linear(hidden.to(w.dtype), w).float()

    def masked(self, logits: Tensor, allowed: Tensor) -> Tensor:
        """logits [B, N] with -inf outside each row's allowed tokens (allowed [B, V]), rows with no
        allowed token in the draft vocabulary left as they are."""
        a = allowed if self.ids is None else allowed[:, self.ids]     # [B, N]
        a = a | ~a.any(-1, keepdim=True)
        return logits.masked_fill(~a, float("-inf"))

    def tokens(self, index: Tensor) -> Tensor:
        """Draft-vocabulary indices -> token ids (same shape)."""
        return index if self.ids is None else self.ids[index]

    def full_probs(self, probs: Tensor) -> Tensor:
        """[.., N] distribution over the draft vocabulary -> [.., V] (zero outside it)."""
        if self.ids is None:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        out[..., self.ids] = probs
        return out

    def pick(self, logits: Tensor, temperature: RowParam, top_p: RowParam, sample: bool,
             generator: torch.Generator | None, allowed: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """logits [B, N] -> (token ids [B], confidence [B], full draft distribution [B, V] | None).
        Greedy unless sampling drafts at temperature > 0; confidence as `pick_tokens`. `allowed` [B, V]
        (a grammar's masks): each row picks among its allowed tokens, and its q is that masked
        distribution; a row none of whose allowed tokens is in the draft vocabulary picks unmasked."""
        if allowed is not None:
            logits = self.masked(logits, allowed)
        idx, conf, probs = pick_tokens(logits, temperature, top_p, sample, generator)
        return self.tokens(idx), conf, None if probs is None else self.full_probs(probs)


def draft_vocab_from_counts(counts: Tensor, size: int, always: Iterable[int] = ()) -> Tensor:
    """The `size` most frequent token ids (counts [V]), `always` included (EOS and other special
    tokens a response must be able to end with), sorted by id. size >= V means the full vocabulary."""
    V = counts.shape[0]
    if size <= 0 or size >= V:
        return torch.arange(V)
    score = counts.double().clone()
    forced = [i for i in always if 0 <= i < V]
    score[forced] = float("inf")
    ids = torch.argsort(score, descending=True, stable=True)[:size]   # ties: lower id first
    return ids.sort().values


def hot_rows(temperature: RowParam, sample_drafts: bool, batch: int) -> Tensor:
    """[batch] bool: the rows whose drafts are sampled (the drafter samples and their temperature is > 0)."""
    if not sample_drafts:
        return torch.zeros(batch, dtype=torch.bool)
    if isinstance(temperature, Tensor):
        return temperature.reshape(-1) > 0.0
    return torch.full((batch,), temperature > 0.0)


def pick_tokens(logits: Tensor, temperature: RowParam, top_p: RowParam, sample_drafts: bool,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """logits [B, V] -> (token [B], conf [B], probs [B, V] | None).
    Greedy unless the drafter samples drafts and temperature > 0. conf = the largest probability of
    the distribution the token is picked from (greedy: the token's own): it is known before the token
    is drawn, so D-Cut, which reads it to decide what to verify, never looks at the draft it decides
    on (a score of q(d) would verify likely drafts more often than unlikely ones, and the verified
    drafts would no longer be distributed as q). Per-row parameters ([B] tensors) let greedy and sampled rows share one call: a greedy row's
    probs are the one-hot of its token (what greedy drafting means to verification)."""
    hot = hot_rows(temperature, sample_drafts, logits.shape[0])
    n_hot = int(hot.sum())
    if n_hot == 0:
        p = torch.softmax(logits.float(), dim=-1)
        conf, tok = p.max(-1)
        return tok, conf, None
    if isinstance(temperature, Tensor):
        temperature = torch.where(hot, temperature.float(), 1.0)   # greedy rows: anything > 0, replaced below
    probs = logits_to_probs(logits, temperature, top_p)
    tok = sample(probs, generator)
    conf = probs.max(-1).values
    if n_hot < logits.shape[0]:
        g_conf, g_tok = torch.softmax(logits.float(), dim=-1).max(-1)
        tok, conf = torch.where(hot, tok, g_tok), torch.where(hot, conf, g_conf)
        probs = torch.where(hot[:, None], probs, torch.nn.functional.one_hot(g_tok, probs.shape[-1]).float())
    return tok, conf, probs
