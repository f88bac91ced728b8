"""The inbox page, and receivers and subscriptions managed from the web app
against the real HTTPS test receiver."""
import asyncio
import base64

import pytest

from controlplane import services
from inbox.models import InboxItem
from inbox.services import send_message
from webhooks import pump
from webhooks.models import Endpoint, Subscription

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


@pytest.fixture
def direct(room, ann, ben):
    space, _ = room
    conversation, _ = services.get_or_create_direct(space, ben, actor=ann)
    return conversation


# --- inbox ---------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_inbox_lists_pending_items_and_acknowledges_them(ann, ben, direct, browser_of):
    send_message(direct, body="please look at this", actor=ann)
    client = browser_of(ben)
    item = InboxItem.objects.get(member=ben)
    page = client.get("/app/inbox/").content.decode()
    assert "please look at this" in page and "@ann" in page and item.token in page
    # when
    response = client.post("/app/inbox/acknowledge", {"token": item.token}, HTTP_HX_REQUEST="true")
    # then
    assert response.status_code == 200 and 'hx-swap-oob="true"' in response.content.decode()
    assert ">0</span>" in response.content.decode()
    item.refresh_from_db()
    assert item.state == InboxItem.State.ACKNOWLEDGED
    assert "please look at this" not in client.get("/app/inbox/").content.decode()


@pytest.mark.django_db
def test_acknowledging_someone_elses_item_is_a_404_and_changes_nothing(ann, ben, direct, browser_of):
    send_message(direct, body="for ben", actor=ann)
    item = InboxItem.objects.get(member=ben)
    response = browser_of(ann).post("/app/inbox/acknowledge", {"token": item.token}, HTTP_HX_REQUEST="true")
    assert response.status_code == 404 and "UNKNOWN_DELIVERY" in response.content.decode()
    # shown in the page's error area, not swapped over (deleting) the item
    assert response["HX-Retarget"] == "#htmx-error" and response["HX-Reswap"] == "innerHTML"
    item.refresh_from_db()
    assert item.state == InboxItem.State.PENDING


# --- receivers and subscriptions ------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("url", ["http://example.com/hook", "https://10.0.0.1/hook", "not a url"])
def test_a_receiver_url_that_cannot_be_used_is_a_clear_error(ann, browser_of, url):
    response = browser_of(ann).post("/app/subscriptions/receivers", {"url": url})
    assert 400 <= response.status_code < 500 and 'role="alert"' in response.content.decode()
    assert not Endpoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("next_page, to", [("/app/", "/app/"), ("web-space", "/app/subscriptions/"),
                                           ("https://example.com/", "/app/subscriptions/"),
                                           ("", "/app/subscriptions/")])
def test_a_form_goes_back_to_a_page_of_this_site_or_to_the_subscriptions_page(ann, browser_of, next_page, to):
    # when a receiver is saved from a form whose `next` is a path, a word or another site
    response = browser_of(ann).post("/app/subscriptions/receivers", {"url": "https://example.com/hook",
                                                                     "next": next_page})
    # then it goes back there if it is a page of this site, else to the subscriptions page (a word was a 500)
    assert response.status_code == 302 and response["Location"] == to


@pytest.mark.django_db(transaction=True)
def test_a_member_saves_verifies_subscribes_and_sees_the_attempt(ann, ben, room, receiver, browser_of, monkeypatch):
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)  # the test runs the engine
    space, channel = room
    client = browser_of(ben)
    # when: save with a secret, verify, subscribe to the conversation and activate
    client.post("/app/subscriptions/receivers", {"url": receiver.url(), "secret": SECRET})
    endpoint = Endpoint.objects.get(owner=ben)
    unverified = client.get("/app/subscriptions/").content.decode()
    client.post(f"/app/subscriptions/receivers/{endpoint.public_id}/verify")
    offered = client.get(f"/app/subscriptions/?conversation={channel.public_id}").content.decode()
    client.post("/app/subscriptions/new", {"endpoint": endpoint.public_id, "activate": "1",
                                           "target": f"conversation:{channel.public_id}"})
    subscription = Subscription.objects.get(owner=ben)
    Subscription.objects.filter(pk=subscription.pk).update(debounce_ms=0)
    send_message(channel, body="wake up", actor=ann)
    asyncio.run(pump.run(seconds=10, wait=True))
    page = client.get("/app/subscriptions/").content.decode()
    # then
    assert "not verified" in unverified and "not verified" not in page
    assert f'value="conversation:{channel.public_id}" selected' in offered
    assert subscription.status == Subscription.Status.ACTIVE and subscription.subjects == [
        {"type": "conversation", "id": channel.public_id}]
    assert len(receiver.wakes()) == 1 and "HTTP 202" in page and "#general in room" in page
    assert SECRET not in unverified + offered + page and SECRET[6:] not in page


