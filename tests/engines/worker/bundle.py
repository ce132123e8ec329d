"""A tiny random model bundle with the demo tokenizer (worker and benchmark tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from engines.model import ModelConfig, Transformer, init_weights, save_model

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"


def tiny_bundle(out: Path, drafters: tuple[str, ...] = ()) -> Path:
    """Random tiny target (vocab of the demo tokenizer) + the demo tokenizer files (+ random drafters)."""
    from engines.tokenizer import Tokenizer

    tok = Tokenizer.load(DEMO)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_id)
    model = Transformer(cfg)
    init_weights(model, std=0.2)
    save_model(model, out, dtype=torch.float32)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, out / name)
    if drafters:
        from engines.drafters.registry import new_drafter, save_drafter
        from engines.model import load_model

        target = load_model(out)
        for kind in drafters:
            save_drafter(new_drafter(kind, target), out / "drafters" / kind)
    return out
