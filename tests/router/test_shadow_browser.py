"""A shadow policy through the dashboard (router/static/dashboard.html) in a real browser
(tests/browser.py) against a real gateway (uvicorn, fake engine workers writing real feedback to a
real Redis): submit the editor's policy as a shadow, watch its predicted goodput against the live
policy's while the live one serves, promote it, and find each action in the history. 10-24 s and
6-10 s of browser start on two cores shared at load 7-10."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser import browser
from tests.router.conftest import settings_for
from tests.router.gateway_thread import GatewayThread
from tests.router.test_dashboard_browser import wait_js
from tests.router.test_shadow import CODE_REQ, workers

pytestmark = pytest.mark.timeout(60)
AUTH = {"authorization": "Bearer s3cret-admin-token"}


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def _put_policy(url: str, change: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(url + "/admin/policy", headers=AUTH)
    doc = {k: v for k, v in r.json().items() if k != "version"}
    doc.update(change)
    assert httpx.put(url + "/admin/policy", json=doc, headers={**AUTH, "if-match": r.headers["etag"]}).status_code == 200
    return doc


def _code(url: str) -> str:
    r = httpx.post(url + "/v1/chat/completions", json=CODE_REQ, timeout=10)
    assert r.status_code == 200, r.text
    return r.headers["x-specroute-pool"]


def test_submit_compare_and_promote_in_the_dashboard(chromium: Any, redis_url: str) -> None:
    gw = GatewayThread(lambda addrs: settings_for({"mtp": [addrs[0]], "dfly": [addrs[1]]}, redis_url,
                                                  stats_interval_s=0.05), list(workers(redis_url))).start()
    page = chromium.new_page()
    page.add_init_script("sessionStorage.setItem('specroute-admin-token', 's3cret-admin-token')")
    try:
        for pool in ("mtp", "dfly"):  # evidence for both pools on code
            _put_policy(gw.url, {"pins": {"code": pool}})
            assert [_code(gw.url) for _ in range(3)] == [pool] * 3
        live = _put_policy(gw.url, {"pins": {}, "exploration_rate": 0.0, "learning": {"enabled": False}})
        time.sleep(0.3)

        page.goto(gw.url + "/dashboard?refresh=300")
        wait_js(page, "document.getElementById('pver').textContent.includes('version 4')")
        assert "no shadow policy" in page.inner_text("#shadow")
        # submit: the editor's document, code sent to mtp, as the shadow
        cand = {**live, "defaults": {**live["defaults"], "code": "mtp"}}
        page.fill("#policy", json.dumps(cand))
        page.click("#shadow-submit")
        wait_js(page, "document.getElementById('shadow-result').textContent.includes('submitted')")
        sid = httpx.get(gw.url + "/admin/shadow", headers=AUTH).json()["shadow"]["id"]

        # compare: the live policy serves every request, the shadow's decisions are only scored
        assert [_code(gw.url) for _ in range(4)] == ["dfly"] * 4
        wait_js(page, "document.getElementById('shadow-agree') && "
                      "document.querySelector('#shadow-compare tbody td:nth-child(2)').textContent === '4'")
        live_g = float(page.inner_text("#shadow-compare .live-goodput"))
        shadow_g = float(page.inner_text("#shadow-compare .shadow-goodput"))
        cmp_ = httpx.get(gw.url + "/admin/shadow", headers=AUTH).json()["comparison"]
        assert shadow_g > live_g > 0 and abs(shadow_g - cmp_["shadow_goodput"]) < 0.1
        assert page.inner_text("#shadow-agree") == "0" and page.inner_text("#shadow-gain").startswith("+")
        assert sid in page.inner_text("#shadow-id")

        # promote: the candidate becomes the live policy, and serves
        page.click("#shadow-promote")
        wait_js(page, "document.getElementById('shadow-result').textContent.includes('promoted')")
        assert f"promoted {sid} as version 5" in page.inner_text("#shadow-result")
        wait_js(page, "document.getElementById('pver').textContent.includes('version 5')")
        wait_js(page, "document.getElementById('shadow').textContent.includes('no shadow policy')")
        assert _code(gw.url) == "mtp"
        # audited: both actions in the dashboard's history and the admin API's
        wait_js(page, "document.getElementById('versions').textContent.includes('shadow:promote')")
        assert "shadow:submit" in page.inner_text("#versions")
        hist = httpx.get(gw.url + "/admin/policy/versions", headers=AUTH).json()["versions"]
        assert [(h["action"], h["actor"]) for h in hist[:2]] == [("shadow:promote", "ops"), ("shadow:submit", "ops")]
    finally:
        page.close()
        gw.stop()
