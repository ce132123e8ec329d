"""`specroute bench fuzz`: property-based fuzzing of the gateway's `/v1/*` and `/admin/*` endpoints
from its own OpenAPI document (schemathesis over hypothesis), against a real gateway (uvicorn, real
Redis, fake engine workers on loopback gRPC), with the admin token, so the admin handlers run too.

Every case is one HTTP request; it counts as a server error when the answer is a 5xx, as a hang when
no answer came within `--timeout` seconds, and as malformed when an error answer is not OpenAI's
`{"error": {"message", "type", "param", "code"}}`. Writes `cases`, `server_errors`, `hangs`,
`malformed` (and the first few of each) per operation and in all to `--out` (bench/results/fuzz.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_server import RedisServer
from tests.router.conftest import ADMIN, settings_for
from tests.router.fake_engine import FakeConfig
from tests.router.gateway_thread import GatewayThread

KEEP = 5  # examples kept per failure kind


def _is_openai_error(body: Any) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err)


def fuzz_operation(op: Any, base_url: str, examples: int, timeout_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"operation": f"{op.method.upper()} {op.path}", "cases": 0, "server_errors": 0,
                           "hangs": 0, "malformed": 0, "statuses": {}, "examples": []}

    @given(case=op.as_strategy())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: schemathesis.Case) -> None:
        row["cases"] += 1
        headers = {**(case.headers or {}), **ADMIN}
        try:
            r = case.call(base_url=base_url, headers=headers, timeout=timeout_s)
        except (httpx.TimeoutException, TimeoutError, OSError) as exc:
            row["hangs"] += 1
            _keep(row, "hang", case, repr(exc))
            return
        row["statuses"][str(r.status_code)] = row["statuses"].get(str(r.status_code), 0) + 1
        if r.status_code >= 500:
            row["server_errors"] += 1
            _keep(row, "server_error", case, f"{r.status_code} {r.text[:200]}")
            return
        ct = r.headers.get("content-type") or ""
        ct = ct[0] if isinstance(ct, list) else ct
        if r.status_code >= 400 and ct.startswith("application/json"):
            try:
                ok = _is_openai_error(r.json())
            except ValueError:
                ok = False
            if not ok:
                row["malformed"] += 1
                _keep(row, "malformed", case, r.text[:200])

    run()
    return row


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=40), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def mutations(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Bodies near `base`: some of its fields (or new ones) replaced by any JSON value, or any JSON."""
    keys = st.sampled_from(sorted(base)) | st.text(max_size=12) if base else st.text(max_size=12)
    near = st.dictionaries(keys, JSON, max_size=3).map(lambda d: {**base, **d})
    return st.one_of(near, near, JSON)


def fuzz_body(method: str, path: str, base: dict[str, Any], base_url: str, examples: int,
              timeout_s: float) -> dict[str, Any]:
    """An endpoint whose body the OpenAPI document leaves open (the admin writes): JSON bodies mutated
    from a valid one, sent with the admin token, `If-Match: *` and the JSON content type."""
    row: dict[str, Any] = {"operation": f"{method} {path} (mutated bodies)", "cases": 0, "server_errors": 0,
                           "hangs": 0, "malformed": 0, "statuses": {}, "examples": []}
    client = httpx.Client(base_url=base_url, timeout=timeout_s)

    @given(body=mutations(base))
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(body: Any) -> None:
        row["cases"] += 1
        try:
            r = client.request(method, path, content=json.dumps(body),
                               headers={**ADMIN, "content-type": "application/json", "if-match": "*"})
        except (httpx.TimeoutException, OSError) as exc:
            row["hangs"] += 1
            _keep_raw(row, "hang", method, path, body, repr(exc))
            return
        row["statuses"][str(r.status_code)] = row["statuses"].get(str(r.status_code), 0) + 1
        if r.status_code >= 500:
            row["server_errors"] += 1
            _keep_raw(row, "server_error", method, path, body, f"{r.status_code} {r.text[:200]}")
        elif r.status_code >= 400 and not _is_openai_error(r.json()):
            row["malformed"] += 1
            _keep_raw(row, "malformed", method, path, body, r.text[:200])

    try:
        run()
    finally:
        client.close()
    return row


def _keep_raw(row: dict[str, Any], kind: str, method: str, path: str, body: Any, detail: str) -> None:
    if len(row["examples"]) < KEEP:
        row["examples"].append({"kind": kind, "method": method, "path": path, "body": repr(body)[:200],
                                "detail": detail})


def _keep(row: dict[str, Any], kind: str, case: Any, detail: str) -> None:
    if len(row["examples"]) < KEEP:
        row["examples"].append({"kind": kind, "method": case.method, "path": case.formatted_path,
                                "body": repr(case.body)[:200], "detail": detail})


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specroute bench fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=2000, help="cases in all (spread over the operations)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a case counts as a hang")
    p.add_argument("--out", default="bench/results/fuzz.json")
    args = p.parse_args(argv)
    t0 = time.time()
    with RedisServer() as redis_srv:
        gt = GatewayThread(
            lambda addrs: settings_for({"mtp": [addrs[0]], "dfly": [addrs[1]]}, redis_srv.url, max_body_bytes=65536),
            [FakeConfig(max_context=4096), FakeConfig(max_context=4096)]).start()
        try:
            schema = schemathesis.openapi.from_url(gt.url + "/openapi.json")
            ops = [r.ok() for r in schema.get_all_operations()]
            ops = [op for op in ops if op.path.startswith(("/v1/", "/admin/"))]
            policy = httpx.get(gt.url + "/admin/policy", headers=ADMIN, timeout=10).json()
            bodies = [("POST", "/v1/chat/completions", {"model": "fake-model", "max_tokens": 4, "stream": False,
                                                        "messages": [{"role": "user", "content": "hello"}]}),
                      ("POST", "/v1/completions", {"model": "fake-model", "prompt": "hello", "max_tokens": 4,
                                                   "stream": True}),
                      ("POST", "/v1/responses", {"model": "fake-model", "input": "hello", "max_output_tokens": 4}),
                      ("PUT", "/admin/policy", policy), ("POST", "/admin/policy/validate", policy),
                      ("POST", "/admin/policy/rollback", {"version": 1, "note": "fuzz"}),
                      ("PUT", "/admin/keys/fuzz-key", {"secret": "sk-fuzz-0123456789abcdef", "rpm": 5})]
            per_op = -(-args.cases // (len(ops) + len(bodies)))
            rows = [fuzz_operation(op, gt.url, per_op, args.timeout) for op in ops]
            rows += [fuzz_body(m, path, base, gt.url, per_op, args.timeout) for m, path, base in bodies]
            while sum(r["cases"] for r in rows) < args.cases:  # small input spaces run out: the body fuzz goes on
                rows += [fuzz_body(m, path, base, gt.url, per_op, args.timeout) for m, path, base in bodies]
        finally:
            gt.stop()
    total = {k: sum(r[k] for r in rows) for k in ("cases", "server_errors", "hangs", "malformed")}
    out = {"bench": "fuzz", "command": "specroute bench fuzz " + " ".join(argv), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "schemathesis": schemathesis.__version__, "timeout_s": args.timeout, "wall_s": round(time.time() - t0, 1),
           **total, "operations": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(total))
    return 0 if total["server_errors"] == 0 and total["hangs"] == 0 else 1