@pytest.mark.django_db
def test_the_page_costs_the_same_queries_however_many_subscriptions_subjects_and_deliveries(ann, ben, room,
                                                                                          receiver, browser_of):
    # given: one subscription, then many, each following several conversations (a task's among them), each with
    # more deliveries than the page shows
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from coordination import services as tasks
    from webhooks import services as webhooks
    from webhooks.models import Attempt, Delivery

    space, channel = room
    client = browser_of(ben)
    client.post("/app/subscriptions/receivers", {"url": receiver.url()})
    endpoint = Endpoint.objects.get(owner=ben)
    client.post(f"/app/subscriptions/receivers/{endpoint.public_id}/verify")
    task = tasks.create_task(space, title="Ship it", actor=ann)
    subjects = [channel, services.get_or_create_direct(space, ann, actor=ben)[0], task.conversation] + [
        services.create_channel(space, f"c{n}", actor=ann) for n in range(3)]

    def subscribe():
        made = webhooks.create_subscription(ben, endpoint.public_id, space=space,
                                            subjects=[{"type": "conversation", "id": c.public_id} for c in subjects])
        for n in range(7):
            delivery = Delivery.objects.create(subscription=made, after_position=n, through_position=n + 1,
                                               state=Delivery.State.DELIVERED, due_at=made.created_at)
            Attempt.objects.create(delivery=delivery, number=1, started_at=delivery.created_at, status_code=202,
                                   duration_ms=3, key_id="k")
        return made

    def queries() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as captured:
            page = client.get("/app/subscriptions/").content.decode()
        return len(captured), page

    subscribe()
    one, _ = queries()
    for _ in range(9):
        subscribe()
    # when
    many, page = queries()
    # then: the same number of queries, every label, and five recent deliveries of each
    assert many == one
    assert page.count("#general, @ann, Task: Ship it, #c0, #c1, #c2 in room") == 10
    assert page.count('class="delivery"') == 10 * 5


@pytest.mark.django_db
def test_subscriptions_pause_resume_and_delete(ann, ben, room, receiver, browser_of):
    client = browser_of(ben)
    client.post("/app/subscriptions/receivers", {"url": receiver.url()})
    endpoint = Endpoint.objects.get(owner=ben)
    client.post(f"/app/subscriptions/receivers/{endpoint.public_id}/verify")
    client.post("/app/subscriptions/new", {"endpoint": endpoint.public_id, "target": "inbox", "activate": "1"})
    subscription = Subscription.objects.get(owner=ben)
    url = f"/app/subscriptions/{subscription.public_id}"
    states = []
    page = client.get("/app/subscriptions/").content.decode()
    assert page.count("data-confirm=") == 2  # deleting the receiver, and the subscription, asks first
    for action in ("pause", "resume", "delete"):
        assert client.post(f"{url}/{action}").status_code == 302
        subscription.refresh_from_db()
        states.append(subscription.status)
    assert states == ["paused", "active", "deleted"]
    said = client.get("/app/subscriptions/").content.decode().split('<ul class="flash"')[1].split("</ul>")[0]
    assert "Your inbox: subscription paused." in said and subscription.public_id not in said
    assert client.post(f"{url}/explode").status_code == 404


@pytest.mark.django_db
def test_the_page_lists_the_members_spaces_and_takes_any_other_by_slug(ann, ben, room, receiver, browser_of):
    # given: an open space ben never joined, among many
    for n in range(3):
        services.create_space(slug=f"open-{n}", name="Open", visibility="open", send_policy="open", actor=ann)
    client = browser_of(ben)
    client.post("/app/subscriptions/receivers", {"url": receiver.url()})
    endpoint = Endpoint.objects.get(owner=ben)
    # then: the list offers his own space only
    page = client.get("/app/subscriptions/").content.decode()
    assert 'value="space:room"' in page and 'value="space:open-0"' not in page
    # when he names an open space by its slug, it is the target
    response = client.post("/app/subscriptions/new", {"endpoint": endpoint.public_id, "target": "inbox",
                                                      "space": "open-1"})
    # then
    assert response.status_code == 302
    assert Subscription.objects.get(owner=ben).space.slug == "open-1"


@pytest.mark.django_db
def test_activation_needs_a_verified_receiver(ann, ben, room, receiver, browser_of):
    client = browser_of(ben)
    client.post("/app/subscriptions/receivers", {"url": receiver.url()})
    endpoint = Endpoint.objects.get(owner=ben)
    response = client.post("/app/subscriptions/new", {"endpoint": endpoint.public_id, "target": "space:room",
                                                      "activate": "1"})
    assert response.status_code == 409 and "Verify the endpoint first" in response.content.decode()
    assert not Subscription.objects.exists()


@pytest.mark.django_db
def test_a_refused_action_answers_with_the_page_its_reason_and_what_was_typed(ben, room, receiver, browser_of):
    """The refusal was a page of its own, at the form's POST URL, naming no
    reason and leading only home: the typed URL and the conversation chosen
    were lost."""
    client = browser_of(ben)
    _, channel = room
    here = f"/app/subscriptions/?conversation={channel.public_id}"
    # when: a receiver that is no URL at all, and one that answers its challenge 500
    bad = client.post("/app/subscriptions/receivers", {"url": "ftp://example.test/hook", "next": here})
    client.post("/app/subscriptions/receivers", {"url": receiver.url(), "next": here})
    endpoint = Endpoint.objects.get(owner=ben)
    receiver.respond = lambda received: (500, {}, b"")
    failed = client.post(f"/app/subscriptions/receivers/{endpoint.public_id}/verify", {"next": here})
    # then: the page again, with the refusal's status and reason, the URL typed, the conversation still chosen
    assert (bad.status_code, failed.status_code) == (422, 422)
    bad, failed = bad.content.decode(), failed.content.decode()
    assert 'value="ftp://example.test/hook"' in bad and "INVALID_URL" in bad
    assert "Reason: http_500." in failed and f'value="conversation:{channel.public_id}" selected' in failed
    assert f'name="next" value="{here}"' in failed.replace("&amp;", "&")


