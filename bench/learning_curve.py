"""`specroute bench learning-curve`: how a drafter's held-out acceptance grows with its training data,
and what reaching a target would take at that rate.

Reads the training reports (`train_<kind>.json`, written by `specroute train`) of successive runs of
one drafter, each a point (response tokens trained on, held-out tau per domain at T=0). Per domain it
fits `tau - 1 = a + b * log2(tokens)` by least squares over the points and, for each target mean
accepted length, extrapolates the response tokens needed:

    tokens_needed = tokens_last * 2 ** ((target - tau_last) / b)

and the hours the target would spend generating them at the fastest rate the reports measured
(response tokens per second of self-distillation generation). The target is read as a held-out tau:
real decoding's mean accepted length has stayed at or below the proxy (`bench/results/<model>/
acceptance.json` against the reports). `--slope-factor` repeats the estimate with a curve steeper
than the one measured.

With `--selfdistill DIR` it also scores n-gram tables (bigram, trigram with bigram back-off) built
from that directory's self-distillation sequences on a tenth of them held out: the first draft's
top-1 accuracy a drafter that never reads the target's hidden state can reach on the same data.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specroute.errors import UserError

DOMAINS = ("chat", "code", "math")


def point(report: dict[str, Any], setting: str) -> dict[str, Any]:
    """One run: response tokens, steps, held-out tau and first-draft accuracy per domain."""
    s, data = report["summary"], report["recipe"]["data"]
    held = s["heldout"][setting]
    return {"response_tokens": int(data["response_tokens"]), "steps": int(s["steps"]),
            "generation_seconds": float(data.get("generation_seconds") or 0.0),
            "continues": report["recipe"].get("init_from"),
            "tau": {d: held[d]["tau"] for d in DOMAINS if d in held},
            "acc1": {d: held[d]["acc"][0] for d in DOMAINS if d in held}}


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise UserError("the reports must differ in response tokens")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def generation_rate(points: Sequence[dict[str, Any]]) -> float:
    """The fastest generation measured: response tokens per second between consecutive reports (each
    report's generation time covers all of its data), else over the first report's data."""
    rates = [p["response_tokens"] / p["generation_seconds"] for p in points[:1] if p["generation_seconds"]]
    for a, b in zip(points, points[1:], strict=False):
        dt = b["generation_seconds"] - a["generation_seconds"]
        if dt > 0 and b["response_tokens"] > a["response_tokens"]:
            rates.append((b["response_tokens"] - a["response_tokens"]) / dt)
    if not rates:
        raise UserError("no report records its generation time")
    return max(rates)


def extrapolate(points: Sequence[dict[str, Any]], targets: dict[str, float], slope_factors: Sequence[float]
                ) -> dict[str, Any]:
    """Per domain: the fit, and per target and slope factor the tokens and generation hours needed."""
    rate = generation_rate(points)
    last = points[-1]
    out: dict[str, Any] = {"generation_tokens_per_s": round(rate, 1), "domains": {}}
    for dom, target in targets.items():
        xs = [math.log2(p["response_tokens"]) for p in points]
        ys = [p["tau"][dom] - 1 for p in points]
        a, b = fit(xs, ys)
        row: dict[str, Any] = {"target": target, "tau_last": last["tau"][dom], "intercept": round(a, 4),
                               "slope_per_doubling": round(b, 4), "needed": []}
        for f in slope_factors:
            slope = b * f
            if slope <= 0:
                row["needed"].append({"slope_factor": f, "tokens": None, "generation_hours": None})
                continue
            doublings = max(0.0, (target - last["tau"][dom]) / slope)
            tokens = last["response_tokens"] * 2 ** doublings
            row["needed"].append({"slope_factor": f, "doublings": round(doublings, 2), "tokens": float(f"{tokens:.3g}"),
                                  "times_the_last_run": float(f"{tokens / last['response_tokens']:.3g}"),
                                  "generation_hours": float(f"{tokens / rate / 3600:.3g}")})
        out["domains"][dom] = row
    return out


def ngram_baseline(folder: Path, seed: int = 0) -> dict[str, Any]:
    """First-draft top-1 accuracy of n-gram tables on the greedy self-distillation answers in `folder`
    (a tenth of the answers held out, the rest counted)."""
    seqs: list[tuple[str, list[int]]] = []
    for f in sorted(folder.glob("selfdistill_*.json.gz")):
        if "_sampled_" in f.name:
            continue
        d = json.loads(gzip.decompress(f.read_bytes()))
        seqs += [(dom, toks[pl:]) for toks, pl, dom in zip(d["tokens"], d["prompt_lens"], d["domains"], strict=True)]
    if len(seqs) < 10:
        raise UserError(f"too few self-distillation answers in {folder}")
    random.Random(seed).shuffle(seqs)
    cut = len(seqs) // 10
    bigram: dict[int, Counter[int]] = defaultdict(Counter)
    trigram: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
    for _, r in seqs[cut:]:
        for a, b, c in zip(r, r[1:], r[2:], strict=False):
            trigram[(a, b)][c] += 1
        for a, b in zip(r, r[1:], strict=False):
            bigram[a][b] += 1
    best2 = {k: c.most_common(1)[0][0] for k, c in bigram.items()}
    best3 = {k: c.most_common(1)[0][0] for k, c in trigram.items()}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for dom, r in seqs[:cut]:
        for i in range(1, len(r) - 1):   # the draft after r[i], knowing r[..i]
            c = counts[dom]
            c[0] += 1
            c[1] += best2.get(r[i]) == r[i + 1]
            c[2] += best3.get((r[i - 1], r[i]), best2.get(r[i])) == r[i + 1]
    return {"answers": len(seqs), "held_out_answers": cut,
            "acc1": {dom: {"positions": n, "bigram": round(b / n, 4), "trigram_backoff": round(t / n, 4)}
                     for dom, (n, b, t) in sorted(counts.items())}}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specroute bench learning-curve", description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="append", required=True, metavar="FILE[=LABEL]",
                    help="a run's train_<kind>.json, in training order (repeat; at least two)")
    ap.add_argument("--setting", default="k3", help="the reports' held-out setting (k3, block16, ...)")
    ap.add_argument("--targets", default="chat=2.5,code=2.7,math=2.7", help="DOMAIN=mean accepted length,...")
    ap.add_argument("--slope-factor", default="1,3", help="extrapolate with these multiples of the fitted slope")
    ap.add_argument("--selfdistill", default=None, help="score n-gram tables on this self-distillation folder")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if len(args.report) < 2:
        raise UserError("a curve needs at least two --report files")
    points = []
    for spec in args.report:
        path, _, label = spec.partition("=")
        p = point(json.loads(Path(path).read_text()), args.setting)
        points.append({"label": label or path, **p})
    targets = {k: float(v) for k, v in (t.split("=") for t in args.targets.split(","))}
    factors = [float(x) for x in args.slope_factor.split(",")]
    result: dict[str, Any] = {"benchmark": "learning-curve", "setting": args.setting, "points": points,
                              "extrapolation": extrapolate(points, targets, factors),
                              "command": " ".join(["bench learning-curve", *argv])}
    if args.selfdistill:
        result["ngram_baseline"] = ngram_baseline(Path(args.selfdistill))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for dom, row in result["extrapolation"]["domains"].items():
        need = ", ".join(f"x{n['slope_factor']:g} slope: {n['times_the_last_run']}x the data, "
                         f"{n['generation_hours']} h to generate" for n in row["needed"] if n["tokens"])
        print(f"{dom}: tau {row['tau_last']} -> {row['target']}, {row['slope_per_doubling']} per doubling; {need}")
    print(f"wrote {out}")
    return 0
