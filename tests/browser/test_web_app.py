"""The web app in Chromium against real server processes: live messages
between two members, drafts, a scrolled-up reader, receivers and
subscriptions, approvals. Screenshots land in docs/screenshots/."""
import httpx
import pytest
from django.conf import settings

from controlplane import bearer, services
from controlplane.errors import GrantRequired
from inbox.services import send_message
from tests.browser.web import human, open_conversation, shoot, sign_in
from tests.servers import serving

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def room():
    ann, ben = human("ann"), human("ben")
    space = services.create_space(slug="room", name="Room", visibility="private", send_policy="open", actor=ann)
    services.add_member(space, ben, actor=ann)
    general = services.create_channel(space, "general", actor=ann)
    for i in range(60):  # more than a page, so history pages upward
        send_message(general, body=f"earlier message {i}\nwith a second line", actor=ann if i % 2 else ben)
    return ann, ben, space, general


def messages_in(page) -> list[str]:
    return page.locator("#messages .msg .body").all_inner_texts()


def send_from(page, text: str) -> None:
    page.locator("#body").fill(text)
    page.locator("#body").press("Enter")


def exchange(first, second, message: str, reply: str) -> None:
    """`first` sends, `second` sees it live and replies, `first` sees that."""
    send_from(first, message)
    second.locator("#messages .body", has_text=message.splitlines()[-1]).wait_for()
    send_from(second, reply)
    first.locator("#messages .body", has_text=reply.splitlines()[-1]).wait_for()
    assert messages_in(first)[-2:] == messages_in(second)[-2:] == [message, reply]


def test_two_members_talk_live_without_losing_drafts_or_their_place(room, browser):
    ann, ben, space, general = room
    _, token = bearer.issue_credential(ann, actor=None)
    with serving("--no-worker") as (base, _):
        login = browser.new_page()
        login.goto(f"{base}/app/login/")
        shoot(login, "login")
        ann_page, ben_page = sign_in(browser, base, "ann"), sign_in(browser, base, "ben")
        shoot(ben_page, "home")
        open_conversation(ann_page, base, space, general)
        open_conversation(ben_page, base, space, general)

        # two members exchange messages live, by keyboard
        exchange(ann_page, ben_page, "hello ben", "hi ann,\nall good")

        # an unsent draft survives incoming messages and a reload
        ben_page.locator("#body").fill("a half-written thought")
        send_from(ann_page, "are you there?")
        ben_page.get_by_text("are you there?").wait_for()
        assert ben_page.locator("#body").input_value() == "a half-written thought"
        assert ben_page.evaluate("document.activeElement.id") == "body"
        ben_page.reload()
        ben_page.locator("#live-status.live").wait_for()
        assert ben_page.locator("#body").input_value() == "a half-written thought"

        # a reader scrolled up stays put and gets the marker
        ben_page.evaluate("document.getElementById('log').scrollTop = 0")
        httpx.post(f"{base}/v0/spaces/room/conversations/{general.public_id}/messages",
                   json={"body": "sent through the API"}, headers={"Authorization": f"Bearer {token}"}
                   ).raise_for_status()
        ben_page.locator("#messages").get_by_text("sent through the API").wait_for(state="attached")
        assert ben_page.evaluate("document.getElementById('log').scrollTop") == 0
        assert ben_page.locator("#new-marker").is_visible()
        ben_page.locator("#new-marker").click()
        assert ben_page.locator("#new-marker").is_hidden()
        distance = "(l => l.scrollHeight - l.scrollTop - l.clientHeight)(document.getElementById('log'))"
        assert ben_page.evaluate(distance) < 48

        # older history pages in above, keeping the reader's place
        assert "earlier message 0\nwith a second line" not in messages_in(ben_page)
        ben_page.evaluate("document.getElementById('log').scrollTop = 0")
        ben_page.locator("#older").click()
        ben_page.get_by_text("earlier message 0").wait_for()
        assert ben_page.evaluate("document.getElementById('log').scrollTop") > 0
        assert len(messages_in(ben_page)) == 60 + 4 and ben_page.locator("#older").count() == 0

        # a dropped socket reconnects and backfills what it missed, once
        ben_page.evaluate("window.switchboard.conversation.drop()")
        send_from(ann_page, "while the socket was down")
        ben_page.get_by_text("while the socket was down").wait_for()
        ben_page.locator("#live-status.live").wait_for()
        assert messages_in(ben_page).count("while the socket was down") == 1
        # a network gone away says so (the socket still looked open, and the page said "Live"),
        # and the page catches up once it is back
        ben_page.context.set_offline(True)
        ben_page.locator("#live-status.down", has_text="Reconnecting…").wait_for(timeout=3_000)
        send_from(ann_page, "while ben was offline")
        ben_page.context.set_offline(False)
        ben_page.get_by_text("while ben was offline").wait_for()
        ben_page.locator("#live-status.live").wait_for()
        assert messages_in(ann_page)[-3:] == messages_in(ben_page)[-3:]
        shoot(ben_page, "conversation")

        # signing out forgets the browser's drafts: the next person to use it must not find them
        ben_page.locator("#body").fill("not for the next person")
        drafts = "Object.keys(localStorage).filter(name => name.startsWith('switchboard:draft:'))"
        assert len(ben_page.evaluate(drafts)) == 1
        ben_page.get_by_role("button", name="Sign out @ben").click()
        ben_page.wait_for_url("**/app/login/")
        assert ben_page.evaluate(drafts) == []


