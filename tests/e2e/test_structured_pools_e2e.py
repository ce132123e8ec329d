"""Structured output, forced tool calls, logprobs, n and the Responses API on our speculative engine
pools, end to end: the official `openai` client -> a real gateway -> two real workers on the demo
bundle, one pool each, real redis-server. The pools are the acceptance's: `mtp` (an MTP worker) and
`dfly-dcut` (a DFly worker with D-Cut, `--dcut`, over test_served_exactness.py's cost table written
for this machine, so that it does not profile first). Each pool is reached through an API key limited
to it, and every answer names the pool it came from. The module's requests are sent at once
(`answers`), both pools' interleaved, THREADS in flight per pool (each worker batches them, on its
own core); then the logprobs requests, one at a time on each worker (a D-Cut worker running one row
drafts for it at once and every 8 to 16 plain steps; in a batch, under this table, it seldom does).
Per pool:

- `response_format` json_schema (strict, bounded so that every output ends within MAX_TOKENS)
  validates on N_SCHEMA held-out prompts (the fixture's held-out split: no training prompt of the
  demo bundle), greedy and seeded T=0.8 in turn, and some tokens were drafted (speculation ran
  under the grammar);
- `tool_choice="required"` gives one call with valid arguments on every ask; streamed, its
  `delta.tool_calls` reassemble into valid arguments, the call the same request makes whole;
- logprobs (top 3), greedy, seeded T=0.8/top-p 0.9 and greedy under the json_schema, whole and
  streamed, against the AR reference computed in this process (`Reference`, the demo target): the
  tokens are AR's (`ar_generate`; near-tie rule), their logprobs and top 3 the target's teacher-forced
  on them under the request's rule (engines/logprobs.py: grammar mask, then temperature and top-p),
  within test_openai_surface_e2e.py's 2 * LOGIT_TOL / T; some of them were drafted;
- n=3 gives three choices, choice i seeded seed + i, the prompt counted once and the completion
  tokens summed;
- `check_responses_round_trip` (`responses.create`, a follow-up by `previous_response_id`, `.stream`)
  through the pool's key, every answer to that key from its pool (the Responses API runs the chat
  handler with the caller's headers, so the key's pool limit holds);
- on `dfly-dcut`, D-Cut ran on the constrained rows: its `specroute_dcut_cut_*` counters grew. (On
  these rows it finds, under this table, that drafting seldom pays: the worker runs plain steps with
  a drafted probe now and then, and cuts the drafts of the probes it scores lowest.)

Cost: ~60 CPU seconds in all (~20 s to start, the workers loading side by side); the report line
(`-s`) gives the module's wall and CPU seconds.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch

from engines.dcut.profile import profile_path
from engines.generate import ar_generate, prefill
from engines.grammar import GrammarCompiler, masked_logits
from engines.logprobs import FLOOR, processed_logprobs
from engines.model import KVCache, load_model
from engines.sampling import SamplingParams, logits_to_probs, seeded_scores
from engines.tokenizer import Tokenizer
from engines.training.data import load_prompts
from router.api.structured import response_spec
from specroute.contracts.grammar import GrammarSpec
from specroute.readiness import grpc_serving
from tests.e2e.test_gateway_e2e import CHAT, DEMO, _http, _spawn, _wait
from tests.e2e.test_openai_surface_e2e import LOGIT_TOL
from tests.e2e.test_served_exactness import cpu_seconds, proc_cpu, write_dcut_profile
from tests.openai_checks import (
    FUNCS,
    PERSON,
    PERSON_FORMAT,
    PERSON_MAX_TOKENS,
    TIME,
    WEATHER,
    check_responses_round_trip,
)
from tests.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POOLS = ("mtp", "dfly-dcut")
N_SCHEMA = 50
THREADS = 8                  # requests in flight (the worker batches them)
ADMIN = "e2e-admin-token-0123"
MAX_TOKENS = PERSON_MAX_TOKENS
FMT = PERSON_FORMAT
ASKS = ("What is the weather in Oslo?", "What time is it in Paris?", "Is it raining in Rome?", "Tell me the time.")
# logprobs cases: the request's parameters, the sampling rule they ask for and the grammar the gateway makes of them
LOGPROB_CASES: dict[str, tuple[dict[str, Any], SamplingParams, GrammarSpec | None]] = {
    "greedy": ({"temperature": 0, "max_tokens": 24}, SamplingParams(0.0), None),
    "seeded": ({"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 24}, SamplingParams(0.8, 0.9, 7), None),
    "greedy json_schema": ({"temperature": 0, "response_format": FMT, "max_tokens": MAX_TOKENS}, SamplingParams(0.0),
                           response_spec(FMT)),
}
N3_SEED, N3_TOKENS = 3, 8


class Pools:
    """Redis, an `mtp` worker, a `dfly --dcut` worker (its metrics on a side port) and a gateway with
    one pool per worker and one API key per pool (limited to it)."""

    def __init__(self, tmp: Path) -> None:
        self.t0, self.cpu0 = time.perf_counter(), cpu_seconds()
        self.cpu_at_stop = 0.0
        self.redis = RedisServer().start()
        self.metrics_port = free_port()
        ports = {p: free_port() for p in (*POOLS, "gw")}
        write_dcut_profile(profile_path(DEMO, tmp), int(json.loads((DEMO / "drafters" / "dfly" / "config.json")
                                                                   .read_text())["block_size"]) - 1)
        common = ["--model", str(DEMO), "--max-running", str(THREADS)]
        self.procs = [
            _spawn(["worker", "--engine", "mtp", "--port", str(ports["mtp"]), *common], tmp / "mtp.log"),
            _spawn(["worker", "--engine", "dfly", "--dcut", "--dcut-profile-dir", str(tmp), "--port",
                    str(ports["dfly-dcut"]), "--metrics-port", str(self.metrics_port), *common], tmp / "dfly-dcut.log"),
        ]
        try:
            for proc, pool in zip(self.procs, POOLS, strict=True):
                _wait(lambda p=pool: grpc_serving(f"127.0.0.1:{ports[p]}"), proc, pool, tmp / f"{pool}.log")
            self.keys = {p: f"sk-structured-{p}-0123456789" for p in POOLS}
            env = {"SPECROUTE_ADMIN_TOKEN": f"ops:{ADMIN}",
                   "SPECROUTE_API_KEYS": ",".join(f"{p}:{k}" for p, k in self.keys.items()),
                   "SPECROUTE_API_KEY_LIMITS": json.dumps({p: {"pools": [p]} for p in POOLS})}
            pools = [f for p in POOLS for f in ("--pool", f"{p}=127.0.0.1:{ports[p]}")]
            self.procs.append(_spawn(["gateway", "--port", str(ports["gw"]), *pools, "--redis-url", self.redis.url],
                                     tmp / "gw.log", env=env))
            self.url = f"http://127.0.0.1:{ports['gw']}"
            _wait(lambda: _http(self.url + "/readyz")[0] == 200 and self.pools_up(), self.procs[-1], "gateway",
                  tmp / "gw.log", 120)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - self.t0
        self.dcut_grew: dict[str, float] = {}
        self.seen: dict[str, list[tuple[str, str | None]]] = {p: [] for p in POOLS}   # (path, x-specroute-pool)
        self.clients = {p: openai.OpenAI(base_url=self.url + "/v1", api_key=k, max_retries=0, timeout=120,
                                         http_client=openai.DefaultHttpxClient(event_hooks={"response": [
                                             lambda r, p=p: self.seen[p].append(
                                                 (r.request.url.path, r.headers.get("x-specroute-pool")))]}))
                        for p, k in self.keys.items()}

    def pools_up(self) -> bool:
        status, pools, _ = _http(self.url + "/admin/pools", headers={"authorization": f"Bearer {ADMIN}"})
        return status == 200 and all(pools.get(p, {}).get("available_endpoints") == 1 for p in POOLS)

    def dcut_counters(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:  # noqa: S310
            text = r.read().decode()
        out = {}
        for name in ("specroute_dcut_cut_steps_total", "specroute_dcut_cut_drafts_total",
                     "specroute_spec_decode_num_drafts_total"):
            m = re.search(rf"^{name} (\S+)$", text, re.M)
            out[name] = float(m.group(1)) if m else 0.0
        return out

    def cpu_s(self) -> float:
        """CPU seconds of this process and the servers (while they run)."""
        return cpu_seconds() + sum(proc_cpu(p.pid) for p in self.procs if p.poll() is None)

    def stop(self) -> None:
        self.cpu_at_stop = self.cpu_s()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:   # a worker still draining
                p.kill()
        self.redis.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    s = Pools(tmp_path_factory.mktemp("structured"))
    try:
        yield s
    finally:
        s.stop()
        print(f"\nstructured pools: started in {s.startup_s:.1f} s, module {time.perf_counter() - s.t0:.1f} s wall, "
              f"{s.cpu_at_stop - s.cpu0:.1f} CPU s (this process and the servers)")


def heldout(n: int, seed: int) -> list[str]:
    """`n` short held-out prompts (the fixture's held-out split), shuffled by `seed`."""
    items = [p.prompt for p in load_prompts("heldout") if len(p.prompt) < 200]
    random.Random(seed).shuffle(items)
    return items[:n]


@dataclass
class Answers:
    """What one pool answered: the schema requests', the forced calls' and the streamed call's."""

    schema: list[Any] = field(default_factory=list)
    calls: dict[int, Any] = field(default_factory=dict)   # by the ask's index
    streamed: list[Any] = field(default_factory=list)
    logprobs: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)   # case -> (text, logprobs.content)
    logprobs_drafted: list[int] = field(default_factory=lambda: [0, 0])   # whole logprobs requests' drafted, accepted
    n3: Any = None
    seed_plus_one: Any = None   # the n=3 request alone, seeded N3_SEED + 1
    responses_error: BaseException | None = None   # what check_responses_round_trip raised


