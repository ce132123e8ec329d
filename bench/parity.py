"""`specroute bench parity`: our engine's greedy output against transformers' for the same bundle.

Both decode the same held-out prompts (balanced chat / code / math, the model's own chat template)
greedily in fp32. An output passes when the two token lists are identical, or when at the first
difference transformers' two candidate logits (for the shared prefix) are a near-tie: both within
1e-4 of the maximum. Writes `parity.json` with one row per prompt and the counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from engines.dcut.profile import cpu_name
from engines.generate import ar_generate
from engines.model import load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from engines.training.distill import pick_prompts

TOL = 1e-4


def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], max_tokens: int, eos: set[int]) -> list[int]:
    """transformers' greedy continuation (its own generate loop and KV cache), EOS included."""
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0])
    return out[0, len(prompt_ids):].tolist()


@torch.no_grad()
def hf_gap(model: torch.nn.Module, prefix: list[int], a: int, b: int) -> tuple[float, float]:
    """(|logit a - logit b|, max logit - min(logit a, logit b)) of transformers' next-token logits."""
    logits = model(torch.tensor([prefix])).logits[0, -1].float()
    la, lb, top = float(logits[a]), float(logits[b]), float(logits.max())
    return abs(la - lb), top - min(la, lb)


def compare(ours: list[int], ref: list[int]) -> int | None:
    """First differing position, or None when identical (a length difference counts as one)."""
    if ours == ref:
        return None
    return next((i for i, (x, y) in enumerate(zip(ours, ref, strict=False)) if x != y), min(len(ours), len(ref)))


def main(argv: list[str]) -> int:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(prog="specroute bench parity", description=__doc__)
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--per-domain", type=int, default=17, help="held-out prompts per domain")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, default=Path("bench/results/smollm2"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ours_model, tok = load_model(args.model), Tokenizer.load(args.model)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = set(ours_model.config.eos_ids) | {tok.eos_id}
    rows = []
    t0 = time.perf_counter()
    for p in pick_prompts("heldout", args.per_domain, args.seed):
        ids = tok.encode_chat([{"role": "user", "content": p.prompt}])
        ours = ar_generate(ours_model, tok, ids, SamplingParams(), args.max_tokens,
                           max_len=len(ids) + args.max_tokens + 1).token_ids
        ref = hf_greedy(hf, ids, args.max_tokens, eos)
        pos = compare(ours, ref)
        row = {"id": p.id, "domain": p.domain, "prompt_tokens": len(ids), "tokens": len(ref),
               "identical": pos is None}
        if pos is not None:
            if pos < min(len(ours), len(ref)):
                gap, below_max = hf_gap(hf, ids + ref[:pos], ours[pos], ref[pos])
                row.update(position=pos, gap=gap, near_tie=gap < TOL and below_max < TOL)
            else:
                row.update(position=pos, gap=None, near_tie=False)
        rows.append(row)
        verdict = "identical" if pos is None else f"differs at {pos}, near tie: {row['near_tie']}"
        print(f"{p.id}: {verdict}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {"prompts": len(rows), "identical": sum(r["identical"] for r in rows),
               "near_ties": sum(bool(r.get("near_tie")) for r in rows),
               "failures": sum(not r["identical"] and not r.get("near_tie") for r in rows)}
    result = {"meta": {"bench": "parity", "model": args.model, "max_tokens": args.max_tokens, "tolerance": TOL,
                       "reference": "transformers AutoModelForCausalLM.generate, greedy, fp32",
                       "command": "specroute bench parity " + " ".join(argv), "commit": commit,
                       "date": datetime.now(UTC).isoformat(timespec="seconds"), "cpu": cpu_name(),
                       "seconds": round(time.perf_counter() - t0, 1)},
              "summary": summary, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if summary["failures"] == 0 else 1
