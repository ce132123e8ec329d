"""`specroute bench served`: does the served D-Cut pool keep what its drafter delivers offline?

Three real gRPC workers on the same bundle, one torch thread each, all started before the run:
`ar`, `dfly` (plain: what the drafter delivers offline at that block size, outputs identical) and
`dfly --dcut` (what `make run` serves). Every held-out prompt goes to the three in turn
(interleaved, so machine noise hits all three alike), one request at a time (concurrency 1), at
temperature 0. Per domain and worker: mean accepted length as the worker reports it (plain steps
count as steps; mean over requests and token-weighted), decode tokens/s (median over prompts of
tokens after the first / time after the first chunk), and the ratios D-Cut / plain for acceptance
and for speedup over AR. Outputs are compared token by token with AR's.

    specroute bench served --out bench/results/            # writes served.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, median

from specroute.errors import UserError
from specroute.readiness import free_port, grpc_serving, poll_until

DOMAINS = ("chat", "code", "math")
ARMS = (("ar", []), ("dfly", ["--no-dcut"]), ("dfly+dcut", ["--dcut"]))


def _start(kind: str, flags: list[str], model: str, block: int, threads: int, profile_dir: str
           ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "specroute.cli", "worker", "--engine", kind.split("+")[0], "--model", model,
           "--port", str(port), "--threads", str(threads), "--dcut-profile-dir", profile_dir, *flags]
    if kind != "ar":
        cmd += ["--block-size", str(block)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"

    def alive() -> None:
        if proc.poll() is not None:
            raise UserError(f"worker {kind} exited with {proc.returncode}")

    if not poll_until(lambda: grpc_serving(address), timeout=180, alive=alive):
        proc.kill()
        raise UserError(f"worker {kind} did not become ready")
    return proc, address


def _prompts(model: str, per_domain: int, max_prompt_tokens: int) -> list[tuple[str, str, str]]:
    from engines.tokenizer import Tokenizer
    from engines.training.data import load_prompts

    tok = Tokenizer.load(model)
    by: dict[str, list[tuple[str, str, str]]] = {d: [] for d in DOMAINS}
    for p in load_prompts("heldout"):
        if p.domain in by and len(by[p.domain]) < per_domain and \
                len(tok.encode_chat([{"role": "user", "content": p.prompt}])) <= max_prompt_tokens:
            by[p.domain].append((p.id, p.domain, p.prompt))
    if not any(by.values()):
        raise UserError("no held-out prompts found (set SPECROUTE_DATA_DIR or put ../shared/data beside the repo)")
    return [by[d][i] for i in range(per_domain) for d in DOMAINS if i < len(by[d])]


def _one(stub, pb, text: str, domain: str, max_tokens: int) -> dict:
    req = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content=text)], max_tokens=max_tokens,
                             sampling=pb.SamplingParams(temperature=0.0), domain=domain)
    t0 = time.perf_counter()
    first = None
    ids: list[int] = []
    stats = None
    for chunk in stub.Generate(req, timeout=600):
        if first is None and chunk.token_ids:
            first = time.perf_counter()
        ids.extend(chunk.token_ids)
        if chunk.finish_reason:
            stats = chunk.stats
    end = time.perf_counter()
    decode_s = end - (first or t0)
    return {"ids": ids, "tokens": len(ids), "steps": stats.steps if stats else 0,
            "accepted": stats.accepted_tokens if stats else 0,
            "mal": stats.mean_accepted_length if stats else 0.0,
            "decode_tok_s": (len(ids) - 1) / decode_s if len(ids) > 1 and decode_s > 0 else 0.0}


def _summary(rows: list[dict]) -> dict:
    steps = sum(r["steps"] for r in rows)
    return {"requests": len(rows), "tokens": sum(r["tokens"] for r in rows),
            "mal_mean": round(mean(r["mal"] for r in rows), 4) if rows else 0.0,
            "mal_token_weighted": round(1 + sum(r["accepted"] for r in rows) / steps, 4) if steps else 0.0,
            "decode_tok_s_median": round(median(r["decode_tok_s"] for r in rows), 2) if rows else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench served", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--per-domain", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile-dir", default=None, help="D-Cut profile cache (default: a fresh one, measured now)")
    ap.add_argument("--out", default="bench/results/")
    args = ap.parse_args(argv)

    import tempfile

    import grpc

    from specroute.v1 import engine_pb2 as pb
    from specroute.v1 import engine_pb2_grpc as pbg

    prompts = _prompts(args.model, args.per_domain, args.max_prompt_tokens)
    profile_dir = args.profile_dir or tempfile.mkdtemp(prefix="served-dcut-")
    procs, stubs = [], {}
    try:
        for name, flags in ARMS:   # one at a time, so the D-Cut profile is measured on a quiet machine
            proc, address = _start(name, flags, args.model, args.block_size, args.threads, profile_dir)
            procs.append(proc)
            stubs[name] = pbg.EngineStub(grpc.insecure_channel(address))
        results: dict[str, list[dict]] = {name: [] for name, _ in ARMS}
        t0 = time.time()
        for pid, domain, text in prompts:
            for name, _ in ARMS:
                results[name].append({"id": pid, "domain": domain,
                                      **_one(stubs[name], pb, text, domain, args.max_tokens)})
        wall = time.time() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)

    mismatches = sum(r["ids"] != a["ids"] for name in ("dfly", "dfly+dcut")
                     for r, a in zip(results[name], results["ar"], strict=True))
    table: dict[str, dict] = {}
    for d in DOMAINS:
        cell = {name: _summary([r for r in results[name] if r["domain"] == d]) for name, _ in ARMS}
        ar_speed = cell["ar"]["decode_tok_s_median"] or 1.0
        for name in ("dfly", "dfly+dcut"):
            cell[name]["speedup_vs_ar"] = round(cell[name]["decode_tok_s_median"] / ar_speed, 3)
        plain, dc = cell["dfly"], cell["dfly+dcut"]
        cell["dcut_over_plain"] = {
            "mal_mean": round(dc["mal_mean"] / plain["mal_mean"], 3) if plain["mal_mean"] else None,
            "mal_token_weighted": round(dc["mal_token_weighted"] / plain["mal_token_weighted"], 3)
            if plain["mal_token_weighted"] else None,
            "speedup": round(dc["speedup_vs_ar"] / plain["speedup_vs_ar"], 3) if plain["speedup_vs_ar"] else None}
        table[d] = cell
    report = {"meta": {"model": args.model, "block_size": args.block_size, "threads": args.threads,
                       "max_tokens": args.max_tokens, "per_domain": args.per_domain, "concurrency": 1,
                       "temperature": 0.0, "wall_s": round(wall, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "lossless_mismatches_vs_ar": mismatches,
                       "note": "plain dfly = the drafter offline at this block size (identical outputs); "
                               "mal counts plain steps as steps, as the worker reports it"},
              "domains": table}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "served.json").write_text(json.dumps(report, indent=2) + "\n")
    for d in DOMAINS:
        c = table[d]
        print(f"{d:5s} MAL plain {c['dfly']['mal_mean']:.2f} dcut {c['dfly+dcut']['mal_mean']:.2f} "
              f"(x{c['dcut_over_plain']['mal_mean']})  speedup plain {c['dfly']['speedup_vs_ar']:.2f} "
              f"dcut {c['dfly+dcut']['speedup_vs_ar']:.2f} (x{c['dcut_over_plain']['speedup']})")
    print(f"wrote {out / 'served.json'} ({mismatches} outputs differ from AR)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
