"""`specroute sim predictor` (bench/sim/predictor.py) on a tiny hand-made trace: the replay's pricing,
the cross-fitted predictor (no prompt is predicted by a model that saw it) and the arms' figures."""

from __future__ import annotations

from bench.sim.core import Replay, Request
from bench.sim.gateway_policy import RequestContext, default_policy
from bench.sim.predictor import MODES, evaluate, fold_of, items_of, lean_policy, request_ms, samples, summary
from tests.bench.test_sim import Flat

FENCED = "Fix this code:\n```python\ndef f(x):\n    return x\n```"


def trace(n: int, warmup: int = 20, start: int = 0) -> tuple[list[Request], list[str]]:
    """Code requests (the first `warmup` unmeasured): a fenced prompt is MTP's (it accepts most of its
    drafts, DFly few), any other DFly's."""
    reqs, texts = [], []
    for i in range(start, start + n):
        fenced = i % 2 == 0
        text = f"{FENCED} # {i}" if fenced else f"Write a function number {i} that sorts a list."
        good, bad = (Replay(31, 10, 30, 21, 10), Replay(31, 28, 28 * 7, 3, 28))
        mtp, dfly = (good, bad) if fenced else (Replay(31, 25, 75, 6, 25), Replay(31, 6, 42, 25, 6))
        reqs.append(Request(i, 0, 2, {"code": 0.95, "chat": 0.05}, 0.05, 0.0, 20,
                            {"mtp": mtp, "dfly": dfly, "ar": Replay(31, 30)},
                            RequestContext("", "latin", "0", "short"), i >= start + warmup))
        texts.append(text)
    return reqs, texts


def test_pricing_and_folds() -> None:
    reqs, texts = trace(4)
    p = Flat()
    # drafted steps: one draft call + a verify at the row's width (D-Cut: its padding and work), plain ones a verify
    assert request_ms(reqs[0], "mtp", p) == 10 * (2.0 + 11.0)
    assert request_ms(reqs[0], "ar", p) == 30 * 11.0
    assert request_ms(reqs[0], "dfly", p) == 28 * (2.0 + 11.0 + 0.5)
    assert {fold_of(t) for t in texts} <= {0, 1} and fold_of(texts[0]) == fold_of(texts[0])
    items = items_of({"S1/1": reqs}, {"S1/1": texts})["S1/1"]
    # every speculative mode's record of each request; a fold's samples are its own requests'
    assert len(samples(items)) == 2 * len(items)
    assert sum(len(samples(items, f)) for f in (0, 1)) == 2 * len(items)


def test_a_predictable_trace_is_captured_without_leakage() -> None:
    # warm-up long enough for every pool's first step times (the predictor knows acceptance, not speed)
    (r1, t1), (r2, t2) = trace(100, 40), trace(100, 40, start=100)
    items = items_of({"S1/1": r1, "S1/2": r2}, {"S1/1": t1, "S1/2": t2})
    doc = evaluate(items, Flat(), ridge=0.01, prior_weight=30.0, policy=lean_policy(default_policy(list(MODES))))
    every = [it for its in items.values() for it in its]
    for f, p in doc["predictors"].items():   # each fold's predictor was fitted on the other fold alone
        assert p["records"] == len(samples([it for it in every if it.fold != int(f)]))
    s = doc["scenarios"]["S1"]
    gains = s["gain_over_best_static"]
    assert s["rounds"] == 2 and gains["request-oracle"] > 0.1
    assert all(gains["request-oracle"] >= g for g in gains.values())
    # the features tell the two kinds apart: the predictor captures most of the oracle's gain, learning
    # per context alone cannot (every request has the same context)
    assert s["captured"]["predicted"] > 0.5 > s["captured"]["learned"]
    assert doc["held_out_error"]["mtp"]["r2_vs_context_rate"] > 0.5
    out = summary(doc)
    assert set(out) == {"learned", "predicted", "perfect-prior", "target"}
    assert out["predicted"]["captured_min"] == s["captured"]["predicted"]
