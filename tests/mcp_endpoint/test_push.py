"""MCP-managed push subscriptions on the delivery engine, against a real
HTTPS receiver: identity, leases, secret rotation, what is offered, and
the ordinary routes' refusal to touch them."""
import asyncio
import base64
import datetime as dt
import json

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from controlplane import services
from controlplane.clock import freeze, now
from inbox import firewall
from inbox.models import InboxItem
from inbox.render import item_occurrence
from inbox.services import send_message
from webhooks import engine, mcp
from webhooks import pump as timer_loop
from webhooks.models import Delivery, Subscription
from webhooks.services import create_endpoint, deliveries_of
from webhooks.transport import Outcome
from webhooks.verification import verify_endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]
SECRET = "whsec_" + base64.b64encode(b"a" * 32).decode()
ROTATED = "whsec_" + base64.b64encode(b"b" * 32).decode()


def pump():
    return asyncio.run(timer_loop.run(seconds=10.0, wait=False))


def subscribe(world, secret=SECRET, ttl_ms=None, name=mcp.ITEM, arguments=None, url=None):
    return mcp.subscribe(world["ada"], name, arguments or {}, url or world["url"], secret, ttl_ms=ttl_ms)


def pushes(receiver):
    return [r for r in receiver.requests if r.json().get("type") != "verification"]


def test_the_id_is_stable_per_identity_and_the_lease_is_bounded(world, receiver):
    # when
    first = subscribe(world)
    again = subscribe(world, ttl_ms=1_000)
    longest = subscribe(world, ttl_ms=30 * 24 * 3600 * 1000)
    other = subscribe(world, url=receiver.url("/other"))
    # then: one subscription for one identity; leases of 24 h by default, 60 s to 7 days
    assert first["id"] == again["id"] == longest["id"] != other["id"]
    assert Subscription.objects.filter(mcp_name=mcp.ITEM).count() == 2
    assert mcp.lease_for(None) == dt.timedelta(hours=24)
    assert mcp.lease_for(1_000) == dt.timedelta(seconds=60)
    assert mcp.lease_for(10**12) == mcp.lease_for(10**20) == dt.timedelta(days=7)  # any integer
    assert mcp.lease_for(-10**20) == dt.timedelta(seconds=60)
    lease = Subscription.objects.get(public_id=first["id"]).lease_expires_at
    assert dt.timedelta(days=6, hours=23) < lease - now() <= dt.timedelta(days=7)
    # one verification challenge per URL and secret (cached for ten minutes)
    assert [r.path for r in receiver.requests if r.json().get("type") == "verification"] == ["/items", "/other"]


def test_a_refresh_within_its_lease_to_the_same_receiver_is_not_challenged_again(world, receiver):
    """Every refresh past the ten minutes' cache sent a new challenge and
    counted against VERIFY_PER_HOUR: an agent keeping 30 subscriptions alive
    was refused most refreshes, and their leases ran out."""
    def challenges():
        return [r.path for r in receiver.requests if r.json().get("type") == "verification"]

    created = subscribe(world, ttl_ms=3600 * 1000)
    with freeze(now() + dt.timedelta(minutes=30)):
        # when: refreshed within its lease, past the cache
        assert subscribe(world, ttl_ms=3600 * 1000)["id"] == created["id"]
        assert challenges() == ["/items"]
        # but: a new secret is the receiver's to confirm
        subscribe(world, secret=ROTATED, ttl_ms=3600 * 1000)
        assert challenges() == ["/items", "/items"]
    with freeze(now() + dt.timedelta(hours=2)):
        # and: so is a subscription whose lease ran out
        subscribe(world, secret=ROTATED)
        assert challenges() == ["/items", "/items", "/items"]


def test_an_ordinary_endpoints_verification_does_not_stand_for_the_mcp_challenge(world, receiver):
    # given: ada verified her own endpoint at the same URL with the same secret a moment ago
    receiver.respond = lambda received: (200, {"Content-Type": "application/json"},
                                         json.dumps({"challenge": received.json()["challenge"]}).encode())
    endpoint = create_endpoint(world["ada"], world["url"], SECRET, actor=world["ada"])
    verify_endpoint(endpoint)
    # when
    subscribe(world)
    # then: the receiver was still asked the Events extension's challenge
    assert [r.json()["type"] for r in receiver.requests] == ["spaces.webhook.challenge", "verification"]
    # and the other way round: a push verified first does not stand for an endpoint's challenge
    subscribe(world, url=receiver.url("/other"), secret=ROTATED)
    verify_endpoint(create_endpoint(world["ada"], receiver.url("/other"), ROTATED, actor=world["ada"]))
    assert [r.json()["type"] for r in receiver.requests[2:]] == ["verification", "spaces.webhook.challenge"]


