"""Helpers for the web app's browser tests."""
from __future__ import annotations

from pathlib import Path

from controlplane import services
from controlplane.models import Member

SCREENSHOTS = Path(__file__).resolve().parent.parent.parent / "docs" / "screenshots"
PASSWORD = "a browser's password"
WIDTHS = {"desktop": (1280, 800), "mobile": (360, 740)}


def human(handle: str, **kwargs) -> Member:
    return services.create_member(handle, kind=Member.Kind.HUMAN, display_name=handle.title(), password=PASSWORD,
                                  actor=None, **kwargs)


# What the pages' Content-Security-Policy refused, by any page of any
# context `sign_in` made (tests/browser/conftest.py wants none).
REFUSED: list[str] = []


def sign_in(browser, base: str, handle: str, viewport=WIDTHS["desktop"]):
    """A new browser context (its own cookies and storage) signed in as `handle`, by keyboard."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    context.set_default_timeout(10_000)
    context.on("console", lambda m: REFUSED.append(m.text) if "Content Security Policy" in m.text else None)
    page = context.new_page()
    page.goto(f"{base}/app/login/")
    # The handle field takes the focus by itself (autofocus), which a busy
    # browser may apply after the load event: keys typed before it are lost.
    # (A selector, not wait_for_function, whose polling is an eval the pages' policy refuses.)
    page.locator("#id_username:focus").wait_for()
    page.keyboard.type(handle)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/app/")
    return page


def open_conversation(page, base: str, space, conversation):
    page.goto(f"{base}/app/spaces/{space.slug}/{conversation.public_id}/")
    page.locator("#live-status.live").wait_for()


def shoot(page, name: str, full_page: bool = False) -> None:
    """Screenshots at desktop and 360 px width, for docs/web.md; at 360 px
    nothing may be wider than the window."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for label, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(150)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name} is {overflow}px wider than {width}px"
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{label}.png"), full_page=full_page)
    page.set_viewport_size({"width": WIDTHS["desktop"][0], "height": WIDTHS["desktop"][1]})
