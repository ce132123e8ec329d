"""Turning logits into distributions and tokens, exactly as plain sampling does.

Every decode path (AR, speculative verification, drafters that sample) goes through
`logits_to_probs`, so temperature and top-p are applied identically everywhere; that is what
makes speculative sampling's output distribution equal the target's.

A request with a seed samples by the Gumbel-max rule with noise that is a function of (seed,
position) only (`seeded_scores`): its token at position t is argmax(log p_t + g_t). That is an exact
sample of p_t (g_t is fresh Gumbel noise, independent of every earlier token), and it does not
depend on how many random numbers anything else drew: every engine verifies a seeded row greedily on
these scores (drafts are accepted iff they equal that argmax), so a seeded request gets the same
tokens alone or in any batch, with or without drafting, on every path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy
    top_p: float = 1.0         # 1 = disabled
    seed: int | None = None
    logprobs: int | None = None   # report emitted tokens' logprobs with this many top tokens (None: off)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if not (0.0 <= self.temperature <= 100.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"top logprobs must be in [0, 20], got {self.logprobs}")


RowParam = float | Tensor   # one temperature (top-p) for every row, or one per row: [...] = logits' leading dims


def logits_to_probs(logits: Tensor, temperature: RowParam, top_p: RowParam = 1.0) -> Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature and nucleus truncation.
    temperature 0 gives the one-hot of the argmax. Per-row parameters (tensors of the leading shape)
    must have every temperature > 0; a row with top_p 1 is not truncated."""
    logits = logits.float()
    if not isinstance(temperature, Tensor) and temperature <= 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    t = temperature[..., None].float() if isinstance(temperature, Tensor) else temperature
    probs = torch.softmax(logits / t, dim=-1)
    tp = top_p[..., None].float() if isinstance(top_p, Tensor) else top_p
    if bool((torch.as_tensor(tp) < 1.0).any()):
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) >= tp              # keep the smallest prefix whose mass reaches top_p
        if isinstance(tp, Tensor):
            drop &= tp < 1.0                       # rows without top-p keep everything
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """[..., V] -> [...] token ids (one multinomial draw per row)."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.view(probs.shape[:-1])


def position_noise(seed: int, position: int, V: int) -> Tensor:
    """[V] Gumbel noise of a seeded request's token at absolute `position` (a function of both only)."""
    g = torch.Generator().manual_seed(hash((int(seed), int(position))) & (2**63 - 1))
    u = torch.rand(V, generator=g, dtype=torch.float64).clamp(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


def seeded_scores(probs: Tensor, seed: int, first_position: int) -> Tensor:
    """probs [T, V] of the tokens at positions first_position.. -> [T, V] log p + Gumbel noise; the
    argmax of row t is the seeded request's token there (zero-probability tokens never win)."""
    T, V = probs.shape
    noise = torch.stack([position_noise(seed, first_position + t, V) for t in range(T)]) if T \
        else torch.zeros(0, V, dtype=torch.float64)
    return torch.log(probs.double()) + noise


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return g
