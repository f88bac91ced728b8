"""Every delivery kind (space wake, inbox wake, and the MCP pushes: items,
the pending count, a space's work) × every receiver outcome, against the
real HTTPS receiver: any 2xx delivers; a failure of any kind (3xx, another
4xx, connection refused, an untrusted certificate, a timeout, 5xx) is
recorded and retried with the same id, after its Retry-After if it names
one; 100 failed attempts over an hour suspend, and 410 or 413 suspend for
good (SPEC §8, §9)."""
import datetime as dt
import json
import socket
import time

import pytest

from controlplane.clock import freeze, now
from inbox.models import InboxItem
from tests.webhooks.conftest import MCP_NAMES, MCP_SECRET, challenge_or, pushes
from tests.webhooks.scene import SECRET, pump
from webhooks import mcp, transport
from webhooks.models import Attempt, Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]
KINDS = ("space", "inbox", *MCP_NAMES)
TIMEOUTS = (transport.READ_TIMEOUT, transport.TOTAL_TIMEOUT)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_delivery(subscription):
    return Delivery.objects.filter(subscription=subscription).exclude(state="cancelled").order_by("id").first()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [200, 204, "200 with a large body"])
def test_any_2xx_delivers(cell, receiver, kind, status):
    world = cell(kind)
    code, body = (200, b"x" * 100_000) if status == "200 with a large body" else (status, b"")
    receiver.respond = challenge_or(lambda r: (code, {}, body))
    sent = world["send"]("hello alice")
    pump()
    assert first_delivery(world["subscription"]).state == "delivered" and len(pushes(receiver)) == 1
    if kind == "item":  # and for an item, the 2xx acknowledged it
        assert InboxItem.objects.get(message=sent.message, member=world["alice"]).state == "acknowledged"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("outcome", ["302", "400", "401", "404", "429", "refused", "tls", "timeout", "500"])
def test_a_failed_attempt_is_recorded_and_retried_with_the_same_id(cell, receiver, https_receiver, settings,
                                                                  monkeypatch, kind, outcome):
    world = cell(kind)
    subscription = world["subscription"]
    expected_error, wait = None, 5
    if outcome == "302":
        receiver.respond = challenge_or(lambda r: (302, {"Location": receiver.url("/elsewhere")}, b""))
    elif outcome == "429":
        receiver.respond = challenge_or(lambda r: (429, {"Retry-After": "30"}, b""))
        wait = 30
    elif outcome in ("400", "401", "404", "500"):
        receiver.respond = challenge_or(lambda r: (int(outcome), {}, b""))
    elif outcome == "refused":
        Endpoint.objects.filter(pk=subscription.endpoint_id).update(url=f"https://localhost:{closed_port()}/x")
        expected_error = "connect_error"
    elif outcome == "tls":
        settings.WEBHOOK_CA_BUNDLE = None  # the receiver's certificate is no longer trusted
        expected_error = "tls_error"
    elif outcome == "timeout":
        monkeypatch.setattr(transport, "READ_TIMEOUT", 0.5)
        monkeypatch.setattr(transport, "TOTAL_TIMEOUT", 1.0)
        receiver.respond = challenge_or(lambda r: (time.sleep(2), (202, {}, b"{}"))[1])
        expected_error = "timeout"
    sent = world["send"]("hello alice")
    start = now()
    with freeze(start):
        assert pump() >= 1
    delivery = first_delivery(subscription)
    attempt = Attempt.objects.get(delivery=delivery)
    assert delivery.state == "pending", (kind, outcome, delivery.state)
    if expected_error:
        assert (attempt.status_code, attempt.error_class) == (None, expected_error)
    else:
        assert attempt.status_code == int(outcome)
    assert wait * 0.8 <= (delivery.due_at - start).total_seconds() <= wait * 1.2
    assert Subscription.objects.get(pk=subscription.pk).status == "active"
    if kind == "item":
        assert InboxItem.objects.get(message=sent.message, member=world["alice"]).state == "pending"
    # the receiver is fixed; the retry is the same wake
    receiver.respond = challenge_or(lambda r: (202, {}, b"{}"))
    settings.WEBHOOK_CA_BUNDLE = str(https_receiver[1])
    Endpoint.objects.filter(pk=subscription.endpoint_id).update(url=receiver.url(f"/{kind}"))
    monkeypatch.setattr(transport, "READ_TIMEOUT", TIMEOUTS[0])
    monkeypatch.setattr(transport, "TOTAL_TIMEOUT", TIMEOUTS[1])
    with freeze(start + dt.timedelta(seconds=wait * 1.2 + 1)):
        pump()
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 2
    ids = {r.headers.get("Webhook-Id") or r.headers.get("webhook-id") for r in pushes(receiver)}
    assert len(ids) == 1, ids
    # the history shows the failure without secrets
    history = world["as_alice"].get(f"/v0/webhook-subscriptions/{subscription.public_id}/deliveries")
    assert history.status_code == 200, history.json()
    text = json.dumps(history.json())
    assert SECRET not in text and MCP_SECRET not in text


