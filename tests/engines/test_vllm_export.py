"""`specroute model export-vllm` (engines/vllm_export.py) without vLLM: the EAGLE MiniCPM layout and config
vLLM loads, and, through vLLM's `EagleMiniCPMModel` forward written out in plain torch, the same output as
our MTP head's chain step and logits that are ours times rms(y) (so the same greedy draft); DFly refused
with the reason."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engines.drafters.registry import load_drafter
from engines.model import causal_mask, load_model
from engines.vllm_export import EAGLE_ARCH, export_vllm
from specroute.cli import main as cli_main
from specroute.errors import UserError
from tests.engines.worker.bundle import tiny_bundle


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's Qwen2 default). x [T, heads, hd], pos [T]."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = pos[:, None].float() * inv[None]                       # [T, hd/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def eagle_minicpm(w: dict[str, torch.Tensor], cfg: dict, embed: torch.Tensor, h: torch.Tensor,
                  toks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """vLLM's EAGLE MiniCPM head (scalings 1) on one sequence: h [T, H] target hidden, toks/pos [T] ->
    the output it feeds back and reads logits from [T, H]."""
    g = lambda n: w["model." + n]  # noqa: E731
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    x = torch.cat([rms(embed[toks], g("input_norm1.weight"), eps), rms(h, g("input_norm2.weight"), eps)], -1)
    x = x @ g("fc.weight").T
    L = "eagle_layers.0."
    y = rms(x, g(L + "input_layernorm.weight"), eps)
    q, k, v = (y @ g(L + f"self_attn.{p}_proj.weight").T for p in "qkv")
    q, k = rope(q.view(-1, nh, hd), pos, theta), rope(k.view(-1, nkv, hd), pos, theta)
    v = v.view(-1, nkv, hd)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    x = x + a.transpose(0, 1).reshape(len(toks), nh * hd) @ g(L + "self_attn.o_proj.weight").T
    y = rms(x, g(L + "post_attention_layernorm.weight"), eps)
    return x + (F.silu(y @ g(L + "mlp.gate_proj.weight").T) * (y @ g(L + "mlp.up_proj.weight").T)) \
        @ g(L + "mlp.down_proj.weight").T


def test_mtp_exports_as_mimo_mtp_and_matches_our_head(tmp_path):
    model = tiny_bundle(tmp_path / "m", drafters=("mtp",))
    weights = model / "drafters" / "mtp" / "model.safetensors"
    g = torch.Generator().manual_seed(1)   # a fresh head has zero-initialised parts: make every weight matter
    save_file({k: v + (0.05 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
               for k, v in load_file(str(weights)).items()}, str(weights))
    out = tmp_path / "vllm-mtp"
    assert cli_main(["model", "export-vllm", "--model", str(model), "--drafter", "mtp", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [EAGLE_ARCH] and cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 1
    assert (cfg["scale_emb"], cfg["scale_depth"], cfg["mup_denominator"], cfg["dim_model_base"]) == (
        1.0, 1.0, 1, cfg["hidden_size"])
    assert (out / "tokenizer.json").is_file()
    w = load_file(str(out / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in w.values())
    target = load_model(model)
    drafter = load_drafter("mtp", model, target).float()
    T = 7
    h = torch.randn(1, T, cfg["hidden_size"], generator=g)
    toks = torch.randint(0, cfg["vocab_size"], (1, T), generator=g)
    pos = torch.arange(T)[None]

    def kv_fn(k, v):
        return k, v, causal_mask(pos, pos)

    with torch.no_grad():
        y = drafter.step(h, toks, pos, kv_fn)[0]
        theirs = eagle_minicpm(w, cfg, target.model.embed_tokens.weight, h[0], toks[0], pos[0])
        ours_logits = target.lm_head(target.model.norm(y))
        their_logits = theirs @ w["lm_head.weight"].T
    torch.testing.assert_close(theirs, y, atol=2e-4, rtol=2e-4)            # the chain feeds back the same
    scale = theirs.pow(2).mean(-1, keepdim=True).add(cfg["rms_norm_eps"]).sqrt()
    torch.testing.assert_close(their_logits / scale, ours_logits, atol=2e-4, rtol=2e-4)
    assert torch.equal(their_logits.argmax(-1), ours_logits.argmax(-1))    # the same greedy draft


def test_dfly_export_is_refused_with_the_reason(tmp_path):
    model = tiny_bundle(tmp_path / "m", drafters=("dfly",))
    with pytest.raises(UserError, match="q and k per head"):
        export_vllm(model, "dfly", tmp_path / "out")
    assert not (tmp_path / "out").exists()