@pytest.fixture(scope="module")
def answers(served: Pools) -> dict[str, Answers]:
    """Every request of the module, both pools' at once (each worker decodes on its own core), THREADS
    in flight per pool, with the D-Cut worker's counters before and after (`served.dcut_grew`); then
    the logprobs requests, one at a time on each worker (both workers at once)."""
    out = {p: Answers() for p in POOLS}
    prompts = heldout(N_SCHEMA, 33)

    def schema(pool: str, i: int) -> None:
        out[pool].schema.append(served.clients[pool].chat.completions.create(
            model="specroute", messages=[{"role": "user", "content": prompts[i]}], response_format=FMT,
            max_tokens=MAX_TOKENS, temperature=0.8 * (i % 2), seed=i))

    def call(pool: str, i: int) -> None:
        out[pool].calls[i] = served.clients[pool].chat.completions.create(
            model="specroute", messages=[{"role": "user", "content": ASKS[i]}], tools=[WEATHER, TIME],
            tool_choice="required", max_tokens=64, temperature=0.7 * (i % 2), seed=i)

    def stream(pool: str) -> None:
        out[pool].streamed = list(served.clients[pool].chat.completions.create(
            model="specroute", messages=[{"role": "user", "content": ASKS[0]}], tools=[WEATHER, TIME],
            tool_choice="required", max_tokens=64, temperature=0, stream=True))

    def logprobs(pool: str, case: str, streamed: bool) -> None:
        kw = dict(model="specroute", messages=CHAT, logprobs=True, top_logprobs=3, **LOGPROB_CASES[case][0])
        c = served.clients[pool].chat.completions
        if streamed:
            events = list(c.create(stream=True, **kw))
            out[pool].logprobs[f"{case} streamed"] = (
                "".join(ch.delta.content or "" for ev in events for ch in ev.choices),
                [t for ev in events for ch in ev.choices if ch.logprobs and ch.logprobs.content for t in ch.logprobs.content])
        else:
            r = c.create(**kw)
            assert _pool_of(r) == pool
            spec = (r.model_extra or {})["specroute"]
            out[pool].logprobs_drafted[0] += spec["drafted_tokens"]
            out[pool].logprobs_drafted[1] += spec["accepted_tokens"]
            out[pool].logprobs[case] = (r.choices[0].message.content or "", r.choices[0].logprobs.content)

    def n3(pool: str) -> None:
        kw = dict(model="specroute", messages=CHAT, max_tokens=N3_TOKENS, temperature=1.0)
        out[pool].n3 = served.clients[pool].chat.completions.create(seed=N3_SEED, n=3, **kw)
        out[pool].seed_plus_one = served.clients[pool].chat.completions.create(seed=N3_SEED + 1, **kw)

    def responses(pool: str) -> None:
        try:
            check_responses_round_trip(served.clients[pool], "specroute")
        except Exception as exc:   # noqa: BLE001 - raised again by the test that checks it
            out[pool].responses_error = exc

    def logprobs_alone(pool: str) -> None:
        for case in LOGPROB_CASES:
            for streamed in (False, True):
                logprobs(pool, case, streamed)

    # the chains of requests first: they run beside the rest
    jobs = [(responses, (p,)) for p in POOLS] + [(n3, (p,)) for p in POOLS]
    jobs += [(call, (p, i)) for i in range(len(ASKS)) for p in POOLS] + [(stream, (p,)) for p in POOLS]
    jobs += [(schema, (p, i)) for i in range(N_SCHEMA) for p in POOLS]
    before, t0 = served.dcut_counters(), time.perf_counter()
    with ThreadPoolExecutor(THREADS * len(POOLS)) as ex:
        for f in [ex.submit(fn, *args) for fn, args in jobs]:
            f.result()
    after = served.dcut_counters()
    served.dcut_grew = {k: after[k] - before[k] for k in after}
    print(f"\n{len(jobs)} requests in {time.perf_counter() - t0:.1f} s; D-Cut: {served.dcut_grew}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(POOLS)) as ex:   # then the logprobs requests, one at a time on each worker
        for f in [ex.submit(logprobs_alone, p) for p in POOLS]:
            f.result()
    print(f"{2 * len(LOGPROB_CASES) * len(POOLS)} logprobs requests in {time.perf_counter() - t0:.1f} s")
    return out


def _pool_of(r: Any) -> str:
    return (r.model_extra or {})["specroute"]["pool"]


@pytest.mark.parametrize("pool", POOLS)
def test_json_schema_strict_validates_on_heldout_prompts(answers: dict[str, Answers], pool: str) -> None:
    outs = answers[pool].schema
    assert len(outs) == N_SCHEMA and {_pool_of(r) for r in outs} == {pool}
    bad = []
    for r in outs:
        finish, content = r.choices[0].finish_reason, r.choices[0].message.content or ""
        try:
            assert finish == "stop"
            jsonschema.validate(json.loads(content), PERSON)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append((finish, content, str(exc)[:100]))
    drafted = sum((r.model_extra or {})["specroute"]["drafted_tokens"] for r in outs)
    print(f"{pool} json_schema: {N_SCHEMA - len(bad)}/{N_SCHEMA} valid, {drafted} tokens drafted; "
          f"e.g. {outs[0].choices[0].message.content!r}")
    assert not bad, bad
    assert drafted > 0, f"{pool} drafted nothing under the grammar"


@pytest.mark.parametrize("pool", POOLS)
def test_required_tool_calls_whole_and_streamed(answers: dict[str, Answers], pool: str) -> None:
    assert sorted(answers[pool].calls) == list(range(len(ASKS)))
    for r in answers[pool].calls.values():
        assert _pool_of(r) == pool
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls and len(ch.message.tool_calls) == 1, ch
        call = ch.message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), FUNCS[call.function.name]["function"]["parameters"])

    parts = answers[pool].streamed
    deltas = [tc for c in parts if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert deltas and deltas[0].id and deltas[0].function.name in FUNCS, parts
    assert all(d.index == 0 for d in deltas) and all(d.function.name is None for d in deltas[1:])
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), FUNCS[deltas[0].function.name]["function"]["parameters"])
    assert parts[-1].choices[0].finish_reason == "tool_calls"
    # greedy, the stream is the call the same request makes whole
    whole = answers[pool].calls[0].choices[0].message.tool_calls[0].function
    assert (deltas[0].function.name, args) == (whole.name, whole.arguments)


