"""`n > 1`: one worker call per choice, opened together, read together, summed for the usage.

- `open_all`: open every choice's call concurrently; if one cannot be opened, the others are closed
  (never left running) and its error is the request's;
- `collect_all`: read every call whole (non-streaming), concurrently;
- `merged`: the chunks of every call as they arrive, tagged with their choice index (streaming);
- `combined`: the totals of the choices: the prompt counted once (it is one prompt, as OpenAI counts
  it), completion tokens and speculative counts summed over the choices.

A choice's failure is `ChoiceFailed` (its index and the worker's error), so the caller can charge the
right endpoint and end the whole request with that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from router.api.openai_wire import Collected
from router.workers.upstream import Upstream
from specroute.contracts.stats import mean_accepted_length
from specroute.v1 import engine_pb2


class ChoiceFailed(Exception):
    """Choice `index`'s worker call failed with `error` (a grpc.aio.AioRpcError or an APIError)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


async def open_all(opens: Sequence[Awaitable[Upstream]]) -> list[Upstream]:
    """Every call open, in order; the first failure (after the others are closed) is raised."""
    tasks = [asyncio.ensure_future(o) for o in opens]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        for r in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(r, Upstream):
                r.close(False)
        raise


async def collect_all(ups: Sequence[Upstream], cols: Sequence[Collected]) -> None:
    """Read every call whole into its `Collected` (raises `ChoiceFailed` for the first that fails)."""
    async def one(i: int) -> None:
        try:
            async for chunk in ups[i].chunks():
                cols[i].add(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ChoiceFailed(i, exc) from exc

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(ups))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def merged(ups: Sequence[Upstream], observe: Callable[[float], None] | None = None
                 ) -> AsyncIterator[tuple[int, Any]]:
    """(choice index, chunk) of every call as they arrive, until all have ended (raises
    `ChoiceFailed` for the first that fails; the others are cancelled)."""
    q: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for chunk in ups[i].chunks(observe):
                q.put_nowait((i, chunk, None))
            q.put_nowait((i, None, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            q.put_nowait((i, None, exc))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(ups))]
    try:
        left = len(ups)
        while left:
            i, chunk, exc = await q.get()
            if exc is not None:
                raise ChoiceFailed(i, exc)
            if chunk is None:
                left -= 1
                continue
            yield i, chunk
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def combined(cols: Sequence[Collected]) -> Collected:
    """The request's totals over its choices (usage, statistics and feedback read this)."""
    if len(cols) == 1:
        return cols[0]
    out = Collected(min(c.ttft_s for c in cols))
    out.finish = cols[0].finish
    out.prompt_tokens = max(c.prompt_tokens for c in cols)
    out.cached_tokens = min(c.cached_tokens for c in cols)   # the prompt counts once: what every choice read cached
    out.completion_tokens = sum(c.completion_tokens or c.num_tokens for c in cols)
    out.num_tokens = sum(c.num_tokens for c in cols)
    stats = [c.stats for c in cols if c.stats is not None]
    if stats:
        s = engine_pb2.SpecStats(drafted_tokens=sum(x.drafted_tokens for x in stats),
                                 accepted_tokens=sum(x.accepted_tokens for x in stats), steps=sum(x.steps for x in stats))
        for x in stats:
            for k, v in x.steps_by_drafter.items():
                s.steps_by_drafter[k] += v
        s.mean_accepted_length = mean_accepted_length(int(s.accepted_tokens), int(s.steps))
        out.stats = s
    return out
