"""`specroute model export-vllm --model BUNDLE --drafter KIND --out DIR`: one of our drafters in a layout
vLLM's own speculative decoding loads.

MTP -> vLLM's EAGLE head of MiniCPM (`EagleMiniCPMForCausalLM`; `--vllm-method eagle --vllm-drafter DIR`),
the one vLLM draft model whose structure is our chain head's: norms on both inputs before the projection,
then a plain pre-norm Llama layer, its own config (our head's 9 KV heads; vLLM's MTP models take their
layer's shape from the target's config, 3 KV heads here), and the output before any norm fed back into
the next step. MiniCPM's scalings are set to 1 (`scale_emb`, `scale_depth`, `mup_denominator`,
`dim_model_base` = hidden size):

    ours                                         EAGLE MiniCPM (model.*)
    eh_proj([enorm(E[t]) ; hnorm(h)])            fc([input_norm1(E[t]) ; input_norm2(h)])
    layer (q/k/v/o, SwiGLU MLP, two norms)       eagle_layers.0
    logits = E . norm(y)                         logits = lm_head . y, lm_head = E * w_norm (each row)

vLLM's head reads no final norm: with `lm_head` = the embedding times the target's final-norm weight,
its logits are ours times rms(y) > 0, so its greedy draft (vLLM drafts greedily by default) is ours.
What differs: vLLM drafts over the full vocabulary (ours over its reduced draft vocabulary), so a draft
ours could not make is possible there.

DFly and DFlash have no vLLM format that holds them (`UNSUPPORTED`): every vLLM DFlash model
(`DFlashDraftModel`, `DFlash2DraftModel`, Laguna's) applies per-head RMSNorm to q and k (Qwen3 attention)
and feeds one shared context projection to every layer, with no correction head; our block drafters
have Llama attention (DFly also a per-layer blend of the target layers and a correction head). Writing
their weights into that layout would give vLLM a different drafter, so the export refuses and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from specroute.errors import UserError

EAGLE_ARCH = "MiniCPMForCausalLM"   # vLLM's EAGLEConfig prefixes "Eagle": EagleMiniCPMForCausalLM
UNSUPPORTED = {
    "dfly": "vLLM's DFlash models (qwen3_dflash, qwen3_dflash2, laguna_dflash) normalise q and k per head "
            "(Qwen3 attention) and share one context projection across layers, with no correction head; "
            "DFly has Llama attention, per-layer fusion of the target layers and a correction head: no "
            "weight mapping reproduces it",
    "dflash": "vLLM's DFlash models normalise q and k per head (Qwen3 attention); our DFlash layers have "
              "Llama attention without q/k norms: no weight mapping reproduces them",
}


def eagle_config(target: dict, draft: dict) -> dict:
    """The draft checkpoint's config.json: a Llama config (transformers reads it) with MiniCPM's EAGLE
    architecture, the head's own layer shape and MiniCPM's scalings at 1."""
    keep = ("vocab_size", "hidden_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "bos_token_id",
            "eos_token_id")
    H = int(draft["hidden_size"])
    return {**{k: target[k] for k in keep if k in target},
            "architectures": [EAGLE_ARCH], "model_type": "llama", "num_hidden_layers": 1,
            "intermediate_size": int(draft["intermediate_size"]),
            "num_attention_heads": int(draft["num_attention_heads"]),
            "num_key_value_heads": int(draft["num_key_value_heads"]),
            "head_dim": H // int(draft["num_attention_heads"]), "hidden_act": "silu", "hidden_act_param": 0.0,
            "tie_word_embeddings": False, "scale_emb": 1.0, "scale_depth": 1.0, "mup_denominator": 1,
            "dim_model_base": H, "num_experts": 0, "torch_dtype": "float32"}


def eagle_state(drafter: dict[str, Tensor], target_norm: Tensor, head: Tensor) -> dict[str, Tensor]:
    """Our MTP weights (`drafters/mtp/model.safetensors`) + the target's final norm [H] and LM head [V, H]
    (its embedding when tied) -> EAGLE MiniCPM tensors (fp32); lm_head [V, H] = head * norm (each row)."""
    f = {k: v.detach().to(torch.float32).contiguous() for k, v in drafter.items() if k != "draft_vocab"}
    norm, E = target_norm.detach().to(torch.float32), head.detach().to(torch.float32)
    out = {"model.fc.weight": f["eh_proj.weight"], "model.input_norm1.weight": f["enorm.weight"],
           "model.input_norm2.weight": f["hnorm.weight"], "model.norm.weight": norm.clone(),
           "lm_head.weight": (E * norm[None, :]).contiguous()}
    for k, v in f.items():
        if k.startswith("layer."):
            out["model.eagle_layers.0." + k[len("layer."):]] = v
    return out


def export_vllm(model_dir: str | Path, kind: str, out: str | Path) -> Path:
    """Write `model_dir`'s `kind` drafter into `out` in vLLM's layout (UserError where none holds it)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model_dir, out = Path(model_dir), Path(out)
    if kind in UNSUPPORTED:
        raise UserError(f"{kind} has no vLLM format: {UNSUPPORTED[kind]}")
    if kind != "mtp":
        raise UserError(f"no vLLM export for {kind!r} (mtp exports; {', '.join(UNSUPPORTED)} have no vLLM format)")
    src = model_dir / "drafters" / kind
    if not (src / "model.safetensors").is_file() or not (model_dir / "model.safetensors").is_file():
        raise UserError(f"no {kind} drafter or target in {model_dir} (need drafters/{kind}/ and model.safetensors)")
    target_cfg = json.loads((model_dir / "config.json").read_text())
    draft_cfg = json.loads((src / "config.json").read_text())
    if draft_cfg.get("num_layers", 1) != 1:
        raise UserError(f"{src}: the export holds one layer, the drafter has {draft_cfg['num_layers']}")
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        head = f.get_tensor("lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight")
        norm = f.get_tensor("model.norm.weight")
    state = eagle_state(load_file(str(src / "model.safetensors")), norm, head)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(eagle_config(target_cfg, draft_cfg), indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):   # vLLM's draft ModelConfig reads a tokenizer
        if (model_dir / name).is_file():
            (out / name).write_bytes((model_dir / name).read_bytes())
    return out
