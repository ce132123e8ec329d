"""Classification metrics (pure numpy): accuracy, macro-F1, confusion, expected calibration error."""

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


def report(probs: np.ndarray, y: np.ndarray, sources: Sequence[str]) -> dict[str, Any]:
    """The standard figures for a set of predictions."""
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
    }


def confusion_dict(cm: np.ndarray) -> dict[str, dict[str, int]]:
    return {LABELS[i]: {LABELS[j]: int(cm[i, j]) for j in range(len(LABELS))} for i in range(len(LABELS))}
