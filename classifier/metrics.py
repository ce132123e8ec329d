"""Classification metrics (pure numpy): accuracy, macro-F1, confusion, expected calibration error,
per-group tables and how well the uncertainty separates wrong from right predictions (AUROC)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from classifier.model import LABELS


def confusion(y: np.ndarray, pred: np.ndarray, k: int = len(LABELS)) -> np.ndarray:
    """Rows: true label, columns: predicted label."""
    return np.bincount(y * k + pred, minlength=k * k).reshape(k, k)


def macro_f1(y: np.ndarray, pred: np.ndarray, k: int = len(LABELS)) -> float:
    """Mean F1 over the classes present in `y` or `pred`."""
    cm = confusion(y, pred, k)
    f1s = []
    for c in range(k):
        tp = cm[c, c]
        fp = cm[:, c].sum() - tp
        fn = cm[c, :].sum() - tp
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s)) if f1s else 0.0


def ece(probs: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    """Expected calibration error of the top label (equal-width confidence bins)."""
    if len(y) == 0:
        return 0.0
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y).astype(np.float64)
    bins = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        mask = bins == b
        if mask.any():
            total += mask.sum() * abs(correct[mask].mean() - conf[mask].mean())
    return float(total / len(y))


def uncertainty(probs: np.ndarray) -> np.ndarray:
    """Normalised entropy of each row (0 = certain, 1 = uniform): what `classify` reports."""
    p = np.clip(probs, 1e-300, 1.0)
    return np.clip(-(probs * np.log(p)).sum(axis=1) / np.log(probs.shape[1]), 0.0, 1.0)


def auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of `score` for telling `positive` rows from the others (ties count
    half); None when either side is empty."""
    score = np.asarray(score, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(score.size, dtype=np.float64)
    sorted_scores = score[order]
    # average ranks over ties
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], score.size]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def uncertainty_quality(probs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """How well the uncertainty flags mistakes: AUROC of the normalised entropy (and of 1 - max
    probability) for wrong vs right predictions, mean uncertainty of each, and the share of mistakes
    made with probability above 0.95."""
    pred = probs.argmax(axis=1)
    wrong = pred != y
    unc = uncertainty(probs)
    conf = probs.max(axis=1)
    return {
        "auroc_entropy": auroc(unc, wrong),
        "auroc_one_minus_max_prob": auroc(1.0 - conf, wrong),
        "mean_uncertainty_wrong": float(unc[wrong].mean()) if wrong.any() else None,
        "mean_uncertainty_right": float(unc[~wrong].mean()) if (~wrong).any() else None,
        "n_wrong": int(wrong.sum()),
        "wrong_with_p_over_0.95": int((wrong & (conf > 0.95)).sum()),
    }


def group_table(probs: np.ndarray, y: np.ndarray, groups: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per group: n, accuracy, macro-F1 (over the classes present in the group's labels or
    predictions: a one-domain group with one mistake has macro-F1 0.5, so read it with the accuracy),
    the true domain counts and ECE."""
    pred = probs.argmax(axis=1)
    g = np.asarray(groups)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(g.tolist())):
        mask = g == name
        counts = np.bincount(y[mask], minlength=len(LABELS))
        out[name] = {
            "n": int(mask.sum()),
            "accuracy": round(float((pred[mask] == y[mask]).mean()), 4),
            "macro_f1": round(macro_f1(y[mask], pred[mask]), 4),
            "ece": round(ece(probs[mask], y[mask]), 4),
            "domains": {LABELS[k]: int(counts[k]) for k in range(len(LABELS))},
        }
    return out


def report(
    probs: np.ndarray, y: np.ndarray, sources: Sequence[str], langs: Sequence[str] | None = None
) -> dict[str, Any]:
    """The standard figures for a set of predictions (`langs`: add the per-language table)."""
    pred = probs.argmax(axis=1)
    src = np.asarray(sources)
    per_source: dict[str, float] = {}
    per_source_confusion: dict[str, dict[str, dict[str, int]]] = {}
    per_source_n: dict[str, int] = {}
    for s in sorted(set(src.tolist())):
        mask = src == s
        per_source[s] = float((pred[mask] == y[mask]).mean())
        per_source_n[s] = int(mask.sum())
        per_source_confusion[s] = confusion_dict(confusion(y[mask], pred[mask]))
    binary_y = (y != 0).astype(int)
    binary_pred = (probs[:, 1] + probs[:, 2] > 0.5).astype(int)
    return {
        "n": int(len(y)),
        "accuracy": float((pred == y).mean()) if len(y) else 0.0,
        "macro_f1": macro_f1(y, pred),
        "ece": ece(probs, y),
        "binary_accuracy": float((binary_pred == binary_y).mean()) if len(y) else 0.0,
        "binary_macro_f1": macro_f1(binary_y, binary_pred, 2),
        "confusion": confusion_dict(confusion(y, pred)),
        "per_source": per_source,
        "per_source_n": per_source_n,
        "per_source_confusion": per_source_confusion,
        "per_source_table": group_table(probs, y, sources),
        "per_language": group_table(probs, y, langs) if langs is not None else {},
        "uncertainty": uncertainty_quality(probs, y),
    }


def confusion_dict(cm: np.ndarray) -> dict[str, dict[str, int]]:
    return {LABELS[i]: {LABELS[j]: int(cm[i, j]) for j in range(len(LABELS))} for i in range(len(LABELS))}
