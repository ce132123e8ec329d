"""`specroute generate`: one request through the AR or a speculative engine, with acceptance stats.

    specroute generate --model models/demo --engine dfly --block 16 "Write a haiku about caches."

Prints the generated text on stdout and one stats line on stderr (tokens, verification steps, mean
accepted length including the bonus token, tokens/s, finish reason).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from engines.drafters.registry import DRAFTERS, engine_kinds
from engines.errors import EngineError
from engines.factory import LoadedEngine, load_engine, new_decoder
from engines.sampling import SamplingParams
from engines.spec_generate import spec_generate
from specroute.errors import UserError


def block_kinds() -> tuple[str, ...]:
    """Drafters that take --block (read from the registry at call time)."""
    return tuple(k for k, d in DRAFTERS.items() if not d.autoregressive)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2 (through UserError)
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specroute generate", description=__doc__.splitlines()[0])
    p.add_argument("prompt", help="user message (or raw text with --raw)")
    p.add_argument("--model", default="models/demo", help="model bundle directory (default: models/demo)")
    p.add_argument("--engine", choices=engine_kinds(), default="ar")
    p.add_argument("--block", type=int, default=None, help=f"block size for {'/'.join(block_kinds())} (e.g. 8 or 16)")
    p.add_argument("--k", type=int, default=None, help="drafts per step (default: the drafter's maximum)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as raw text, without the chat template")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--sample-drafts", action=argparse.BooleanOptionalAction, default=True,
                   help="at temperature > 0, sample drafts from the drafter's distribution (default; "
                        "--no-sample-drafts: greedy drafts, q one-hot)")
    return p


def load(model_dir: str | Path, engine: str, block: int | None = None, k: int | None = None
         ) -> tuple[LoadedEngine, int]:
    """The engine for `engine` and its drafts per step, validated (UserError on any mismatch)."""
    if block is not None and engine not in block_kinds():
        raise UserError(f"--block applies to {'/'.join(block_kinds())}; use --k for {engine}")
    if k is not None and k < 1:
        raise UserError(f"--k must be >= 1, got {k}")
    if block is not None and block < 2:
        raise UserError(f"--block must be >= 2, got {block}")
    try:
        eng = load_engine(engine, model_dir, block_size=block)
    except EngineError as exc:
        raise UserError(str(exc)) from None
    if eng.drafter is None:
        return eng, 0
    if k is not None and k > eng.block_size:
        what = f"this {engine} drafter" if eng.drafter.autoregressive else f"block {eng.block_size + 1}"
        raise UserError(f"--k {k} is larger than {what} drafts per step ({eng.block_size})")
    return eng, k or eng.block_size


def label(eng: LoadedEngine, k: int) -> str:
    """`ar`, `mtp k=3`, `dfly block=16 k=15`: the stats line's prefix."""
    if eng.drafter is None:
        return eng.kind
    return f"{eng.kind} k={k}" if eng.drafter.autoregressive else f"{eng.kind} block={eng.block_size + 1} k={k}"


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
    eng, k = load(args.model, args.engine, args.block, args.k)
    ids = eng.tokenizer.encode(args.prompt) if args.raw else \
        eng.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    t0 = time.perf_counter()
    dec = new_decoder(eng, 1, sample_drafts=args.sample_drafts)
    try:
        res = spec_generate(eng.target, eng.drafter, eng.tokenizer, ids, params, max_tokens=args.max_tokens,
                            stop=tuple(args.stop), k=k, decoder=dec)
    except EngineError as exc:
        raise UserError(str(exc)) from None
    wall = time.perf_counter() - t0
    print(res.text)
    s = res.stats
    tps = s.completion_tokens / wall if wall > 0 else 0.0
    print(f"[{label(eng, k)}] prompt={s.prompt_tokens} tokens={s.completion_tokens} steps={s.acceptance.steps} "
          f"mean_accepted_length={s.acceptance.mean_accepted_length:.2f} tokens/s={tps:.1f} "
          f"ttft_ms={s.ttft_s * 1e3:.0f} finish={res.finish_reason}", file=sys.stderr)
    return 0