@pytest.mark.parametrize("kind", KINDS)
def test_suspension_after_100_attempts_spanning_an_hour(cell, receiver, kind):
    world = cell(kind)
    subscription = world["subscription"]
    receiver.respond = challenge_or(lambda r: (503, {}, b""))
    sent = world["send"]("down")
    pump()
    delivery = first_delivery(subscription)
    Delivery.objects.filter(pk=delivery.pk).update(attempts=99, first_attempt_at=now() - dt.timedelta(hours=2),
                                                    due_at=now())
    Attempt.objects.filter(delivery=delivery).update(number=99)
    pump()
    subscription.refresh_from_db()
    assert subscription.status == "suspended" and not subscription.terminal
    assert subscription.suspended_error == "http_503"
    delivery.refresh_from_db()
    assert delivery.state == "failed"
    notices = list(InboxItem.objects.filter(member=world["alice"], kind="subscription.suspended"))
    assert len(notices) == 1 and notices[0].payload["terminal"] is False
    feed = world["as_alice"].get("/v0/me/inbox/events").json()["events"]
    assert "subscription.suspended" in [e["kind"] for e in feed]
    # nothing more is sent while suspended
    count = len(pushes(receiver))
    world["send"]("still down?")
    pump()
    assert len(pushes(receiver)) == count
    if kind == "item":
        assert InboxItem.objects.get(message=sent.message, member=world["alice"]).state == "pending"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [410, 413])
def test_terminal_answers_in_process(cell, receiver, kind, status):
    world = cell(kind)
    subscription = world["subscription"]
    receiver.respond = challenge_or(lambda r: (status, {}, b""))
    world["send"]("gone?")
    pump()
    subscription.refresh_from_db()
    assert subscription.status == "suspended" and subscription.terminal
    assert subscription.suspended_error == f"http_{status}"
    assert first_delivery(subscription).state == "failed"
    assert InboxItem.objects.filter(member=world["alice"], kind="subscription.suspended").count() == 1
    # a later send: nothing more sent; resume (or refresh) cannot clear it
    before = len(pushes(receiver))
    world["send"]("more")
    pump()
    assert len(pushes(receiver)) == before
    if kind in MCP_NAMES:
        from controlplane.errors import Conflict

        arguments = {"space": "lab"} if kind == "work" else {}
        with pytest.raises(Conflict):
            mcp.subscribe(world["alice"], MCP_NAMES[kind], arguments, receiver.url(f"/{kind}"), MCP_SECRET,
                          ttl_ms=None)
        with freeze(now() + dt.timedelta(days=2)):  # lease expiry cannot clear it either
            with pytest.raises(Conflict):
                mcp.subscribe(world["alice"], MCP_NAMES[kind], arguments, receiver.url(f"/{kind}"), MCP_SECRET,
                              ttl_ms=None)
    else:
        collection = "/v0/spaces/lab/webhook-subscriptions" if kind == "space" else "/v0/me/inbox-subscriptions"
        path = f"{collection}/{subscription.public_id}"
        assert world["as_alice"].patch(path, {"status": "active"}).status_code == 409
        assert world["as_alice"].post(f"{path}/activate").status_code == 409
