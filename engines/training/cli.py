"""`specroute train {tokenizer,target,<drafter kind>,draft-vocab,card} --preset demo --out DIR`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engines.drafters.registry import DRAFTERS
from specroute.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specroute train", description=__doc__)
    ap.add_argument("what", choices=("tokenizer", "target", *DRAFTERS, "draft-vocab", "card"))
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--out", type=Path, default=Path("models/demo"),
                    help="bundle directory (drafters go to OUT/drafters/<kind>/)")
    ap.add_argument("--work", type=Path, default=None,
                    help="checkpoints and caches (default: OUT/.work, git-ignored)")
    ap.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--budget", type=float, default=None,
                    help="drafters: wall-time budget in seconds (overrides the preset's)")
    ap.add_argument("--steps", type=int, default=None, help="drafters: step cap (overrides the preset's)")
    ap.add_argument("--loss", choices=("ce", "kl", "tv", "lk"), default=None,
                    help="drafters: objective against the target (default: the preset's; demo: lk)")
    ap.add_argument("--distill-temps", default=None,
                    help="drafters: training temperatures of the soft objective, comma-separated (e.g. 0.7,1)")
    ap.add_argument("--sampled-fraction", type=float, default=None,
                    help="drafters: share of train prompts also answered by sampling at T=0.8 (0 = greedy only)")
    ap.add_argument("--reference-per-domain", type=int, default=None,
                    help="drafters: reference answers per domain (train prompts', corpus conversations') also taught, "
                         "teacher-forced (default: the preset's, 0)")
    ap.add_argument("--per-domain", type=int, default=None,
                    help="drafters: train prompts per domain answered by the target (default: the preset's; cached "
                         "answers are kept, so raising it generates only the new ones)")
    ap.add_argument("--lr", type=float, default=None,
                    help="drafters: peak learning rate (default: the preset's; lower it to continue a trained drafter)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="drafters: start from the trained drafter of this bundle (fine-tune) instead of scratch")
    ap.add_argument("--threads", type=int, default=None,
                    help="drafters: torch threads (default: the preset's; 1 on a machine shared with other jobs, "
                         "where 2 spinning threads collapse)")
    ap.add_argument("--export", action="store_true",
                    help="drafters: write the drafter of the last checkpoint to the bundle without training further")
    ap.add_argument("--size", type=int, default=2048,
                    help="draft-vocab: tokens drafters may propose (the target's most frequent outputs)")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    work = args.work or Path(".cache") / "train" / args.out.name
    if args.what == "tokenizer":
        from engines.training.corpus import train_tokenizer

        path = train_tokenizer(args.out)
        print(f"wrote {path}")
        return 0
    if args.what == "card":
        from engines.training.card import write_card

        print(f"wrote {write_card(args.out)}")
        return 0
    if args.what == "draft-vocab":
        from engines.training.draft_vocab import build_draft_vocab

        print(json.dumps(build_draft_vocab(args.out, args.size), indent=1))
        return 0
    if args.what == "target":
        from engines.training.target import PRESETS, train_target

        if args.preset not in PRESETS:
            raise UserError(f"unknown preset {args.preset!r} (have {', '.join(PRESETS)})")
        if not (args.out / "tokenizer.json").is_file():
            raise UserError(f"no tokenizer in {args.out}: run `specroute train tokenizer --out {args.out}` first")
        report = train_target(args.out, args.preset, work_dir=work, resume=not args.no_resume)
        print(json.dumps({k: report[k] for k in ("parameters", "train_seconds", "heldout_perplexity")}))
        return 0
    from engines.training.drafters import train_drafter

    try:
        temps = tuple(float(t) for t in args.distill_temps.split(",") if t) if args.distill_temps else None
    except ValueError:
        raise UserError(f"--distill-temps: not a list of numbers: {args.distill_temps!r}") from None
    report = train_drafter(args.what, args.out, args.preset, work_dir=work, resume=not args.no_resume,
                           budget_s=args.budget, max_steps=args.steps, loss=args.loss, distill_temps=temps,
                           sampled_fraction=args.sampled_fraction, init_from=args.init_from,
                           reference_per_domain=args.reference_per_domain,
                           per_domain=args.per_domain, lr=args.lr,
                           threads=args.threads, export=args.export)
    print(json.dumps(report.get("summary", {})))
    return 0
