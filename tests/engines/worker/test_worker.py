"""Real worker processes over gRPC: streaming, Info/Load/health, errors, cancellation, limits,
crash, graceful shutdown, Redis feedback (real redis-server) and Redis outages."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engines.generate import ar_generate
from engines.model import load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from specroute.contracts.feedback import stats_key
from specroute.v1 import engine_pb2 as pb
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(300)


def chat(text: str, max_tokens: int = 16, **kw) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content=text)], max_tokens=max_tokens, **kw)


def collect(stub, req, timeout: float = 60) -> list[pb.GenerateChunk]:
    return list(stub.Generate(req, timeout=timeout))


@pytest.fixture(scope="module")
def redis_srv():
    with RedisServer() as r:
        yield r


@pytest.fixture(scope="module")
def ar_worker(bundle, redis_srv):
    from tests.engines.worker.conftest import Worker

    w = Worker("--engine", "ar", "--model", str(bundle), "--max-running", "2", "--max-waiting", "1",
               "--context-length", "1024", "--redis-url", redis_srv.url, "--pool", "ar-pool")
    yield w
    w.close()


def test_streams_tokens_equal_to_plain_decoding(ar_worker, bundle):
    chunks = collect(ar_worker.stub, chat("Write a haiku about the sea.", 24))
    assert chunks[0].prompt_tokens > 0
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length") and all(not c.finish_reason for c in chunks[:-1])
    ids = [t for c in chunks for t in c.token_ids]
    assert final.completion_tokens == len(ids) == sum(c.num_tokens for c in chunks)
    tok = Tokenizer.load(bundle)
    prompt = tok.encode_chat([{"role": "user", "content": "Write a haiku about the sea."}])
    ref = ar_generate(load_model(bundle), tok, prompt, SamplingParams(), max_tokens=24, max_len=1024)
    assert ids == ref.token_ids
    assert "".join(c.text for c in chunks) == ref.text
    assert final.stats.steps == len(ids) - 1 and final.stats.drafted_tokens == 0
    assert dict(final.stats.steps_by_drafter) == {"plain": final.stats.steps}


@pytest.mark.parametrize("cut", [1, 9])
def test_continuation_generates_exactly_the_rest(ar_worker, bundle, cut):
    """A continuation (the gateway moving a stream whose worker died): given the prompt and the first
    `cut` tokens of an answer, and the characters of their text already sent, the worker streams the
    rest: at T=0 the same tokens and text as the whole answer, and the counts of a whole request."""
    q = "Write a haiku about the sea."
    tok = Tokenizer.load(bundle)
    ref = ar_generate(load_model(bundle), tok, tok.encode_chat([{"role": "user", "content": q}]), SamplingParams(),
                      max_tokens=24, max_len=1024)
    sent = tok.decode(ref.token_ids[:cut])
    sent = sent[:-1] if sent.endswith("\ufffd") else sent  # an incomplete character is not sent yet
    chunks = collect(ar_worker.stub, chat(q, 24, prefix_token_ids=ref.token_ids[:cut], prefix_chars=len(sent)))
    assert ref.token_ids[:cut] + [t for c in chunks for t in c.token_ids] == ref.token_ids
    assert sent + "".join(c.text for c in chunks) == ref.text
    assert chunks[-1].completion_tokens == len(ref.token_ids) - cut
    with pytest.raises(grpc.RpcError) as e:  # a prefix as long as the whole answer cannot be continued
        collect(ar_worker.stub, chat(q, 4, prefix_token_ids=ref.token_ids[:4]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_info_load_health_and_metrics(ar_worker):
    info = ar_worker.stub.Info(pb.InfoRequest())
    assert (info.engine, info.max_running, info.max_waiting, info.max_context) == ("ar", 2, 1, 1024)
    assert info.version and not info.dcut
    assert 1.0 <= info.compute_bound_tokens <= 1e6   # measured at startup (engines/forward_cost.py)
    load = ar_worker.stub.Load(pb.LoadRequest())
    assert load.max_running == 2 and load.running == 0
    health = health_pb2_grpc.HealthStub(ar_worker.channel)
    for service in ("", "specroute.v1.Engine"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    collect(ar_worker.stub, chat("hi", 4))
    text = urllib.request.urlopen(f"http://127.0.0.1:{ar_worker.metrics_port}/metrics", timeout=5).read().decode()
    for name in ("specroute_generation_tokens_total", "specroute_requests_running", "specroute_requests_waiting",
                 "specroute_spec_decode_num_drafts_total", "specroute_dcut_kept_ratio"):
        assert name in text


@pytest.mark.parametrize("req, msg", [
    (chat("x", sampling=pb.SamplingParams(temperature=-1)), "temperature"),
    (chat("x", sampling=pb.SamplingParams(temperature=float("nan"))), "temperature"),
    (chat("x", sampling=pb.SamplingParams(top_p=1.5)), "top_p"),
    (pb.GenerateRequest(max_tokens=4), "empty prompt"),
    (pb.GenerateRequest(prompt="   ", max_tokens=4), ""),
    (pb.GenerateRequest(prompt="hi", messages=[pb.ChatMessage(role="user", content="x")]), "either"),
    (pb.GenerateRequest(messages=[pb.ChatMessage(role="robot", content="x")]), "role"),
    (chat("x", max_tokens=-3), "max_tokens"),
    (pb.GenerateRequest(prompt="word " * 1500, max_tokens=4), "context holds 1024"),
])
def test_invalid_requests_get_invalid_argument(ar_worker, req, msg):
    try:
        collect(ar_worker.stub, req)
    except grpc.RpcError as exc:
        if not msg:   # whitespace-only prompt tokenizes to something: either outcome is fine if clean
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            return
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert msg in exc.details() and "\n" not in exc.details()
    else:
        assert not msg, "expected INVALID_ARGUMENT"


def test_cancel_frees_slot_and_queue_full(ar_worker):
    stub = ar_worker.stub
    # earlier tests' cancelled requests may still be draining on a loaded machine
    ar_worker.wait_load(lambda ld: ld.running == 0 and ld.waiting == 0)
    calls = []
    for _ in range(2):
        calls.append(stub.Generate(chat("tell me a long story", 2000)))
        next(calls[-1])   # running (first chunk arrived) before the next one is sent
    assert ar_worker.wait_load(lambda ld: ld.running == 2).running == 2
    waiting = stub.Generate(chat("queued", 2000))
    ar_worker.wait_load(lambda ld: ld.waiting == 1)
    with pytest.raises(grpc.RpcError) as exc:
        collect(stub, chat("one too many", 4))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "full" in exc.value.details()
    for c in calls:
        c.cancel()
    waiting.cancel()
    load = ar_worker.wait_load(lambda ld: ld.running == 0 and ld.waiting == 0)
    assert (load.running, load.waiting) == (0, 0)
    assert collect(stub, chat("after", 3))[-1].finish_reason in ("stop", "length")


def test_deadline_exceeded(ar_worker):
    with pytest.raises(grpc.RpcError) as exc:
        collect(ar_worker.stub, chat("long", 2000), timeout=0.3)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert ar_worker.wait_load(lambda ld: ld.running == 0).running == 0


def test_feedback_reaches_redis(ar_worker, redis_srv):
    r = redis.Redis.from_url(redis_srv.url)
    before = r.xlen("{specroute}:feedback")
    chunks = collect(ar_worker.stub, chat("2+2?", 5, domain="math", request_id="req-fb"))
    t_end = time.monotonic() + 5
    while r.xlen("{specroute}:feedback") == before and time.monotonic() < t_end:
        time.sleep(0.05)
    entry = r.xrevrange("{specroute}:feedback", count=1)[0][1]
    assert entry[b"pool"] == b"ar-pool" and entry[b"domain"] == b"math" and entry[b"request_id"] == b"req-fb"
    assert int(entry[b"tokens"]) == chunks[-1].completion_tokens
    stats = r.hgetall(stats_key("math", "ar-pool"))
    assert float(stats[b"n"]) >= 1 and float(stats[b"tokens"]) >= 1


def test_feedback_carries_the_request_context(ar_worker, redis_srv):
    """The gateway's context (GenerateRequest.context) reaches the v2 per-context statistics, and its
    features (GenerateRequest.features) the stream entry the predictor is trained from."""
    r = redis.Redis.from_url(redis_srv.url)
    ctx = "d=math|s=cyrillic|t=0|l=short"
    collect(ar_worker.stub, chat("2+2?", 3, domain="math", context=ctx, request_id="req-ctx", features=[0.25, 1.0]))
    t_end = time.monotonic() + 5
    while r.zscore("{specroute}:stats:v2:index", f"{ctx}:ar-pool") is None and time.monotonic() < t_end:
        time.sleep(0.05)
    assert float(r.hget(f"{{specroute}}:stats:v2:ctx:{ctx}:ar-pool", "n")) >= 1
    assert float(r.hget("{specroute}:stats:v2:ctx:d=math|t=0:ar-pool", "n")) >= 1
    assert float(r.hget("{specroute}:stats:v2:all:ar-pool", "n")) >= 1
    entry = next(e for _, e in r.xrevrange("{specroute}:feedback", count=10) if e[b"request_id"] == b"req-ctx")
    assert entry[b"context"] == ctx.encode() and entry[b"features"] == b"0.2500,1.0000"


def test_redis_down_is_counted_not_fatal(bundle, start_worker):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    w = start_worker("--engine", "ar", "--model", str(bundle), "--redis-url", dead)
    for _ in range(2):
        assert collect(w.stub, chat("hello", 4))[-1].finish_reason in ("stop", "length")
    t_end = time.monotonic() + 10
    value = 0.0
    while time.monotonic() < t_end:
        text = urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=5).read().decode()
        line = next(x for x in text.splitlines() if x.startswith("specroute_redis_errors_total"))
        value = float(line.split()[-1])
        if value >= 1:
            break
        time.sleep(0.1)
    assert value >= 1


def test_killed_worker_fails_stream_at_once(bundle, start_worker):
    w = start_worker("--engine", "ar", "--model", str(bundle))
    call = w.stub.Generate(chat("a very long answer please", 2000), timeout=60)
    next(call)
    w.kill()
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as exc:
        for _ in call:
            pass
    assert time.monotonic() - t0 < 5
    assert exc.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def test_sigterm_drains_running_requests(bundle, start_worker):
    w = start_worker("--engine", "ar", "--model", str(bundle))
    call = w.stub.Generate(chat("finish me", 300), timeout=60)
    first = next(call)
    w.proc.send_signal(15)
    rest = list(call)
    assert rest[-1].finish_reason in ("stop", "length")
    assert first.prompt_tokens > 0
    assert w.proc.wait(30) == 0


def test_null_engine_speaks_the_contract(start_worker):
    w = start_worker("--engine", "null", "--max-running", "4")
    info = w.stub.Info(pb.InfoRequest())
    assert info.engine == "null" and info.compute_bound_tokens == 0.0   # nothing measured: the router's default
    chunks = collect(w.stub, chat("anything at all", 7))
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 7
    assert sum(c.num_tokens for c in chunks) == 7
    assert "".join(c.text for c in chunks).split()[:2] == ["lorem", "ipsum"]
    # coalesce (non-streaming callers): the first chunk, then one final chunk with every later delta
    merged = collect(w.stub, chat("anything at all", 7, coalesce=True))
    # (the first chunk also carries whatever deltas were already queued behind the first: never waits)
    assert len(merged) <= 2 and merged[0].num_tokens >= 1 and merged[0].prompt_tokens == 3
    assert merged[-1].finish_reason == "length" and merged[-1].completion_tokens == 7
    assert "".join(c.text for c in merged) == "".join(c.text for c in chunks)
    assert [t for c in merged for t in c.token_ids] == [t for c in chunks for t in c.token_ids]
    assert sum(c.num_tokens for c in merged) == 7


def test_dcut_worker_live_switch(bundle, start_worker, tmp_path):
    w = start_worker("--engine", "dfly", "--dcut", "--model", str(bundle), "--dcut-profile-dir", str(tmp_path),
                     "--max-running", "4")
    info = w.stub.Info(pb.InfoRequest())
    assert (info.engine, info.drafter, info.dcut, info.block_size) == ("dfly", "dfly", True, 15)
    assert list(tmp_path.glob("*dcut_profile.json"))
    on = collect(w.stub, chat("hello there", 12))
    assert not w.stub.SetDcut(pb.SetDcutRequest(enabled=False)).dcut
    assert not w.stub.Load(pb.LoadRequest()).dcut_enabled
    off = collect(w.stub, chat("hello there", 12))
    assert [t for c in on for t in c.token_ids] == [t for c in off for t in c.token_ids]
    assert off[-1].stats.drafted_tokens >= on[-1].stats.drafted_tokens
    by = dict(off[-1].stats.steps_by_drafter)   # D-Cut off: DFly drafts
    assert set(by) <= {"dfly", "plain"} and by.get("dfly", 0) > 0 and sum(by.values()) == off[-1].stats.steps
    assert w.stub.SetDcut(pb.SetDcutRequest(enabled=True)).dcut


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def test_worker_memory_is_stable(bundle, start_worker, tmp_path):
    import concurrent.futures as cf

    w = start_worker("--engine", "dfly", "--dcut", "--model", str(bundle), "--max-running", "8",
                     "--dcut-profile-dir", str(tmp_path))

    def one(i: int) -> int:
        return collect(w.stub, chat(f"question number {i}: what is {i} + {i}?", 12))[-1].completion_tokens

    with cf.ThreadPoolExecutor(8) as ex:
        assert all(list(ex.map(one, range(100))))
        after_100 = _rss_mb(w.proc.pid)
        assert all(list(ex.map(one, range(100, 400))))
        after_400 = _rss_mb(w.proc.pid)
    assert after_400 <= after_100 * 1.10, (after_100, after_400)
