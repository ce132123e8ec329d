"""The vLLM worker on its own, over gRPC: vLLM (ngram speculation) reproduces our AR engine's greedy output
on 20 held-out prompts given the same token ids; its per-request speculative statistics reach the final
chunk, Prometheus and Redis in our engine's shapes; `Load` follows vLLM's scheduler; cancellation
aborts the request inside vLLM; a seeded request gets the same tokens alone and in a busy batch; at T > 0
under a grammar the output law is the masked target's, ngram drafts and all (marker `exactness`)."""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import redis
import torch

from engines.generate import ar_generate
from engines.model import load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from specroute.contracts.feedback import FEEDBACK_STREAM, stats_key
from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc
from tests.lossless import assert_lossless
from tests.vllm.conftest import DEMO, VLLM_K, VllmWorker

N_PROMPTS, N_TOKENS = 20, 48
EOS = 6


@pytest.fixture(scope="module")
def stub(vllm_worker: VllmWorker):
    with grpc.insecure_channel(vllm_worker.address) as ch:
        yield pb_grpc.EngineStub(ch)


def heldout(n: int) -> list[tuple[str, str]]:
    """n held-out prompts of tests/data (chat, code, math in turn): (domain, text)."""
    from engines.training.data import load_prompts

    items = load_prompts("heldout")
    random.Random(12).shuffle(items)
    per = {"chat": 7, "code": 7, "math": 6}
    out = []
    for p in items:
        if per.get(p.domain, 0) > 0 and len(p.prompt) < 600:
            out.append((p.domain, p.prompt))
            per[p.domain] -= 1
    assert len(out) == n
    return out


def vllm_counter(w: VllmWorker, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))


def generate(stub, text: str, domain: str = "", max_tokens: int = N_TOKENS) -> tuple[list[int], pb.GenerateChunk]:
    req = pb.GenerateRequest(max_tokens=max_tokens, sampling=pb.SamplingParams(temperature=0), domain=domain,
                             request_id=f"t-{random.random():.6f}")
    req.messages.add(role="user", content=text)
    return run(stub, req)


def run(stub, req: pb.GenerateRequest) -> tuple[list[int], pb.GenerateChunk]:
    """The request's tokens and its final chunk (which must finish it)."""
    ids: list[int] = []
    last = None
    for chunk in stub.Generate(req, timeout=300):
        ids.extend(chunk.token_ids)
        last = chunk
    assert last is not None and last.finish_reason in ("stop", "length"), last
    return ids, last


def test_greedy_equals_our_ar_engine_on_20_heldout_prompts(stub, vllm_worker: VllmWorker) -> None:
    prompts = heldout(N_PROMPTS)
    tok = Tokenizer.load(DEMO)
    torch.set_num_threads(1)
    target = load_model(DEMO)
    with ThreadPoolExecutor(8) as pool:   # concurrently: vLLM batches them (continuous batching)
        outs = list(pool.map(lambda p: generate(stub, p[1], p[0]), prompts))
    drafted = accepted = 0
    for (domain, text), (got, last) in zip(prompts, outs, strict=True):
        ids = tok.encode_chat([{"role": "user", "content": text}])
        assert last.prompt_tokens == len(ids), "the worker's chat template differs from ours"
        ref = ar_generate(target, tok, ids, SamplingParams(temperature=0), max_tokens=N_TOKENS,
                          max_len=len(ids) + N_TOKENS + 1).token_ids
        got_, ref_ = [t for t in got if t != EOS], [t for t in ref if t != EOS]
        assert_lossless(target, ids, got_, ref_, label=f"{domain}: {text[:40]!r}")
        s = last.stats
        assert last.completion_tokens == len(got) and s.steps > 0
        assert s.mean_accepted_length == pytest.approx(1 + s.accepted_tokens / s.steps)
        drafted += s.drafted_tokens
        accepted += s.accepted_tokens
    print(f"vLLM ngram over {N_PROMPTS} prompts: {accepted}/{drafted} drafts accepted")
    assert drafted > 0 and 0 < accepted <= drafted   # vLLM's speculation ran, and we got its statistics


