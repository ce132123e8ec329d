"""`specroute classifier {train,eval,cv}`."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from specroute.contracts.split import is_heldout
from specroute.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPORT = REPO_ROOT / "bench" / "results" / "classifier.json"
DEFAULT_CV_REPORT = REPO_ROOT / "bench" / "results" / "classifier-cv.json"
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
    c = sub.add_parser(
        "cv",
        help="cross-validate without writing an artifact: leave one source / language / script out, "
        "with translation families grouped and not, calibration nested",
    )
    c.add_argument("--data", default=None, help="folder of prompt JSONL (default: as for train)")
    c.add_argument("--corpus", default=None, help="corpus folder for extra chat text (default: as for train)")
    c.add_argument("--out", default=str(DEFAULT_CV_REPORT), help="report JSON (default: %(default)s)")
    c.add_argument("--schemes", default="source,language,script", help="which folds (default: %(default)s)")
    c.add_argument("--grouping", default="grouped,ungrouped", help="grouped, ungrouped or both (default: both)")
    c.add_argument("--c", type=float, default=0.1, help="inverse L2 strength (default: %(default)s)")
    c.add_argument("--seed", type=int, default=0)
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
        "per_source_table",
        "per_language",
        "uncertainty",
    )
    return {k: rep[k] for k in keys}


# issue #16: the classifier's targets on unseen traffic
TARGETS = {
    "lolo_macro_f1": (">=", 0.90),
    "loso_macro_f1": (">=", 0.95),
    "ece": ("<=", 0.05),
    "uncertainty_auroc": (">=", 0.85),
    "latency_cpu_p99_4kb_us": ("<=", 200.0),
    "latency_cpu_p99_100kb_us": ("<=", 1000.0),
}


def _acceptance(loso: dict[str, Any], lolo: dict[str, Any] | None, lat: Any) -> dict[str, Any]:
    """Each target of issue #16 with its value(s) and whether it is met (None: not measured)."""
    values: dict[str, list[float | None]] = {
        "lolo_macro_f1": [lolo["macro_f1"] if lolo else None],
        "loso_macro_f1": [loso["macro_f1"]],
        "ece": [loso["ece"], lolo["ece"] if lolo else None],
        "uncertainty_auroc": [
            loso["uncertainty"]["auroc_entropy"],
            lolo["uncertainty"]["auroc_entropy"] if lolo else None,
        ],
        "latency_cpu_p99_4kb_us": [lat.cpu_p99 if lat is not None else None],
        "latency_cpu_p99_100kb_us": [lat.cpu_p99_100kb if lat is not None else None],
    }
    out: dict[str, Any] = {}
    for name, (op, target) in TARGETS.items():
        vals = [v for v in values[name] if v is not None]
        met = None
        if vals:
            met = all(v >= target for v in vals) if op == ">=" else all(v <= target for v in vals)
        shown: Any = values[name][0] if len(values[name]) == 1 else values[name]
        if name in ("ece", "uncertainty_auroc"):
            shown = {"leave_one_source_out": values[name][0], "leave_one_language_out": values[name][1]}
        out[name] = {"value": shown, "target": f"{op} {target}", "met": met}
    return out


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
        loso_idx, loso_logits, loso_fold = T.leave_one_source_out(data, cfg, log=log)
    except ValueError as exc:  # a fold without one of the domains
        raise UserError(f"leave-one-source-out: {exc}") from None
    langs = sorted({e.lang for e in ex if e.evaluate})
    lolo_idx = lolo_logits = lolo_fold = None
    if len(langs) >= 2:
        try:
            lolo_idx, lolo_logits, lolo_fold = T.leave_one_language_out(data, cfg, log=log)
        except ValueError as exc:
            raise UserError(f"leave-one-language-out: {exc}") from None
    y = data.matrix.y
    # one temperature for both kinds of unseen traffic: fitted on the pooled out-of-fold logits
    pooled_logits = loso_logits if lolo_logits is None else np.vstack([loso_logits, lolo_logits])
    pooled_y = y[loso_idx] if lolo_idx is None else np.concatenate([y[loso_idx], y[lolo_idx]])
    temperature = T.fit_temperature(pooled_logits, pooled_y)

    def section(idx: np.ndarray, logits: np.ndarray, fold: np.ndarray) -> tuple[dict[str, Any], list[Any]]:
        # nested: each fold's figures use a temperature fitted on the other folds only
        temps = T.nested_temperatures(logits, y[idx], fold)
        probs = T.apply_junk(T.softmax(logits, temps), data.matrix.junk[idx])
        rep = report(probs, y[idx], [ex[i].source for i in idx], [ex[i].lang for i in idx])
        return rep, hardest_confusions([ex[i] for i in idx], probs, y[idx])

    loso, loso_hard = section(loso_idx, loso_logits, loso_fold)
    log(
        f"leave-one-source-out: accuracy={loso['accuracy']:.4f} macro_f1={loso['macro_f1']:.4f} "
        f"ece={loso['ece']:.4f} uncertainty AUROC={loso['uncertainty']['auroc_entropy']} "
        f"(temperature {temperature:.3f})"
    )
    lolo: dict[str, Any] | None = None
    lolo_hard: list[Any] = []
    if lolo_idx is not None and lolo_logits is not None and lolo_fold is not None:
        lolo, lolo_hard = section(lolo_idx, lolo_logits, lolo_fold)
        log(
            f"leave-one-language-out: accuracy={lolo['accuracy']:.4f} macro_f1={lolo['macro_f1']:.4f} "
            f"ece={lolo['ece']:.4f} uncertainty AUROC={lolo['uncertainty']['auroc_entropy']}"
        )

    rs_idx, rs_logits = T.random_split(data, cfg, seed=args.seed)
    rs_probs = T.apply_junk(T.softmax(rs_logits, temperature), data.matrix.junk[rs_idx])
    rs = report(rs_probs, y[rs_idx], [ex[i].source for i in rs_idx], [ex[i].lang for i in rs_idx])
    log(
        f"random split (80/20 by source x domain): accuracy={rs['accuracy']:.4f} "
        f"macro_f1={rs['macro_f1']:.4f} ece={rs['ece']:.4f}"
    )

    # the final model never sees the held-out split (specroute.contracts.split), the prompts the
    # benchmarks replay: routing is measured on traffic no model of the system was trained on
    final_idx = np.array([i for i, e in enumerate(ex) if not (e.id and is_heldout(e.id))], dtype=np.int64)
    log(f"final model: {len(final_idx)} examples ({len(ex) - len(final_idx)} held-out items left out)")
    fitted = T.fit(ex, data.matrix, final_idx, cfg)
    train_s = time.perf_counter() - t0
    trained_at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    version = f"{MODEL_VERSION}+{data.data_hash[:12]}"
    metrics = {
        "loso_macro_f1": round(loso["macro_f1"], 4),
        "lolo_macro_f1": round(lolo["macro_f1"], 4) if lolo else None,
        "random_split_macro_f1": round(rs["macro_f1"], 4),
        "loso_ece": round(loso["ece"], 4),
        "lolo_ece": round(lolo["ece"], 4) if lolo else None,
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
    lat = final.latency_us
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
            "final_model_examples": len(final_idx),
            "final_model_excludes": "the held-out split (specroute.contracts.split.is_heldout of the item id)",
            "languages": langs,
            "extra_sources": sorted({e.source for e in ex if not e.evaluate}),
            "config": cfg.__dict__,
            "temperature": temperature,
            "temperature_fitted_on": "pooled out-of-fold logits of leave-one-source-out"
            + (" and leave-one-language-out" if lolo else "")
            + " (translation families grouped); the figures below use, per fold, a temperature fitted on "
            "the other folds only",
            "seconds": round(train_s, 1),
        },
        "acceptance": _acceptance(loso, lolo, None if args.skip_latency else lat),
        "leave_one_source_out": {**_figures(loso), "hardest_confusions": [c.model_dump() for c in loso_hard]},
        "leave_one_language_out": (
            {**_figures(lolo), "hardest_confusions": [c.model_dump() for c in lolo_hard]}
            if lolo
            else {"skipped": "the prompts have one language"}
        ),
        "random_split": {**_figures(rs), "test_share": 0.2},
        # the final model on all shared prompts (in-sample), with the latency benchmark
        "accuracy": final.accuracy,
        "macro_f1": final.macro_f1,
        "ece": final.ece,
        "per_source": final.per_source,
        "latency_us": lat.model_dump(),
        "latency_method": final.latency_method,
        "unseen_checks": [c.model_dump() for c in final.unseen_checks],
        "final_model_in_sample": {
            "confusion": final.confusion,
            "mean_uncertainty": final.mean_uncertainty,
            "per_language": final.per_language,
            "hardest_confusions": [c.model_dump() for c in final.hardest_confusions],
        },
    }
    _write_json(args.report, payload)
    lolo_f1 = f"{lolo['macro_f1']:.4f}" if lolo else "n/a"
    print(
        f"leave-one-source-out macro_f1={loso['macro_f1']:.4f} ece={loso['ece']:.4f}; "
        f"leave-one-language-out macro_f1={lolo_f1}; "
        f"random split macro_f1={rs['macro_f1']:.4f} ece={rs['ece']:.4f}; "
        f"latency p50={lat.p50}us p99={lat.p99}us p99_100kb={lat.p99_100kb}us "
        f"(thread CPU p99 {lat.cpu_p99}us, 100KB {lat.cpu_p99_100kb}us); "
        f"artifact {artifact} ({size / 1e6:.2f} MB); report {args.report}"
    )
    return 0