def test_dcut_ran_on_constrained_rows(served: Pools, answers: dict[str, Answers]) -> None:
    """D-Cut chose which drafts to verify on the DFly+D-Cut pool's constrained rows: some drafted steps
    left drafts unverified."""
    grew = served.dcut_grew
    assert grew["specroute_spec_decode_num_drafts_total"] > 0 and grew["specroute_dcut_cut_steps_total"] > 0, grew
    assert grew["specroute_dcut_cut_drafts_total"] > 0, grew


class Reference:
    """The AR reference, in this process: the demo target decoding on its own (`ar_generate`, under the
    request's grammar) and teacher-forced on a pool's tokens (their logits, masked by the grammar)."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.tok = Tokenizer.load(DEMO)
        self.model = load_model(DEMO)
        self.ids = {self.tok.token_piece(i)[1]: i for i in range(self.tok.vocab_size)}
        self.grammars = GrammarCompiler(self.tok.inner.to_str(), self.model.config.vocab_size, self.tok.eos_id)
        self.prompt = self.tok.encode_chat(CHAT)
        self._ar: dict[str, list[int]] = {}

    def ar(self, case: str) -> list[int]:
        """AR's tokens for a logprobs case (its end of sequence left off, as a completion's logprobs)."""
        if case not in self._ar:
            extra, params, spec = LOGPROB_CASES[case]
            out = ar_generate(self.model, self.tok, self.prompt, params, max_tokens=extra["max_tokens"],
                              constraint=None if spec is None else self.grammars.constraint(spec)).token_ids
            eos = set(self.model.config.eos_ids)
            self._ar[case] = out[:-1] if out and out[-1] in eos else out
        return self._ar[case]

    @torch.no_grad()
    def logits(self, case: str, tokens: list[int]) -> torch.Tensor:
        """[len(tokens), V] fp32: the target's logits at each token's position, masked by the case's grammar."""
        seq = self.prompt + tokens
        cache = KVCache.for_model(self.model.config, 1, len(seq) + 1)
        hidden = prefill(self.model, cache, 0, seq).hidden[0, len(self.prompt) - 1:len(seq) - 1]
        logits = self.model.logits(hidden).float()
        spec = LOGPROB_CASES[case][2]
        if spec is not None:
            c = self.grammars.constraint(spec)
            for j, t in enumerate(tokens):
                logits[j] = masked_logits(logits[j], c.mask())
                c.consume(t)
        return logits


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


