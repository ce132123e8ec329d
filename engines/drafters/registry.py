"""Drafter kinds by name, and their files: `<bundle>/drafters/<kind>/{config.json,model.safetensors}`.

The files hold only the drafter's own weights (bf16); the target's embedding and LM head are shared
at load time. Loading checks the drafter against the target (hidden size, vocabulary, depth, layer
ids, and the fingerprint of the target it was trained for) and raises a one-line `UserError` on any
mismatch, so a wrong pairing never silently drafts garbage.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import ValidationError

from engines.drafters.base import Drafter
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.dfly import DFlyDrafter
from engines.drafters.layers import DraftConfig, build_target_layer_ids, target_fingerprint
from engines.drafters.mtp import MTPDrafter
from engines.model import Transformer
from specroute.errors import UserError

DRAFTERS: dict[str, type[Drafter]] = {
    "mtp": MTPDrafter,
    "dflash": DFlashDrafter,
    "dfly": DFlyDrafter,
}



def engine_kinds() -> tuple[str, ...]:
    """Every engine `--engine` accepts that runs our own target: plain AR plus each drafter."""
    return ("ar", *DRAFTERS)


MASK_TOKEN_ID = 2  # engines.tokenizer.SPECIAL_TOKENS order: <|endoftext|>, <|pad|>, <|mask|>, ...


def default_config(kind: str, target: Transformer, **overrides: object) -> DraftConfig:
    """Defaults for a drafter of `target`: target width, MHA, 1 layer (MTP) / 2 layers (block
    drafters) reading 3 target layers, block 16."""
    if kind not in DRAFTERS:
        raise UserError(f"unknown drafter {kind!r} (have {', '.join(DRAFTERS)})")
    tc = target.config
    d: dict[str, object] = dict(
        kind=kind, hidden_size=tc.hidden_size, vocab_size=tc.vocab_size,
        intermediate_size=tc.intermediate_size, num_layers=1 if kind == "mtp" else 2,
        num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_attention_heads,
        rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta,
        target_num_hidden_layers=tc.num_hidden_layers, target_fingerprint=target_fingerprint(target),
    )
    if kind != "mtp":
        n = min(3, tc.num_hidden_layers)
        d.update(target_layer_ids=build_target_layer_ids(tc.num_hidden_layers, n) if tc.num_hidden_layers > 3
                 else list(range(n)), block_size=16, mask_token_id=MASK_TOKEN_ID)
    if kind == "dfly":
        d.update(fusion=True, correction_intermediate_size=tc.hidden_size)
    d.update(overrides)
    return DraftConfig.model_validate(d)


def new_drafter(kind: str, target: Transformer, **cfg: object) -> Drafter:
    """Randomly initialised drafter (training start, tests)."""
    config = default_config(kind, target, **cfg)
    drafter = DRAFTERS[kind](target, config)  # type: ignore[call-arg]
    drafter.reset_parameters()  # type: ignore[operator]
    return drafter.to(target.model.embed_tokens.weight.dtype)


def save_drafter(drafter: Drafter, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in drafter.state_dict().items() if v.numel()}   # an empty draft vocabulary: none
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg: DraftConfig = drafter.cfg  # type: ignore[assignment]
    (out / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2) + "\n")
    return out


def check_compatible(cfg: DraftConfig, target: Transformer, where: str) -> None:
    tc = target.config
    problems = []
    if cfg.hidden_size != tc.hidden_size:
        problems.append(f"hidden size {cfg.hidden_size} != target's {tc.hidden_size}")
    if cfg.vocab_size != tc.vocab_size:
        problems.append(f"vocabulary {cfg.vocab_size} != target's {tc.vocab_size}")
    if cfg.target_num_hidden_layers != tc.num_hidden_layers:
        problems.append(f"trained for a {cfg.target_num_hidden_layers}-layer target, target has {tc.num_hidden_layers}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < tc.num_hidden_layers]
    if bad:
        problems.append(f"target layer ids {bad} out of range for {tc.num_hidden_layers} layers")
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < tc.vocab_size:
        problems.append(f"mask token id {cfg.mask_token_id} outside the vocabulary")
    if not problems and cfg.target_fingerprint and cfg.target_fingerprint != target_fingerprint(target):
        problems.append("it was trained for a different target (embedding fingerprint differs); retrain it")
    if problems:
        raise UserError(f"drafter {where} does not match the target: {'; '.join(problems)}")


def load_drafter(kind: str, model_dir: str | Path, target: Transformer, block_size: int | None = None,
                 head_dtype: torch.dtype | None = torch.bfloat16) -> Drafter:
    """Read `model_dir/drafters/<kind>/`, validate it against `target`, share the target's
    embedding/LM head; block drafters optionally run at `block_size` instead of their default.
    `head_dtype`: precision of the drafting LM head (bf16 by default; None: the target's, exact)."""
    from safetensors.torch import load_file

    if kind not in DRAFTERS:
        raise UserError(f"unknown drafter {kind!r} (have {', '.join(DRAFTERS)})")
    path = Path(model_dir) / "drafters" / kind
    cfg_path, weights = path / "config.json", path / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise UserError(f"no {kind} drafter in {path} (train one with `specroute train {kind} --out {model_dir}`)")
    try:
        cfg = DraftConfig.model_validate_json(cfg_path.read_text())
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"{cfg_path}: invalid drafter config ({'.'.join(map(str, err['loc']))}: {err['msg']})") from None
    if cfg.kind != kind:
        raise UserError(f"{cfg_path}: holds a {cfg.kind!r} drafter, expected {kind!r}")
    check_compatible(cfg, target, str(path))
    try:
        drafter = DRAFTERS[kind](target, cfg)  # type: ignore[call-arg]
    except ValueError as exc:
        raise UserError(f"{cfg_path}: {exc}") from None
    state = load_file(str(weights))
    n_vocab = state["draft_vocab"].numel() if "draft_vocab" in state else 0
    if n_vocab != cfg.draft_vocab_size:
        raise UserError(f"{weights}: draft vocabulary has {n_vocab} ids, config.json says {cfg.draft_vocab_size}")
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if cfg.draft_vocab_size == 0:   # bundles from before draft vocabularies: full vocabulary
        missing = [m for m in missing if m != "draft_vocab"]
    if missing or unexpected:
        raise UserError(f"{weights}: weights do not match config (missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})")
    drafter = drafter.to(target.model.embed_tokens.weight.dtype).eval()
    vocab = drafter.draft_vocab
    if vocab.numel() and (int(vocab.min()) < 0 or int(vocab.max()) >= target.config.vocab_size):
        raise UserError(f"{weights}: draft vocabulary has token ids outside the target's vocabulary")
    drafter.configure_head(head_dtype)
    if block_size is not None:
        if kind == "mtp":
            if block_size < 1:
                raise UserError(f"mtp: draft length must be >= 1, got {block_size}")
        else:
            if block_size < 2:
                raise UserError(f"{kind}: block size must be >= 2, got {block_size}")
            drafter.set_block_size(block_size)  # type: ignore[operator]
    return drafter