def test_two_tabs_of_a_conversation_keep_their_own_drafts(room, browser):
    """A send in one tab deleted the other's draft, and the last tab typed
    in wrote the one draft both reloaded."""
    ann, ben, space, general = room
    with serving("--no-worker") as (base, _):
        first = sign_in(browser, base, "ben")
        second = first.context.new_page()
        for tab in (first, second):
            open_conversation(tab, base, space, general)
        # when: each tab has a draft, and the first sends its own
        second.locator("#body").fill("the second tab's draft")
        first.locator("#body").fill("the first tab's message")
        first.locator("#body").press("Enter")
        second.locator("#messages").get_by_text("the first tab's message").wait_for()
        first.locator("#body").fill("the first tab's next draft")
        # then: each tab's reload finds its own
        for tab, draft in ((second, "the second tab's draft"), (first, "the first tab's next draft")):
            tab.reload()
            tab.locator("#live-status.live").wait_for()
            assert tab.locator("#body").input_value() == draft
        # and a tab opened later takes up the newest one left
        third = first.context.new_page()
        open_conversation(third, base, space, general)
        assert third.locator("#body").input_value() == "the first tab's next draft"


def test_a_page_whose_connection_went_silent_reconnects_and_catches_up(room, browser):
    """A server that stops answering (its processes stopped: the connection
    stays open, nothing arrives) looked Live for ever."""
    import os
    import signal

    from controlplane.processes import in_session

    ann, ben, space, general = room
    with serving("--no-worker", LIVE_HEARTBEAT_SECONDS="0.5") as (base, process):
        page = sign_in(browser, base, "ben")
        open_conversation(page, base, space, general)
        stopped = in_session(process.pid)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            page.locator("#live-status.down", has_text="Reconnecting…").wait_for(timeout=5_000)
            send_message(general, body="while the server was silent", actor=ann)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        page.get_by_text("while the server was silent").wait_for()
        page.locator("#live-status.live").wait_for()


@pytest.mark.postgres
def test_members_on_two_server_processes_talk_live(room, browser):
    """PostgreSQL + Redis: each member's page is served by a different
    process; only the Redis channel layer can carry the news between them
    (the periodic re-read is turned off)."""
    ann, ben, space, general = room
    with serving("--no-worker", FEED_RECHECK_SECONDS=600) as (node_a, _), \
            serving("--no-worker", FEED_RECHECK_SECONDS=600) as (node_b, _):
        ann_page, ben_page = sign_in(browser, node_a, "ann"), sign_in(browser, node_b, "ben")
        open_conversation(ann_page, node_a, space, general)
        open_conversation(ben_page, node_b, space, general)
        exchange(ann_page, ben_page, "from node a", "from node b")


def test_removal_stops_the_live_page(room, browser):
    ann, ben, space, general = room
    with serving("--no-worker") as (base, _):
        ben_page = sign_in(browser, base, "ben")
        open_conversation(ben_page, base, space, general)
        services.remove_member(space, ben, actor=ann)
        ben_page.get_by_text("You no longer have access to this conversation.").wait_for()
        assert ben_page.locator("#body").is_disabled()


