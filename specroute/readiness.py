"""Starting processes on loopback ports (workers, gateways, Redis) and waiting for them to be ready.

Shared by `specroute serve`, the gateway benchmark and the end-to-end tests, each of which turns a
timeout or a dead process into its own kind of error.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a child process to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll_until(check: Callable[[], object], timeout: float, interval: float = 0.25,
               alive: Callable[[], None] | None = None) -> bool:
    """Call `check` until it returns something truthy (an exception counts as "not yet") or `timeout`
    seconds pass; `alive`, called before every try, raises when the awaited process died.
    Returns False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        try:
            if check():
                return True
        except Exception:
            pass
        time.sleep(interval)
    return False


def grpc_serving(address: str, timeout: float = 1.0) -> bool:
    """The standard gRPC health service at `address` reports SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback URLs we built
        return bool(r.status == 200)