def test_items_are_offered_oldest_first_one_at_a_time_and_a_2xx_acknowledges(world, receiver):
    # given
    subscribe(world)
    sent = [send_message(world["direct"], body=f"item {n}", actor=world["bo"]).message for n in range(3)]
    # when
    while pump():
        pass
    # then
    bodies = [Webhook(SECRET).verify(r.body, {k.lower(): v for k, v in r.headers.items()}) for r in pushes(receiver)]
    assert [b["data"]["item"]["postId"] for b in bodies] == [m.public_id for m in sent]
    assert not InboxItem.objects.filter(member=world["ada"], state=InboxItem.State.PENDING).exists()
    assert Delivery.objects.filter(state=Delivery.State.DELIVERED).count() == 3


def test_a_2xx_hands_the_next_admitted_item_to_the_worker_in_the_same_transaction(world, receiver):
    # given: four items, the second held by ada's firewall; the first claimed
    firewall.set_rules(world["ada"], [{"action": "hold", "content_pattern": "secret"}], actor=world["ada"])
    created = subscribe(world)
    for body in ("first", "the secret", "third", "fourth"):
        send_message(world["direct"], body=body, actor=world["bo"])
    firewall.classify_pending(world["ada"].pk)
    (job,) = engine.claim_due(10)
    # when: a worker that may claim records its 2xx
    (handed,) = engine.record([engine.Result(job, Outcome(204, None, 5), "whsec", now())], hand_off=1)
    # then: the first is acknowledged and the next admitted item is this worker's at once:
    # sending, its first attempt, its body frozen; nothing is left for a claim
    delivery = Delivery.objects.get(pk=handed.delivery_id)
    assert delivery.state == Delivery.State.SENDING and delivery.attempts == handed.number == 1
    assert json.loads(handed.body) == json.loads(delivery.body)
    assert json.loads(handed.body)["data"]["item"]["content"] == "third" == delivery.item.message.body
    assert handed.message_id == "evt_" + delivery.item.token[4:] and handed.item_id == delivery.item_id
    assert handed.mcp_subscription_id == created["id"] and handed.mcp_secrets == (job.mcp_secrets[0],)
    assert engine.claim_due(10) == []
    contents = InboxItem.objects.filter(member=world["ada"], state=InboxItem.State.PENDING).order_by("position")
    assert [i.message.body for i in contents] == ["the secret", "third", "fourth"]
    # and a worker that may not claim (stopping) only offers the next: open, for any claim
    assert engine.record([engine.Result(handed, Outcome(204, None, 5), "whsec", now())]) == []
    assert Delivery.objects.get(state=Delivery.State.OPEN).item_id is None
    # and past the subscription's lease nothing is handed off (the item waits for a refresh)
    (last,) = engine.claim_due(10)
    with freeze(now() + dt.timedelta(hours=25)):
        send_message(world["direct"], body="fifth", actor=world["bo"])
        assert engine.record([engine.Result(last, Outcome(204, None, 5), "whsec", now())], hand_off=1) == []
    assert not Delivery.objects.filter(state__in=Delivery.UNFINISHED).exists()


def test_a_pump_claims_a_pushed_subscription_once_and_is_handed_the_rest(world, receiver, monkeypatch):
    # given
    claimed = []
    monkeypatch.setattr(timer_loop, "claim_due", lambda *a: claimed.extend(jobs := engine.claim_due(*a)) or jobs)
    subscribe(world)
    sent = [send_message(world["direct"], body=f"item {n}", actor=world["bo"]).message for n in range(3)]
    # when
    while pump():
        pass
    # then: all three pushed in order, one of them claimed
    assert [r.json()["data"]["item"]["postId"] for r in pushes(receiver)] == [m.public_id for m in sent]
    assert len(claimed) == 1


def test_held_items_are_never_offered(world, receiver):
    # given: ada's firewall holds secrets
    firewall.set_rules(world["ada"], [{"action": "hold", "content_pattern": "secret"}], actor=world["ada"])
    subscribe(world)
    send_message(world["direct"], body="the secret", actor=world["bo"])
    send_message(world["direct"], body="hello", actor=world["bo"])
    firewall.classify_pending(world["ada"].pk)
    # when
    while pump():
        pass
    # then
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["hello"]


