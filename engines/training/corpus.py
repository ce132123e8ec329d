"""Tokenizer training and the tokenized, domain-split corpus (cached as .npy token streams)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np

from engines.tokenizer import SPECIAL_TOKENS, Tokenizer, save_tokenizer_config
from engines.training.data import DOMAINS, Doc, all_docs, split_docs


def train_tokenizer(out_dir: Path, vocab_size: int = 8192, bytes_per_domain: int = 4_000_000,
                    seed: int = 0) -> Path:
    """Byte-level BPE on a domain-balanced sample of the training documents."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    train, _ = split_docs(all_docs())
    rng = random.Random(seed)
    sample: list[str] = []
    for domain in DOMAINS:
        docs = list(train[domain])
        rng.shuffle(docs)
        total = 0
        for d in docs:
            sample.append(d.text)
            total += len(d.text)
            if total >= bytes_per_domain:
                break
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True,
    )
    tok.train_from_iterator(sample, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    save_tokenizer_config(out_dir)
    return out_dir / "tokenizer.json"


def _encode_docs(tok: Tokenizer, docs: list[Doc]) -> np.ndarray:
    ids: list[int] = []
    eot = tok.eot_id
    batch = 256
    for i in range(0, len(docs), batch):
        for seq in tok.encode_batch([d.text for d in docs[i:i + batch]]):
            ids.extend(seq)
            ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def build_token_streams(tokenizer_dir: Path, cache_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """-> {'train'|'heldout': {domain: uint16 token stream}}; cached under `cache_dir`."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tok_hash = hashlib.sha1((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()[:12]
    meta = cache_dir / "streams.json"
    files = {(s, d): cache_dir / f"{s}.{d}.npy" for s in ("train", "heldout") for d in DOMAINS}
    if meta.is_file() and json.loads(meta.read_text()).get("tokenizer") == tok_hash and all(
            f.is_file() for f in files.values()):
        return {s: {d: np.load(files[(s, d)]) for d in DOMAINS} for s in ("train", "heldout")}
    tok = Tokenizer.load(tokenizer_dir)
    train, held = split_docs(all_docs())
    out: dict[str, dict[str, np.ndarray]] = {"train": {}, "heldout": {}}
    stats = {}
    for split, docs in (("train", train), ("heldout", held)):
        for d in DOMAINS:
            arr = _encode_docs(tok, docs[d])
            np.save(files[(split, d)], arr)
            out[split][d] = arr
            stats[f"{split}.{d}"] = {"docs": len(docs[d]), "tokens": int(arr.size),
                                     "chars": sum(len(x.text) for x in docs[d])}
    meta.write_text(json.dumps({"tokenizer": tok_hash, "stats": stats}, indent=2))
    return out
