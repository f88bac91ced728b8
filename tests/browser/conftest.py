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
def browser(monkeypatch):
    """Chromium. Playwright's sync API keeps an event loop on this thread, so
    the test's own (synchronous) database calls are allowed explicitly; the
    servers under test never get this variable."""
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(autouse=True)
def nothing_refused():
    """Every page a test signs in to runs under the web app's
    Content-Security-Policy: nothing it needs may be refused."""
    from tests.browser.web import REFUSED

    REFUSED.clear()
    yield
    assert REFUSED == []
