"""`specroute generate`: one request through the AR or a speculative engine, with acceptance stats.

    specroute generate --model models/demo --engine dfly --block 16 "Write a haiku about caches."

Prints the generated text on stdout and one stats line on stderr (tokens, verification steps, mean
accepted length including the bonus token, tokens/s, finish reason).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.drafters.base import Drafter
from engines.model import Transformer, load_model
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder, spec_generate
from engines.tokenizer import Tokenizer
from specroute.errors import UserError

ENGINES = ("ar", "mtp", "dflash", "dfly")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2 (through UserError)
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specroute generate", description=__doc__.splitlines()[0])
    p.add_argument("prompt", help="user message (or raw text with --raw)")
    p.add_argument("--model", default="models/demo", help="model bundle directory (default: models/demo)")
    p.add_argument("--engine", choices=ENGINES, default="ar")
    p.add_argument("--block", type=int, default=None, help="block size for dflash/dfly (e.g. 8 or 16)")
    p.add_argument("--k", type=int, default=None, help="drafts per step (default: the drafter's maximum)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as raw text, without the chat template")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--sample-drafts", action="store_true",
                   help="at temperature > 0, sample drafts from the drafter's distribution (else greedy drafts)")
    return p


@dataclass
class Engine:
    target: Transformer
    tokenizer: Tokenizer
    drafter: Drafter | None
    k: int


def load_engine(model_dir: str | Path, engine: str, block: int | None = None, k: int | None = None) -> Engine:
    """Target + tokenizer + drafter for `engine`, validated (UserError on any mismatch)."""
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    if block is not None and engine in ("ar", "mtp"):
        raise UserError(f"--block applies to dflash/dfly; use --k for {engine}")
    if k is not None and k < 1:
        raise UserError(f"--k must be >= 1, got {k}")
    if block is not None and block < 2:
        raise UserError(f"--block must be >= 2, got {block}")
    target = load_model(model_dir)
    tok = Tokenizer.load(model_dir)
    if tok.vocab_size > target.config.vocab_size:
        raise UserError(f"tokenizer has {tok.vocab_size} tokens but the model's vocabulary is {target.config.vocab_size}")
    if engine == "ar":
        return Engine(target, tok, None, 0)
    from engines.drafters.registry import load_drafter

    drafter = load_drafter(engine, model_dir, target, block_size=block)
    if k is not None and k > drafter.max_draft:
        what = f"block {drafter.max_draft + 1}" if engine != "mtp" else "this mtp drafter"
        raise UserError(f"--k {k} is larger than {what} drafts per step ({drafter.max_draft})")
    return Engine(target, tok, drafter, k or drafter.max_draft)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = SamplingParams(args.temperature, args.top_p, args.seed)
    try:
        params.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not args.prompt.strip():
        raise UserError("empty prompt")
    eng = load_engine(args.model, args.engine, args.block, args.k)
    ids = eng.tokenizer.encode(args.prompt) if args.raw else \
        eng.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    t0 = time.perf_counter()
    max_len = eng.target.config.max_position_embeddings
    dec = SpecDecoder(eng.target, eng.drafter, 1, max_len, sample_drafts=args.sample_drafts)
    res = spec_generate(eng.target, eng.drafter, eng.tokenizer, ids, params, max_tokens=args.max_tokens,
                        stop=tuple(args.stop), k=eng.k, decoder=dec)
    wall = time.perf_counter() - t0
    print(res.text)
    tps = res.completion_tokens / wall if wall > 0 else 0.0
    label = args.engine + (f" block={eng.drafter.max_draft + 1} k={eng.k}" if eng.drafter is not None and args.engine != "mtp" else
                           f" k={eng.k}" if args.engine == "mtp" else "")
    print(f"[{label}] prompt={res.prompt_tokens} tokens={res.completion_tokens} steps={res.steps} "
          f"mean_accepted_length={res.mean_accepted_length:.2f} tokens/s={tps:.1f} "
          f"ttft_ms={res.ttft_s * 1e3:.0f} finish={res.finish_reason}", file=sys.stderr)
    return 0
