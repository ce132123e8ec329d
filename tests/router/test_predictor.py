"""The per-request acceptance predictor: its features, its fit, its document, the prior it gives the
decision, and its scheduled retraining from the feedback stream (real Redis)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from router.routing.decide import decide
from router.routing.estimate import Learning, PoolState, Shrunk
from router.routing.features import (
    FEATURES,
    PROMPT_FEATURES,
    classifier_features,
    prompt_features,
    request_features,
)
from router.routing.policy import default_policy
from router.routing.predictor import (
    PoolModel,
    Predictor,
    Sample,
    fit,
    level_mean,
    predict,
    predictions,
    with_prediction,
)
from router.state.predictor import HISTORY_KEY, PREDICTOR_KEY, PredictorTrainer, load, read_samples, sample_of
from specroute.contracts.context import RequestContext
from specroute.contracts.feedback import CellStats, build_record, make_recorder, parse_features
from tests.router.conftest import engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(30)
CODE = {"chat": 0.05, "code": 0.9, "math": 0.05}
POOLS = {"mtp": PoolState(True, max_running=8), "dfly": PoolState(True, max_running=8)}


def vec(**kw: float) -> tuple[float, ...]:
    return tuple(kw.get(n, 0.0) for n in FEATURES)


# -- features ------------------------------------------------------------------------------------

def test_cue_words_match_exactly_where_the_word_boundary_pattern_does() -> None:
    """Each cue's count / presence equals that of `\\b` + its pattern with IGNORECASE, on texts
    dense with cue words inside and at the start of words, in any case."""
    import re

    from router.routing.features import _COPY, _FORMAT, _LONG, _SHORT

    rng = random.Random(9)
    pieces = ["json", "Lists", "prefix", "fix", "FIXED", "edit", "credit", "one word", "phone word", "in 12 words",
              "step-by-step", "Explain", "unexplained", "in depth", "within depth", "short", "x", " ", "\n", "_list",
              "2table", "yes or no", "story.", "(copy)"]
    for _ in range(400):
        text = "".join(rng.choice(pieces) + rng.choice(["", " ", ",", "\n"]) for _ in range(rng.randrange(0, 30)))
        low = text.lower()
        for cue in (_FORMAT, _COPY, _SHORT, _LONG):
            ref = re.compile(r"\b" + cue.rx.pattern, re.IGNORECASE)
            assert cue.count(low) == len(ref.findall(text)), (cue.rx.pattern, text)
            assert cue.found(low) == (ref.search(text) is not None), (cue.rx.pattern, text)


def test_the_digit_share_counts_what_str_isdigit_counts() -> None:
    """The digit count's ASCII fast path agrees with `str.isdigit` on any text (Unicode digits,
    superscripts and fullwidth digits take the per-character path)."""
    from router.routing.features import _digits

    rng = random.Random(5)
    alphabet = "abc 0123456789\n{}=" + "\u0663\u00b2\uff15\u00e9\u4e2d"
    for n in (0, 1, 7, 300):
        for _ in range(50):
            text = "".join(rng.choice(alphabet[:19] if rng.random() < 0.5 else alphabet) for _ in range(n))
            assert _digits(text) == sum(c.isdigit() for c in text), text

def test_prompt_features_read_the_cues() -> None:
    f = dict(zip(PROMPT_FEATURES, prompt_features(
        ["Please rewrite this function and fix the bug, return JSON:\n```python\ndef f(x): return x\n```"], 0.0),
        strict=True))
    assert f["code_fence"] == 1.0 and f["copy_cues"] >= 2 / 3 and f["format_words"] > 0
    assert f["quoted_share"] > 0.2 and f["code_punct"] > 0 and f["greedy"] == 1.0 and f["non_ascii"] == 0.0
    g = dict(zip(PROMPT_FEATURES, prompt_features(["Объясни подробно, что такое энтропия?"], None), strict=True))
    assert g["non_ascii"] > 0.5 and g["code_fence"] == 0.0 and g["greedy"] == 0.0 and g["temperature"] == 0.5
    assert dict(zip(PROMPT_FEATURES, prompt_features(["Answer briefly: 2+2?"], 0.7), strict=True))["short_cues"] == 1.0
    empty = prompt_features([], None)
    assert len(empty) == len(PROMPT_FEATURES) and all(0.0 <= x <= 1.0 for x in empty)


def test_every_feature_is_bounded_and_cheap() -> None:
    text = "x = [1, 2, 3]; print({'a': 1}) " * 2000 + "日本語のテキスト" * 500
    t = time.perf_counter()
    for _ in range(100):
        f = request_features(prompt_features([text, "Translate to French: 'hello there, friend'"], 1.7), CODE, 0.3)
    per_call = (time.perf_counter() - t) / 100
    assert len(f) == len(FEATURES) and all(0.0 <= x <= 1.0 for x in f)
    assert per_call < 0.005   # a few C-level passes over at most a few KiB
    assert classifier_features(CODE, 0.3) == (0.0, 1.0, 0.0, pytest.approx(0.85), 0.3)
    assert request_features((0.5,), CODE, 0.1) == ()   # a prompt part of another length: no vector


# -- fit and document ----------------------------------------------------------------------------
def synthetic(n: int, seed: int = 0) -> list[Sample]:
    """mtp's acceptance rises with `code_fence`, dfly's falls with `non_ascii`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fence, lang = float(rng.random() < 0.5), rng.random()
        x = vec(code_fence=fence, non_ascii=lang, domain_code=1.0)
        out.append(Sample("mtp", x, 100, round(100 * (0.3 + 0.4 * fence)), ("code", "*")))
        out.append(Sample("dfly", x, 100, round(100 * (0.7 - 0.5 * lang)), ("code", "*")))
    return out


