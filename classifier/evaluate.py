"""`specroute classifier eval`: quality and latency of a classifier on a folder of JSONL prompts."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from classifier import features as F
from classifier.data import Example
from classifier.metrics import report
from classifier.model import LABELS, Classifier

LENGTH_BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("0-256B", 0, 256),
    ("256B-1KB", 257, 1024),
    ("1-4KB", 1025, 4096),
    ("4KB+", 4097, 1 << 62),
)


class LatencyBucket(BaseModel):
    n: int
    p50: float
    p99: float
    cpu_p99: float


class Latency(BaseModel):
    """Single-call `Classifier.classify` latency in microseconds (text extraction included)."""

    p50: float = Field(description="median over prompts up to 4 KB")
    p99: float = Field(description="99th percentile over prompts up to 4 KB")
    p999: float = Field(0.0, description="99.9th percentile over prompts up to 4 KB")
    max: float = Field(0.0, description="slowest call over prompts up to 4 KB")
    p99_100kb: float = Field(description="99th percentile for 100 KB prompts")
    p50_100kb: float
    cpu_p50: float = Field(description="median thread CPU time (excludes time the OS ran other work)")
    cpu_p99: float
    cpu_p99_100kb: float
    cpu_p99_non_english: float | None = Field(
        None, description="thread CPU p99 over the prompts up to 4 KB that carry a `lang` (not English)"
    )
    n: int
    loadavg_1m: float | None = Field(
        description="machine load when measured (other processes compete for CPUs)"
    )
    cpu_affinity: list[int] | None = Field(
        None, description="the CPU(s) the timing loop was pinned to (None: not pinned)"
    )
    by_length: dict[str, LatencyBucket]
    method: str


class Confusion(BaseModel):
    true: str
    predicted: str
    count: int
    examples: list[dict[str, Any]]


class UnseenCheck(BaseModel):
    text: str
    expected: str
    label: str
    probability: float
    uncertainty: float
    ok: bool


class EvalReport(BaseModel):
    accuracy: float
    macro_f1: float
    ece: float
    per_source: dict[str, float]
    per_source_table: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per source: n, accuracy, macro_f1, ece, true domain counts"
    )
    per_language: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per language (`en` = no `lang` field): as per_source_table"
    )
    uncertainty: dict[str, Any] = Field(
        default_factory=dict, description="how well the uncertainty separates wrong from right (AUROC)"
    )
    unseen_checks: list[UnseenCheck] = Field(default_factory=list)
    latency_us: Latency
    latency_method: str = Field(description="how latency_us was measured (same as latency_us.method)")
    n: int
    binary_accuracy: float
    binary_macro_f1: float
    confusion: dict[str, dict[str, int]]
    per_source_n: dict[str, int]
    per_source_confusion: dict[str, dict[str, dict[str, int]]]
    hardest_confusions: list[Confusion]
    mean_uncertainty: dict[str, float]
    artifact: dict[str, Any]


# Requests in no data file, with the domain they must get (the README's example among them): short
# arithmetic and the same word problem in several languages are math, a code request in a language
# the data has no code prompt for is code, an information question with numbers in it is chat.
UNSEEN_CHECKS: tuple[tuple[str, str], ...] = (
    ("What is 12 * 7?", "math"),
    ("What is 12 * 7? Answer with the number only.", "math"),
    ("Was ist 12 * 7?", "math"),
    ("12 乘以 7 等于多少？", "math"),
    ("Anna has 3 apples and buys 5 more. How many apples does she have?", "math"),
    ("Anna hat 3 Äpfel und kauft 5 weitere. Wie viele Äpfel hat sie jetzt?", "math"),
    ("安娜有3个苹果，又买了5个。她现在一共有多少个苹果？", "math"),
    ("Anna a 3 pommes et en achète 5 de plus. Combien de pommes a-t-elle maintenant ?", "math"),
    ("Pythonでリストを並べ替える関数を書いてください。", "code"),
    ("Напишите функцию на Python, которая переворачивает строку.", "code"),
    ("Write a Python function that reverses a string.", "code"),
    ("How many people live in Berlin?", "chat"),
    ("Wie viele Einwohner hat Berlin?", "chat"),
    ("Write a short poem about the sea.", "chat"),
)


def unseen_checks(clf: Classifier) -> list[UnseenCheck]:
    out = []
    for text, expected in UNSEEN_CHECKS:
        label, probs, unc = clf.classify([{"role": "user", "content": text}])
        out.append(
            UnseenCheck(
                text=text,
                expected=expected,
                label=label,
                probability=round(probs[label], 4),
                uncertainty=round(unc, 4),
                ok=label == expected,
            )
        )
    return out


def _text_preview(request: Any, limit: int = 240) -> str:
    sample, _ = F.request_text(request)
    sample = " ".join(sample.split())
    return sample if len(sample) <= limit else sample[: limit - 3] + "..."


def hardest_confusions(
    examples: Sequence[Example], probs: np.ndarray, y: np.ndarray, per_pair: int = 3
) -> list[Confusion]:
    """Off-diagonal (true, predicted) pairs, most frequent first, with the most confident mistakes."""
    pred = probs.argmax(axis=1)
    out: list[Confusion] = []
    for t in range(len(LABELS)):
        for p in range(len(LABELS)):
            if t == p:
                continue
            rows = np.flatnonzero((y == t) & (pred == p))
            if rows.size == 0:
                continue
            worst = rows[np.argsort(-probs[rows, p])][:per_pair]
            out.append(
                Confusion(
                    true=LABELS[t],
                    predicted=LABELS[p],
                    count=int(rows.size),
                    examples=[
                        {
                            "id": examples[i].id,
                            "source": examples[i].source,
                            "p_predicted": round(float(probs[i, p]), 4),
                            "text": _text_preview(examples[i].request),
                        }
                        for i in worst
                    ],
                )
            )
    out.sort(key=lambda c: -c.count)
    return out


def _request_len(request: Any) -> int:
    if isinstance(request, str):
        return len(request.encode("utf-8", errors="surrogatepass"))
    return sum(len(str(m.get("content", "")).encode("utf-8", errors="surrogatepass")) for m in request)


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _pct(values: Any, q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if len(values) else 0.0


def _pin_to_one_cpu() -> tuple[set[int] | None, list[int] | None]:
    """Pin this thread to one CPU (the last one it may use: CPU 0 tends to take the most interrupts).

    Returns (previous affinity to restore, pinned CPUs); (None, None) where affinity is unsupported.
    """
    try:
        before = os.sched_getaffinity(0)
        cpu = max(before)
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        return None, None
    return before, [cpu]


def _restore_affinity(before: set[int] | None) -> None:
    if before is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


def _100kb_requests(requests: Sequence[Any], n: int) -> list[list[dict[str, str]]]:
    """`n` distinct 100,000-character user messages, each a concatenation of real prompts."""
    texts = [r if isinstance(r, str) else _text_preview(r, 1 << 20) for r in requests] or ["hello"]
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        parts: list[str] = []
        size = 0
        while size < 100_000:
            t = texts[int(rng.integers(len(texts)))]
            parts.append(t)
            size += len(t) + 1
        out.append([{"role": "user", "content": "\n".join(parts)[:100_000]}])
    return out


LATENCY_METHOD = (
    "single Classifier.classify calls (request text extraction included), timed with "
    "time.perf_counter_ns around each call (thread CPU time with time.thread_time_ns beside it); the "
    "timing loop runs pinned to one CPU (os.sched_setaffinity, see cpu_affinity) with the garbage "
    "collector disabled, after a warm-up pass over the prompts; {repeats} passes over all prompts, "
    "percentiles over those up to 4 KB (UTF-8 bytes of the message contents); 100KB: {n_100kb} calls on "
    "distinct 100,000-character concatenations of the prompts, built before timing"
)


def measure_latency(
    clf: Classifier,
    requests: Sequence[Any],
    *,
    repeats: int = 3,
    n_100kb: int = 300,
    non_english: Sequence[bool] | None = None,
) -> Latency:
    """Time single `classify` calls: pinned to one CPU, GC disabled, after a warm-up pass.

    Wall time (perf_counter_ns) is the figure; thread CPU time (thread_time_ns) is recorded beside
    it, because on a shared machine the wall-time tail is mostly time the OS gave to other processes.
    """
    lengths = np.array([_request_len(r) for r in requests])
    big = _100kb_requests(requests, n_100kb)
    wall = time.perf_counter_ns
    cpu = time.thread_time_ns
    classify = clf.classify
    n_calls = repeats * len(requests)
    t_wall = np.zeros(n_calls, dtype=np.int64)
    t_cpu = np.zeros(n_calls, dtype=np.int64)
    b_wall = np.zeros(len(big), dtype=np.int64)
    b_cpu = np.zeros(len(big), dtype=np.int64)
    load = _loadavg()
    before, pinned = _pin_to_one_cpu()
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in requests[:2000]:  # warm-up: caches, branch predictors, lazily built numpy state
            classify(r)
        for r in big[:20]:
            classify(r)

        def timed(r: Any, into_wall: np.ndarray, into_cpu: np.ndarray, i: int) -> None:
            c0 = cpu()
            t0 = wall()
            classify(r)
            t1 = wall()
            into_cpu[i] = cpu() - c0
            into_wall[i] = t1 - t0

        i = 0
        for _ in range(repeats):
            for r in requests:
                timed(r, t_wall, t_cpu, i)
                i += 1
        for j, r in enumerate(big):
            timed(r, b_wall, b_cpu, j)
    finally:
        if gc_was_enabled:
            gc.enable()
        _restore_affinity(before)
    n_arr = np.tile(lengths, repeats)
    t_arr = t_wall / 1000.0
    c_arr = t_cpu / 1000.0
    by_length: dict[str, LatencyBucket] = {}
    for name, lo, hi in LENGTH_BUCKETS:
        mask = (n_arr >= lo) & (n_arr <= hi)
        if mask.any():
            by_length[name] = LatencyBucket(
                n=int(mask.sum()),
                p50=_pct(t_arr[mask], 50),
                p99=_pct(t_arr[mask], 99),
                cpu_p99=_pct(c_arr[mask], 99),
            )
    bt = b_wall / 1000.0
    bc = b_cpu / 1000.0
    by_length["100KB"] = LatencyBucket(n=len(bt), p50=_pct(bt, 50), p99=_pct(bt, 99), cpu_p99=_pct(bc, 99))
    small_mask = n_arr <= 4096
    small = t_arr[small_mask]
    cpu_non_english = None
    if non_english is not None and any(non_english):
        ne_mask = small_mask & np.tile(np.asarray(non_english, dtype=bool), repeats)
        cpu_non_english = _pct(c_arr[ne_mask], 99) if ne_mask.any() else None
    return Latency(
        p50=_pct(small, 50),
        p99=_pct(small, 99),
        p999=_pct(small, 99.9),
        max=round(float(small.max()), 1) if small.size else 0.0,
        p50_100kb=_pct(bt, 50),
        p99_100kb=_pct(bt, 99),
        cpu_p50=_pct(c_arr[small_mask], 50),
        cpu_p99=_pct(c_arr[small_mask], 99),
        cpu_p99_100kb=_pct(bc, 99),
        cpu_p99_non_english=cpu_non_english,
        n=int(small_mask.sum()),
        loadavg_1m=load,
        cpu_affinity=pinned,
        by_length=by_length,
        method=LATENCY_METHOD.format(repeats=repeats, n_100kb=n_100kb),
    )


def evaluate(
    clf: Classifier, examples: Sequence[Example], *, latency: bool = True, repeats: int = 3
) -> EvalReport:
    probs = np.zeros((len(examples), len(LABELS)))
    unc = np.zeros(len(examples))
    for i, ex in enumerate(examples):
        pred = clf.classify(ex.request)
        probs[i] = [pred.probabilities[label] for label in LABELS]
        unc[i] = pred.uncertainty
    y = np.array([LABELS.index(ex.label) for ex in examples])
    rep = report(probs, y, [ex.source for ex in examples], [ex.lang for ex in examples])
    correct = probs.argmax(axis=1) == y
    mean_unc = {
        "all": float(unc.mean()) if len(unc) else 0.0,
        "correct": float(unc[correct].mean()) if correct.any() else 0.0,
        "wrong": float(unc[~correct].mean()) if (~correct).any() else 0.0,
    }
    lat = (
        measure_latency(
            clf,
            [ex.request for ex in examples],
            repeats=repeats,
            non_english=[ex.lang != "en" for ex in examples],
        )
        if latency
        else Latency(
            p50=0,
            p99=0,
            p99_100kb=0,
            p50_100kb=0,
            cpu_p50=0,
            cpu_p99=0,
            cpu_p99_100kb=0,
            n=0,
            loadavg_1m=None,
            by_length={},
            method="not measured",
        )
    )
    return EvalReport(
        **rep,  # `metrics.report`'s standard figures, one field each (accuracy, macro_f1, ece, per_source...)
        unseen_checks=unseen_checks(clf),
        latency_us=lat,
        latency_method=lat.method,
        hardest_confusions=hardest_confusions(examples, probs, y),
        mean_uncertainty=mean_unc,
        artifact={
            "version": clf.info.version,
            "data_hash": clf.info.data_hash,
            "trained_at": clf.info.trained_at,
            "feature_version": clf.info.feature_version,
        },
    )