def revoke(base: str, token: str, grant_id: str) -> None:
    revoked = httpx.post(f"{base}/v0/grants/{grant_id}/revoke", headers={"Authorization": f"Bearer {token}"})
    assert revoked.json()["grant"]["status"] == "revoked"


def test_a_revoked_grant_withholds_the_bodies_an_open_page_shows(room, browser):
    """Before, the page kept showing a body whose grant was revoked until it
    was reloaded: the socket only sends new messages."""
    from grants import services as grants

    ann, ben, _, _ = room
    cy = human("cy")
    vault = services.create_space(slug="vault", name="Vault", visibility="private", send_policy="explicit_only",
                                  actor=ann)
    for member in (ben, cy):
        services.add_member(vault, member, actor=ann)
    direct, _ = services.get_or_create_direct(vault, ben, actor=cy)
    grants.create_grant(vault, grant_id="grt_pair", kind="pair", sender="@cy", recipient="@ben", actor=ann)
    send_message(direct, body="the secret plans", actor=cy)
    _, token = bearer.issue_credential(ann, actor=None)
    with serving("--no-worker") as (base, _):
        ben_page = sign_in(browser, base, "ben")
        open_conversation(ben_page, base, vault, direct)
        assert messages_in(ben_page) == ["the secret plans"]
        # when: ann revokes the grant
        revoke(base, token, "grt_pair")
        # then: withheld in place, without a reload
        ben_page.locator("#messages .body.withheld").wait_for()
        assert "the secret plans" not in ben_page.locator("#messages").inner_text()
        assert ben_page.locator("#live-status.live").count() == 1

        # and a grant revoked while the page was offline (the server told no one): it asks once it is back
        grants.create_grant(vault, grant_id="grt_again", kind="pair", sender="@cy", recipient="@ben", actor=ann)
        send_message(direct, body="the second plans", actor=cy)
        ben_page.get_by_text("the second plans").wait_for()
        ben_page.context.set_offline(True)
        ben_page.locator("#live-status.down", has_text="Reconnecting…").wait_for(timeout=5_000)
        ben_page.wait_for_timeout(500)  # the server hears the close and ends the conversation's stream
        revoke(base, token, "grt_again")  # the server hears of it at once: no lost nudge to find later
        ben_page.context.set_offline(False)
        ben_page.locator("#live-status.live").wait_for()
        ben_page.locator("#messages .body.withheld").nth(1).wait_for()
        assert "the second plans" not in ben_page.locator("#messages").inner_text()


def test_a_member_sets_up_a_receiver_and_sees_the_delivery_attempt(room, receiver, browser):
    ann, ben, space, general = room
    # the server processes trust the receiver's throwaway CA, as the fixture made this process do
    with serving(WEBHOOK_CA_BUNDLE=settings.WEBHOOK_CA_BUNDLE, WEBHOOK_ALLOW_PRIVATE_NETWORKS="1") as (base, _):
        page = sign_in(browser, base, "ben")
        open_conversation(page, base, space, general)
        page.get_by_role("link", name="Webhooks").click()
        page.get_by_label("Receiver URL").fill(receiver.url())
        page.get_by_label("Signing secret").fill("whsec_" + "QUJD" * 11)
        page.get_by_role("button", name="Save receiver").click()
        page.get_by_text("not verified").first.wait_for()
        page.get_by_role("button", name="Verify").click()
        page.locator(".pill.ok", has_text="verified").wait_for()
        assert "#general" in page.get_by_label("What wakes it").locator("option:checked").inner_text()
        page.get_by_role("button", name="Subscribe").click()
        page.locator(".subscription .status-active").wait_for()
        # when a message arrives in the conversation (through the API: the server wakes its workers)
        _, token = bearer.issue_credential(ann, actor=None)
        httpx.post(f"{base}/v0/spaces/room/conversations/{general.public_id}/messages",
                   json={"body": "wake the receiver"}, headers={"Authorization": f"Bearer {token}"}
                   ).raise_for_status()
        # then the page (which refreshes itself) shows the attempt
        page.locator(".attempt", has_text="HTTP 202").wait_for(timeout=30_000)
        assert len(receiver.wakes()) == 1
        assert "QUJD" not in page.content()
        shoot(page, "subscriptions", full_page=True)
        # deleting asks first: dismissed, nothing changes; accepted, the subscription goes
        delete = page.locator(".subscription").get_by_role("button", name="Delete")
        page.once("dialog", lambda dialog: dialog.dismiss())
        delete.click()
        page.wait_for_timeout(300)
        assert page.locator(".subscription .status-active").count() == 1
        page.once("dialog", lambda dialog: dialog.accept())
        delete.click()
        page.get_by_text("Subscription deleted").wait_for()
        assert page.locator(".subscription").count() == 0


