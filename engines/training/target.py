"""Pre-train the target LM on the domain-balanced token streams (nanoGPT-style loop).

bf16 autocast on CPU, AdamW, linear warmup + cosine decay, periodic checkpoints with resume after
interruption (model, optimiser, step, RNG), fixed seed, both cores. At the end the bundle
(`config.json`, `model.safetensors` in bf16, tokenizer files) is written to the output directory
with `train_target.json` holding the figures `card.md` quotes.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from engines.model import ModelConfig, Transformer, init_weights, save_model
from engines.tokenizer import Tokenizer
from engines.training.corpus import build_token_streams
from engines.training.data import DOMAINS
from engines.training.optim import Schedule, adamw, lr_at, optimizer_step, save_checkpoint, train_autocast


@dataclass(frozen=True)
class TargetPreset(Schedule):
    model: dict[str, int]                                            # ModelConfig fields (architecture)
    seq_len: int = 512
    domain_weights: tuple[float, float, float] = (0.36, 0.34, 0.30)  # chat, code, math
    eval_batches: int = 16


def flat_config(p: TargetPreset) -> dict:
    """The preset as one flat dict (architecture fields first), as `train_target.json` records it."""
    return {**p.model, **{k: v for k, v in asdict(p).items() if k != "model"}}


DEMO = TargetPreset(
    model=dict(hidden_size=320, intermediate_size=864, num_hidden_layers=12, num_attention_heads=5,
               num_key_value_heads=1, max_position_embeddings=1024),
    steps=1600, batch_size=8, lr=1.5e-3, min_lr=1.5e-4, warmup=100, weight_decay=0.1, eval_every=400,
    ckpt_every=100)
PRESETS = {
    "demo": DEMO,
    # seconds-long smoke run used by the tests
    "tiny": replace(DEMO, model={**DEMO.model, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2},
                    seq_len=64, batch_size=4, steps=6, warmup=2, eval_every=3, ckpt_every=2, eval_batches=2),
}


class Batcher:
    """Random windows of each domain's token stream, domain chosen per row by weight."""

    def __init__(self, streams: dict[str, np.ndarray], weights: tuple[float, ...], seq_len: int, seed: int):
        self.streams = [torch.from_numpy(streams[d].astype(np.int64)) for d in DOMAINS]
        self.weights = np.asarray(weights) / sum(weights)
        self.seq_len = seq_len
        self.rng = np.random.default_rng(seed)

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

    def domain_batch(self, domain_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.streams[domain_idx]
        starts = self.rng.integers(0, len(s) - self.seq_len - 1, size=n)
        x = torch.stack([s[i:i + self.seq_len] for i in starts])
        y = torch.stack([s[i + 1:i + 1 + self.seq_len] for i in starts])
        return x, y

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        doms = self.rng.choice(len(DOMAINS), size=n, p=self.weights)
        xs, ys = zip(*(self.domain_batch(int(d), 1) for d in doms), strict=True)
        return torch.cat(xs), torch.cat(ys)


def loss_fn(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    B, T = x.shape
    pos = torch.arange(T).expand(B, T)
    logits = model.logits(model(x, pos).hidden)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


@torch.no_grad()
def heldout_perplexity(model: Transformer, held: dict[str, np.ndarray], seq_len: int, batches: int,
                       batch_size: int = 8, seed: int = 0) -> dict[str, float]:
    model.eval()
    out = {}
    b = Batcher(held, (1, 1, 1), seq_len, seed)
    for i, d in enumerate(DOMAINS):
        losses = []
        for _ in range(batches):
            x, y = b.domain_batch(i, batch_size)
            with train_autocast():
                losses.append(loss_fn(model, x, y).item())
        out[d] = float(math.exp(np.mean(losses)))
    model.train()
    return out


def train_target(out_dir: Path, preset_name: str = "demo", work_dir: Path | None = None,
                 tokenizer_dir: Path | None = None, resume: bool = True) -> dict:
    p = PRESETS[preset_name]
    torch.set_num_threads(p.threads)
    torch.manual_seed(p.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = work_dir or (out_dir / ".work")
    tokenizer_dir = tokenizer_dir or out_dir
    tok = Tokenizer.load(tokenizer_dir)
    streams = build_token_streams(tokenizer_dir, work / "tokens")
    cfg = ModelConfig(vocab_size=tok.vocab_size, **p.model, tie_word_embeddings=True, eos_token_id=tok.eos_id,
                      pad_token_id=tok.token_id("<|pad|>"), bos_token_id=tok.eot_id)
    model = Transformer(cfg)
    init_weights(model, num_layers=cfg.num_hidden_layers)
    params = list(model.parameters())
    opt = adamw(params, p)
    batcher = Batcher(streams["train"], p.domain_weights, p.seq_len, p.seed)
    ckpt = work / "target.ckpt.pt"
    step, elapsed, history = 0, 0.0, []
    if resume and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        batcher.load_state(state["batcher"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed, history = state["step"], state["elapsed"], state["history"]
        print(f"resumed from {ckpt} at step {step}")

    def save_ckpt() -> None:
        save_checkpoint(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(), "batcher": batcher.state(),
                               "torch_rng": torch.get_rng_state(), "step": step, "elapsed": elapsed,
                               "history": history, "preset": asdict(p)})

    tokens_per_step = p.batch_size * p.seq_len
    bar = tqdm(total=p.steps, initial=step, desc="target", dynamic_ncols=True)
    model.train()
    while step < p.steps:
        t0 = time.perf_counter()
        x, y = batcher.batch(p.batch_size)
        with train_autocast():
            loss = loss_fn(model, x, y)
        optimizer_step(opt, params, loss, lr_at(step, p.steps, p))
        step += 1
        dt = time.perf_counter() - t0
        elapsed += dt
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_per_step / dt:,.0f}")
        bar.update(1)
        if step % p.eval_every == 0 or step == p.steps:
            ppl = heldout_perplexity(model, streams["heldout"], p.seq_len, p.eval_batches)
            history.append({"step": step, "loss": loss.item(), "elapsed_s": round(elapsed, 1), "heldout_ppl": ppl})
            tqdm.write(f"step {step}: loss {loss.item():.3f} held-out ppl {ppl}")
        if step % p.ckpt_every == 0 or step == p.steps:
            save_ckpt()
    bar.close()
    save_model(model, out_dir)
    if tokenizer_dir != out_dir:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / name, out_dir / name)
    ppl = history[-1]["heldout_ppl"] if history else {}
    report = {
        "preset": preset_name, "config": flat_config(p), "parameters": model.num_parameters(),
        "train_seconds": round(elapsed, 1), "tokens_seen": step * tokens_per_step,
        "heldout_perplexity": ppl, "history": history,
        "token_streams": {s: {d: int(a.size) for d, a in v.items()} for s, v in streams.items()},
    }
    (out_dir / "train_target.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
