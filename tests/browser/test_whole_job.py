"""The whole job in the web app, in Chromium against a real `serve`: a
person creates a space, adds a second person, opens a direct message and
both talk live; the inbox pages through every item, holds and releases
through firewall rules edited on the page; credentials are made, shown once
and revoked. Forms are filled and submitted from the keyboard; every page is
shot at desktop width and at 360 px (where nothing may overflow)."""
import httpx
import pytest

from controlplane import bearer, services
from inbox.models import InboxItem
from inbox.services import send_message
from tests.browser.test_web_app import exchange
from tests.browser.web import human, shoot, sign_in
from tests.servers import serving

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_person_creates_a_space_adds_another_and_both_talk_live_in_a_direct_message(browser):
    human("ann"), human("ben")
    with serving("--no-worker") as (base, _):
        ann = sign_in(browser, base, "ann")
        # ann creates a space
        ann.get_by_label("Slug (a-z, 0-9 and -; in URLs)").fill("studio")
        ann.get_by_label("Name", exact=True).fill("The studio")
        ann.get_by_label("Who may join").select_option("private")
        ann.get_by_label("Name", exact=True).press("Enter")
        ann.wait_for_url(f"{base}/app/spaces/studio/")
        assert "you are owner" in ann.locator("h1").inner_text()
        # she adds ben
        ann.get_by_label("Add a member").fill("@ben")
        ann.get_by_label("Add a member").press("Enter")
        ann.get_by_text("@ben added member of studio.").wait_for()
        assert ann.locator("#member-ben").inner_text().count("member") >= 1
        shoot(ann, "space", full_page=True)
        # and opens a direct message with him
        ann.get_by_label("Direct message with").fill("@ben")
        ann.get_by_label("Direct message with").press("Enter")
        ann.locator("#live-status.live").wait_for()
        assert ann.locator("h1").inner_text().startswith("@ben")
        # ben finds it from his home page, by keyboard
        ben = sign_in(browser, base, "ben")
        link = ben.get_by_role("link", name="@ann")
        link.focus()
        ben.keyboard.press("Enter")
        ben.locator("#live-status.live").wait_for()
        exchange(ann, ben, "welcome to the studio", "thanks, ann")


def test_the_inbox_pages_every_item_and_releases_what_the_firewall_held(browser):
    ann, ben = human("ann"), human("ben")
    space = services.create_space(slug="room", name="Room", visibility="private", send_policy="open", actor=ann)
    services.add_member(space, ben, actor=ann)
    direct, _ = services.get_or_create_direct(space, ben, actor=ann)
    for i in range(55):  # more than a page (50)
        send_message(direct, body=f"item {i:02}", actor=ann)
    with serving() as (base, _):
        page = sign_in(browser, base, "ben")
        page.goto(f"{base}/app/inbox/")
        assert page.get_by_text("item 00").is_visible() and page.get_by_text("item 54").count() == 0
        # acknowledging by keyboard keeps the place: focus moves to the next item's button
        first = page.locator("#inbox-items li.item").first
        first.get_by_role("button", name="Acknowledge").focus()
        page.keyboard.press("Enter")
        page.get_by_text("item 00").wait_for(state="detached")
        assert "item 01" in page.locator("#inbox-items li.item:has(button:focus)").inner_text()
        # acknowledged elsewhere while the keyboard is on it (or its refresh overtaking the page's own answer):
        # the live refresh moves focus to the next item's button, where it fell to the heading
        token = InboxItem.objects.get(member=ben, message__body="item 01").token
        acknowledged = httpx.post(f"{base}/v0/me/inbox/acknowledge", json={"deliveryToken": token},
                                  headers={"Authorization": f"Bearer {bearer.issue_credential(ben, actor=None)[1]}"})
        assert acknowledged.status_code == 200, acknowledged.text
        page.get_by_text("item 01").wait_for(state="detached")
        assert "item 02" in page.locator("#inbox-items li.item:has(button:focus)").inner_text()
        page.get_by_role("link", name="Next page of your inbox").click()
        page.get_by_text("item 54").wait_for()
        assert page.get_by_text("item 01").count() == 0
        # a hold rule, written in the page's form
        page.goto(f"{base}/app/inbox/")
        page.get_by_label("Action").select_option("hold")
        page.get_by_label("Content matches (regular expression)").fill("(?i)deploy")
        page.get_by_label("Guidance").fill("deploys need a second pair of eyes\nand a rollback plan")
        page.get_by_role("button", name="Save rules").click()  # (Enter in the guidance starts a new line)
        page.get_by_text("Firewall saved: 1 rule.").wait_for()
        send_message(direct, body="please deploy tonight", actor=ann)
        held = page.locator("#held .item", has_text="please deploy tonight")
        for _ in range(50):  # the worker classifies it in a moment
            page.reload()
            if held.count():
                break
            page.wait_for_timeout(200)
        assert "deploys need a second pair of eyes\nand a rollback plan" in held.inner_text()
        page.goto(f"{base}/app/inbox/#held")
        shoot(page, "inbox-held")
        held.get_by_role("button", name="Release").click()
        page.get_by_text("Released: the item is in your inbox now.").wait_for()
        assert page.locator("#held").get_by_text("Nothing held.").is_visible()


def test_a_credential_is_named_shown_once_works_and_is_revoked(browser):
    human("ann")
    with serving("--no-worker") as (base, _):
        page = sign_in(browser, base, "ann")
        page.goto(f"{base}/app/credentials/")
        page.get_by_label("Name (where you will use it)").fill("laptop CLI")
        page.get_by_label("Name (where you will use it)").press("Enter")
        token = page.get_by_label("Token").input_value()
        assert token.startswith("sbt_")
        me = httpx.get(f"{base}/v0/me", headers={"Authorization": f"Bearer {token}"})
        assert me.json()["member"]["handle"] == "@ann"
        shoot(page, "credentials")
        page.goto(f"{base}/app/credentials/")
        assert token not in page.content()
        page.get_by_role("button", name="Revoke laptop CLI").click()
        page.get_by_text("Credential laptop CLI was revoked; it no longer works.").wait_for()
        assert httpx.get(f"{base}/v0/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