def test_a_rotated_secret_signs_beside_the_old_one_for_five_minutes(world, receiver):
    # given: the subscription refreshed with a new secret
    subscribe(world)
    subscribe(world, secret=ROTATED)
    send_message(world["direct"], body="during", actor=world["bo"])
    pump()
    with freeze(now() + dt.timedelta(minutes=6)):
        subscribe(world, secret=ROTATED)  # keeps the lease going
        send_message(world["direct"], body="after", actor=world["bo"])
        pump()
    during, after = pushes(receiver)
    # then: both secrets verify the first; only the new one the second
    for secret in (SECRET, ROTATED):
        Webhook(secret).verify(during.body, {k.lower(): v for k, v in during.headers.items()})
    with pytest.raises(WebhookVerificationError):
        headers = {k.lower(): v for k, v in after.headers.items()}
        Webhook(SECRET).verify(after.body, headers)
    assert after.headers["webhook-signature"].count("v1,") == 1


def test_a_subscription_made_again_signs_with_its_new_secret_alone(world, receiver):
    # given: a rotation's overlap still running when the subscription is deleted
    subscribe(world)
    subscribe(world, secret=ROTATED)
    mcp.unsubscribe(world["ada"], mcp.ITEM, {}, world["url"])
    # when: made again, with a third secret, within the five minutes
    third = "whsec_" + base64.b64encode(b"c" * 32).decode()
    subscribe(world, secret=third)
    send_message(world["direct"], body="afresh", actor=world["bo"])
    pump()
    # then: the secrets of the deleted subscription sign nothing
    [push] = pushes(receiver)
    headers = {k.lower(): v for k, v in push.headers.items()}
    Webhook(third).verify(push.body, headers)
    assert headers["webhook-signature"].count("v1,") == 1
    for old in (SECRET, ROTATED):
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(push.body, headers)


def test_an_expired_lease_stops_sending_and_keeps_the_item_for_a_refresh(world, receiver):
    # given
    subscribe(world)
    later = now() + dt.timedelta(hours=25)
    with freeze(later):
        send_message(world["direct"], body="while expired", actor=world["bo"])
        # when
        assert pump() == 0
        assert pushes(receiver) == []
        subscribe(world)  # a refresh
        pump()
    # then
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["while expired"]


def test_an_item_acknowledged_meanwhile_is_not_sent_and_the_next_one_is(world, receiver):
    from inbox.delivery import acknowledge_delivery

    subscribe(world)
    first = send_message(world["direct"], body="first", actor=world["bo"]).message
    send_message(world["direct"], body="second", actor=world["bo"])
    token = InboxItem.objects.get(message=first, member=world["ada"]).token
    acknowledge_delivery(world["ada"], token, actor=world["ada"])
    while pump():
        pass
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["second"]


def test_unsubscribe_cancels_sends_and_keeps_pending_items(world, receiver):
    subscribe(world)
    mcp.unsubscribe(world["ada"], mcp.ITEM, {}, world["url"])
    send_message(world["direct"], body="kept", actor=world["bo"])
    pump()
    assert pushes(receiver) == []
    assert InboxItem.objects.filter(member=world["ada"], state=InboxItem.State.PENDING).count() == 1
    assert mcp.unsubscribe(world["ada"], mcp.ITEM, {}, world["url"]) is False


def test_the_ordinary_routes_refuse_to_change_managed_records(world, api_for):
    # given
    created = subscribe(world)
    subscription = Subscription.objects.get(public_id=created["id"])
    send_message(world["direct"], body="x", actor=world["bo"])
    pump()
    delivery = Delivery.objects.filter(subscription=subscription).first()
    as_ada = api_for(world["ada"])
    route = f"/v0/me/inbox-subscriptions/{created['id']}"
    # when
    answers = [as_ada.patch(route, {"status": "paused"}), as_ada.delete(route), as_ada.post(f"{route}/activate"),
               as_ada.post(f"/v0/webhook-endpoints/{subscription.endpoint.public_id}/verify"),
               as_ada.delete(f"/v0/webhook-endpoints/{subscription.endpoint.public_id}"),
               as_ada.post(f"/v0/webhook-deliveries/{delivery.public_id}/replay"),
               as_ada.post("/v0/me/inbox-subscriptions", {"endpoint_id": subscription.endpoint.public_id})]
    shown = as_ada.get(route).json()["subscription"]
    # then
    assert [(a.status_code, a.json()["error"]["details"].get("managed_by")) for a in answers] == [(409, "mcp")] * 7
    assert shown["scope"] == "inbox_items" and shown["mcp"]["event"] == mcp.ITEM
    assert Subscription.objects.get(pk=subscription.pk).status == Subscription.Status.ACTIVE


