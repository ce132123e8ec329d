"""A real browser for the dashboard tests: Debian's `chromium` (`apt-get install -y chromium`; CI's
`.ci/run` installs it) driven by Playwright from pip. No browser is downloaded: Playwright is pointed
at the system binary."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str:
    path = os.environ.get("SPECROUTE_CHROMIUM") or next(
        (p for p in CHROMIUM_CANDIDATES if os.path.exists(p)), None) or shutil.which("chromium")
    if not path:
        pytest.fail("no chromium for the browser tests: `apt-get install -y chromium` (or set SPECROUTE_CHROMIUM)")
    return path


@contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()
