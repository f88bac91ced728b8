"""Deleting a webhook endpoint (SPEC §8): its subscriptions are deleted and
their unsent wakes cancelled, a request in flight finishes and is recorded,
and the rows go a day later."""
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.errors import NotFound
from inbox.services import send_message
from webhooks import engine, reaper
from webhooks import services as webhooks_services
from webhooks.models import Attempt, Delivery, Endpoint, Subscription
from webhooks.transport import Outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def carol_subscribed(world, receiver, api_for, make_member):
    """carol, in `lab`, with an active inbox subscription (debounce 0) through an endpoint of her own."""
    carol = make_member("carol")
    services.join_space(world["general"].space, actor=carol)
    as_carol = api_for(carol)
    endpoint = as_carol.post("/v0/webhook-endpoints", {"url": receiver.url("/carol")}).json()["endpoint"]["id"]
    assert as_carol.post(f"/v0/webhook-endpoints/{endpoint}/verify").status_code == 200
    created = as_carol.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint, "debounce_ms": 0}).json()
    subscription = created["subscription"]["id"]
    assert as_carol.post(f"/v0/me/inbox-subscriptions/{subscription}/activate").status_code == 200
    return subscription


def test_deleting_an_endpoint_mid_flight_leaves_the_rest_of_the_batch_recorded(world, receiver, api_for,
                                                                                make_member):
    # given: alice's wake and carol's claimed in one batch
    carols = carol_subscribed(world, receiver, api_for, make_member)
    send_message(world["general"], body="hello @carol", actor=world["bob"])
    jobs = engine.claim_due(10)
    assert len(jobs) == 2
    # when: alice deletes her endpoint while both requests are in flight, then both answer 202
    endpoint = world["subscription"]["endpoint_id"]
    assert world["as_alice"].delete(f"/v0/webhook-endpoints/{endpoint}").status_code == 204
    ok = Outcome(status_code=202, error_class=None, duration_ms=5)
    engine.record_or_leave([engine.Result(job, ok, "key", now()) for job in jobs])
    # then: carol's wake is delivered; alice's stays cancelled, with the attempt it made
    assert Delivery.objects.get(subscription__public_id=carols).state == Delivery.State.DELIVERED
    alices = Delivery.objects.get(subscription__public_id=world["subscription"]["id"])
    assert alices.state == Delivery.State.CANCELLED
    assert Attempt.objects.filter(delivery=alices).count() == 1 and Attempt.objects.count() == 2


def test_a_deleted_endpoint_is_gone_from_the_api_but_its_history_stays_until_reaped(world, receiver):
    # given: a wake waiting for alice's endpoint
    as_alice, endpoint = world["as_alice"], world["subscription"]["endpoint_id"]
    send_message(world["general"], body="unsent", actor=world["bob"])
    # when
    assert as_alice.delete(f"/v0/webhook-endpoints/{endpoint}").status_code == 204
    # then: 404 wherever it is named, listed nowhere, and nothing is sent to it
    path = f"/v0/webhook-endpoints/{endpoint}"
    assert [as_alice.get(path).status_code, as_alice.post(f"{path}/verify").status_code,
            as_alice.delete(path).status_code, as_alice.get(world["path"]).status_code] == [404, 404, 404, 404]
    assert as_alice.get("/v0/webhook-endpoints").json()["endpoints"] == []
    subscribing = as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint})
    assert subscribing.status_code == 404
    assert engine.claim_due(10) == [] and receiver.requests == []
    # the rows stay, the subscription deleted and its wake cancelled, until the reaper's day has passed
    deleted = Endpoint.objects.get(public_id=endpoint)
    assert deleted.deleted_at is not None
    assert Subscription.objects.get(endpoint=deleted).status == Subscription.Status.DELETED
    assert list(Delivery.objects.values_list("state", flat=True)) == [Delivery.State.CANCELLED]


def test_deleted_endpoints_leave_their_place_under_the_limit(world, receiver, monkeypatch):
    # given: alice at her limit of endpoints
    monkeypatch.setattr(webhooks_services, "MAX_ENDPOINTS", 2)
    as_alice, endpoint = world["as_alice"], world["subscription"]["endpoint_id"]
    assert as_alice.post("/v0/webhook-endpoints", {"url": receiver.url("/second")}).status_code == 201
    assert as_alice.post("/v0/webhook-endpoints", {"url": receiver.url("/third")}).status_code == 409
    # when
    assert as_alice.delete(f"/v0/webhook-endpoints/{endpoint}").status_code == 204
    # then: the deleted one's row is kept, and counts no more
    assert as_alice.post("/v0/webhook-endpoints", {"url": receiver.url("/third")}).status_code == 201
    assert Endpoint.objects.filter(owner=world["alice"]).count() == 3


def test_a_subscription_deleted_with_its_endpoint_is_not_brought_back(world):
    # given: alice's subscriptions, an active one and one never activated, as read before she deleted their endpoint
    as_alice, endpoint = world["as_alice"], world["subscription"]["endpoint_id"]
    created = as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint}).json()["subscription"]["id"]
    active, inactive = (Subscription.objects.get(public_id=p) for p in (world["subscription"]["id"], created))
    assert as_alice.delete(f"/v0/webhook-endpoints/{endpoint}").status_code == 204
    # when: an activation and a pause that read them before go on
    with pytest.raises(NotFound):
        webhooks_services.activate(inactive)
    with pytest.raises(NotFound):
        webhooks_services.update_subscription(active, status="paused", debounce_ms=None)
    # then
    assert set(Subscription.objects.values_list("status", flat=True)) == {Subscription.Status.DELETED}


def test_the_reaper_removes_endpoints_deleted_a_day_ago_but_not_with_a_request_in_flight(world, receiver, api_for,
                                                                                         make_member):
    # given: alice's endpoint deleted with its attempted wake; carol's deleted with a request of hers in flight
    carols = carol_subscribed(world, receiver, api_for, make_member)
    send_message(world["general"], body="hello @carol", actor=world["bob"])
    jobs = engine.claim_due(10)
    ok = Outcome(status_code=202, error_class=None, duration_ms=5)
    engine.record([engine.Result(job, ok, "key", now()) for job in jobs if job.subscription_id != carols])
    carol_endpoint = Subscription.objects.get(public_id=carols).endpoint
    for endpoint in (Subscription.objects.get(public_id=world["subscription"]["id"]).endpoint, carol_endpoint):
        webhooks_services.delete_endpoint(endpoint)
    # and bob's endpoint, deleted within the day
    as_bob = api_for(world["bob"])
    bobs = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url("/bob")}).json()["endpoint"]["id"]
    with freeze(now() + dt.timedelta(hours=23)):
        assert as_bob.delete(f"/v0/webhook-endpoints/{bobs}").status_code == 204
    # when: the reaper runs now, and a day later while a request to carol's is in flight (one handed off
    # after the delete committed, say)
    assert reaper.reap_deleted_endpoints() == 0
    with freeze(now() + dt.timedelta(days=1, minutes=1)):
        Delivery.objects.filter(subscription__public_id=carols).update(state=Delivery.State.SENDING,
                                                                       claimed_until=now() + engine.lease())
        reaped = reaper.reap_deleted_endpoints()
    # then: alice's went with its subscription, wake and attempt; carol's and bob's stay
    assert reaped == 1
    assert set(Endpoint.objects.values_list("public_id", flat=True)) == {carol_endpoint.public_id, bobs}
    assert list(Subscription.objects.values_list("public_id", flat=True)) == [carols]
    assert Delivery.objects.count() == 1 and Attempt.objects.count() == 0
