"""The dashboard (router/static/dashboard.html) in a real browser (tests/browser.py) against a real
gateway (uvicorn, fake engine workers): connection loss, the admin token's storage, Apply without a
loaded version, pools that report no acceptance, the charts (from Redis), the policy controls
(validate, diff, apply) and a phone-width layout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser import browser
from tests.router.conftest import settings_for
from tests.router.fake_engine import FakeConfig
from tests.router.gateway_thread import GatewayThread

pytestmark = pytest.mark.timeout(60)


def wait_js(page: Any, expr: str, timeout: float = 10_000) -> None:
    """Poll `expr` in the page (the dashboard's CSP forbids the in-page eval `wait_for_function` uses)."""
    end = time.monotonic() + timeout / 1000
    while not page.evaluate(expr):
        assert time.monotonic() < end, f"timed out waiting for {expr}"
        page.wait_for_timeout(50)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def _gateway() -> GatewayThread:
    return GatewayThread(lambda addrs: settings_for({"mtp": [addrs[0]], "dfly": [addrs[1]]}, None),
                         [FakeConfig(), FakeConfig()]).start()


def test_dashboard_shows_lost_connection_within_one_refresh(chromium: Any) -> None:
    gw = _gateway()
    page = chromium.new_page()
    page.add_init_script("sessionStorage.setItem('specroute-admin-token', 's3cret-admin-token')")
    try:
        page.goto(gw.url + "/dashboard?refresh=300")
        wait_js(page, "document.getElementById('status').textContent.includes('ready')", timeout=10_000)
        wait_js(page, "document.querySelectorAll('#pools td.ok').length >= 2", timeout=10_000)
    finally:
        gw.stop()
    # one refresh (300 ms) plus the fetch's own failure: well under two seconds
    page.wait_for_selector("#lost", timeout=2_000)
    assert "connection lost" in page.inner_text("#status")
    assert "ready" not in page.inner_text("#status")
    pools = page.inner_text("#pools tbody")
    assert "healthy" not in pools and "unknown" in pools
    page.close()


def test_token_storage_apply_needs_a_loaded_version_and_mal_dash(chromium: Any) -> None:
    gw = _gateway()
    page = chromium.new_page()
    puts: list[dict[str, str]] = []
    page.on("request", lambda r: puts.append(r.headers) if r.method == "PUT" else None)
    try:
        page.goto(gw.url + "/dashboard?refresh=300")
        # without a token the policy cannot be loaded: Apply must not fall back to `If-Match: *`
        wait_js(page, "document.getElementById('result').textContent.includes('invalid_admin_token')",
                               timeout=10_000)
        page.fill("#policy", '{"pools": ["mtp", "dfly"], "defaults": {"chat": "mtp", "code": "mtp", '
                             '"math": "mtp"}, "safe_pool": "mtp"}')
        page.click("button:text-is('Apply')")
        wait_js(page, "document.getElementById('result').textContent.includes('Reload')", timeout=5_000)
        assert puts == []

        # the token is kept for the tab only
        page.fill("#token", "s3cret-admin-token")
        page.dispatch_event("#token", "change")
        wait_js(page, "document.getElementById('pver').textContent.includes('version')", timeout=10_000)
        assert page.evaluate("localStorage.getItem('specroute-admin-token')") is None
        assert page.evaluate("sessionStorage.getItem('specroute-admin-token')") == "s3cret-admin-token"

        page.click("button:text-is('Apply')")
        wait_js(page, "document.getElementById('result').textContent.length > 0 && "
                               "!document.getElementById('result').textContent.includes('Reload')", timeout=5_000)
        assert len(puts) == 1 and puts[0]["if-match"] == '"0"'

        # fake workers report no mean accepted length (0): shown as a dash, not 0.00
        wait_js(page, "document.querySelectorAll('#pools td.mal').length >= 2", timeout=10_000)
        assert set(page.eval_on_selector_all("#pools td.mal", "els => els.map(e => e.textContent)")) == {"—"}
    finally:
        page.close()
        gw.stop()


def test_charts_controls_and_phone_width(chromium: Any, redis_url: str) -> None:
    gw = GatewayThread(lambda addrs: settings_for({"mtp": [addrs[0]], "dfly": [addrs[1]]}, redis_url,
                                                  timeseries_interval_s=0.2),
                       [FakeConfig(), FakeConfig()]).start()
    page = chromium.new_page(viewport={"width": 390, "height": 844})  # a phone
    page.add_init_script("sessionStorage.setItem('specroute-admin-token', 's3cret-admin-token')")
    try:
        for text in ("write python code", "hello", "solve 2 + 2 = x"):
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=10,
                           json={"model": "fake-model", "messages": [{"role": "user", "content": text}], "max_tokens": 4})
            assert r.status_code == 200
        page.goto(gw.url + "/dashboard?refresh=300")
        # charts drawn from the samples in Redis: goodput, MAL, shares, latency, requests/errors
        wait_js(page, "document.querySelectorAll('#charts svg path.line').length >= 4", timeout=10_000)
        titles = page.eval_on_selector_all("#charts .chart h3", "els => els.map(e => e.textContent)")
        assert any("goodput" in t for t in titles) and any("latency" in t for t in titles)
        assert any("routing shares" in t for t in titles)
        # nothing wider than the phone: the page, and every chart within the screen
        assert page.evaluate("document.documentElement.scrollWidth") <= 391
        assert page.evaluate("[...document.querySelectorAll('#charts svg')].every("
                             "s => s.getBoundingClientRect().right <= innerWidth)")

        # controls: pin code to mtp, drain dfly, canary 10% to dfly... then validate (diff) and apply
        page.wait_for_selector("select[data-pin='code']", timeout=10_000)
        page.select_option("select[data-pin='code']", "mtp")
        page.fill("#ctl-threshold", "0.4")
        page.click("#ctl-validate")
        wait_js(page, "document.getElementById('ctl-result').textContent.includes('pins.code')", timeout=5_000)
        result = page.inner_text("#ctl-result")
        assert result.startswith("valid") and "uncertainty_threshold: 0.6 → 0.4" in result
        page.click("#ctl-apply")
        wait_js(page, "document.getElementById('ctl-result').textContent.includes('applied version')",
                               timeout=5_000)
        policy = httpx.get(gw.url + "/admin/policy", headers={"authorization": "Bearer s3cret-admin-token"}).json()
        assert policy["pins"] == {"code": "mtp"} and policy["uncertainty_threshold"] == 0.4
        # the reloaded controls show the applied policy
        wait_js(page, "document.querySelector(\"select[data-pin='code']\").value === 'mtp' && "
                               "document.getElementById('pver').textContent.includes('version 2')", timeout=5_000)
    finally:
        page.close()
        gw.stop()
