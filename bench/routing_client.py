"""The load generator of `specroute bench routing`: closed-loop clients streaming chat completions
from the gateway over HTTP/1.1 keep-alive (a minimal client, so its own CPU cost stays small on a
machine the workers and the gateway share).

Each request is `POST /v1/chat/completions` with `stream: true` and `stream_options.include_usage`;
TTFT is the arrival of the first event with content, end-to-end the arrival of `[DONE]`; the final
usage event carries the gateway's `specroute` object (pool, reason, domain, drafted / accepted
tokens, verification steps and those steps by the drafter that drafted them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.common import KeepAliveConn, read_chunks, read_head
from bench.routing_trace import TraceItem

# The gateway's decision, from the `specroute` object of the final usage event: (column of a row, key in
# that object, type; missing keys read as the type's empty value).
DECISION_COLUMNS: tuple[tuple[str, str, type[str] | type[int] | type[dict]], ...] = (
    ("pool", "pool", str), ("reason", "reason", str), ("classified", "domain", str),
    ("drafted", "drafted_tokens", int), ("accepted", "accepted_tokens", int), ("steps", "steps", int),
    ("drafter_steps", "steps_by_drafter", dict),
)


@dataclass
class Result:
    item: TraceItem
    t_send: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    ok: bool = False
    error: str = ""
    text: str = ""
    completion_tokens: int = 0
    decision: dict[str, Any] = field(default_factory=lambda: {col: kind() for col, _, kind in DECISION_COLUMNS})
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self, with_text: bool) -> dict[str, Any]:
        r: dict[str, Any] = {**self.item.row(), "t_send": round(self.t_send, 4), "t_first": round(self.t_first, 4),
                             "t_end": round(self.t_end, 4), "ok": self.ok, "completion_tokens": self.completion_tokens,
                             **self.decision}
        if self.error:
            r["error"] = self.error[:200]
        if with_text:
            r["text"] = self.text
        return r


class StreamConn(KeepAliveConn):
    """One keep-alive connection: POST a JSON body, read a chunked SSE body event by event."""

    async def request(self, path: str, body: bytes, res: Result, t0: float) -> None:
        reader = await self.send(path, body)
        status = int((await reader.readline()).split()[1])
        head = await read_head(reader)
        if not head.chunked:
            data = await reader.readexactly(head.length or 0)
            res.error = f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}"
        else:
            buf = b""
            parts: list[str] = []
            async for chunk in read_chunks(reader):
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    self._event(ev, res, parts, t0)
            res.text = "".join(parts)
            res.ok = status == 200 and not res.error and res.t_end > 0
        if head.close:
            self.close()

    @staticmethod
    def _event(ev: bytes, res: Result, parts: list[str], t0: float) -> None:
        if not ev.startswith(b"data: "):
            return
        payload = ev[6:]
        if payload == b"[DONE]":
            res.t_end = time.perf_counter() - t0
            return
        obj = orjson.loads(payload)
        if "error" in obj:
            res.error = str(obj["error"].get("message", obj["error"]))
            return
        for ch in obj.get("choices") or ():
            text = (ch.get("delta") or {}).get("content")
            if text:
                if not res.t_first:
                    res.t_first = time.perf_counter() - t0
                parts.append(text)
        if obj.get("usage"):
            res.completion_tokens = int(obj["usage"].get("completion_tokens", 0))
        spec = obj.get("specroute")
        if spec:
            res.decision = {col: kind(spec.get(key, kind())) for col, key, kind in DECISION_COLUMNS}


def request_body(it: TraceItem, max_tokens: int, model: str = "specroute") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": it.text}],
                         "max_tokens": max_tokens, "temperature": it.temperature, "seed": it.index,
                         "stream": True, "stream_options": {"include_usage": True}})


async def run_segment(host: str, port: int, items: Sequence[TraceItem], concurrency: int, max_tokens: int,
                      t0: float, timeout_s: float = 600.0) -> list[Result]:
    """`concurrency` closed-loop clients over `items` in order (each sends its next request when its
    previous one ends); times relative to `t0` (perf_counter)."""
    results = [Result(it) for it in items]
    nxt = 0

    async def client() -> None:
        nonlocal nxt
        conn = StreamConn(host, port)
        while nxt < len(results):
            res = results[nxt]
            nxt += 1
            res.t_send = time.perf_counter() - t0
            try:
                await asyncio.wait_for(conn.request("/v1/chat/completions", request_body(res.item, max_tokens),
                                                    res, t0), timeout_s)
            except Exception as exc:  # counted as an error; a fresh connection for the next request
                res.error = res.error or f"{type(exc).__name__}: {exc}"
                conn.close()
            if not res.t_end:
                res.t_end = time.perf_counter() - t0
        conn.close()

    await asyncio.gather(*(client() for _ in range(max(1, min(concurrency, len(results))))))
    return results