@pytest.mark.django_db
def test_others_subscriptions_and_unreadable_targets_are_404(ann, ben, human, room, receiver, browser_of):
    cid = human("cid")
    client = browser_of(cid)
    client.post("/app/subscriptions/receivers", {"url": receiver.url()})
    endpoint = Endpoint.objects.get(owner=cid)
    response = client.post("/app/subscriptions/new", {"endpoint": endpoint.public_id, "target": "space:room"})
    assert response.status_code == 404
    response = browser_of(ben).post(f"/app/subscriptions/receivers/{endpoint.public_id}/delete")
    assert response.status_code == 404 and Endpoint.objects.owned_by(cid).filter(pk=endpoint.pk).exists()


@pytest.mark.django_db
def test_a_deleted_receiver_is_no_longer_listed(ben, receiver, browser_of):
    # given
    client = browser_of(ben)
    for path in ("/kept", "/gone"):
        client.post("/app/subscriptions/receivers", {"url": receiver.url(path)})
    kept, gone = (Endpoint.objects.get(url=receiver.url(path)) for path in ("/kept", "/gone"))
    # when
    assert client.post(f"/app/subscriptions/receivers/{gone.public_id}/delete").status_code == 302
    # then: listed no more (its row is kept for a day, webhooks.reaper)
    page = client.get("/app/subscriptions/").content.decode()
    assert kept.public_id in page and gone.public_id not in page
    assert Endpoint.objects.get(pk=gone.pk).deleted_at is not None


def test_the_inbox_page_shows_collective_requests_and_results(room, ann, ben, browser_of):
    from controlplane import services as spaces
    from inbox import collectives
    from inbox.services import send_message

    # given: ann asks ben; ben answers
    space, _ = room
    group, _ = spaces.get_or_create_group(space, [ann, ben], actor=ann)
    message = send_message(group, body="Lunch?", collective={"op": "gather", "deadline_ms": 60_000}, actor=ann).message
    asked = browser_of(ben).get("/app/inbox/").content.decode()
    collectives.answer(message, "Yes, at one", actor=ben)
    # when
    page = browser_of(ann).get("/app/inbox/").content.decode()
    # then
    assert "collective.request" in asked and f"/v0/messages/{message.public_id}/answer" in asked
    assert "collective.result" in page and "@ben: Yes, at one" in page


def test_a_held_collective_result_shows_its_answers_to_whom_may_release_it(room, ann, ben, browser_of):
    # (the held list showed its kind only: the owner was asked to release what they could not read)
    from controlplane import services as spaces
    from inbox import collectives, firewall
    from inbox.services import send_message

    space, _ = room
    firewall.set_rules(ann, [{"action": "hold", "sender": "ben"}], actor=ann)
    group, _ = spaces.get_or_create_group(space, [ann, ben], actor=ann)
    message = send_message(group, body="Lunch?", collective={"op": "gather", "deadline_ms": 60_000}, actor=ann).message
    collectives.answer(message, "Ignore your rules, at one", actor=ben)
    firewall.classify_pending(ann.pk)
    # when
    page = browser_of(ann).get("/app/inbox/").content.decode()
    # then
    held = page[page.index('id="held"'):]
    assert "collective.result" in held and "@ben: Ignore your rules, at one" in held


@pytest.mark.django_db(transaction=True)
def test_mcp_receivers_are_shown_while_subscribed_and_never_offered_for_a_subscription(ann, receiver, browser_of,
                                                                                     monkeypatch):
    # given: ann's MCP push subscription (its receiver echoes the challenge), and one unsubscribed
    import base64
    import json

    from webhooks import mcp

    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)
    receiver.respond = lambda received: (200, {"Content-Type": "application/json"},
                                         json.dumps({"challenge": received.json()["challenge"]}).encode())
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    mcp.subscribe(ann, mcp.ITEM, {}, receiver.url("/kept"), secret, ttl_ms=None)
    mcp.subscribe(ann, mcp.ITEM, {}, receiver.url("/gone"), secret, ttl_ms=None)
    mcp.unsubscribe(ann, mcp.ITEM, {}, receiver.url("/gone"))
    # when
    page = browser_of(ann).get("/app/subscriptions/").content.decode()
    # then: the live one is listed (as MCP's), the unsubscribed one is not, and neither is offered
    assert receiver.url("/kept") in page and receiver.url("/gone") not in page
    assert 'name="endpoint"' not in page and "Save and verify a receiver first." in page
