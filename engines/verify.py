"""The lossless verification rule: pure functions over tensors, batched, with per-row `keep`.

A verification step feeds `[y0, d_1..d_K]` to the target and gets the target's distribution p_i at
every draft position i (p_{K+1} is the bonus position). Row b verifies only its first `keep[b]`
drafts; the token after the accepted prefix comes from p at the first rejected or unverified
position, so verifying a prefix of the draft (D-Cut) is still exact.

- Greedy (temperature 0): accept d_i while d_i == argmax p_i; then emit argmax p at the first
  mismatch (the correction) or at position keep+1 (the bonus).
- Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); on the first rejection emit x ~ norm(max(0, p_i - q_i)); if all kept
  drafts are accepted emit the bonus x ~ p_{keep+1}. `draft_probs=None` means greedy drafting
  (q one-hot at d), the default for every drafter.

`target_probs` must come from `engines.sampling.logits_to_probs` with the request's temperature and
top-p, exactly as plain sampling computes them; that is what makes the output distribution equal
the target's.

Shapes: B rows, K drafts (the widest row), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _kept_mask(keep: Tensor, K: int) -> Tensor:
    """keep [B] -> [B, K] bool, True for the first keep[b] positions of row b."""
    return torch.arange(K, device=keep.device)[None, :] < keep[:, None]


def _prefix_length(ok: Tensor) -> Tensor:
    """[B, K] bool -> [B] length of the all-True prefix."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def verify_greedy(target_logits: Tensor, drafts: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """target_logits [B, K+1, V], drafts [B, K], keep [B] (0..K)
    -> (num_accepted [B], next_token [B]): correction at the first mismatch, else the bonus."""
    B, K = drafts.shape
    assert target_logits.shape[:2] == (B, K + 1), (target_logits.shape, drafts.shape)
    top = target_logits.argmax(dim=-1)                                  # [B, K+1]
    ok = (drafts == top[:, :K]) & _kept_mask(keep, K)                   # [B, K]
    num_accepted = _prefix_length(ok)                                   # [B]
    next_token = top.gather(1, num_accepted[:, None]).squeeze(1)        # [B]
    return num_accepted, next_token


def _generator_for(generator: torch.Generator | Sequence[torch.Generator | None] | None,
                   b: int) -> torch.Generator | None:
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    return generator[b]


def verify_sample(target_probs: Tensor, drafts: Tensor, draft_probs: Tensor | None, keep: Tensor,
                  generator: torch.Generator | Sequence[torch.Generator | None] | None = None,
                  ) -> tuple[Tensor, Tensor]:
    """Speculative sampling. target_probs [B, K+1, V] (after temperature / top-p), drafts [B, K],
    draft_probs [B, K, V] or None (greedy drafts: q one-hot), keep [B] (0..K); `generator` is one
    generator for the batch or one per row (per-request seeds).
    -> (num_accepted [B], next_token [B])."""
    B, K = drafts.shape
    V = target_probs.shape[-1]
    assert target_probs.shape[:2] == (B, K + 1), (target_probs.shape, drafts.shape)
    p = target_probs.float()
    p_d = p[:, :K].gather(2, drafts[..., None]).squeeze(-1)             # [B, K] p_i(d_i)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)                                      # q one-hot at d
    else:
        q_d = draft_probs.float().gather(2, drafts[..., None]).squeeze(-1)
    per_row = generator is not None and not isinstance(generator, torch.Generator)
    if per_row:  # one uniform per draft position, from each row's own generator (per-request seeds)
        u = torch.stack([torch.rand(K, generator=_generator_for(generator, b)) for b in range(B)]) \
            if K else torch.zeros(B, 0)                                 # [B, K]
    else:
        u = torch.rand(B, K, generator=generator)                       # [B, K]
    ok = (q_d > 0) & (u * q_d < p_d) & _kept_mask(keep, K)              # u < p/q  <=>  accept
    num_accepted = _prefix_length(ok)                                   # [B]

    rows = torch.arange(B)
    dist = p[rows, num_accepted]                                        # [B, V] p at the stop position
    rejected = num_accepted < keep                                      # [B] else: bonus from p
    if K and bool(rejected.any()):
        at = num_accepted.clamp_max(K - 1)
        if draft_probs is None:
            q = torch.nn.functional.one_hot(drafts[rows, at], V).float()   # [B, V]
        else:
            q = draft_probs.float()[rows, at]
        residual = (dist - q).clamp_min(0.0)                            # max(0, p - q)
        # an all-zero residual means p == q up to rounding, where rejection has probability ~0:
        # fall back to p, the exact distribution in that limit
        use = rejected & (residual.sum(-1) > 0)
        dist = torch.where(use[:, None], residual, dist)
    dist = dist / dist.sum(-1, keepdim=True)
    if per_row:
        next_token = torch.stack([torch.multinomial(dist[b], 1, generator=_generator_for(generator, b))[0]
                                  for b in range(B)])
    else:
        next_token = torch.multinomial(dist, 1, generator=generator).squeeze(-1)
    return num_accepted, next_token
