"""Continuous batching: ragged concurrent requests equal per-request AR output; slots, limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engines.batcher import Batcher
from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.drafters.registry import DRAFTERS, engine_kinds
from engines.generate import ar_generate
from engines.model import ModelConfig, Transformer, init_weights
from engines.requests import BatcherConfig, Event, GenRequest, QueueFull
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from tests.demo import Demo
from tests.lossless import assert_lossless

EOS = 5
TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=160,
                   eos_token_id=EOS)


class CharTok:
    """Test double for the tokenizer: one character per id."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(48 + i) for i in ids)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    m = Transformer(TINY)
    init_weights(m, std=0.3)   # peaky logits: few near-ties
    return m.eval()


class Collector:
    def __init__(self, delay: float = 0.0) -> None:
        self.events: list[Event] = []
        self.done = threading.Event()
        self.delay = delay   # a slow sink slows the loop thread (keeps requests running)

    def __call__(self, ev: Event) -> None:
        time.sleep(self.delay)
        self.events.append(ev)
        if ev.finish_reason:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def final(self) -> Event:
        return self.events[-1]


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(6, 97, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def make_drafter(kind: str, target):
    if kind == "ar":
        return None
    registry = pytest.importorskip("engines.drafters.registry")
    torch.manual_seed(1)
    d = registry.new_drafter(kind, target)
    return d.eval()


def run_batch(target, drafter, reqs, max_running=4, dcut=None, max_len=120, k=None):
    dec = SpecDecoder(target, drafter, max_running, max_len, prefill_chunk=16)
    b = Batcher(dec, CharTok.decode, [EOS], BatcherConfig(max_running=max_running, max_waiting=64,
                                                          max_len=max_len, prefill_chunk=16,
                                                          prefill_budget=24, k=k), dcut).start()
    cols = []
    for r in reqs:
        c = Collector()
        b.submit(r, c)
        cols.append(c)
    for c in cols:
        assert c.done.wait(120), "request did not finish"
    b.stop()
    return b, cols


@pytest.mark.parametrize("kind", engine_kinds())
@pytest.mark.parametrize("use_dcut", [False, True, "probing"])
@pytest.mark.parametrize("n, running", [(10, 4), (32, 32)])
def test_concurrent_ragged_requests_match_ar(target, kind, use_dcut, n, running):
    """use_dcut="probing": drafting never pays (costly drafter), so D-Cut runs plain steps with
    one-row probes every other step: mixed plain/probe steps stay lossless too."""
    if use_dcut and (kind == "ar" or not DRAFTERS[kind].supports_dcut):
        pytest.skip("D-Cut needs chain drafts")
    drafter = make_drafter(kind, target)
    ps = prompts(n)
    reqs = [GenRequest(p, SamplingParams(), max_tokens=5 + 7 * (i % 4), request_id=str(i))
            for i, p in enumerate(ps)]
    dcut = None
    if use_dcut:
        k = drafter.max_draft
        table = CostTable.linear(k, base_ms=1.0, per_token_ms=0.5)
        if use_dcut == "probing":
            table = table.with_draft_ms([1e4] * len(table.batch_sizes))
        dcut = DcutController(table, k, probe_first=1, probe_rows=2)
    b, cols = run_batch(target, drafter, reqs, dcut=dcut, max_running=running)
    if use_dcut == "probing" and running == 4:
        assert b.probe_steps > 0 and b.dcut is not None and b.dcut.skipped_steps > 0
    for r, c in zip(reqs, cols, strict=True):
        ref = ar_generate(target, CharTok(), r.prompt_ids, SamplingParams(), max_tokens=r.max_tokens, max_len=120)
        assert c.final.finish_reason == ref.finish_reason
        assert_lossless(target, r.prompt_ids, c.tokens, ref.token_ids, label=f"{kind} req {r.request_id}")
        st = c.final.stats
        assert st is not None and st.completion_tokens == len(c.tokens) and st.prompt_tokens == len(r.prompt_ids)
        if drafter is not None:
            assert st.acceptance.steps > 0 and st.acceptance.drafted >= st.acceptance.accepted


def test_stop_strings_and_context_limit(target):
    p = prompts(1, seed=3)[0]
    ref = ar_generate(target, CharTok(), p, SamplingParams(), max_tokens=200, max_len=60)
    _, cols = run_batch(target, None, [GenRequest(p, SamplingParams(), max_tokens=60 - len(p))], max_len=60)
    assert cols[0].tokens == ref.token_ids


def test_cancel_and_deadline_free_slots(target):
    dec = SpecDecoder(target, None, 2, 150)
    b = Batcher(dec, CharTok.decode, [], BatcherConfig(max_running=2, max_waiting=4, max_len=150)).start()
    long = GenRequest(prompts(1)[0], max_tokens=100)
    c1, c2 = Collector(0.01), Collector(0.01)
    h1 = b.submit(long, c1)
    b.submit(GenRequest(prompts(1)[0], max_tokens=100, deadline=time.monotonic() + 0.05), c2)
    time.sleep(0.1)
    b.cancel(h1)
    assert c1.done.wait(10) and c2.done.wait(10)
    assert c1.final.finish_reason == "cancelled" and c2.final.finish_reason == "deadline"
    assert b.wait_idle(5)
    assert b.load().running == 0 and b._free == [0, 1] and not dec.slots
    b.stop()


def test_waiting_queue_bound(target):
    dec = SpecDecoder(target, None, 1, 150)
    b = Batcher(dec, CharTok.decode, [], BatcherConfig(max_running=1, max_waiting=2, max_len=150))
    # not started: nothing leaves the waiting queue
    for _ in range(2):
        b.submit(GenRequest([7, 8, 9], max_tokens=4), Collector())
    with pytest.raises(QueueFull, match="waiting queue is full"):
        b.submit(GenRequest([7, 8, 9], max_tokens=4), Collector())
    assert b.load().waiting == 2
    b.start()
    assert b.wait_idle(10)
    b.stop()


def test_stop_finishes_everything_with_shutdown(target):
    dec = SpecDecoder(target, None, 1, 150)
    b = Batcher(dec, CharTok.decode, [], BatcherConfig(max_running=1, max_waiting=4, max_len=150))
    cols = [Collector(0.01) for _ in range(3)]
    for c in cols:
        b.submit(GenRequest([7, 8, 9], max_tokens=100), c)
    b.start()
    time.sleep(0.05)
    b.stop()
    assert all(c.done.is_set() for c in cols)
    assert {c.final.finish_reason for c in cols} <= {"shutdown", "length"}


DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.fixture(scope="module")
def demo_ar(demo: Demo) -> Callable[[list[int]], list[int]]:
    """Plain AR output (24 tokens, stops at EOS) of the demo target per prompt, decoded once and shared by
    every drafter and D-Cut setting below (the same 32 prompts each time)."""
    memo: dict[tuple[int, ...], list[int]] = {}

    def ref(ids: list[int]) -> list[int]:
        if tuple(ids) not in memo:
            memo[tuple(ids)] = ar_generate(demo.target, demo.tok, ids, SamplingParams(), max_tokens=24).token_ids
        return memo[tuple(ids)]

    return ref


@pytest.mark.slow
@pytest.mark.parametrize("kind, use_dcut", [("mtp", False), ("dflash", False), ("dfly", False), ("dfly", True),
                                            ("dflash", True)])
def test_demo_model_32_concurrent_mixed_requests_equal_ar(demo_ar, kind, use_dcut):
    """The 'lossless under load' criterion on the real demo bundle: 32 concurrent mixed-domain requests."""
    if not (DEMO / "drafters" / kind / "config.json").is_file():
        pytest.skip(f"models/demo has no {kind} drafter yet")
    from bench.engine import mixed_prompts
    from engines.factory import load_engine, new_decoder

    eng = load_engine(kind, DEMO)
    dec = new_decoder(eng, 32, prefill_chunk=128)
    ps = mixed_prompts(eng.tokenizer, 32, 200)
    reqs = [GenRequest(ids, SamplingParams(), max_tokens=24, request_id=pid) for pid, _, ids in ps]
    k = eng.drafter.max_draft
    dcut = DcutController(CostTable.linear(k, base_ms=2.0, per_token_ms=0.5), k) if use_dcut else None
    b = Batcher(dec, eng.tokenizer.decode, [eng.tokenizer.eos_id],
                BatcherConfig(max_running=32, max_waiting=64, max_len=dec.max_len), dcut).start()
    cols = []
    for r in reqs:
        c = Collector()
        b.submit(r, c)
        cols.append(c)
    assert all(c.done.wait(600) for c in cols)
    b.stop()
    for r, c in zip(reqs, cols, strict=True):
        assert_lossless(eng.target, r.prompt_ids, c.tokens, demo_ar(r.prompt_ids), label=f"{kind} {r.request_id}")
