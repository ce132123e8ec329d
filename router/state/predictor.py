"""The acceptance predictor's document in Redis and its scheduled retraining (router/routing/predictor.py
is the model; this is its I/O).

- `{specroute}:predictor`: the current document (JSON), its `version` one more than the one it replaced;
  `{specroute}:predictor:history`: the last `HISTORY` documents, newest first.
- Retraining: every gateway checks each `check_s` seconds; when the stored document is older than
  `retrain_s` (or there is none), the one gateway that takes `{specroute}:predictor:lock` (held for
  `retrain_s`) reads the newest `records` entries of the feedback stream, fits (in a thread: the fit
  is plain Python) and stores the result when at least `min_records` entries carry features. Every
  gateway then serves the stored document (`current`); a document of other features is not used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from router.routing.predictor import Predictor, Sample, fit
from router.tasks import run_every
from specroute.contracts.context import GLOBAL_LEVEL, context_keys_for, domain_level
from specroute.contracts.feedback import FEEDBACK_STREAM, PREFIX, parse_features

log = logging.getLogger("specroute.gateway.predictor")

PREDICTOR_KEY = PREFIX + "predictor"
HISTORY_KEY = PREFIX + "predictor:history"
LOCK_KEY = PREFIX + "predictor:lock"
HISTORY = 10


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def sample_of(entry: Mapping[Any, Any]) -> Sample | None:
    """The fit's view of one feedback stream entry (None without features or drafts)."""
    e = {_text(k): _text(v) for k, v in entry.items()}
    feats = parse_features(e.get("features", ""))
    try:
        drafted, accepted = int(e.get("drafted", "0")), int(e.get("accepted", "0"))
    except ValueError:
        return None
    if not feats or drafted <= 0 or not e.get("pool"):
        return None
    domain = domain_level(e.get("domain", ""))
    levels = (*context_keys_for(e.get("context", ""), domain), domain, GLOBAL_LEVEL)
    return Sample(e["pool"], feats, drafted, max(0, accepted), levels)


async def read_samples(client: Any, records: int) -> list[Sample]:
    """The newest `records` entries of the feedback stream that carry features and drafts."""
    entries = await client.xrevrange(FEEDBACK_STREAM, count=max(1, records))
    return [s for _id, fields in entries if (s := sample_of(fields)) is not None]


async def load(client: Any) -> Predictor | None:
    raw = await client.get(PREDICTOR_KEY)
    if raw is None:
        return None
    try:
        return Predictor.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("stored predictor is not valid, ignored: %s", str(exc)[:300])
        return None


async def save(client: Any, doc: Predictor) -> Predictor:
    """Store `doc` as the next version (and at the head of the history)."""
    cur = await load(client)
    doc = doc.model_copy(update={"version": (cur.version if cur is not None else 0) + 1})
    text = doc.model_dump_json()
    pipe = client.pipeline(transaction=True)
    pipe.set(PREDICTOR_KEY, text)
    pipe.lpush(HISTORY_KEY, text)
    pipe.ltrim(HISTORY_KEY, 0, HISTORY - 1)
    await pipe.execute()
    return doc


async def server_time(client: Any) -> float:
    sec, usec = await client.time()
    return float(sec) + float(usec) / 1e6


class PredictorTrainer:
    """Holds the predictor the gateway decides with (`current`) and retrains it on schedule."""

    def __init__(self, client: Any, *, check_s: float, retrain_s: float, records: int, min_records: int,
                 ridge: float, prior_weight: float,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.client = client
        self.check_s, self.retrain_s = check_s, retrain_s
        self.records, self.min_records = records, min_records
        self.ridge, self.prior_weight = ridge, prior_weight
        self.on_error = on_error
        self.current: Predictor | None = None
        self.closing = False

    async def step(self) -> Predictor | None:
        """Load the stored document, first refitting it if it is missing or due and this gateway holds
        the lock; returns what it stored (None when it did not fit)."""
        doc = await load(self.client)
        now = await server_time(self.client)
        stored = None
        if (doc is None or now - doc.trained_at >= self.retrain_s) and await self.client.set(
                LOCK_KEY, "1", nx=True, ex=max(1, int(self.retrain_s))):
            samples = await read_samples(self.client, self.records)
            if len(samples) >= self.min_records:
                fitted = await asyncio.to_thread(fit, samples, ridge=self.ridge, prior_weight=self.prior_weight, now=now)
                doc = stored = await save(self.client, fitted)
                log.info("predictor v%d fitted on %d records (%d pools)", doc.version, doc.records, len(doc.pools))
        if doc is not None and doc.usable():
            self.current = doc
        return stored

    async def _step(self) -> None:
        try:
            await self.step()
        except Exception as exc:
            if self.on_error is not None:
                self.on_error(exc)
            raise

    async def _run(self) -> None:
        try:
            await self._step()
        except Exception:
            log.exception("predictor load")
        await run_every(self.check_s, self._step, lambda: self.closing, "predictor retrain")

    def start(self) -> list[asyncio.Task[None]]:
        """Load (or fit) now, then check every `check_s`."""
        return [asyncio.create_task(self._run(), name="specroute-predictor")]
