"""The request classifier as the gateway uses it: loaded lazily (and retried in the background when
the artifact is missing), timed, and never allowed to fail a request.

Without a classifier, or when it raises, a request is `unknown` with full uncertainty, which the
policy sends to the safe pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from router.observability.metrics import Metrics
from router.routing.policy import UNKNOWN_DOMAIN

log = logging.getLogger("specroute.gateway")

ClassifyFn = Callable[[list[dict[str, str]]], tuple[str, Mapping[str, float], float]]
Classification = tuple[str, Mapping[str, float], float]  # label, probabilities, uncertainty

PROBE = [{"role": "user", "content": "Write a Python function that returns the sum of a list."}]
UNCLASSIFIED: Classification = (UNKNOWN_DOMAIN, MappingProxyType({}), 1.0)


def load_classifier() -> ClassifyFn:
    """Import `classifier.classify` lazily and probe it once (loads the artifact, surfaces errors now)."""
    from classifier import classify  # the gateway may start before the artifact is trained

    classify(PROBE)
    return classify  # type: ignore[no-any-return]


class Classifier:
    def __init__(self, metrics: Metrics, fn: ClassifyFn | None = None, retry_s: float = 30.0) -> None:
        self.metrics = metrics
        self.fn = fn
        self.error: str | None = None
        self.retry_s = retry_s
        self.closing = False
        self._warned = 0.0

    async def start(self) -> list[asyncio.Task[None]]:
        """Load the classifier unless one was injected; on failure, a task that retries."""
        if self.fn is not None:
            return []
        try:
            self.fn = await asyncio.to_thread(load_classifier)
            self.error = None
            return []
        except Exception as exc:  # classifier missing or broken: not ready, route to the safe pool
            self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error("classifier unavailable (requests go to the safe pool): %s", self.error)
            return [asyncio.create_task(self._retry(), name="specroute-classifier-retry")]

    async def _retry(self) -> None:
        while self.fn is None and not self.closing:
            await asyncio.sleep(self.retry_s)
            with contextlib.suppress(Exception):
                self.fn = await asyncio.to_thread(load_classifier)
                self.error = None
                log.info("classifier loaded")

    def __call__(self, messages: list[dict[str, str]]) -> Classification:
        fn = self.fn
        if fn is None:
            return UNCLASSIFIED
        t = time.perf_counter()
        try:
            label, probs, unc = fn(messages)
        except Exception as exc:  # a classifier bug must not fail the request
            now = time.monotonic()
            if now - self._warned > 60.0:
                self._warned = now
                log.warning("classifier failed (request sent to the safe pool): %s", str(exc)[:300])
            return UNCLASSIFIED
        finally:
            self.metrics.classify_seconds.observe(time.perf_counter() - t)
        return label, probs, float(unc)
