"""`specroute bench ties --requests bench/results/routing-requests.jsonl.gz --out bench/results/`: is every
T=0 difference of a routing run a near-tie?

`bench routing` compares the temperature-0 outputs of every arm and round with a reference (all-AR's first
round) by text; it runs no model itself. A difference is tolerated only where the target's two candidate
logits at the first differing token are within 1e-4 (fp32): batch composition and tokens per step change
the last bits of a logit, and at an exact tie they decide. This reads the run's request file, and for each
prompt whose outputs differ checks every distinct output against the reference's with
`engines.lossless.check_lossless` (the shared prefix through the target in one plain forward). The
outputs are text, so their tokens are re-encoded: a re-encoding that differs from what was generated
shows up as a difference with no near-tie, to be looked at by hand, never as a pass.

Writes `<name>.json`: per differing prompt its cell, index, prompt id, the outputs' arms and rounds, the
first differing position, the logit gap there, and `ok`; `bugs` counts the differences that are no tie.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.routing_trace import read_prompts


def differing(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, list[str]]]:
    """(cell, index) -> {text: ["arm#round", ...]} for the prompts whose T=0 outputs differ, the reference
    (all-AR's first round, else the first output seen) listed first."""
    by: dict[tuple[str, int], dict[str, list[str]]] = defaultdict(dict)
    ref: dict[tuple[str, int], str] = {}
    for r in rows:
        if not r.get("ok") or r.get("temperature") != 0.0 or "text" not in r:
            continue
        key = (r["cell"], int(r["index"]))
        tag = f"{r['arm']}#{r['round']}"
        by[key].setdefault(r["text"], []).append(tag)
        if tag == "all-ar#1" or key not in ref:
            ref[key] = r["text"]
    out: dict[tuple[str, int], dict[str, list[str]]] = {}
    for key, texts in by.items():
        if len(texts) > 1:
            out[key] = {ref[key]: texts[ref[key]], **{t: a for t, a in texts.items() if t != ref[key]}}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench ties", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", required=True, help="a `bench routing` request file (*-requests.jsonl.gz)")
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--out", default="bench/results/")
    ap.add_argument("--name", default="routing-ties")
    args = ap.parse_args(argv)

    import torch

    from engines.lossless import check_lossless
    from engines.model import load_model
    from engines.tokenizer import Tokenizer
    from engines.training.data import data_dir

    torch.set_num_threads(1)
    with gzip.open(args.requests, "rt") as f:
        rows = [json.loads(line) for line in f]
    prompts = {p.id: p.text for p in read_prompts(data_dir())}
    rows_by_key = {(r["cell"], int(r["index"])): r for r in rows}
    tok = Tokenizer.load(args.model)
    model = load_model(args.model).eval()
    found: list[dict[str, Any]] = []
    for (cell, index), texts in sorted(differing(rows).items()):
        pid = rows_by_key[(cell, index)]["prompt_id"]
        ids = tok.encode_chat([{"role": "user", "content": prompts[pid]}])
        ref, *others = texts
        for text in others:
            chk = check_lossless(model, ids, tok.encode(text), tok.encode(ref))
            found.append({"cell": cell, "index": index, "prompt_id": pid, "reference": texts[ref],
                          "outputs": texts[text], "position": chk.position, "gap": chk.gap, "ok": chk.ok,
                          "reason": chk.reason})
            print(f"{cell} #{index} {pid}: {len(texts[text])} outputs differ from {len(texts[ref])} at token "
                  f"{chk.position}, logit gap {chk.gap}: {'near-tie' if chk.ok else 'NOT A TIE'}")
    report = {"benchmark": "ties", "requests": str(args.requests), "model": str(args.model), "tolerance": 1e-4,
              "differing_prompts": len({(d["cell"], d["index"]) for d in found}),
              "bugs": sum(not d["ok"] for d in found), "differences": found}
    out = Path(args.out) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['differing_prompts']} prompts with differing T=0 outputs, {report['bugs']} not a near-tie; "
          f"wrote {out}")
    return 0 if report["bugs"] == 0 else 1
