"""The load generator of `specroute bench routing`: closed-loop clients streaming chat completions
from the gateway over HTTP/1.1 keep-alive (a minimal client, so its own CPU cost stays small on a
machine the workers and the gateway share).

Each request is `POST /v1/chat/completions` with `stream: true` and `stream_options.include_usage`;
TTFT is the arrival of the first event with content, end-to-end the arrival of `[DONE]`; the final
usage event carries the gateway's `specroute` object (pool, reason, domain, drafted / accepted
tokens, verification steps).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.routing_trace import TraceItem


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
    pool: str = ""
    reason: str = ""
    classified: str = ""
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self, with_text: bool) -> dict[str, Any]:
        r: dict[str, Any] = {**self.item.row(), "t_send": round(self.t_send, 4), "t_first": round(self.t_first, 4),
                             "t_end": round(self.t_end, 4), "ok": self.ok, "completion_tokens": self.completion_tokens,
                             "pool": self.pool, "reason": self.reason, "classified": self.classified,
                             "drafted": self.drafted, "accepted": self.accepted, "steps": self.steps}
        if self.error:
            r["error"] = self.error[:200]
        if with_text:
            r["text"] = self.text
        return r


class StreamConn:
    """One keep-alive connection: POST a JSON body, read a chunked SSE body event by event."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, path: str, body: bytes, res: Result, t0: float) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write((f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        status = int((await self.reader.readline()).split()[1])
        chunked, length, close = False, 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip().lower()
            chunked |= k == "transfer-encoding" and "chunked" in v
            length = int(v) if k == "content-length" else length
            close |= k == "connection" and v == "close"
        if not chunked:
            data = await self.reader.readexactly(length)
            res.error = f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}"
        else:
            buf = b""
            parts: list[str] = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                buf += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    self._event(ev, res, parts, t0)
            res.text = "".join(parts)
            res.ok = status == 200 and not res.error and res.t_end > 0
        if close:
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
            res.pool, res.reason, res.classified = spec.get("pool", ""), spec.get("reason", ""), spec.get("domain", "")
            res.drafted, res.accepted = int(spec.get("drafted_tokens", 0)), int(spec.get("accepted_tokens", 0))
            res.steps = int(spec.get("steps", 0))


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
