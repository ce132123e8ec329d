"""The worker names each request by the gateway's request id and trace context in its log (issue
#14): a client's `x-request-id` (and a traced request's `traceparent` gRPC metadata) can be followed
from the gateway's access log and traces into the worker's log."""

from __future__ import annotations

import time

import pytest

from specroute.v1 import engine_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def test_worker_logs_the_request_id(start_worker) -> None:  # type: ignore[no-untyped-def]
    w = start_worker("--engine", "null", "--max-running", "2", env={"SPECROUTE_LOG_LEVEL": "DEBUG"})
    req = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="hi")], max_tokens=3,
                             request_id="client-req-7", domain="chat")
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    chunks = list(w.stub.Generate(req, timeout=30, metadata=(("traceparent", tp),)))
    assert chunks[-1].finish_reason == "length"
    t_end = time.monotonic() + 5
    while "client-req-7" not in w.output:
        assert time.monotonic() < t_end, w.output
        time.sleep(0.05)
    line = next(x for x in w.output.splitlines() if "client-req-7" in x)
    assert "finished (length)" in line and "3 completion tokens" in line and f"trace {tp}" in line
