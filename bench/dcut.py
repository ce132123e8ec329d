"""`specroute bench dcut`: global top-K (D-Cut) against per-request truncation at equal verify budgets.

Runs a block drafter with full verification over a batch of held-out mixed prompts (temperature 0),
recording every step's draft confidences c[i, 1..K] and accepted length L_i. At T=0 verifying only a
prefix of n drafts accepts exactly min(L_i, n), so each strategy is scored offline on the same steps:

- fixed-n: every request verifies n = ceil(rho * K) drafts,
- D-Cut:   the global top ceil(rho * B * K) positions by prefix product of confidences,

for rho in {0.25, 0.5, 0.75, 1.0} (the page's table, specdec-anchors section 8.1). Also reports the
verify cost of each choice under the measured cost table, padded per forward as our engine runs it.
Writes `dcut.json` and `dcut.png` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from engines.drafters.registry import DRAFTERS
from specroute.errors import UserError

RHOS = (0.25, 0.5, 0.75, 1.0)


def record_steps(dec, k: int, prompts, batch: int, max_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Full-verification steps of k drafts over `batch` rows of the decoder `dec` (rows refill from
    `prompts`): conf [B,K] and L [B] per step."""
    from engines.sampling import SamplingParams

    queue = list(prompts)
    rows: dict[int, int] = {}   # slot -> tokens emitted
    confs, accs = [], []

    def admit(slot: int) -> None:
        if queue:
            _, _, ids = queue.pop(0)
            dec.prefill(slot, ids, SamplingParams())
            rows[slot] = 1

    for s in range(batch):
        admit(s)
    while rows:
        slots = sorted(rows)
        prop = dec.draft(slots, k)
        out = dec.verify(slots, prop, [k] * len(slots))
        confs.append(prop.conf.float().numpy())
        accs.append(np.array([len(o) - 1 for o in out]))
        for s, o in zip(slots, out, strict=True):
            rows[s] += len(o)
            if rows[s] >= max_tokens:
                dec.release(s)
                del rows[s]
                admit(s)
    return confs, accs


def score(confs, accs, table) -> list[dict]:
    from engines.dcut.selection import plan_groups, prefix_scores

    out = []
    for rho in RHOS:
        fixed_acc = topk_acc = fixed_tok = topk_tok = 0.0
        fixed_ms = topk_ms = 0.0
        for c, L in zip(confs, accs, strict=True):
            B, K = c.shape
            n = math.ceil(rho * K)
            fixed_acc += float(np.minimum(L, n).sum())
            fixed_tok += B * n
            fixed_ms += table.cost(B, n / K)
            s = prefix_scores(c).reshape(-1)
            kk = math.ceil(rho * B * K)
            order = np.argsort(-s, kind="stable")[:kk]
            keep = np.bincount(order // K, minlength=B)
            topk_acc += float(np.minimum(L, keep).sum())
            topk_tok += float(keep.sum())
            topk_ms += plan_groups(keep.tolist(), K, table)[1]
        out.append({"ratio": rho, "fixed_verify_tokens": fixed_tok, "fixed_accepted": fixed_acc,
                    "fixed_accepted_per_verify": round(fixed_acc / fixed_tok, 4) if fixed_tok else 0.0,
                    "fixed_verify_ms": round(fixed_ms, 1),
                    "dcut_verify_tokens": topk_tok, "dcut_accepted": topk_acc,
                    "dcut_accepted_per_verify": round(topk_acc / topk_tok, 4) if topk_tok else 0.0,
                    "dcut_verify_ms": round(topk_ms, 1)})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench dcut", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--drafter", default="dfly", choices=tuple(DRAFTERS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile-dir", default=None)
    ap.add_argument("--out", default="bench/results/")
    args = ap.parse_args(argv)

    import torch

    from bench.engine import mixed_prompts
    from engines.dcut.profile import load_or_profile
    from engines.factory import load_engine, new_decoder

    torch.set_num_threads(args.threads)
    model = Path(args.model)
    if not (model / "drafters" / args.drafter / "config.json").is_file():
        raise UserError(f"no {args.drafter} drafter in {model}/drafters/{args.drafter} (train it first)")
    engine = load_engine(args.drafter, model)
    decoder = new_decoder(engine, args.batch, prefill_chunk=128)
    prompts = mixed_prompts(engine.tokenizer, args.prompts, 256)
    table = load_or_profile(engine.target, model, engine.block_size, args.threads, cache_dir=args.profile_dir,
                            batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= args.batch) or (1,),
                            context=256, capture=tuple(engine.drafter.capture_layers))
    with torch.inference_mode():
        confs, accs = record_steps(decoder, engine.block_size, prompts, args.batch, args.max_tokens)
    rows = score(confs, accs, table)
    doc = {"model": str(model), "drafter": args.drafter, "batch": args.batch, "k": engine.block_size,
           "steps": len(confs), "mean_accepted_length_full": round(1 + float(np.mean(np.concatenate(accs))), 3),
           "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dcut.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, out / "dcut.png")
    for r in rows:
        print(f"bench dcut: rho={r['ratio']:.2f} fixed {r['fixed_accepted_per_verify']:.3f} accepted/verify "
              f"({r['fixed_verify_ms']:.0f} ms)  top-K {r['dcut_accepted_per_verify']:.3f} "
              f"({r['dcut_verify_ms']:.0f} ms)", file=sys.stderr)
    print(f"bench dcut: wrote {out / 'dcut.json'} and {out / 'dcut.png'}")
    return 0


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    x = [r["ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["fixed_accepted"] for r in rows], marker="o", label="fixed depth per request")
    ax.plot(x, [r["dcut_accepted"] for r in rows], marker="o", label="global top-K (D-Cut)")
    ax.set_xlabel("verify budget (fraction of drafted positions)")
    ax.set_ylabel("accepted draft tokens")
    ax.set_title(f"{doc['drafter']} k={doc['k']} batch {doc['batch']}, {doc['steps']} steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