def test_feedback_and_metrics_in_our_shapes(stub, vllm_worker: VllmWorker) -> None:
    r = redis.Redis.from_url(vllm_worker.redis_url, decode_responses=True)
    generate(stub, "Write a Python function that returns the sum of a list.", "code")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not r.exists(stats_key("code", "vllm")):
        time.sleep(0.1)
    cell = r.hgetall(stats_key("code", "vllm"))
    assert float(cell["n"]) >= 1 and float(cell["steps"]) > 0 and float(cell["drafted"]) > 0
    records = [f for _, f in r.xrange(FEEDBACK_STREAM)]
    assert records and all(rec["pool"] == "vllm" and rec["engine"] == "vllm" for rec in records)
    with urllib.request.urlopen(f"http://127.0.0.1:{vllm_worker.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for name in ("specroute_spec_decode_num_draft_tokens_total", "specroute_generation_tokens_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert name in text, name
    info = stub.Info(pb.InfoRequest(), timeout=10)
    assert (info.engine, info.drafter, info.block_size, info.max_context) == ("vllm", "ngram", VLLM_K, 1024)


def test_load_follows_vllm_scheduler_and_cancel_aborts(stub, vllm_worker: VllmWorker) -> None:
    # greedy on a raw prompt: this model loops until max_tokens (a sampled answer may stop after a few
    # tokens, before the cancel, depending on the CPU's kernels)
    req = pb.GenerateRequest(max_tokens=900, sampling=pb.SamplingParams(temperature=0.0))
    req.prompt = "Once upon a time"
    call = stub.Generate(req, timeout=300)
    seen: list[pb.LoadResponse] = []
    got = 0
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append(stub.Load(pb.LoadRequest(), timeout=10))
            time.sleep(0.05)

    t = threading.Thread(target=poll)
    t.start()
    try:
        with pytest.raises(grpc.RpcError) as err:
            for chunk in call:   # cancel once Load has shown the request in vLLM's scheduler
                got += len(chunk.token_ids)
                if got >= 8 and (any(x.running == 1 for x in seen) or got >= 600):
                    call.cancel()
    finally:
        time.sleep(0.3)
        stop.set()
        t.join()
    assert err.value.code() == grpc.StatusCode.CANCELLED
    assert any(s.running == 1 and s.cache_usage > 0 for s in seen), (
        f"Load never showed vLLM's running request: {sorted({(x.running, x.waiting, x.cache_usage > 0) for x in seen})}, "
        f"{got} tokens\n{vllm_worker.tail()}")
    deadline = time.monotonic() + 10   # vLLM aborted it: the scheduler is empty again
    while time.monotonic() < deadline:
        s = stub.Load(pb.LoadRequest(), timeout=10)
        if s.running == 0 and s.waiting == 0:
            break
        time.sleep(0.1)
    assert (s.running, s.waiting) == (0, 0)
    # vLLM aborted it: its own token counter stands still (the request asked for 900 tokens)
    before = vllm_counter(vllm_worker, "vllm:generation_tokens_total")
    time.sleep(2.0)
    assert vllm_counter(vllm_worker, "vllm:generation_tokens_total") == before, "vLLM kept generating"
    ids, last = generate(stub, "Tell me a short story about a dog.", "chat", 8)   # still serving
    assert ids and last.finish_reason in ("stop", "length")


def sample(stub, prompt: str, params: pb.SamplingParams, max_tokens: int, grammar: str = "") -> tuple[list[int], pb.GenerateChunk]:
    """One raw-prompt request's tokens and final chunk."""
    req = pb.GenerateRequest(max_tokens=max_tokens, sampling=params, grammar=grammar, request_id=f"s-{random.random():.6f}")
    req.prompt = prompt
    return run(stub, req)


@pytest.mark.exactness
def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_busy_batch(stub) -> None:
    """vLLM gives a seeded row its own generator: the same request alone and among greedy, hot and
    other seeded rows (with ngram drafts in the batch) gets the same tokens."""
    prompt = "Once upon a time there was a little dog. Once upon a time"
    seeded = pb.SamplingParams(temperature=0.9, top_p=0.95, has_seed=True, seed=1234)
    alone, _ = sample(stub, prompt, seeded, 24)
    others = [pb.SamplingParams(temperature=0), pb.SamplingParams(temperature=1.0),
              pb.SamplingParams(temperature=0.7, top_p=0.9, has_seed=True, seed=7), pb.SamplingParams(temperature=1.0),
              pb.SamplingParams(temperature=0)]
    with ThreadPoolExecutor(len(others) + 1) as pool:
        busy = [pool.submit(sample, stub, prompt if i % 2 else "Tell me a story.", p, 40) for i, p in enumerate(others[:3])]
        mine = pool.submit(sample, stub, prompt, seeded, 24)
        busy += [pool.submit(sample, stub, "Write a function.", p, 40) for p in others[3:]]
        got = mine.result()[0]
        drafted = sum(f.result()[1].stats.drafted_tokens for f in busy)
    assert got == alone
    assert drafted > 0   # ngram drafts shared the batch


@pytest.mark.exactness
def test_constrained_sampling_law_with_ngram_drafts(stub) -> None:
    """At T > 0 under a grammar, vLLM's output law (its guidance backend, ngram drafts verified under the
    masks) is the masked, tempered target's: N samples against the law enumerated with our target and
    grammar compiler (tests/engines/test_grammar_exactness.py's grammar and temperature), chi-square."""
    from scipy.stats import chisquare

    from engines.grammar import GrammarCompiler
    from tests.engines.test_grammar_exactness import GRAMMAR, TEMPERATURE, exact_law

    n = 600
    tok = Tokenizer.load(DEMO)
    torch.set_num_threads(1)
    target = load_model(DEMO).eval()
    compiler = GrammarCompiler(tok.inner.to_str(), target.config.vocab_size, tok.eos_id)
    text = "ab. ba. aa. bb. ab. ba. ab. aa."   # n-grams the ngram drafter finds in the prompt
    prompt = tok.encode(text)
    law = exact_law(target, compiler, tok, prompt)
    total = sum(law.values())
    assert abs(total - 1.0) < 1e-5
    params = pb.SamplingParams(temperature=TEMPERATURE)
    with ThreadPoolExecutor(16) as pool:   # vLLM batches them
        outs = list(pool.map(lambda _: sample(stub, text, params, 8, GRAMMAR.to_wire()), range(n)))
    assert outs[0][1].prompt_tokens == len(prompt), "the worker tokenizes the prompt differently"
    seen = Counter(tok.decode([t for t in ids if t != tok.eos_id]) for ids, _ in outs)
    drafted = sum(last.stats.drafted_tokens for _, last in outs)
    keys = sorted(law)
    assert set(seen) <= set(keys), seen
    _, pvalue = chisquare([seen[k] for k in keys], [n * law[k] / total for k in keys])
    print(f"vLLM constrained law: {dict(seen)} against {({k: round(n * v, 1) for k, v in law.items()})}, "
          f"p={pvalue:.3g}, {drafted} tokens drafted")
    assert pvalue > 1e-3, (dict(seen), law)
    assert drafted > 0   # vLLM's ngram drafts were verified under the masks
