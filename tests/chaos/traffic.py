"""A bounded, mixed stream of OpenAI requests for the chaos suite, and how each one ended.

`Traffic` runs `concurrency` client threads, each sending one request after another (chat and code
prompts, streamed and not, a short pause between them) until stopped. Every request ends as one of:

- `served`: a complete answer (JSON with choices, or a stream that reached `[DONE]`);
- `clean`: an OpenAI-shaped error (`{"error": {"message", "type", "param", "code"}}`), as the JSON
  body of a non-200 response or as the last event of a stream;
- `refused`: the connection was refused (nothing listening: the gateway itself was down);
- `hung`: no answer within the request's deadline;
- `unclean`: anything else (a cut stream, a non-OpenAI body, a reset connection).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT = "Tell me a short story about a friendly dog."
CODE = "Write a Python function `def add(a, b):` that returns a + b.\n```python\n"
KINDS = (("chat", True), ("code", True), ("chat", False), ("code", False))


def is_openai_error(obj: Any) -> bool:
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err)


@dataclass
class Outcome:
    kind: str
    stream: bool
    start: float  # time.monotonic()
    end: float
    result: str  # served | clean | refused | hung | unclean
    pool: str | None = None  # x-specroute-pool of the response
    status: int | None = None
    detail: str = ""  # error code, or what went wrong
    max_gap_s: float = 0.0  # longest wait for the next stream event
    text: str = ""  # the answer's text (a stream's deltas joined)


def send(client: httpx.Client, kind: str, stream: bool, deadline_s: float, max_tokens: int = 8,
         content: str | None = None, on_first: Callable[[], None] | None = None,
         temperature: float | None = None) -> Outcome:
    """One request, classified (never raises); `on_first` is called at a stream's first event."""
    body: dict[str, Any] = {
        "model": "specroute", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": content if content is not None else (CHAT if kind == "chat" else CODE)}]}
    if temperature is not None:
        body["temperature"] = temperature
    t0 = time.monotonic()
    out = Outcome(kind, stream, t0, t0, "unclean")
    try:
        with client.stream("POST", "/v1/chat/completions", json=body,
                           timeout=httpx.Timeout(deadline_s, connect=5.0)) as r:
            out.status, out.pool = r.status_code, r.headers.get("x-specroute-pool")
            if r.status_code != 200 or not stream:
                data = r.read()
                out.end = time.monotonic()
                obj = json.loads(data)
                if r.status_code == 200 and obj.get("choices"):
                    out.result, out.text = "served", obj["choices"][0]["message"]["content"] or ""
                elif r.status_code != 200 and is_openai_error(obj):
                    out.result, out.detail = "clean", str(obj["error"]["code"])
                else:
                    out.detail = f"status {r.status_code}: {data[:200]!r}"
                return out
            last, t_prev, events = None, time.monotonic(), 0
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.monotonic()
                if events == 0 and on_first is not None:
                    on_first()
                out.max_gap_s = max(out.max_gap_s, now - t_prev)
                t_prev, events = now, events + 1
                last = line[6:]
                if last.startswith("{") and '"choices"' in last:
                    choices = json.loads(last)["choices"]
                    out.text += (choices[0]["delta"].get("content") or "") if choices else ""
                if now - t0 > deadline_s:
                    raise httpx.ReadTimeout("stream past its deadline")
            out.end = time.monotonic()
            if last == "[DONE]":
                out.result = "served"
            elif last is not None and is_openai_error(json.loads(last)):
                out.result, out.detail = "clean", str(json.loads(last)["error"]["code"])
            else:
                out.detail = f"stream ended after {events} events without [DONE] or an error event"
    except httpx.ConnectError as exc:
        out.result, out.detail = "refused", type(exc).__name__
    except httpx.TimeoutException as exc:
        out.result, out.detail = "hung", f"{type(exc).__name__}: {exc}"
    except (httpx.HTTPError, ValueError) as exc:
        out.result, out.detail = "unclean", f"{type(exc).__name__}: {exc}"
    out.end = out.end if out.end > t0 else time.monotonic()
    return out


@dataclass
class Traffic:
    base_url: str
    concurrency: int = 4
    deadline_s: float = 20.0
    pause_s: float = 0.05
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _inflight: dict[int, float | None] = field(default_factory=dict)  # thread -> start of its request

    def _run(self, i: int) -> None:
        n = i
        with httpx.Client(base_url=self.base_url) as client:
            while not self._stop.is_set():
                kind, stream = KINDS[n % len(KINDS)]
                n += 1
                with self._lock:
                    self._inflight[i] = time.monotonic()
                out = send(client, kind, stream, self.deadline_s)
                with self._lock:
                    self.outcomes.append(out)
                    self._inflight[i] = None
                if out.result == "refused":
                    time.sleep(0.2)
                self._stop.wait(self.pause_s)

    def start(self) -> Traffic:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.concurrency)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.deadline_s + 10)

    def between(self, t0: float, t1: float) -> list[Outcome]:
        """Requests that started in [t0, t1)."""
        with self._lock:
            return [o for o in self.outcomes if t0 <= o.start < t1]

    def wait_done(self, t: float) -> None:
        """Wait until every request started before `t` has ended and been recorded (bounded: a
        request never outlives its deadline)."""
        end = time.monotonic() + self.deadline_s + 10
        while time.monotonic() < end:
            with self._lock:
                if all(s is None or s >= t for s in self._inflight.values()):
                    return
            time.sleep(0.05)


def tally(outcomes: Iterable[Outcome]) -> Counter[str]:
    return Counter(o.result for o in outcomes)
