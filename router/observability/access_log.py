"""The structured access log: one JSON line per completion request.

Where it is written: `/v1/chat/completions` and `/v1/completions` bypass Starlette's middleware (the
app's fast path, router/app.py, calls `router.api.completions.serve` directly), so the hook lives
where that handler finishes: once the response has gone out, `serve` builds the `Outcome` (a view of
what the request established: id, key, decision, tokens) and hands it to `AccessLog.write`.

Each line: `ts`, `request_id`, `key` (the API key's name, or null), `kind`, `model`, `stream`,
`domain`, `temperature` and `constraint` (the request context's buckets, specroute/contracts/context.py),
`pool`, `reason`, `status`, `prompt_tokens`, `completion_tokens`, `mean_accepted_length`,
`latency_ms` (whole request, as the gateway saw it). Successful requests are sampled (`sample` in
[0, 1]); every error (status >= 400) is written. Off by default, and then nothing is built.

Lines go to stderr or a file (`access_log_file`), not through `logging`: a request only appends its
encoded line to a buffer, and the buffer is written in one `write` per batch, `flush_s` after its
first line (or at once when `max_lines` are waiting, when there is no event loop, and on `close`).
A crash loses at most the last `flush_s` of lines.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from router.keys.ring import ApiKey


class Outcome:
    """The access log's (and trace's) view of one finished request (all optional)."""

    __slots__ = ("api_key", "trace", "rid", "key", "kind", "model", "stream", "domain", "temperature", "constraint",
                 "pool", "reason", "status", "prompt_tokens", "completion_tokens", "mal", "shadow_pool")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.api_key: ApiKey | None = None
        self.trace: Any = None  # the request's trace (router.observability.tracing.RequestTrace), when tracing is on
        self.rid = self.key = self.model = self.domain = self.pool = self.reason = None
        self.temperature: str | None = None   # the request context's temperature bucket (once admitted)
        self.constraint: str | None = None    # ... and its output constraint: none, json or tools
        self.stream = False
        self.status = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.mal: float | None = None
        self.shadow_pool: str | None = None   # the shadow policy's pool for the request (not served)

    def as_dict(self, latency_s: float, now: float) -> dict[str, object]:
        out: dict[str, object] = {
            "ts": round(now, 3), "request_id": self.rid, "key": self.key, "kind": self.kind, "model": self.model,
            "stream": self.stream, "domain": self.domain, "temperature": self.temperature,
            "constraint": self.constraint, "pool": self.pool, "reason": self.reason,
            "status": self.status, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "mean_accepted_length": None if self.mal is None else round(self.mal, 4),
            "latency_ms": round(latency_s * 1000.0, 3),
        }
        if self.shadow_pool is not None:
            out["shadow_pool"] = self.shadow_pool
        return out


class AccessLog:
    def __init__(self, sample: float = 1.0, path: Path | None = None,
                 rand: Callable[[], float] = random.random, flush_s: float = 0.1, max_lines: int = 512) -> None:
        self.sample = min(1.0, max(0.0, sample))
        self.rand = rand
        self.flush_s = flush_s
        self.max_lines = max_lines
        self._file: IO[bytes] | None = open(path, "ab") if path is not None else None  # noqa: SIM115
        self._lines: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def write(self, out: Outcome, latency_s: float) -> None:
        if out.status < 400 and (self.sample <= 0.0 or (self.sample < 1.0 and self.rand() >= self.sample)):
            return
        self._lines.append(orjson.dumps(out.as_dict(latency_s, time.time()), option=orjson.OPT_APPEND_NEWLINE))
        if len(self._lines) >= self.max_lines:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:  # no event loop: write it now
                self.flush()

    def flush(self) -> None:
        """Write every buffered line (one write)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        data = b"".join(self._lines)
        self._lines.clear()
        if self._file is not None:
            self._file.write(data)
            self._file.flush()
        else:
            err = sys.stderr
            buf = getattr(err, "buffer", None)
            if buf is not None:
                err.flush()
                buf.write(data)
                buf.flush()
            else:
                err.write(data.decode())
                err.flush()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
