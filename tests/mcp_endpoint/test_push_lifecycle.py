"""An MCP push subscription's life against a real HTTPS receiver: lapsed
leases, unsubscribing while a push is in flight, the managed endpoint's
place under the limits, a refresh after a suspension, and its owner's
reinstatement."""
import datetime as dt
import json

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.errors import LimitExceeded
from inbox.services import send_message
from tests.mcp_endpoint.test_push import SECRET, pump, pushes, subscribe
from webhooks import engine, mcp
from webhooks.models import Delivery, Endpoint, Subscription
from webhooks.transport import Outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def test_lapsed_leases_give_their_places_to_new_subscriptions(world, receiver, monkeypatch):
    # given: as many inbox subscriptions as a member may hold, one of them rejected for good
    from webhooks import services as webhooks_services

    monkeypatch.setattr(webhooks_services, "MAX_INBOX", 3)
    first, second = subscribe(world, url=receiver.url("/a")), subscribe(world, url=receiver.url("/b"))
    rejected = subscribe(world, url=receiver.url("/r"))
    Subscription.objects.filter(public_id=rejected["id"]).update(status=Subscription.Status.SUSPENDED, terminal=True)
    with pytest.raises(LimitExceeded):
        subscribe(world, url=receiver.url("/c"))
    # when: their leases run out, and another subscription is made
    with freeze(now() + dt.timedelta(hours=25)):
        third = subscribe(world, url=receiver.url("/c"))
        again = subscribe(world, url=receiver.url("/a"))  # a lapsed one comes back as new
    # then: the lapsed ones made room; the one rejected for good stays so until unsubscribed
    status = dict(Subscription.objects.values_list("public_id", "status"))
    assert status == {first["id"]: "active", second["id"]: "deleted", rejected["id"]: "suspended",
                      third["id"]: "active"} and again["id"] == first["id"]
    assert Subscription.objects.get(public_id=rejected["id"]).terminal


def test_managed_endpoints_leave_the_members_own_endpoints_room_and_go_a_day_after(world, receiver, api_for,
                                                                                   monkeypatch):
    # given: a member with room for one endpoint of their own, after subscribing and unsubscribing twice
    from webhooks import services as webhooks_services

    monkeypatch.setattr(webhooks_services, "MAX_ENDPOINTS", 1)
    for path in ("/a", "/b"):
        subscribe(world, url=receiver.url(path))
        assert mcp.unsubscribe(world["ada"], mcp.ITEM, {}, receiver.url(path))
    kept = subscribe(world, url=receiver.url("/c"))
    # when
    created = api_for(world["ada"]).post("/v0/webhook-endpoints", {"url": receiver.url("/mine")})
    # then: managed endpoints do not count
    assert created.status_code == 201, created.json()
    # and a day after an unsubscribe, the subscription goes with its endpoint and history
    assert mcp.reap_deleted() == 0
    with freeze(now() + dt.timedelta(days=1, minutes=1)):
        assert mcp.reap_deleted() == 2
    assert list(Subscription.objects.values_list("public_id", flat=True)) == [kept["id"]]
    assert Endpoint.objects.filter(managed=True).count() == 1


def test_an_unsubscribe_while_its_push_is_in_flight_leaves_the_rest_of_the_batch_recorded(world, receiver):
    # given: two subscriptions' pushes claimed in one batch
    from webhooks.models import Attempt

    subscribe(world)
    subscribe(world, url=receiver.url("/other"))
    send_message(world["direct"], body="one", actor=world["bo"])
    jobs = engine.claim_due(10)
    assert len(jobs) == 2
    # when: the agent unsubscribes the first while its push is in flight, then both answer 204
    assert mcp.unsubscribe(world["ada"], mcp.ITEM, {}, world["url"])
    ok = Outcome(status_code=204, error_class=None, duration_ms=5)
    engine.record_or_leave([engine.Result(job, ok, "key", now()) for job in jobs])
    # then: both answers are recorded (the unsubscribed one's row is still there to take it)
    assert sorted(Delivery.objects.values_list("state", flat=True)) == ["cancelled", "delivered"]
    assert Attempt.objects.count() == 2


def test_a_2xx_to_a_push_unsubscribed_in_flight_acknowledges_its_item_all_the_same(world, receiver):
    """SPEC §9: a 2xx acknowledges the item. Its attempt was recorded as 204
    and the item left pending, so a new subscribe pushed it again."""
    from inbox.models import InboxItem

    # given: a push in flight
    subscribe(world)
    send_message(world["direct"], body="one", actor=world["bo"])
    (job,) = engine.claim_due(10)
    # when: the agent unsubscribes, then the receiver answers 204
    assert mcp.unsubscribe(world["ada"], mcp.ITEM, {}, world["url"])
    engine.record_or_leave([engine.Result(job, Outcome(status_code=204, error_class=None, duration_ms=5), "key",
                                          now())])
    # then: the item was acknowledged by that 204, and a new subscribe does not push it again
    assert InboxItem.objects.get(member=world["ada"]).state == InboxItem.State.ACKNOWLEDGED
    subscribe(world)
    pump()
    assert pushes(receiver) == []