def test_fit_recovers_a_linear_acceptance_and_its_level_means() -> None:
    doc = fit(synthetic(200), ridge=0.01, prior_weight=7.0, now=123.0)
    assert doc.usable() and doc.records == 400 and doc.trained_at == 123.0 and doc.prior_weight == 7.0
    mtp, dfly = doc.pools["mtp"], doc.pools["dfly"]
    assert predict(mtp, vec(code_fence=1.0, domain_code=1.0)) == pytest.approx(0.7, abs=0.02)
    assert predict(mtp, vec(domain_code=1.0)) == pytest.approx(0.3, abs=0.02)
    assert predict(dfly, vec(non_ascii=1.0, domain_code=1.0)) == pytest.approx(0.2, abs=0.03)
    assert mtp.level_means["code"] == pytest.approx(0.5, abs=0.03) and mtp.level_means["*"] == mtp.level_means["code"]
    # the document round-trips and refuses what does not fit its features
    again = Predictor.model_validate_json(doc.model_dump_json())
    assert again == doc
    with pytest.raises(ValidationError):
        Predictor(pools={"mtp": PoolModel(bias=0.5, weights=[0.1], records=1)})
    with pytest.raises(ValidationError):
        PoolModel(bias=float("nan"), weights=[], records=0)
    assert not doc.model_copy(update={"feature_version": 0}).usable()
    assert predictions(doc, (), ["mtp"]) == {} and set(predictions(doc, vec(), ["mtp", "ar"])) == {"mtp"}
    assert fit([Sample("ar", vec(), 0, 0)]).pools == {}


def test_prediction_is_the_prior_and_evidence_keeps_its_deviation() -> None:
    learning = Learning()
    model = PoolModel(bias=0.3, weights=[0.0] * len(FEATURES), records=1, level_means={"code": 0.5, "*": 0.4})
    levels = ("d=code|t=0", "code", "*")
    assert level_mean(model, levels) == 0.5 and level_mean(model, ("math",)) is None
    assert predict(model, vec(), levels) == pytest.approx(0.8) and predict(model, vec(), ("math", "*")) == pytest.approx(0.7)
    fresh = Shrunk(1.0, 1.0, 3.0, 10.0, 0.0)   # no evidence: the prediction stands alone
    p = with_prediction(fresh, model, vec(), levels, 10.0, learning)
    assert p.a / (p.a + p.b) == pytest.approx(0.8) and (p.draft_len, p.step_ms) == (3.0, 10.0)
    e = 1000.0 * learning.evidence_per_request   # much evidence at 0.3: the level's rate plus the deviation
    rich = Shrunk(0.3 * e, 0.7 * e, 3.0, 10.0, 1000.0)
    q = with_prediction(rich, model, vec(), levels, 10.0, learning)
    assert q.a / (q.a + q.b) == pytest.approx(0.3 + 0.3, abs=0.01)
    assert with_prediction(rich, model, vec(), levels, 0.0, learning) == rich


def test_decide_uses_the_prior_and_records_the_features() -> None:
    policy = default_policy(["mtp", "dfly"]).model_copy(update={"exploration_rate": 0.0})
    ctx = RequestContext("", "latin", "0", "short")
    # one request of evidence each (under min_samples: without the prior, the default pool serves)
    def c(alpha: float) -> CellStats:
        return CellStats(n=1, tokens=20 * (1 + 3 * alpha), drafted=60, accepted=60 * alpha, steps=20, decode_ms=200, t=1)
    stats = {("*", "mtp"): c(0.5), ("code", "mtp"): c(0.5), ("*", "dfly"): c(0.5), ("code", "dfly"): c(0.5)}
    prompt = prompt_features(["```python\ndef f(): pass\n```"], 0.0)
    plain = decide(CODE, 0.1, stats, POOLS, policy, random.Random(0), ctx, prompt)
    assert (plain.pool, plain.reason) == ("dfly", "default")
    assert plain.features == request_features(prompt, CODE, 0.1) and len(plain.features) == len(FEATURES)
    fence = FEATURES.index("code_fence")
    w_mtp = [0.0] * len(FEATURES)
    w_mtp[fence] = 0.6
    doc = Predictor(pools={"mtp": PoolModel(bias=0.0, weights=w_mtp, records=10, level_means={"*": 0.3}),
                           "dfly": PoolModel(bias=0.0, weights=[0.0] * len(FEATURES), records=10,
                                             level_means={"*": 0.5})})
    learned = doc.model_copy(update={"prior_weight": 10.0})
    d = decide(CODE, 0.1, stats, POOLS, policy, random.Random(0), ctx, prompt, learned)
    assert (d.pool, d.reason) == ("mtp", "learned") and d.scores["mtp"] > d.scores["dfly"]
    no_fence = prompt_features(["def f(): pass"], 0.0)
    assert decide(CODE, 0.1, stats, POOLS, policy, random.Random(0), ctx, no_fence, learned).pool == "dfly"
    # deterministic for one RNG seed, and a predictor of other features changes nothing
    again = decide(CODE, 0.1, stats, POOLS, policy, random.Random(0), ctx, prompt, learned)
    assert again == d
    stale = learned.model_copy(update={"feature_version": 0})
    assert decide(CODE, 0.1, stats, POOLS, policy, random.Random(0), ctx, prompt, stale).pool == "dfly"


