"""At T > 0 a grammar-constrained request's output law is the masked target's, on every path: the exact
law of the outputs a small grammar allows (every token sequence enumerated: the target's masked, tempered
distribution at each prefix) against histograms of AR and of speculative decoding (MTP, DFly and DSpark,
whose drafts are sampled under the grammar's masks: q is the masked draft distribution; and DFlash,
whose block is proposed unmasked, so most of its drafts are disallowed and go to the residual of the
masked p).
The tiny random bundle with the demo tokenizer, real llguidance, the real batcher: 600 samples per path,
~40-100 s per path on 2 loaded cores (marked slow)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from engines.batcher import Batcher
from engines.drafters.registry import load_drafter
from engines.grammar import GrammarCompiler, masked_logits
from engines.model import load_model
from engines.requests import BatcherConfig, Event, GenRequest
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from engines.tokenizer import Tokenizer
from specroute.contracts.grammar import GrammarSpec
from tests.tiny_bundle import make_tiny_bundle

pytestmark = [pytest.mark.exactness, pytest.mark.slow]

GRAMMAR = GrammarSpec("lark", 'start: /[ab]{2}/ "."')   # aa. ab. ba. bb. in whatever tokens the vocabulary has
TEMPERATURE = 1.3
N = 600


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bundle(tmp_path_factory.mktemp("g") / "bundle", drafters=("mtp", "dfly", "dspark", "dflash"))


@torch.no_grad()
def exact_law(target, compiler: GrammarCompiler, tok: Tokenizer, prompt: list[int]) -> dict[str, float]:
    """Every output the grammar allows (token sequences up to EOS) with its probability under the masked,
    tempered target, by enumeration (a forward per prefix)."""
    law: Counter[str] = Counter()

    def walk(seq: list[int], c, prob: float) -> None:
        ids = prompt + seq
        hidden = target(torch.tensor([ids]), torch.arange(len(ids))[None]).hidden
        logits = masked_logits(target.logits(hidden[0, -1]).float(), c.mask())
        p = logits_to_probs(logits, TEMPERATURE)
        for t in torch.nonzero(p > 1e-9)[:, 0].tolist():
            if t == compiler.eos_id:
                law[tok.decode(seq)] += prob * float(p[t])
            else:
                c.consume(t)
                walk(seq + [t], c, prob * float(p[t]))
                c.matcher.rollback(1)

    walk([], compiler.constraint(GRAMMAR), 1.0)
    return dict(law)


def sample_outputs(decoder: SpecDecoder, tok: Tokenizer, compiler: GrammarCompiler, prompt: list[int]) -> Counter[str]:
    b = Batcher(decoder, tok.decode, [tok.eos_id], BatcherConfig(max_running=decoder.num_slots, max_waiting=N,
                                                                   max_len=decoder.max_len)).start()
    outs: Counter[str] = Counter()
    lock, done = threading.Lock(), threading.Semaphore(0)
    for _ in range(N):
        got: list[int] = []

        def sink(ev: Event, got: list[int] = got) -> None:
            got.extend(ev.token_ids)
            if ev.finish_reason:
                with lock:
                    outs[tok.decode([t for t in got if t != tok.eos_id])] += 1
                done.release()
        b.submit(GenRequest(list(prompt), SamplingParams(TEMPERATURE), max_tokens=8,
                            constraint=compiler.constraint(GRAMMAR)), sink)
    for _ in range(N):
        assert done.acquire(timeout=120)
    b.stop()
    return outs


@pytest.mark.parametrize("kind", ["ar", "dfly", "mtp", "dspark", "dflash"])
def test_constrained_sampling_law(bundle: Path, kind: str) -> None:
    torch.manual_seed(0)
    target = load_model(bundle).eval()
    tok = Tokenizer.load(bundle)
    compiler = GrammarCompiler(tok.inner.to_str(), target.config.vocab_size, tok.eos_id)
    prompt = tok.encode("<|user|>\nab?")
    law = exact_law(target, compiler, tok, prompt)
    assert set(law) == {"aa.", "ab.", "ba.", "bb."} and abs(sum(law.values()) - 1.0) < 1e-5
    drafter = None if kind == "ar" else load_drafter(kind, bundle, target, head_dtype=None).eval()
    seen = sample_outputs(SpecDecoder(target, drafter, 32, 64, prefill_chunk=16), tok, compiler, prompt)
    keys = sorted(law)
    assert set(seen) <= set(keys), seen
    total = sum(law.values())
    _, pvalue = chisquare([seen[k] for k in keys], [N * law[k] / total for k in keys])
    assert pvalue > 1e-3, (kind, dict(seen), law)