def test_range_events_push_in_the_extension_shape(world, receiver):
    # given: bo's pending count, and the space's work, pushed
    mcp.subscribe(world["bo"], mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    mcp.subscribe(world["bo"], mcp.WORK, {"space": "lab"}, receiver.url("/work"), SECRET, ttl_ms=None)
    # when: ada writes to bo
    send_message(world["direct"], body="to bo", actor=world["ada"])
    while pump():
        pass
    # then
    by_path = {r.path: r.json() for r in pushes(receiver)}
    assert by_path["/pending"]["data"] == {"pendingCount": 1} and by_path["/pending"]["cursor"] is None
    work = by_path["/work"]
    assert work["name"] == mcp.WORK and set(work["data"]) == {"space", "event_range", "url"}
    assert work["data"]["url"].endswith("/v0/spaces/lab/events")


def test_work_pushed_for_one_task_carries_its_id_and_nothing_else_wakes_it(world, receiver):
    from coordination import services as tasks

    # given: bo watches one task of the space
    space = world["direct"].space
    mine, other = (tasks.create_task(space, title=t, actor=world["bo"]) for t in ("mine", "other"))
    mcp.subscribe(world["bo"], mcp.WORK, {"space": "lab", "task_id": mine.public_id}, receiver.url("/task"), SECRET,
                  ttl_ms=None)
    # when: a message elsewhere, the other task claimed, then this one
    send_message(world["direct"], body="to bo", actor=world["ada"])
    tasks.claim_task(space, other.public_id, actor=world["ada"])
    while pump():
        pass
    quiet = len(pushes(receiver))
    tasks.claim_task(space, mine.public_id, actor=world["ada"])
    while pump():
        pass
    # then
    (pushed,) = [r.json() for r in pushes(receiver)]
    assert quiet == 0 and pushed["data"]["task_id"] == mine.public_id


def test_an_item_too_large_for_an_event_is_a_reference(world):
    item = send_message(world["direct"], body="small", actor=world["bo"]).message
    row = InboxItem.objects.get(message=item)
    assert item_occurrence(row, mcp.ITEM)["data"]["kind"] == "item"
    row.payload = {**row.payload, "content": "x" * (300 * 1024)}
    reference = item_occurrence(row, mcp.ITEM)
    assert reference["data"] == {"kind": "reference", "itemKind": "direct", "bytes": row.content_bytes,
                                 "deliveryToken": row.token}
    assert reference["eventId"] == "evt_" + row.token[4:]
    # the whole envelope is measured, not only its data: the largest item carried fits with its cursor
    from inbox.render import CURSOR_ROOM, MAX_ITEM_ENVELOPE
    row.payload = {**row.payload, "content": ""}
    room = MAX_ITEM_ENVELOPE - CURSOR_ROOM - len(mcp.item_body(row).encode())
    for extra, kind in ((room, "item"), (room + 1, "reference")):
        row.payload = {**row.payload, "content": "x" * extra}
        assert item_occurrence(row, mcp.ITEM)["data"]["kind"] == kind
    row.payload = {**row.payload, "content": "x" * room}
    assert len(mcp.item_body(row).encode()) + CURSOR_ROOM == MAX_ITEM_ENVELOPE


def test_a_subscription_with_nothing_pending_is_offered_nothing_more(world, receiver):
    # given: a delivery offered for an event that carries no item (a grant notice, say)
    created = subscribe(world)
    subscription = Subscription.objects.get(public_id=created["id"])
    mcp.offer([subscription.pk])
    # when
    pump()
    # then: it found nothing, ended, and no new one took its place
    assert pushes(receiver) == []
    assert list(Delivery.objects.filter(subscription=subscription).values_list("state", flat=True)) == ["cancelled"]
    # and the history shows no wake (it showed a `cancelled` one no one had cancelled)
    assert list(deliveries_of(subscription)) == []


def test_item_pushes_and_range_wakes_are_claimed_in_one_batch(world, receiver):
    # given: bo's pending count and the space's work pushed (range wakes, no item), due
    # first; then ada's items pushed
    mcp.subscribe(world["bo"], mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    mcp.subscribe(world["bo"], mcp.WORK, {"space": "lab"}, receiver.url("/work"), SECRET, ttl_ms=None)
    send_message(world["direct"], body="to bo", actor=world["ada"])
    subscribe(world)
    send_message(world["direct"], body="to ada", actor=world["bo"])
    # when: one claim takes the three first attempts, their bodies frozen in one statement
    # (found by the fault matrix: on PostgreSQL two items-less rows before an item made
    # the statement's UNION text-typed, and every claim failed while such a mix was due)
    jobs = engine.claim_due(10)
    # then
    assert len(jobs) == 3
    frozen = {d.subscription.mcp_name: d for d in Delivery.objects.filter(state=Delivery.State.SENDING)}
    assert frozen[mcp.ITEM].item_id == InboxItem.objects.get(member=world["ada"]).pk
    for name in (mcp.PENDING, mcp.WORK):
        assert frozen[name].item_id is None and json.loads(frozen[name].body)["name"] == name


def test_the_sweep_offers_again_only_what_may_send(world, receiver):
    # given: ada's pending item whose offer was lost
    created = subscribe(world)
    send_message(world["direct"], body="its offer was lost", actor=world["bo"])
    subscription = Subscription.objects.get(public_id=created["id"])
    Delivery.objects.filter(subscription=subscription).delete()
    # when / then: past the lease the sweep offers nothing; within it, one delivery
    with freeze(now() + dt.timedelta(hours=25)):
        assert mcp.offer_waiting() == 0
    assert mcp.offer_waiting() == 1
    assert list(Delivery.objects.filter(subscription=subscription).values_list("state", flat=True)) == ["open"]
    # and a suspended subscription is offered nothing
    Delivery.objects.filter(subscription=subscription).delete()
    Subscription.objects.filter(pk=subscription.pk).update(status=Subscription.Status.SUSPENDED)
    assert mcp.offer_waiting() == 0
    # nor is a suspended member's (its claim would cancel each offer, and every run made a new one)
    Subscription.objects.filter(pk=subscription.pk).update(status=Subscription.Status.ACTIVE)
    services.update_member(world["ada"], status="suspended", actor=None)
    for _ in range(3):
        assert mcp.offer_waiting() == 0 and engine.claim_due(10) == []
    assert not Delivery.objects.filter(subscription=subscription).exists()


def test_a_claim_left_on_a_subscription_that_may_not_send_keeps_no_timer_busy(world, receiver):
    """A worker died mid-push, and the lease lapsed: the claim is taken back
    only once the subscription may send again. Counting it as due kept the
    timer claiming at once, for good."""
    # given: a push claimed by a worker that was killed mid-request (nothing recorded)
    subscribe(world)
    send_message(world["direct"], body="one", actor=world["bo"])
    assert len(engine.claim_due(10)) == 1
    # when: the subscription's lease has run out (and the claim's long before)
    with freeze(now() + dt.timedelta(hours=25)):
        # then: nothing may be claimed, and nothing is due
        assert engine.claim_due(10) == []
        assert engine.next_due_in(60) is None
    # while the claim of a subscription that may send falls due when it runs out
    assert 0 < engine.next_due_in(3600) <= engine.lease().total_seconds()


def test_push_chains_leave_a_worker_room_for_what_else_falls_due(world, receiver, make_member, monkeypatch):
    # given: a worker with room for four sends; four members' inboxes, five items each,
    # pushed; then bo's pending count subscribed and woken, due after all four chains
    monkeypatch.setattr(timer_loop, "MAX_IN_FLIGHT", 4)
    space = world["direct"].space
    members = [world["ada"]] + [make_member(f"m{n}") for n in range(3)]
    for member in members:
        if member != world["ada"]:
            services.join_space(space, actor=member)
        mcp.subscribe(member, mcp.ITEM, {}, world["url"], SECRET, ttl_ms=None)
        direct, _ = services.get_or_create_direct(space, member, actor=world["bo"])
        for n in range(5):
            send_message(direct, body=f"item {n}", actor=world["bo"])
    mcp.subscribe(world["bo"], mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    send_message(world["direct"], body="to bo", actor=world["ada"])
    receiver.requests.clear()
    # when
    while pump():
        pass
    # then: the wake went out in the worker's second batch, not after the chains drained
    sent = pushes(receiver)
    names = [r.json()["name"] for r in sent]
    assert names.count(mcp.ITEM) == 20 and mcp.PENDING in names
    assert names.index(mcp.PENDING) < 8, names
    assert not InboxItem.objects.filter(member__in=members, state=InboxItem.State.PENDING).exists()
