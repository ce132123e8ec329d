"""Batch affinity (router/routing/affinity.py): the pure choice, and the dispatcher keeping each worker's
in-flight rows by kind over real gRPC streams to two test-double workers."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.observability.metrics import Metrics
from router.routing.affinity import Candidate, choose
from router.workers.pools import PoolManager
from router.workers.upstream import Dispatcher, Upstream
from specroute.contracts.context import COOL, HOT, request_context
from specroute.v1 import engine_pb2
from tests.router.conftest import engines
from tests.router.fake_engine import FakeConfig

ROW = 1 / 8   # one row of a worker with room for 8


def test_a_request_is_hot_where_drafting_stops_paying() -> None:
    batches = [request_context(["x"], t, 1).batch for t in (0.0, 0.5, 0.8, 0.9, 1.0, 1.5, None)]
    assert batches == [COOL] * 3 + [HOT] * 4


def test_without_slack_the_least_loaded_wins_whatever_it_runs() -> None:
    cands = [Candidate(2 * ROW, ROW, same=2, total=2), Candidate(ROW, ROW, same=0, total=1)]
    assert choose(cands, 0.0) == [1]
    assert choose([Candidate(ROW, ROW), Candidate(ROW, ROW)], 0.0) == [0, 1]   # a tie: the caller draws
    assert choose([], 1.0) == []


def test_within_slack_the_worker_running_the_requests_kind_wins() -> None:
    # one row more than the least loaded, all of them of the request's kind: it takes the request
    assert choose([Candidate(2 * ROW, ROW, same=2, total=2), Candidate(ROW, ROW, same=0, total=1)], 1.0) == [0]
    # two rows more is beyond a slack of one: balance first
    assert choose([Candidate(3 * ROW, ROW, same=3, total=3), Candidate(ROW, ROW, same=0, total=1)], 1.0) == [1]
    # rows of the other kind count against a worker: two of its kind beside two others lose to one alone
    assert choose([Candidate(4 * ROW, ROW, same=2, total=4), Candidate(4 * ROW, ROW, same=1, total=1)], 1.0) == [1]
    # an idle worker beside one running the other kind takes it
    assert choose([Candidate(0.0, ROW), Candidate(ROW, ROW, same=0, total=1)], 1.0) == [0]
    # traffic of one kind is balanced on load alone: a busier worker's rows of the same kind do not draw
    # the request (preferring them kept two workers a row or two apart, and cost 13% in S3's first half)
    assert choose([Candidate(4 * ROW, ROW, same=4, total=4), Candidate(3 * ROW, ROW, same=3, total=3)], 1.0) == [1]
    assert choose([Candidate(2 * ROW, ROW, same=0, total=0), Candidate(ROW, ROW, same=0, total=0)], 1.0) == [1]
    # slack counts in each endpoint's own rows: 0.2 more load is within one row of a worker with room for
    # four, beyond one row of a worker with room for ten
    other = Candidate(0.1, 0.1, same=0, total=1)
    assert choose([Candidate(0.3, 0.25, same=1, total=1), other], 1.0) == [0]
    assert choose([Candidate(0.3, 0.1, same=3, total=3), other], 1.0) == [1]


def test_the_dispatcher_batches_hot_requests_with_hot_ones_and_counts_them_per_worker() -> None:
    """Six streams held open at once, hot and cool alternating, over a pool of two workers: with a slack
    of one row each worker runs one kind (least-loaded balancing alone may mix them); closing the
    streams returns every worker's count to zero."""

    async def main() -> None:
        async with engines(FakeConfig(name="a", token_delay_s=0.2), FakeConfig(name="b", token_delay_s=0.2)) as es:
            pm = PoolManager({"mtp": [e.address for e in es]}, affinity_slack=1.0)
            await pm.start()
            try:
                d = Dispatcher(pm, Metrics(), max_attempts=3)
                ups: list[Upstream] = []
                for i, t in enumerate((1.0, 0.0, 1.0, 0.0, 1.0, 0.0)):
                    req = engine_pb2.GenerateRequest(request_id=f"r{i}", prompt="hello there", max_tokens=8)
                    req.sampling.temperature = t
                    batch = request_context(["x"], t, 1).batch
                    ups.append(await d.open(["mtp"], req, time.monotonic() + 10, batch=batch))
                by_worker = {up.endpoint.address: {u.batch for u in ups if u.endpoint is up.endpoint} for up in ups}
                assert sorted(map(sorted, by_worker.values())) == [[COOL], [HOT]], by_worker
                assert sorted(e.worker.inflight for e in pm.endpoints()) == [3, 3]
                for e in pm.endpoints():
                    assert e.worker.batches[HOT] + e.worker.batches[COOL] == 3
                for up in ups:
                    up.close(ok=False)
                assert all(e.worker.inflight == 0 and not +e.worker.batches for e in pm.endpoints())
            finally:
                await pm.close()

    asyncio.run(main())


def test_the_slack_is_a_setting_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.cli import build_parser, settings_from_args
    from router.settings import Settings

    assert Settings(pools="a=h:1").affinity_slack == 1.0
    assert settings_from_args(build_parser().parse_args(["--pool", "a=h:1", "--affinity-slack", "0"])).affinity_slack == 0
    monkeypatch.setenv("SPECROUTE_AFFINITY_SLACK", "2")
    assert Settings(pools="a=h:1").affinity_slack == 2.0
    with pytest.raises(ValueError):
        Settings(pools="a=h:1", affinity_slack=-1)
