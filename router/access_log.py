"""The structured access log: one JSON line per completion request.

Where it is written: `/v1/chat/completions` and `/v1/completions` bypass Starlette's middleware (the
app's fast path, router/app.py, calls `router.api.completions.serve` directly), so an access-log
middleware would never see them. The hook lives where that handler finishes: `serve` fills one
`Outcome` along the way (request id, key, decision, tokens) and, after the response has gone out,
hands it to `AccessLog.write`.

Each line: `ts`, `request_id`, `key` (the API key's name, or null), `kind`, `model`, `stream`,
`domain`, `pool`, `reason`, `status`, `prompt_tokens`, `completion_tokens`, `mean_accepted_length`,
`latency_ms` (whole request, as the gateway saw it). Successful requests are sampled (`sample` in
[0, 1]); every error (status >= 400) is written. Lines go to their own logger, `specroute.access`
(not propagated), on stderr or a file (`access_log_file`); off by default, and then nothing is built.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from router.keys import ApiKey

LOGGER = "specroute.access"


class Outcome:
    """What the completion handler learned about one request (filled as it goes; all optional)."""

    __slots__ = ("api_key", "span", "up_span", "rid", "key", "kind", "model", "stream", "domain", "pool", "reason", "status",
                 "prompt_tokens", "completion_tokens", "mal")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.api_key: ApiKey | None = None
        self.span: Any = None  # the request's trace span (router/tracing.py), when tracing is on
        self.up_span: Any = None
        self.rid = self.key = self.model = self.domain = self.pool = self.reason = None
        self.stream = False
        self.status = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.mal: float | None = None

    def as_dict(self, latency_s: float, now: float) -> dict[str, object]:
        return {
            "ts": round(now, 3), "request_id": self.rid, "key": self.key, "kind": self.kind, "model": self.model,
            "stream": self.stream, "domain": self.domain, "pool": self.pool, "reason": self.reason,
            "status": self.status, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "mean_accepted_length": None if self.mal is None else round(self.mal, 4),
            "latency_ms": round(latency_s * 1000.0, 3),
        }


class AccessLog:
    def __init__(self, sample: float = 1.0, path: Path | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.sample = min(1.0, max(0.0, sample))
        self.rand = rand
        self.logger = logging.getLogger(LOGGER)
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        handler: logging.Handler = (logging.FileHandler(path, encoding="utf-8") if path is not None
                                    else logging.StreamHandler(sys.stderr))
        handler.setFormatter(logging.Formatter("%(message)s"))
        for old in list(self.logger.handlers):  # one gateway per process: replace, never duplicate
            self.logger.removeHandler(old)
            old.close()
        self.logger.addHandler(handler)
        self.handler = handler

    def write(self, out: Outcome, latency_s: float) -> None:
        if out.status < 400 and (self.sample <= 0.0 or (self.sample < 1.0 and self.rand() >= self.sample)):
            return
        self.logger.info(orjson.dumps(out.as_dict(latency_s, time.time())).decode())

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()
