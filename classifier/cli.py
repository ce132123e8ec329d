"""`specroute classifier {train,eval}`."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from specroute.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPORT = REPO_ROOT / "bench" / "results" / "classifier.json"
MODEL_VERSION = "1.0"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute classifier", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser(
        "train", help="train, evaluate (leave-one-source-out + random split), write the artifact"
    )
    t.add_argument(
        "--data",
        default=None,
        help="folder of prompt JSONL (default: $SPECROUTE_DATA_DIR/prompts, else ../shared/data/prompts)",
    )
    t.add_argument(
        "--corpus",
        default=None,
        help="corpus folder for extra chat text (default: the data folder's corpus/)",
    )
    t.add_argument("--no-extra", action="store_true", help="train on the prompt files only")
    t.add_argument(
        "--artifact", default=None, help="artifact path (default: classifier/artifacts/classifier.npz)"
    )
    t.add_argument(
        "--report", default=str(DEFAULT_REPORT), help="training report JSON (default: %(default)s)"
    )
    t.add_argument("--c", type=float, default=0.1, help="inverse L2 strength (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--skip-latency", action="store_true", help="do not time the final model")
    e = sub.add_parser("eval", help="evaluate a classifier on any folder of prompt JSONL")
    e.add_argument(
        "--data", required=True, help="folder of *.jsonl (fields: source, domain, prompt|messages)"
    )
    e.add_argument("--out", required=True, help="output JSON file")
    e.add_argument("--artifact", default=None, help="artifact path (default: the shipped one)")
    e.add_argument("--repeats", type=int, default=3, help="timing passes over the prompts")
    e.add_argument("--no-latency", action="store_true")
    return p


def _write_json(path: str | Path, payload: dict[str, Any]) -> None:
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None


def _load(artifact: str | None):
    from classifier.model import Classifier

    try:
        return Classifier.load(artifact)
    except (FileNotFoundError, ValueError, OSError, KeyError) as exc:
        raise UserError(str(exc)) from None


def cmd_eval(args: argparse.Namespace) -> int:
    from classifier.data import read_prompt_dir
    from classifier.evaluate import evaluate

    clf = _load(args.artifact)
    examples, _ = read_prompt_dir(args.data)
    rep = evaluate(clf, examples, latency=not args.no_latency, repeats=max(1, args.repeats))
    _write_json(args.out, rep.model_dump())
    lat = rep.latency_us
    print(
        f"n={rep.n} accuracy={rep.accuracy:.4f} macro_f1={rep.macro_f1:.4f} ece={rep.ece:.4f} "
        f"latency p50={lat.p50}us p99={lat.p99}us (<=4KB, n={lat.n}) p50_100kb={lat.p50_100kb}us "
        f"p99_100kb={lat.p99_100kb}us [thread CPU p50={lat.cpu_p50}us p99={lat.cpu_p99}us, 100KB "
        f"{lat.cpu_p99_100kb}us; pinned to CPU {lat.cpu_affinity}; load {lat.loadavg_1m}] -> {args.out}"
    )
    return 0


def _figures(rep: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "n",
        "accuracy",
        "macro_f1",
        "ece",
        "binary_accuracy",
        "binary_macro_f1",
        "confusion",
        "per_source",
        "per_source_n",
        "per_source_confusion",
    )
    return {k: rep[k] for k in keys}


def cmd_train(args: argparse.Namespace) -> int:
    import numpy as np

    from classifier import train as T
    from classifier.data import DATA_HINT, data_dir
    from classifier.evaluate import evaluate, hardest_confusions
    from classifier.metrics import report
    from classifier.model import default_artifact_path

    t0 = time.perf_counter()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.data is None:
        args.data = str(data_dir() / "prompts")
        if not Path(args.data).is_dir():
            raise UserError(f"no training data: {args.data} not found ({DATA_HINT}, or pass --data)")
    if args.corpus is None:
        args.corpus = str(data_dir() / "corpus")
    if not Path(args.data).is_dir():
        raise UserError(f"prompt folder not found: {args.data}")
    cfg = T.TrainConfig(c=args.c)
    data = T.load_training_data(
        args.data, None if args.no_extra else args.corpus, extra=not args.no_extra, seed=args.seed
    )
    ex = data.examples
    domains = {e.label for e in ex if e.evaluate}
    if domains != {"chat", "code", "math"}:
        raise UserError(f"{args.data}: training needs chat, code and math prompts, found {sorted(domains)}")
    if len({e.source for e in ex if e.evaluate}) < 2:
        raise UserError(f"{args.data}: leave-one-source-out needs at least two sources")
    n_prompts = sum(e.evaluate for e in ex)
    log(
        f"data: {n_prompts} prompts + {len(ex) - n_prompts} extra training texts "
        f"({time.perf_counter() - t0:.1f}s)"
    )

    try:
        loso_idx, loso_logits = T.leave_one_source_out(data, cfg, log=log)
    except ValueError as exc:  # a fold without one of the domains
        raise UserError(f"leave-one-source-out: {exc}") from None
    y = data.matrix.y
    temperature = T.fit_temperature(loso_logits, y[loso_idx])
    loso_probs = T.apply_junk(T.softmax(loso_logits, temperature), data.matrix.junk[loso_idx])
    loso = report(loso_probs, y[loso_idx], [ex[i].source for i in loso_idx])
    loso_hard = hardest_confusions([ex[i] for i in loso_idx], loso_probs, y[loso_idx])
    log(
        f"leave-one-source-out: accuracy={loso['accuracy']:.4f} macro_f1={loso['macro_f1']:.4f} "
        f"ece={loso['ece']:.4f} (temperature {temperature:.3f})"
    )

    rs_idx, rs_logits = T.random_split(data, cfg, seed=args.seed)
    rs_probs = T.apply_junk(T.softmax(rs_logits, temperature), data.matrix.junk[rs_idx])
    rs = report(rs_probs, y[rs_idx], [ex[i].source for i in rs_idx])
    log(
        f"random split (80/20 by source x domain): accuracy={rs['accuracy']:.4f} "
        f"macro_f1={rs['macro_f1']:.4f} ece={rs['ece']:.4f}"
    )

    fitted = T.fit(ex, data.matrix, np.arange(len(ex)), cfg)
    train_s = time.perf_counter() - t0
    trained_at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    version = f"{MODEL_VERSION}+{data.data_hash[:12]}"
    metrics = {
        "loso_macro_f1": round(loso["macro_f1"], 4),
        "random_split_macro_f1": round(rs["macro_f1"], 4),
        "loso_ece": round(loso["ece"], 4),
    }
    meta = {
        "version": version,
        "data_hash": data.data_hash,
        "data_files": [os.path.basename(f) for f in data.files],
        "trained_at": trained_at,
        "temperature": temperature,
        "config": cfg.__dict__,
        "metrics": metrics,
    }
    artifact = Path(args.artifact) if args.artifact else default_artifact_path()
    T.save_artifact(str(artifact), fitted, temperature, meta)
    size = artifact.stat().st_size
    log(f"artifact: {artifact} ({size / 1e6:.2f} MB), version {version}")

    clf = _load(str(artifact))
    prompts = [e for e in ex if e.evaluate]
    final = evaluate(clf, prompts, latency=not args.skip_latency)
    payload = {
        "version": version,
        "data_hash": data.data_hash,
        "trained_at": trained_at,
        "artifact": {
            "path": str(artifact.relative_to(REPO_ROOT) if artifact.is_relative_to(REPO_ROOT) else artifact),
            "bytes": size,
        },
        "training": {
            "n_prompts": n_prompts,
            "n_extra": len(ex) - n_prompts,
            "extra_sources": sorted({e.source for e in ex if not e.evaluate}),
            "config": cfg.__dict__,
            "temperature": temperature,
            "seconds": round(train_s, 1),
        },
        "leave_one_source_out": {**_figures(loso), "hardest_confusions": [c.model_dump() for c in loso_hard]},
        "random_split": {**_figures(rs), "test_share": 0.2},
        # the final model on all shared prompts (in-sample), with the latency benchmark
        "accuracy": final.accuracy,
        "macro_f1": final.macro_f1,
        "ece": final.ece,
        "per_source": final.per_source,
        "latency_us": final.latency_us.model_dump(),
        "latency_method": final.latency_method,
        "final_model_in_sample": {
            "confusion": final.confusion,
            "mean_uncertainty": final.mean_uncertainty,
            "hardest_confusions": [c.model_dump() for c in final.hardest_confusions],
        },
    }
    _write_json(args.report, payload)
    lat = final.latency_us
    print(
        f"leave-one-source-out macro_f1={loso['macro_f1']:.4f} ece={loso['ece']:.4f}; "
        f"random split macro_f1={rs['macro_f1']:.4f} ece={rs['ece']:.4f}; "
        f"latency p50={lat.p50}us p99={lat.p99}us p99_100kb={lat.p99_100kb}us; "
        f"artifact {artifact} ({size / 1e6:.2f} MB); report {args.report}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "train":
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # one core: the machine is shared with model training
            return cmd_train(args)
    return cmd_eval(args)


if __name__ == "__main__":
    sys.exit(main())
