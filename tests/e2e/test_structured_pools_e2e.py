"""Structured output and forced tool calls on our speculative engine pools, end to end: the official
`openai` client -> a real gateway -> two real workers on the demo bundle, one pool each, real
redis-server. The pools are the acceptance's: `mtp` (an MTP worker) and `dfly-dcut` (a DFly worker
with D-Cut, `--dcut`, over test_served_exactness.py's cost table written for this machine, so that it
does not profile first). Each pool is reached through an API key limited to it, and every answer
names the pool it came from. All the module's requests are sent at once (`answers`), both pools'
interleaved, THREADS in flight per pool (each worker batches them, on its own core). Per pool:

- `response_format` json_schema (strict, bounded so that every output ends within MAX_TOKENS)
  validates on N_SCHEMA held-out prompts (the fixture's held-out split: no training prompt of the
  demo bundle), greedy and seeded T=0.8 in turn, and some tokens were drafted (speculation ran
  under the grammar);
- `tool_choice="required"` gives one call with valid arguments on every ask; streamed, its
  `delta.tool_calls` reassemble into valid arguments, the call the same request makes whole;
- on `dfly-dcut`, D-Cut ran on the constrained rows: its `specroute_dcut_cut_*` counters grew. (On
  these rows it finds, under this table, that drafting seldom pays: the worker runs plain steps with
  a drafted probe now and then, and cuts the drafts of the probes it scores lowest.)

Cost: ~40 CPU seconds in all (~15 s to start, the workers loading side by side); the report line
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

from engines.dcut.profile import profile_path
from engines.training.data import load_prompts
from specroute.readiness import grpc_serving
from tests.e2e.test_gateway_e2e import DEMO, _http, _spawn, _wait
from tests.e2e.test_served_exactness import cpu_seconds, proc_cpu, write_dcut_profile
from tests.openai_checks import PERSON, PERSON_FORMAT, PERSON_MAX_TOKENS
from tests.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POOLS = ("mtp", "dfly-dcut")
N_SCHEMA = 50
THREADS = 8                  # requests in flight (the worker batches them)
ADMIN = "e2e-admin-token-0123"
MAX_TOKENS = PERSON_MAX_TOKENS
FMT = PERSON_FORMAT
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 6},
                                                "unit": {"enum": ["C", "F"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
FUNCS = {"get_weather": WEATHER, "get_time": TIME}
ASKS = ("What is the weather in Oslo?", "What time is it in Paris?", "Is it raining in Rome?", "Tell me the time.")


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
        self.clients = {p: openai.OpenAI(base_url=self.url + "/v1", api_key=k, max_retries=0, timeout=120)
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


@pytest.fixture(scope="module")
def answers(served: Pools) -> dict[str, Answers]:
    """Every request of the module, both pools' at once (each worker decodes on its own core), THREADS
    in flight per pool; with the D-Cut worker's counters before and after (`served.dcut_grew`)."""
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

    jobs = [(call, (p, i)) for i in range(len(ASKS)) for p in POOLS] + [(stream, (p,)) for p in POOLS]
    jobs += [(schema, (p, i)) for i in range(N_SCHEMA) for p in POOLS]
    before, t0 = served.dcut_counters(), time.perf_counter()
    with ThreadPoolExecutor(THREADS * len(POOLS)) as ex:
        for f in [ex.submit(fn, *args) for fn, args in jobs]:
            f.result()
    after = served.dcut_counters()
    served.dcut_grew = {k: after[k] - before[k] for k in after}
    print(f"\n{len(jobs)} requests in {time.perf_counter() - t0:.1f} s; D-Cut: {served.dcut_grew}")
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
