"""`specroute model export-vllm --model BUNDLE --drafter KIND --out DIR`: one of our drafters in a layout
vLLM's own speculative decoding loads.

MTP -> vLLM's MiMo MTP (`--vllm-method mtp --vllm-drafter DIR`): the closest of vLLM's formats to our
chain head, and the only one whose layer is ours (a Llama layer; MiMo's Qwen2 layer with zero q/k/v
biases). vLLM's `mtp` method reads a separate draft checkpoint whose architecture is `MiMoForCausalLM`
and turns it into `MiMoMTPModel`; the target stays our Llama bundle. The mapping:

    ours                                        MiMo MTP (model.mtp_layers.0.*)
    enorm, hnorm                                token_layernorm, hidden_layernorm
    eh_proj([enorm(E[t]) ; hnorm(h)])           input_proj([hidden_layernorm(h) ; token_layernorm(E[t])])
                                                (the two column halves swapped)
    layer (q/k/v/o, MLP, two norms)             self_attn (+ zero q/k/v biases), mlp, the two norms
    target's final norm, then its LM head       final_layernorm (= the target's norm), the target's head

What vLLM then runs differs from our engine in three ways, none of which touches the output (vLLM
verifies every draft against the target):
- the first draft of a step is ours; vLLM feeds the *normed* output back into the next chain step where
  ours feeds the output before the final norm, so drafts 2..k are vLLM's reading of the head, not ours;
- vLLM zeroes the token embedding at position 0;
- vLLM drafts over the full vocabulary (ours over its reduced draft vocabulary).

DFly has no vLLM format that holds it (`UNSUPPORTED`): every vLLM DFlash model (`DFlashDraftModel`,
`DFlash2DraftModel`, Laguna's) applies per-head RMSNorm to q and k (Qwen3 attention) and feeds one shared
context projection to every layer, with no correction head; DFly's layers have Llama attention, a
per-layer blend of the target layers and a correction head after the backbone. Writing its weights into
that layout would give vLLM a different drafter, so the export refuses and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from specroute.errors import UserError

MIMO_ARCH = "MiMoForCausalLM"
LAYER = "model.mtp_layers.0."
UNSUPPORTED = {
    "dfly": "vLLM's DFlash models (qwen3_dflash, qwen3_dflash2, laguna_dflash) normalise q and k per head "
            "(Qwen3 attention) and share one context projection across layers, with no correction head; "
            "DFly has Llama attention, per-layer fusion of the target layers and a correction head: no "
            "weight mapping reproduces it",
    "dflash": "vLLM's DFlash models normalise q and k per head (Qwen3 attention); our DFlash layers have "
              "Llama attention without q/k norms: no weight mapping reproduces them",
    "eagle3": "no trained eagle3 drafter ships for this target (export a trained one by adding its mapping here)",
}


def mimo_mtp_config(target: dict, draft: dict) -> dict:
    """The draft checkpoint's config.json: the target's Llama fields, the drafter's layer shape, MiMo's
    architecture (vLLM's `mtp` method maps it to `MiMoMTPModel`) and one MTP layer."""
    keep = ("vocab_size", "hidden_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "bos_token_id",
            "eos_token_id", "tie_word_embeddings")
    return {**{k: target[k] for k in keep if k in target},
            "architectures": [MIMO_ARCH], "model_type": "qwen2", "num_nextn_predict_layers": 1,
            "num_hidden_layers": int(target["num_hidden_layers"]),
            "intermediate_size": int(draft["intermediate_size"]),
            "num_attention_heads": int(draft["num_attention_heads"]),
            "num_key_value_heads": int(draft["num_key_value_heads"]),
            "head_dim": int(draft["hidden_size"]) // int(draft["num_attention_heads"]),
            "hidden_act": "silu", "use_sliding_window": False, "torch_dtype": "float32"}


def mimo_mtp_state(drafter: dict[str, Tensor], target_norm: Tensor, embed: Tensor) -> dict[str, Tensor]:
    """Our MTP weights (`drafters/mtp/model.safetensors`) + the target's final norm [H] and embedding [V, H]
    -> MiMo MTP tensors (fp32). eh_proj [H, 2H] reads [E ; h]; input_proj reads [h ; E]."""
    H = target_norm.shape[0]
    f = {k: v.detach().to(torch.float32).contiguous() for k, v in drafter.items() if k != "draft_vocab"}
    eh = f["eh_proj.weight"]
    out = {LAYER + "input_proj.weight": torch.cat([eh[:, H:], eh[:, :H]], dim=1).contiguous(),
           LAYER + "token_layernorm.weight": f["enorm.weight"],
           LAYER + "hidden_layernorm.weight": f["hnorm.weight"],
           LAYER + "final_layernorm.weight": target_norm.detach().to(torch.float32).contiguous(),
           "model.embed_tokens.weight": embed.detach().to(torch.float32).contiguous()}
    for k, v in f.items():
        if k.startswith("layer."):
            out[LAYER + k[len("layer."):]] = v
    for p in ("q", "k", "v"):   # Qwen2 attention has q/k/v biases: zero reproduces ours
        w = out[LAYER + f"self_attn.{p}_proj.weight"]
        out[LAYER + f"self_attn.{p}_proj.bias"] = torch.zeros(w.shape[0])
    return out


def export_vllm(model_dir: str | Path, kind: str, out: str | Path) -> Path:
    """Write `model_dir`'s `kind` drafter into `out` in vLLM's layout (UserError where none holds it)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model_dir, out = Path(model_dir), Path(out)
    if kind in UNSUPPORTED:
        raise UserError(f"{kind} has no vLLM format: {UNSUPPORTED[kind]}")
    if kind != "mtp":
        raise UserError(f"unknown drafter {kind!r} for export-vllm (mtp exports; {', '.join(UNSUPPORTED)} do not)")
    src = model_dir / "drafters" / kind
    if not (src / "model.safetensors").is_file() or not (model_dir / "model.safetensors").is_file():
        raise UserError(f"no {kind} drafter or target in {model_dir} (need drafters/{kind}/ and model.safetensors)")
    target_cfg = json.loads((model_dir / "config.json").read_text())
    draft_cfg = json.loads((src / "config.json").read_text())
    if draft_cfg.get("num_layers", 1) != 1:
        raise UserError(f"{src}: MiMo MTP holds one layer, the drafter has {draft_cfg['num_layers']}")
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        norm, embed = f.get_tensor("model.norm.weight"), f.get_tensor("model.embed_tokens.weight")
    state = mimo_mtp_state(load_file(str(src / "model.safetensors")), norm, embed)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(mimo_mtp_config(target_cfg, draft_cfg), indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):   # vLLM's draft ModelConfig reads a tokenizer
        if (model_dir / name).is_file():
            (out / name).write_bytes((model_dir / name).read_bytes())
    return out
