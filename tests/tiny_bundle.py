"""A tiny model bundle for CLI / benchmark / worker tests: a random target whose vocabulary matches the
demo tokenizer (8192), the demo `tokenizer.json`, and random mtp/dflash/dfly drafters saved the way
`specroute train` saves them. Random drafters accept almost nothing, which is fine for plumbing tests.

    from tests.tiny_bundle import make_tiny_bundle
    path = make_tiny_bundle(tmp_path / "bundle")
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engines.model import ModelConfig, Transformer, init_weights, load_model, save_model

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "models" / "demo" / "tokenizer.json"


def make_tiny_bundle(path: Path, seed: int = 0, drafters: tuple[str, ...] = ("mtp", "dflash", "dfly"),
                     max_position_embeddings: int = 256) -> Path:
    from engines.drafters.registry import new_drafter, save_drafter

    if not TOKENIZER.is_file():
        pytest.skip(f"{TOKENIZER} missing")
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=8192, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_position_embeddings, eos_token_id=6)
    model = Transformer(cfg)
    init_weights(model, std=0.1, num_layers=cfg.num_hidden_layers)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model, path, dtype=torch.float32)
    shutil.copy(TOKENIZER, path / "tokenizer.json")
    target = load_model(path)
    for kind in drafters:
        save_drafter(new_drafter(kind, target), path / "drafters" / kind, dtype=torch.float32)
    return path