# -- records and retraining (real Redis) ---------------------------------------------------------
def test_record_features_are_bounded_and_parsed_back() -> None:
    rec = build_record(request_id="r", pool="mtp", domain="code", context="", engine="mtp", tokens=5,
                       counts=(9, 4, 3), wall_s=0.1, ttft_s=0.01, features=(0.25, 1.0))
    assert rec.features == (0.25, 1.0)
    bad = build_record(request_id="r", pool="mtp", domain="code", context="", engine="mtp", tokens=5,
                       counts=(9, 4, 3), wall_s=0.1, ttft_s=0.01, features=(float("inf"),))
    assert bad.features == ()
    assert parse_features("0.2500,1.0000") == (0.25, 1.0)
    assert parse_features("") == parse_features("a,b") == parse_features(",".join(["1"] * 65)) == ()
    assert sample_of({b"pool": b"mtp", b"drafted": b"0", b"features": b"0.1"}) is None
    s = sample_of({"pool": "mtp", "domain": "code", "drafted": "9", "accepted": "4", "context": "d=code|s=latin|t=0|l=short",
                   "features": "0.1,0.2"})
    assert s is not None and s.levels == ("d=code|s=latin|t=0|l=short", "d=code|t=0", "code", "*")


async def test_the_gateway_retrains_on_schedule_from_the_feedback_stream(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        record = make_recorder(client)
        for s in synthetic(30):
            await record(build_record(request_id="", pool=s.pool, domain="code", context="d=code|s=latin|t=0|l=short",
                                      engine=s.pool, tokens=50, counts=(s.drafted, s.accepted, 25), wall_s=0.5,
                                      ttft_s=0.05, features=s.features))
        assert len(await read_samples(client, 1000)) == 60
        kw = {"check_s": 0.05, "records": 1000, "ridge": 0.01, "prior_weight": 5.0}
        too_few = PredictorTrainer(client, retrain_s=60.0, min_records=1000, **kw)
        assert await too_few.step() is None and too_few.current is None and await load(client) is None
        await client.delete("{specroute}:predictor:lock")
        a = PredictorTrainer(client, retrain_s=0.3, min_records=20, **kw)
        b = PredictorTrainer(client, retrain_s=0.3, min_records=20, **kw)
        first = await a.step()
        assert first is not None and first.version == 1 and first.records == 60 and first.prior_weight == 5.0
        assert await b.step() is None and b.current == first   # fresh: the other gateway only loads it
        assert predict(first.pools["mtp"], vec(code_fence=1.0, domain_code=1.0)) == pytest.approx(0.7, abs=0.03)
        tasks = a.start()   # the scheduled loop refits once the document is `retrain_s` old
        try:
            for _ in range(100):
                await asyncio.sleep(0.05)
                cur = await load(client)
                if cur is not None and cur.version >= 2:
                    break
            assert cur is not None and cur.version >= 2 and cur.trained_at > first.trained_at
            assert await client.llen(HISTORY_KEY) == cur.version
        finally:
            a.closing = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await client.set(PREDICTOR_KEY, "{not json")
        assert await load(client) is None
    finally:
        await client.aclose()


async def test_a_served_request_carries_its_features_to_the_worker_and_the_record(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url, gateway_feedback=True)
    ) as c:
        body = {"model": "fake-model", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Fix this:\n```python\ndef f(): pass\n```"}]}
        r = await c.post("/v1/chat/completions", json=body, headers={"x-request-id": "feat-1"})
        assert r.status_code == 200
        sent = es[0].servicer.requests[-1]
        want = dict(zip(FEATURES, sent.features, strict=True))
        assert want["code_fence"] == 1.0 and want["greedy"] == 1.0 and want["domain_code"] == 1.0
        client = aioredis.Redis.from_url(redis_url)
        try:
            for _ in range(100):
                entries = await client.xrange("{specroute}:feedback")
                if any(f.get(b"request_id") == b"feat-1" for _, f in entries):
                    break
                await asyncio.sleep(0.05)
            mine = [f for _, f in entries if f.get(b"request_id") == b"feat-1"]
            assert mine and parse_features(mine[0][b"features"].decode()) == pytest.approx(sent.features, abs=1e-4)
        finally:
            await client.aclose()
