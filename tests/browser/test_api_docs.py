"""The API docs UI renders from the server's own assets, with no outside requests."""
import pytest

from tests.servers import serving

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_docs_ui_renders_every_route_offline(browser):
    with serving("--no-worker") as (base, _):
        page = browser.new_page(viewport={"width": 360, "height": 800})
        outside = []
        page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(base) else None)
        # when
        page.goto(f"{base}/v0/docs/")
        page.wait_for_selector(".opblock", timeout=20_000)
        # then
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        assert "/v0/spaces/{slug}/conversations/{conversation}/messages" in [p.replace("\u200b", "") for p in paths]
        assert page.locator(".opblock").count() >= 21
        assert outside == []
        page.screenshot(path="var/docs-ui.png")