def _first_difference_is_a_near_tie(ref: Reference, case: str, got: list[int], logits: torch.Tensor) -> str:
    """'' when a pool's tokens are AR's, or differ first where the two tokens' scores (greedy: the masked
    logits; seeded: `seeded_scores`, the Gumbel-max rule's) are both within the near-tie bound of the
    top one (LOGIT_TOL; seeded, 2 * LOGIT_TOL / T, as the logprobs' bound); else what is wrong."""
    want = ref.ar(case)
    if got == want:
        return ""
    i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if i is None:
        return f"{len(got)} tokens, AR's {len(want)}, with the same prefix"
    params = LOGPROB_CASES[case][1]
    if params.greedy:
        scores, tol = logits[i].double(), LOGIT_TOL
    else:
        assert params.seed is not None
        probs = logits_to_probs(logits[i], params.temperature, params.top_p)[None]
        scores, tol = seeded_scores(probs, params.seed, len(ref.prompt) + i)[0], 2 * LOGIT_TOL / params.temperature
    top, a, b = float(scores.max()), float(scores[got[i]]), float(scores[want[i]])
    if top - a < tol and top - b < tol:
        return ""
    return f"first difference at {i}: {got[i]} (score {a:.6f}), AR's {want[i]} (score {b:.6f}), top {top:.6f}"


