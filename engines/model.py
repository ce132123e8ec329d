"""Llama-style decoder written for decoding (gpt-fast / nanoGPT style).

RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention and a static KV cache
with independent slots: many sequences at different lengths share one batch, each row names its
cache slot and the absolute positions of its tokens. Rolling a slot back is moving its length
pointer; stale entries past the pointer are never read because a query at position p only attends
to keys at positions <= p, all of which are either committed or written by the same forward.

Parameter names follow Hugging Face's `LlamaForCausalLM`, so `model.safetensors` + `config.json`
load in `transformers` unchanged, and local Llama/Qwen2-family checkpoints load here.

Shapes: B batch rows, T tokens per row, S cache slots, L max cache length, H hidden size,
nh / nkv query / key-value heads, hd head dim, V vocabulary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specroute.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf_dict(cls, d: dict) -> ModelConfig:
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        if d.get("rope_scaling"):
            raise UserError(f"unsupported config: rope_scaling={d['rope_scaling']!r}")
        rope = d.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise UserError(f"unsupported config: rope_parameters={rope!r} (only the default rotary embedding)")
        if d.get("hidden_act", "silu") != "silu":
            raise UserError(f"unsupported config: hidden_act={d['hidden_act']!r} (only silu)")
        head_dim = d.get("head_dim")
        if head_dim is not None and head_dim * d["num_attention_heads"] != d["hidden_size"]:
            raise UserError("unsupported config: head_dim * num_attention_heads != hidden_size")
        if d["num_attention_heads"] % d.get("num_key_value_heads", d["num_attention_heads"]):
            raise UserError("unsupported config: num_attention_heads not divisible by num_key_value_heads")
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            model_type=model_type,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
        )

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d.update(
            architectures=["LlamaForCausalLM"],
            hidden_act="silu",
            head_dim=self.head_dim,
            attention_dropout=0.0,
            mlp_bias=False,
            initializer_range=0.02,
            torch_dtype="bfloat16",
            use_cache=True,
        )
        d.update(self.extra)
        return d

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, list) else (self.eos_token_id,)


class KVCache:
    """Static per-layer K/V buffers `[S, L, nkv, hd]` plus a committed length per slot."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        shape = (num_layers, num_slots, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)  # [S]
        self.max_len = max_len
        self.num_slots = num_slots

    @classmethod
    def for_model(cls, config: ModelConfig, num_slots: int, max_len: int,
                  dtype: torch.dtype = torch.float32) -> KVCache:
        return cls(config.num_hidden_layers, num_slots, max_len, config.num_key_value_heads,
                   config.head_dim, dtype)

    def write(self, layer: int, slots: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """slots [B], positions [B, T], k/v [B, T, nkv, hd]."""
        rows = slots[:, None].expand_as(positions)
        self.k[layer, rows, positions] = k
        self.v[layer, rows, positions] = v

    def read(self, layer: int, slots: Tensor, upto: int) -> tuple[Tensor, Tensor]:
        """K/V of positions [0, upto) for each row: [B, upto, nkv, hd] each."""
        return self.k[layer, slots, :upto], self.v[layer, slots, :upto]

    def rollback(self, slot: int, length: int) -> None:
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, hd] (HF's non-interleaved rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions[..., None].float() * inv_freq  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def causal_mask(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """Key j is visible to query i iff pos_k[j] <= pos_q[i]. [B, T], [B, L] -> [B, 1, T, L]."""
    return (k_positions[:, None, :] <= q_positions[:, :, None])[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * hd, cfg.hidden_size, bias=False)

    def query(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [B, T, H] -> roped q [B, nh, T, hd]."""
        B, T, _ = x.shape
        return apply_rope(self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2), cos, sin)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, H] -> roped k, v [B, T, nkv, hd] (the layout the cache stores)."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)   # [B, nkv, T, hd]
        return apply_rope(k, cos, sin).transpose(1, 2), self.v_proj(x).view(B, T, self.nkv, self.hd)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """q [B, nh, T, hd], keys/values [B, L, nkv, hd], mask [B|1, 1, T, L] -> output [B, T, H]."""
        B, _, T, _ = q.shape
        out = F.scaled_dot_product_attention(
            q, keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
            attn_mask=mask, enable_gqa=self.nh != self.nkv,
        )  # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, layer: int,
                cache: KVCache | None, slots: Tensor | None) -> Tensor:
        q = self.query(x, cos, sin)
        k, v = self.kv(x, cos, sin)
        if cache is None:
            keys, values, k_pos = k, v, positions
        else:
            assert slots is not None
            cache.write(layer, slots, positions, k.to(cache.k.dtype), v.to(cache.v.dtype))
            upto = int(positions.max()) + 1
            keys, values = cache.read(layer, slots, upto)  # [B, upto, nkv, hd]
            k_pos = torch.arange(upto, device=x.device).expand(x.shape[0], upto)
        return self.attend(q, keys, values, causal_mask(positions, k_pos))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, layer: int,
                cache: KVCache | None, slots: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, layer, cache, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class ForwardOut:
    hidden: Tensor                  # [B, T, H] after the final norm (what the LM head reads)
    captured: list[Tensor]          # outputs of the requested decoder layers, each [B, T, H]


class Transformer(nn.Module):
    """`LlamaForCausalLM`-compatible decoder. Call `forward` for features, `logits` for the head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, tokens: Tensor) -> Tensor:
        return self.model.embed_tokens(tokens)

    def logits(self, hidden: Tensor) -> Tensor:
        """[.., H] -> [.., V] in fp32."""
        return self.lm_head(hidden).float()

    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCache | None = None,
                slots: Tensor | None = None, capture: Sequence[int] = ()) -> ForwardOut:
        """tokens, positions [B, T]; slots [B] (required with a cache). Writes K/V at `positions`
        of each row's slot; does not move the cache's length pointers (callers commit)."""
        x = self.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        captured: list[Tensor] = []
        want = set(capture)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, positions, i, cache, slots)
            if i in want:
                captured.append(x)
        if list(capture) != sorted(want):
            order = sorted(want)
            captured = [captured[order.index(i)] for i in capture]
        return ForwardOut(self.model.norm(x), captured)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def init_weights(model: nn.Module, std: float = 0.02, num_layers: int | None = None) -> None:
    """nanoGPT-style init: normal(0, std), residual projections scaled by 1/sqrt(2 * layers)."""
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        scale = std
        if num_layers and (name.endswith("o_proj.weight") or name.endswith("down_proj.weight")):
            scale = std / math.sqrt(2 * num_layers)
        nn.init.normal_(p, mean=0.0, std=scale)


def load_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir)
    if not path.is_dir():
        raise UserError(f"model directory not found: {path}")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"no config.json in model directory {path}")
    try:
        d = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_path}: invalid JSON ({exc.msg})") from None
    try:
        return ModelConfig.from_hf_dict(d)
    except KeyError as exc:
        raise UserError(f"{cfg_path}: missing field {exc.args[0]!r}") from None


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Transformer:
    """Load a HF-format Llama/Qwen2 checkpoint (`config.json` + `model*.safetensors`)."""
    from safetensors.torch import load_file

    path = Path(model_dir)
    cfg = load_config(path)
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise UserError(f"no model*.safetensors in {path}")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    model = Transformer(cfg)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    unexpected = [u for u in unexpected if not u.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise UserError(f"{path}: weights do not match config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(dtype).eval()


def save_model(model: Transformer, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
