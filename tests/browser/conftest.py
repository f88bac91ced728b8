"""Browser tests drive Debian's Chromium through Playwright (no downloaded browser)."""
import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pytest_collection_modifyitems(config, items):
    if CHROMIUM.exists():
        return
    if os.environ.get("SWITCHBOARD_REQUIRE_BROWSER"):
        raise pytest.UsageError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    missing = pytest.mark.skip(reason=f"{CHROMIUM} is missing: apt-get install -y chromium")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(missing)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()