CV_SCHEMES = {"source": "leave_one_source_out", "language": "leave_one_language_out", "script": "leave_one_script_out"}
CV_TARGETS = {"source": ("macro_f1", ">=", 0.95), "language": ("macro_f1", ">=", 0.90)}


def cmd_cv(args: argparse.Namespace) -> int:
    """Every (scheme, grouping) as out-of-fold predictions, calibrated two ways: `nested` (each fold
    with a temperature fitted on the other folds only: the figure to quote) and `pooled` (one temperature
    fitted on every fold's logits and scored on them: the old, optimistic way)."""
    import numpy as np

    from classifier import train as T
    from classifier.data import DATA_HINT, data_dir, script_of
    from classifier.metrics import group_table, report

    t0 = time.perf_counter()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    data_path = args.data or str(data_dir() / "prompts")
    if not Path(data_path).is_dir():
        raise UserError(f"no prompt folder: {data_path} ({DATA_HINT}, or pass --data)")
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    groupings = [g.strip() for g in args.grouping.split(",") if g.strip()]
    bad = [s for s in schemes if s not in CV_SCHEMES] + [g for g in groupings if g not in ("grouped", "ungrouped")]
    if bad or not schemes or not groupings:
        raise UserError(f"classifier cv: unknown {', '.join(bad) or 'empty selection'} "
                        f"(--schemes from {','.join(CV_SCHEMES)}; --grouping grouped,ungrouped)")
    cfg = T.TrainConfig(c=args.c)
    data = T.load_training_data(data_path, args.corpus or str(data_dir() / "corpus"), seed=args.seed)
    ex, y = data.examples, data.matrix.y
    out: dict[str, Any] = {
        "data_hash": data.data_hash, "n_prompts": int(sum(e.evaluate for e in ex)), "n_extra": int(sum(not e.evaluate for e in ex)),
        "config": cfg.__dict__,
        "grouped": "an item held out takes every translation of it (other languages, other sources: "
                   "classifier.data.family) out of training with it",
        "calibration": {"nested": "each fold scored with a temperature fitted on the other folds' out-of-fold "
                                  "logits only", "pooled": "one temperature fitted on every fold's logits and "
                                                           "scored on the same logits (the old figure)"},
        "scripts": {lang: script_of(lang) for lang in sorted({e.lang for e in ex if e.evaluate})},
        "results": {},
    }
    for grouping in groupings:
        for scheme in schemes:
            name = f"{CV_SCHEMES[scheme]}{'' if grouping == 'grouped' else '_ungrouped'}"
            log(f"{name}:")
            run = getattr(T, CV_SCHEMES[scheme])
            idx, logits, fold = run(data, cfg, log=log, grouped=grouping == "grouped")
            temps = T.nested_temperatures(logits, y[idx], fold)
            pooled_t = T.fit_temperature(logits, y[idx])
            junk = data.matrix.junk[idx]
            probs = T.apply_junk(T.softmax(logits, temps), junk)
            nested = report(probs, y[idx], [ex[i].source for i in idx], [ex[i].lang for i in idx])
            pooled = report(T.apply_junk(T.softmax(logits, pooled_t), junk), y[idx],
                            [ex[i].source for i in idx], [ex[i].lang for i in idx])
            out["results"][name] = {
                **{k: nested[k] for k in ("n", "accuracy", "macro_f1", "ece", "confusion", "per_source_table",
                                          "per_language", "uncertainty")},
                "per_script": group_table(probs, y[idx], [script_of(ex[i].lang) for i in idx]),
                "ece_pooled_temperature": pooled["ece"],
                "temperature_pooled": pooled_t,
                "temperature_nested": [round(float(t), 4) for t in np.unique(temps)],
            }
            log(f"  {name}: macro_f1={nested['macro_f1']:.4f} accuracy={nested['accuracy']:.4f} "
                f"ece nested={nested['ece']:.4f} pooled={pooled['ece']:.4f}")
            _write_json(args.out, {**out, "partial": True})   # each scheme as it finishes
    res = out["results"]
    acceptance: dict[str, Any] = {}
    for scheme, (metric, op, target) in CV_TARGETS.items():
        key = CV_SCHEMES[scheme]
        if key in res:
            v = res[key][metric]
            acceptance[f"{key}_{metric}"] = {"value": v, "target": f"{op} {target}", "met": v >= target}
    eces = {k: v["ece"] for k, v in res.items() if not k.endswith("_ungrouped")}
    if eces:
        acceptance["ece_nested"] = {"value": eces, "target": "<= 0.05", "met": all(v <= 0.05 for v in eces.values())}
    out["acceptance"] = acceptance
    out["seconds"] = round(time.perf_counter() - t0, 1)
    _write_json(args.out, out)
    print("; ".join(f"{k} macro_f1={v['macro_f1']:.4f} ece={v['ece']:.4f}" for k, v in res.items()) + f" -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd in ("train", "cv"):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # one core: the machine is shared with model training
            return cmd_train(args) if args.cmd == "train" else cmd_cv(args)
    return cmd_eval(args)


if __name__ == "__main__":
    sys.exit(main())