def test_a_refresh_resumes_a_subscription_suspended_after_its_retries(world, receiver):
    # given: a subscription suspended after its retries ran out (not by a 410 or 413)
    created = subscribe(world)
    Subscription.objects.filter(public_id=created["id"]).update(
        status=Subscription.Status.SUSPENDED, suspended_reason="retries_exhausted", suspended_at=now())
    send_message(world["direct"], body="waiting", actor=world["bo"])
    assert pump() == 0
    # when
    assert subscribe(world)["id"] == created["id"]
    pump()
    # then
    assert Subscription.objects.get(public_id=created["id"]).status == Subscription.Status.ACTIVE
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["waiting"]


def test_a_reinstated_members_pushes_go_on_at_once(world, receiver):
    """They waited for the minute's sweep: the claims while she was
    suspended had cancelled her offers."""
    # given: ada suspended with an item pending, its offer left by the claims
    created = subscribe(world)
    services.update_member(world["ada"], status="suspended", actor=None)
    send_message(world["direct"], body="while she was away", actor=world["bo"])
    assert engine.claim_due(10) == []
    subscription = Subscription.objects.get(public_id=created["id"])
    assert Delivery.objects.filter(subscription=subscription, state=Delivery.State.OPEN).count() == 1
    # when
    services.update_member(world["ada"], status="active", actor=None)
    # then: the next run pushes it
    pump()
    assert [json.loads(r.body)["data"]["item"]["content"] for r in pushes(receiver)] == ["while she was away"]


def test_revoking_the_credential_that_made_or_last_refreshed_a_subscription_ends_it(world, receiver):
    """Pushes send whole messages: a token taken, then revoked, kept a
    subscription of its making pushing (and acknowledging) its member's
    items until the lease ran out, up to a week, and the member's REST
    routes may not touch it."""
    from controlplane import bearer

    # given: one subscription made with a credential, one refreshed with another
    taken, kept = (bearer.issue_credential(world["ada"], actor=None)[0] for _ in range(2))
    made = mcp.subscribe(world["ada"], mcp.ITEM, {}, world["url"], SECRET, ttl_ms=None,
                         credential_id=taken.public_id)
    other_url = receiver.url("/other")
    mcp.subscribe(world["ada"], mcp.ITEM, {}, other_url, SECRET, ttl_ms=None, credential_id=taken.public_id)
    other = mcp.subscribe(world["ada"], mcp.ITEM, {}, other_url, SECRET, ttl_ms=None, credential_id=kept.public_id)
    # when the first credential is revoked, and a message comes
    bearer.revoke_credential(taken, actor=world["ada"])
    send_message(world["direct"], body="after the revocation", actor=world["bo"])
    pump()
    # then: its subscription is deleted; the refreshed one goes on
    status = dict(Subscription.objects.values_list("public_id", "status"))
    assert status == {made["id"]: "deleted", other["id"]: "active"}
    assert [(r.path, r.json()["data"]["item"]["content"]) for r in pushes(receiver)] == [
        ("/other", "after the revocation")]


@pytest.mark.parametrize("made", ["new", "refreshed with a new secret"])
def test_a_credential_revoked_while_its_subscribe_verifies_the_receiver_makes_no_subscription(world, receiver,
                                                                                              monkeypatch, made):
    """The challenge runs outside any transaction: a revocation then found
    no subscription of the credential's to end, and the subscription was
    stored without one, so no revocation ever ended it (a stolen token's
    receiver can hold its challenge open for 15 s)."""
    from controlplane import bearer
    from controlplane.errors import Forbidden
    from webhooks import verification

    # given: the credential the subscribe is made with, revoked while its receiver is being verified
    taken, kept = (bearer.issue_credential(world["ada"], actor=None)[0] for _ in range(2))
    if made != "new":
        mcp.subscribe(world["ada"], mcp.ITEM, {}, world["url"], SECRET, ttl_ms=None, credential_id=kept.public_id)
    verifying = verification.verify_endpoint

    def revoked_meanwhile(*args, **kwargs):
        bearer.revoke_credential(taken, actor=world["ada"])
        return verifying(*args, **kwargs)

    monkeypatch.setattr(verification, "verify_endpoint", revoked_meanwhile)
    secret = SECRET if made == "new" else "whsec_" + "QUJD" * 8
    # when / then: refused, and nothing of it stays to push the member's messages
    with pytest.raises(Forbidden):
        mcp.subscribe(world["ada"], mcp.ITEM, {}, world["url"], secret, ttl_ms=None, credential_id=taken.public_id)
    live = Subscription.objects.exclude(status="deleted")
    assert [s.credential_id for s in live] == ([] if made == "new" else [kept.pk])
