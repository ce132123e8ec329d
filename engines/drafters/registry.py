"""Drafter kinds by name (the one registry: every list of kinds is derived from `DRAFTERS`), and
their files: `<bundle>/drafters/<kind>/{config.json,model.safetensors}`.

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
from engines.drafters.config import DraftConfig, target_fingerprint
from engines.drafters.dflare import DFlareDrafter
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.dfly import DFlyDrafter
from engines.drafters.dspark import DSparkDrafter
from engines.drafters.eagle3 import Eagle3Drafter
from engines.drafters.mtp import MTPDrafter
from engines.model import Transformer
from specroute.errors import UserError

DRAFTERS: dict[str, type[Drafter]] = {
    "mtp": MTPDrafter,
    "dflash": DFlashDrafter,
    "dfly": DFlyDrafter,
    "dflare": DFlareDrafter,
    "dspark": DSparkDrafter,
    "eagle3": Eagle3Drafter,
}


def engine_kinds() -> tuple[str, ...]:
    """Every engine `--engine` accepts that runs our own target: plain AR plus each drafter."""
    return ("ar", *DRAFTERS)


def drafter_class(kind: str) -> type[Drafter]:
    if kind not in DRAFTERS:
        raise UserError(f"unknown drafter {kind!r} (have {', '.join(DRAFTERS)})")
    return DRAFTERS[kind]


def new_drafter(kind: str, target: Transformer, **cfg: object) -> Drafter:
    """Randomly initialised drafter (training start, tests)."""
    cls = drafter_class(kind)
    drafter = cls(target, cls.default_config(target, **cfg))
    drafter.reset_parameters()
    return drafter.to(target.model.embed_tokens.weight.dtype)


def save_drafter(drafter: Drafter, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in drafter.state_dict().items() if v.numel()}   # an empty draft vocabulary: none
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(drafter.cfg.model_dump(), indent=2) + "\n")
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

    cls = drafter_class(kind)
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
        drafter = cls(target, cfg)
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
        try:
            drafter.set_block_size(block_size)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return drafter
