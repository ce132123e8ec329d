"""A mixed fleet from one command: `specroute serve --vllm-pool vllm=method=ngram,k=2` starts Redis, our MTP
and DFly workers, a vLLM worker and the gateway; `/v1/models`, `/admin/pools` (the dashboard's view) and
`/metrics` show the vLLM pool, a request pinned to it is served by vLLM, and stopping serve leaves no
process behind (vLLM's engine core included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specroute.readiness import http_ok, poll_until
from tests.redis_server import free_port
from tests.vllm.conftest import DEMO, REPO, alive, children
from tests.vllm.test_2_gateway import http

TOKEN = "serve-vllm-admin"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def test_serve_with_a_vllm_pool(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "SPECROUTE_ADMIN_TOKEN": f"ops:{TOKEN}", "VLLM_LOGGING_LEVEL": "WARNING",
           "SPECROUTE_WORKER_THREADS": "1"}
    env.pop("REDIS_URL", None)
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "specroute.cli", "serve", "--model", str(DEMO), "--port", str(port),
                                 "--vllm-pool", "vllm=method=ngram,k=2,max_running=4"],
                                stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    tree: list[int] = []
    try:
        def check() -> None:
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]

        assert poll_until(lambda: http_ok(url + "/readyz"), 900, 0.5, check), log.read_text(errors="replace")[-4000:]
        tree = children(proc.pid)
        status, models, _ = http(url + "/v1/models")
        cards = {m["id"]: m["specroute"]["pools"] for m in models["data"]}
        assert {p["pool"] for p in cards["demo"]} == {"mtp", "dfly", "vllm"}, cards
        _, pools, _ = http(url + "/admin/pools", headers=ADMIN)
        info = pools["vllm"]["endpoints"][0]["info"]
        assert pools["vllm"]["healthy"] and (info["engine"], info["drafter"], info["block_size"]) == ("vllm", "ngram", 2)
        _, doc, h = http(url + "/admin/policy", headers=ADMIN)
        status, new, _ = http(url + "/admin/policy", {**doc, "exploration_rate": 0.0, "pins": {"*": "vllm"}}, "PUT",
                              {**ADMIN, "if-match": h["etag"]})
        assert status == 200, new
        status, body, headers = http(url + "/v1/chat/completions", {
            "model": "demo", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]}, "POST")
        assert status == 200 and headers["x-specroute-pool"] == "vllm", body
        assert body["specroute"]["pool"] == "vllm" and body["usage"]["completion_tokens"] > 0
        _, metrics, _ = http(url + "/metrics")
        assert 'pool="vllm"' in metrics and "specroute_requests_total" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in tree):
            time.sleep(0.2)
        left = [p for p in tree if alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
    assert tree and not left, f"processes left behind: {left}"