@pytest.fixture
def guarded():
    """ann's explicit_only space with ben in it, their direct conversation,
    and an admin, root."""
    ann, ben = human("ann"), human("ben")
    human("root", is_admin=True)
    space = services.create_space(slug="guarded", name="Guarded", visibility="private", send_policy="explicit_only",
                                  actor=ann)
    services.add_member(space, ben, actor=ann)
    direct, _ = services.get_or_create_direct(space, ann, actor=ben)
    return space, direct, ben


def test_an_admin_approves_and_the_sender_sees_the_message(browser, guarded):
    space, direct, _ = guarded
    with serving("--no-worker") as (base, _):
        ben_page = sign_in(browser, base, "ben")
        open_conversation(ben_page, base, space, direct)
        send_from(ben_page, "may I deploy on Friday?")
        ben_page.get_by_text("No grant covers @ann.").wait_for()
        ben_page.get_by_role("button", name="Request approval").click()
        ben_page.get_by_text("Sent to an admin for approval").wait_for()
        assert ben_page.locator("#body").input_value() == ""

        admin = sign_in(browser, base, "root")
        admin.goto(f"{base}/staff/approvals/")
        admin.locator("pre.body", has_text="may I deploy on Friday?").wait_for()
        shoot(admin, "approvals")
        admin.get_by_role("button", name="Approve and send").click()
        admin.get_by_text("the message was sent").wait_for()

        ben_page.locator("#messages").get_by_text("may I deploy on Friday?").wait_for()

        ann_page = sign_in(browser, base, "ann")
        ann_page.locator("#inbox-count", has_text="1").wait_for()
        ann_page.goto(f"{base}/app/inbox/")
        ann_page.get_by_text("may I deploy on Friday?").wait_for()
        shoot(ann_page, "inbox")
        ann_page.get_by_role("button", name="Acknowledge").click()
        ann_page.get_by_text("Nothing pending.").wait_for()
        ann_page.locator("#inbox-count", has_text="0").wait_for()


def test_the_admin_change_page_approves_and_denies(browser, guarded):
    # given: two approval requests from ben to ann in an explicit_only space
    from grants.models import ApprovalRequest
    _, direct, ben = guarded
    for key, body in (("admin-approve-1", "please approve"), ("admin-deny-001", "please deny")):
        with pytest.raises(GrantRequired):
            send_message(direct, body=body, idempotency_key=key, request_approval=True, actor=ben)
    to_approve, to_deny = (ApprovalRequest.objects.get(idempotency_key=k) for k in ("admin-approve-1", "admin-deny-001"))
    with serving("--no-worker") as (base, _):
        admin = sign_in(browser, base, "root")
        # when: the buttons on each request's own admin page are clicked
        admin.goto(f"{base}/admin/grants/approvalrequest/{to_approve.pk}/change/")
        admin.get_by_role("button", name="Approve and send").click()
        admin.get_by_text("the message was sent").wait_for()
        admin.goto(f"{base}/admin/grants/approvalrequest/{to_deny.pk}/change/")
        admin.locator("#id_reason").fill("not on a Friday")
        admin.get_by_role("button", name="Deny").click()
        admin.get_by_text(f"Denied {to_deny.public_id}").wait_for()
    # then
    to_approve.refresh_from_db(), to_deny.refresh_from_db()
    assert (to_approve.status, to_approve.message.body) == ("approved", "please approve")
    assert (to_deny.status, to_deny.reason) == ("denied", "not on a Friday")