@pytest.mark.parametrize("pool", POOLS)
def test_logprobs_are_the_ar_targets_whole_and_streamed(answers: dict[str, Answers], reference: Reference,
                                                        pool: str) -> None:
    """Each case's tokens are AR's (the near-tie rule), and their logprobs and top 3 are the target's,
    teacher-forced on them, under the request's sampling rule (engines/logprobs.py: grammar mask, then
    temperature and top-p), within 2 * LOGIT_TOL / T (T = 1 at greedy; test_openai_surface_e2e.py's
    argument: each fp32 logit may differ by LOGIT_TOL between forwards of other shapes)."""
    got = answers[pool].logprobs
    assert sorted(got) == sorted(f"{c}{s}" for c in LOGPROB_CASES for s in ("", " streamed"))
    report = {}
    for label, (text, content) in got.items():
        case = label.removesuffix(" streamed")
        params = LOGPROB_CASES[case][1]
        tol = 2 * LOGIT_TOL / (params.temperature or 1.0)
        assert content and "".join(c.token for c in content) == text, label
        tokens = [reference.ids[bytes(c.bytes)] for c in content]
        logits = reference.logits(case, tokens)
        wrong = _first_difference_is_a_near_tie(reference, case, tokens, logits)
        assert not wrong, (pool, label, wrong)
        lp = processed_logprobs(logits, params)
        worst = 0.0
        for j, c in enumerate(content):
            top = [(reference.ids[bytes(t.bytes)], t.logprob) for t in c.top_logprobs]
            assert len(top) == 3 and len({t for t, _ in top}) == 3, (label, j, top)
            assert c.logprob > FLOOR and [v for _, v in top] == sorted((v for _, v in top), reverse=True), (label, j)
            third = float(lp[j].topk(3).values[-1])   # the top 3 are the target's, up to ties within tol
            worst = max(worst, abs(c.logprob - float(lp[j, tokens[j]])), third - min(float(lp[j, t]) for t, _ in top),
                        *(abs(v - float(lp[j, t])) for t, v in top))
        report[label] = worst
        assert worst <= tol, (pool, label, worst, tol)
    drafted, accepted = answers[pool].logprobs_drafted
    print(f"{pool} logprobs vs AR's ({drafted} tokens drafted, {accepted} accepted), largest |difference|: "
          + ", ".join(f"{k} {v:.1e}" for k, v in report.items()))
    assert drafted > 0, f"{pool} drafted nothing for the logprobs requests"


