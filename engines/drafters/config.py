"""`drafters/<kind>/config.json`: the schema every drafter kind shares, and the target-derived defaults.

Which kinds exist is the registry's business (`engines.drafters.registry.DRAFTERS`): `kind` is a plain
name here, checked against the registry when a drafter is built or loaded.
"""

from __future__ import annotations

import hashlib

import torch
from pydantic import BaseModel, ConfigDict, Field

from engines.model import ModelConfig, Transformer

MASK_TOKEN_ID = 2  # engines.tokenizer.SPECIAL_TOKENS order: <|endoftext|>, <|pad|>, <|mask|>, ...


def build_target_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """Target decoder layers read by block drafters (z-lab's rule): evenly spaced in [1, L-3].
    L=12, n=3 -> [1, 5, 9]; n=1 -> [L//2]."""
    if n == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (n - 1)) for i in range(n)]


def default_target_layers(num_target_layers: int, n: int = 3) -> list[int]:
    """`n` layers by z-lab's rule, or simply the first `n` of a target with 3 layers or fewer."""
    n = min(n, num_target_layers)
    return build_target_layer_ids(num_target_layers, n) if num_target_layers > 3 else list(range(n))


def target_fingerprint(target: Transformer) -> str:
    """Short hash of the target's (bf16-rounded) embedding: drafters are trained for one target."""
    w = target.model.embed_tokens.weight.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy()
    return hashlib.sha256(w.tobytes()).hexdigest()[:16]


class DraftConfig(BaseModel):
    """`drafters/<kind>/config.json`."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1)                              # a name in the registry
    hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target_num_hidden_layers: int = Field(ge=1)
    target_layer_ids: list[int] = Field(default_factory=list)   # block drafters: captured target layers
    block_size: int = 0                                          # block drafters: default block (B)
    mask_token_id: int | None = None                             # block drafters: <|mask|>
    num_draft: int = 3                                           # mtp: default chain length k
    fusion: bool = False                                         # per-layer blend of target layers (dfly)
    correction_intermediate_size: int = 0                       # dfly: correction head width (0 = none)
    markov_rank: int = Field(default=0, ge=0)                    # dspark: rank of the bigram logit bias
    tree_topk: int = Field(default=0, ge=0)                      # tree drafters: children per expanded node
    tree_nodes: int = Field(default=0, ge=0)                     # tree drafters: nodes verified per step
    draft_vocab_size: int = Field(default=0, ge=0)               # drafting head rows (0 = full vocabulary)
    target_fingerprint: str | None = None
    torch_dtype: str = "bfloat16"

    @classmethod
    def for_target(cls, target: Transformer, **fields: object) -> DraftConfig:
        """The target's width, MHA over its head count, one layer; `fields` (kind, ...) on top."""
        tc = target.config
        d: dict[str, object] = dict(
            hidden_size=tc.hidden_size, vocab_size=tc.vocab_size, intermediate_size=tc.intermediate_size,
            num_layers=1, num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=tc.num_attention_heads, rms_norm_eps=tc.rms_norm_eps,
            rope_theta=tc.rope_theta, target_num_hidden_layers=tc.num_hidden_layers,
            target_fingerprint=target_fingerprint(target),
        )
        return cls.model_validate({**d, **fields})

    def layer_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
