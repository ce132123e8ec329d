"""Property-based API fuzzing: schemathesis generates requests from our OpenAPI document; no 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.redis_server import RedisServer
from tests.router.conftest import settings_for
from tests.router.fake_engine import FakeConfig
from tests.router.gateway_thread import GatewayThread


@pytest.fixture(scope="module")
def gateway_url(redis_srv: RedisServer) -> Iterator[str]:
    redis_srv.start()
    gt = GatewayThread(
        lambda addrs: settings_for({"mtp": [addrs[0]], "dfly": [addrs[1]]}, redis_srv.url, max_body_bytes=65536),
        [FakeConfig(max_context=4096), FakeConfig(max_context=4096)],
    ).start()
    try:
        yield gt.url
    finally:
        gt.stop()


def test_no_server_errors(gateway_url: str) -> None:
    # (the schemathesis pytest plugin does not support this pytest version: drive hypothesis directly)
    schema = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    checked = []
    for result in schema.get_all_operations():
        op = result.ok()

        @given(case=op.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=gateway_url, timeout=10)
            assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
            ct = response.headers.get("content-type") or ""
            ct = ct[0] if isinstance(ct, list) else ct
            if response.status_code >= 400 and ct.startswith("application/json"):
                body = response.json()
                assert "error" in body and {"message", "type", "param", "code"} <= set(body["error"])

        check()
        checked.append(f"{op.method.upper()} {op.path}")
    assert "POST /v1/chat/completions" in checked and "POST /v1/completions" in checked