@pytest.mark.parametrize("pool", POOLS)
def test_n_three_choices_usage_summed(answers: dict[str, Answers], pool: str) -> None:
    """n=3 (seeded N3_SEED, T=1): three choices, choice i seeded N3_SEED + i (choice 1 is the same request
    alone, seeded N3_SEED + 1); the usage counts the prompt once and sums the choices' completion tokens."""
    r, one = answers[pool].n3, answers[pool].seed_plus_one
    assert _pool_of(r) == _pool_of(one) == pool
    assert [ch.index for ch in r.choices] == [0, 1, 2] and all(ch.message.content for ch in r.choices)
    full = sum(ch.finish_reason == "length" for ch in r.choices)   # N3_TOKENS long; the others end sooner
    assert r.usage is not None and one.usage is not None and r.usage.prompt_tokens == one.usage.prompt_tokens
    assert N3_TOKENS * full + (3 - full) <= r.usage.completion_tokens <= 3 * N3_TOKENS
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert one.choices[0].message.content == r.choices[1].message.content


@pytest.mark.parametrize("pool", POOLS)
def test_responses_round_trip_on_the_keys_pool(served: Pools, answers: dict[str, Answers], pool: str) -> None:
    """`check_responses_round_trip` (create, a follow-up by `previous_response_id`, `.stream`) through the
    pool's key, and the key's pool served all of it: every answer to that key, Responses' and chat's,
    says it came from the pool (`x-specroute-pool`)."""
    if answers[pool].responses_error is not None:
        raise answers[pool].responses_error
    responses = [h for path, h in served.seen[pool] if path.endswith("/responses")]
    assert len(responses) == 4, served.seen[pool]
    assert {h for _, h in served.seen[pool]} == {pool}, served.seen[pool]
