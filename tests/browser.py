"""A real browser for the console's tests: Playwright driving Debian's chromium, headless.

Never a downloaded browser (``playwright install`` fetches one, which this machine's closed
network refuses): .ci/run installs Debian's ``chromium`` and the tests launch that binary. The
flags keep it from reaching for the network (updates, sync, QUIC), where it would stall. Without
the binary the tests skip and say why.

Screenshots go to a temporary folder, and into docs/images (the console guide's pictures) when
``RAYTXN_DOCS_SCREENSHOTS=1``: the suite does not rewrite the docs on every run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
WAIT_MS = 30_000  # how long a page may take to show what a test waits for (pages refresh every second)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium under Playwright; skips (saying why) when Debian's chromium is absent."""
    if not os.access(CHROMIUM, os.X_OK):
        print(f"{CHROMIUM} is missing (apt-get install chromium): the console's browser tests skip")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any) -> Any:
    """A page in a fresh context (its own cookies: its own console session)."""
    page = browser.new_context(viewport={"width": 1360, "height": 760}).new_page()
    page.set_default_timeout(WAIT_MS)
    return page


def login(page: Any, base: str, token: str) -> None:
    page.goto(base + "/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_selector("#principal")


def screenshot(page: Any, name: str, tmp_dir: Path) -> Path:
    """``console-<name>.png`` of the whole page, in ``tmp_dir`` (and docs/images when asked)."""
    path = tmp_dir / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("RAYTXN_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMAGES / path.name), full_page=True)
    return path


def cell_number(text: str) -> float | None:
    """The number a table cell shows ("1,234.5/s", "7", "—": None)."""
    found = re.search(r"-?[\d,]+(\.\d+)?", text)
    return None if found is None else float(found.group(0).replace(",", ""))
