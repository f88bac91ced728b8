"""The delivery engine against a real HTTPS receiver: signatures, the feed
range, retries, suspension, debounce, pause and resume (SPEC §8)."""
import base64
import datetime as dt
import json
import logging

import nacl.signing
import pytest
from django.db import transaction
from standardwebhooks.webhooks import Webhook
from switchboard_client import WakeVerifier, fetch_signing_keys

from controlplane import services
from controlplane.clock import freeze, now
from inbox.services import send_message
from tests.conftest import Api, error_code
from tests.webhooks.scene import SECRET, pump
from webhooks import engine
from webhooks.crypto import rotate_signing_key
from webhooks.models import Attempt, Delivery, Subscription
from webhooks.transport import Outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def keys_of(anon: Api):
    return {k["key_id"]: base64.urlsafe_b64decode(k["public_key"] + "=")
            for k in anon.get("/v0/webhook-signing-keys").json()["keys"]}


def test_a_wake_is_signed_and_names_a_feed_range_with_the_message(world, receiver, anon):
    # given
    message = send_message(world["general"], body="build is green", actor=world["bob"]).message
    # when
    assert pump() == 1
    # then: one wake, signed with the published Ed25519 key (checked with PyNaCl)...
    (wake,) = receiver.wakes()
    body = wake.json()
    key_id, timestamp = wake.headers["Webhook-Key-Id"], wake.headers["Webhook-Timestamp"]
    ed25519 = next(s[3:] for s in wake.headers["Webhook-Signature"].split() if s.startswith("v1="))
    nacl.signing.VerifyKey(keys_of(anon)[key_id]).verify(
        f"{key_id}.{timestamp}.".encode() + wake.body, base64.urlsafe_b64decode(ed25519 + "=="))
    # ...and the Standard Webhooks way, with the endpoint's secret
    assert Webhook(SECRET).verify(wake.body, wake.headers) == body
    # the envelope
    assert body["type"] == "spaces.events.available" and body["space"] == "lab"
    assert body["id"] == wake.headers["Webhook-Id"] and body["id"].startswith("whd_")
    assert body["subscription"] == {"id": world["subscription"]["id"], "version": 2}
    assert body["issuer"] == "http://127.0.0.1:8000" and set(body["event_range"]) == {"after", "through"}
    assert wake.headers["Accept-Encoding"] == "identity"  # the answer is read as sent, never inflated
    # the receiver reads the owner's feed from `after` and finds the message
    events = world["as_alice"].get("/v0/spaces/lab/events", cursor=body["event_range"]["after"]).json()["events"]
    assert [e["data"]["message"]["id"] for e in events if e["kind"] == "message.created"] == [message.public_id]
    assert events[-1]["position"] == message.position
    # and the package's own helper accepts it
    helper = WakeVerifier(lambda: fetch_signing_keys("http://testserver", opener=lambda url: anon.get(
        url.removeprefix("http://testserver")).content), issuer="http://127.0.0.1:8000", secret=SECRET)
    assert helper.verify(wake.headers, wake.body) == body
    assert helper.first_time(body["id"]) and not helper.first_time(body["id"])


def test_retries_keep_the_id_and_body_with_a_fresh_signature(world, receiver):
    # given: the receiver fails twice (the second time asking for 30 s)
    answers = iter([(500, {}, b""), (503, {"Retry-After": "30"}, b""), (202, {}, b"{}")])
    receiver.respond = lambda received: next(answers)
    send_message(world["general"], body="retry me", actor=world["bob"])
    # when (the clock stands still during each run, so a delay is exactly what was chosen)
    start = now()
    with freeze(start):
        pump()
    first_retry = Delivery.objects.get().due_at - start
    with freeze(start + dt.timedelta(seconds=7)):
        pump()
        second_retry = Delivery.objects.get().due_at - now()
    with freeze(start + dt.timedelta(seconds=40)):
        pump()
    # then
    first, second, third = receiver.wakes()
    assert first.body == second.body == third.body
    assert len({r.headers["Webhook-Id"] for r in (first, second, third)}) == 1
    assert 4 <= first_retry.total_seconds() <= 6  # about 5 s, ±20%
    assert 29.5 <= second_retry.total_seconds() <= 30.5  # Retry-After honoured
    delivery = Delivery.objects.get()
    assert delivery.state == "delivered" and delivery.attempts == 3
    assert list(Attempt.objects.order_by("number").values_list("status_code", flat=True)) == [500, 503, 202]


def test_a_claim_leased_by_a_clock_a_day_ahead_is_taken_again_at_once(world, receiver):
    # given: a wake claimed by a worker whose clock ran a day ahead, which died
    # before it recorded anything (found by the fault matrix: its lease held the
    # wake, and every later one of its subscription, for a day)
    send_message(world["general"], body="claimed by a bad clock", actor=world["bob"])
    with freeze(now() + dt.timedelta(days=1)):
        (claimed,) = engine.claim_due(10)
    # when: a worker with the right time looks
    due_in = engine.next_due_in(60)
    pump()
    # then: it is due now, and taken again and sent as the same wake
    assert due_in == 0.0
    (wake,) = receiver.wakes()
    assert wake.headers["Webhook-Id"] == claimed.public_id
    delivery = Delivery.objects.get()
    assert delivery.state == "delivered" and delivery.attempts == 2


def test_a_late_2xx_leaves_a_wake_that_a_newer_attempt_owns(world, receiver):
    # given: a wake whose claim's lease ran out before its answer came, and
    # which another worker claimed again
    send_message(world["general"], body="answered late", actor=world["bob"])
    (first,) = engine.claim_due(10)
    with freeze(now() + engine.lease() + dt.timedelta(seconds=1)):
        (second,) = engine.claim_due(10)
    assert (first.delivery_id, first.number + 1) == (second.delivery_id, second.number)
    # when: the first attempt's 2xx is recorded
    engine.record([engine.Result(first, Outcome(202, None, 5), "k", now())])
    # then: the delivery is still the second attempt's, sending
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.finished_at) == ("sending", 2, None)
    # and the second attempt's answer is what finishes it
    engine.record([engine.Result(second, Outcome(204, None, 5), "k", now())])
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.finished_at is not None and delivery.claimed_until is None
    # (the first attempt was recorded as lease_expired when it was claimed again; its answer took that place)
    assert list(Attempt.objects.order_by("number").values_list("number", "status_code")) == [(1, 202), (2, 204)]


def test_a_claim_takes_the_longest_due_wakes_first(world, receiver):
    # given: three subscriptions' wakes, due at different times
    as_alice, endpoint_id = world["as_alice"], world["subscription"]["endpoint_id"]
    for _ in range(2):
        extra = as_alice.post("/v0/me/inbox-subscriptions", {"endpoint_id": endpoint_id,
                                                              "debounce_ms": 0}).json()["subscription"]
        as_alice.post(f"/v0/me/inbox-subscriptions/{extra['id']}/activate")
    subscriptions = list(Subscription.objects.filter(status="active").order_by("pk"))
    assert len(subscriptions) == 3
    at = now()
    Delivery.objects.bulk_create(Delivery(subscription=s, after_position=0, through_position=1, state="pending",
                                          due_at=at - dt.timedelta(seconds=seconds))
                                 for s, seconds in zip(subscriptions, (5, 30, 10)))
    # when: a worker has room for two
    jobs = engine.claim_due(2)
    # then: the two due longest, longest first; the third waits its turn
    by_subscription = dict(Delivery.objects.values_list("pk", "subscription_id"))
    assert [by_subscription[j.delivery_id] for j in jobs] == [subscriptions[1].pk, subscriptions[2].pk]
    assert [j.delivery_id for j in engine.claim_due(2)] == [
        d.pk for d in Delivery.objects.filter(subscription=subscriptions[0])]


def test_only_a_recovering_claim_takes_a_lapsed_lease(world, receiver):
    # given: a wake claimed by a worker that died, whose lease has run out
    send_message(world["general"], body="claimed, then the worker died", actor=world["bob"])
    (lost,) = engine.claim_due(10)
    later = now() + engine.lease() + dt.timedelta(seconds=1)
    with freeze(later):
        # when: a busy timer's claim (due wakes only) looks, then a recovering one
        busy = engine.claim_due(10, recover=False)
        recovering = engine.claim_due(10, recover=True)
    # then: only the recovering claim takes it again, as the same wake
    assert busy == []
    assert [(j.delivery_id, j.number) for j in recovering] == [(lost.delivery_id, 2)]
    # and the lost attempt is in the history (it was not: the worker died before recording it)
    assert list(Attempt.objects.values_list("number", "error_class", "status_code")) == [(1, "lease_expired", None)]
    # when: the second attempt is answered
    with freeze(later):
        engine.record([engine.Result(recovering[0], Outcome(204, None, 5), "k", now())])
    assert list(Attempt.objects.order_by("number").values_list("number", "error_class", "status_code")) == [
        (1, "lease_expired", None), (2, None, 204)]


def test_a_retry_scheduled_by_a_clock_a_day_ahead_is_sent_at_once(world, receiver):
    # given: a worker whose clock ran a day ahead got a 500 and set the retry by that clock
    answers = iter([(500, {}, b""), (202, {}, b"{}")])
    receiver.respond = lambda received: next(answers)
    send_message(world["general"], body="retried by a bad clock", actor=world["bob"])
    with freeze(now() + dt.timedelta(days=1)):
        pump()
    assert Delivery.objects.get().due_at > now() + dt.timedelta(hours=23)
    # when: a worker with the right time looks
    due_in = engine.next_due_in(60)
    pump()
    # then: the retry is due now and sent, as the same wake
    assert due_in == 0.0
    first, second = receiver.wakes()
    assert first.headers["Webhook-Id"] == second.headers["Webhook-Id"]
    assert Delivery.objects.get().state == "delivered"


def test_backoff_doubles_and_is_capped():
    delays = [engine.retry_delay(n, None) for n in (1, 2, 3, 10, 30)]
    assert 4 <= delays[0] <= 6 and 8 <= delays[1] <= 12 and 16 <= delays[2] <= 24
    assert delays[3] <= 600 and delays[4] <= 600
    assert engine.retry_delay(1, 10_000) == 600


def test_a_redirect_is_a_failure_and_is_not_followed(world, receiver):
    receiver.respond = lambda received: (302, {"Location": receiver.url("/elsewhere")}, b"")
    send_message(world["general"], body="hop", actor=world["bob"])
    pump()
    assert [r.path for r in receiver.requests] == ["/hook"]
    assert Delivery.objects.get().state == "pending" and Attempt.objects.get().status_code == 302


def test_debounce_coalesces_a_burst_into_one_wake(world, receiver):
    world["as_alice"].patch(world["path"], {"debounce_ms": 400})
    for n in range(5):
        send_message(world["general"], body=f"burst {n}", actor=world["bob"])
    assert pump() == 0  # inside the window, nothing is due
    pump(wait=True, seconds=3)
    (wake,) = receiver.wakes()
    events = world["as_alice"].get("/v0/spaces/lab/events",
                                   cursor=wake.json()["event_range"]["after"]).json()["events"]
    assert [e["data"]["message"]["body"] for e in events] == [f"burst {n}" for n in range(5)]


def test_pause_and_resume_produce_a_catch_up_wake(world, receiver):
    world["as_alice"].patch(world["path"], {"status": "paused"})
    send_message(world["general"], body="while paused", actor=world["bob"])
    assert pump() == 0 and receiver.wakes() == []
    world["as_alice"].patch(world["path"], {"status": "active"})
    pump()
    (wake,) = receiver.wakes()
    events = world["as_alice"].get("/v0/spaces/lab/events",
                                   cursor=wake.json()["event_range"]["after"]).json()["events"]
    assert [e["data"]["message"]["body"] for e in events] == ["while paused"]


def test_wakes_of_a_subscription_are_chained_and_sent_in_order(world, receiver):
    receiver.respond = lambda received: (500, {}, b"")
    send_message(world["general"], body="1", actor=world["bob"])
    pump()
    send_message(world["general"], body="2", actor=world["bob"])
    with freeze(now() + dt.timedelta(seconds=7)):
        receiver.respond = None
        pump()
        pump()
    first, second = (r.json() for r in receiver.wakes()[-2:])
    assert first["event_range"]["through"] == second["event_range"]["after"]
    assert [d.state for d in Delivery.objects.order_by("id")] == ["delivered", "delivered"]


@pytest.mark.parametrize("sent_before", [True, False])
def test_a_suspended_owners_wakes_wait_and_keep_their_chain(world, receiver, sent_before):
    """SPEC §8: each wake starts where the one before ended. Wakes that fell
    due while their owner was suspended were cancelled, and the next one
    after the reinstatement began past their ranges."""
    # given: a wake sent (or about to be), then alice suspended, and an event while she is
    send_message(world["general"], body="before", actor=world["bob"])
    if sent_before:
        pump()
    services.update_member(world["alice"], status="suspended", actor=None)
    send_message(world["general"], body="while suspended", actor=world["bob"])
    assert pump() == 0
    # when: she is reinstated, and another event comes
    services.update_member(world["alice"], status="active", actor=None)
    send_message(world["general"], body="after", actor=world["bob"])
    while pump():
        pass
    # then: the wakes chain from the activation on, and the feed from them holds every event
    ranges = [r.json()["event_range"] for r in receiver.wakes()]
    assert ranges and all(a["through"] == b["after"] for a, b in zip(ranges, ranges[1:]))
    assert not Delivery.objects.filter(state=Delivery.State.CANCELLED).exists()
    events = world["as_alice"].get("/v0/spaces/lab/events",
                                   cursor=ranges[0]["after"]).json()["events"]
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.created"] == [
        "before", "while suspended", "after"]


def test_the_database_keeps_one_open_delivery_per_subscription(world):
    """The offer statements (`ON CONFLICT DO NOTHING`) and debounce rely on
    the unique index, which the migrations keep through every change to the
    table's indexes."""
    from django.db import IntegrityError

    # given: a wake offered and not yet sent
    send_message(world["general"], body="1", actor=world["bob"])
    (offered,) = Delivery.objects.filter(state=Delivery.State.OPEN)
    # when: a second open delivery for the same subscription
    # then
    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(subscription_id=offered.subscription_id, after_position=offered.through_position,
                                through_position=offered.through_position + 1, due_at=now())


def test_removal_from_a_private_space_stops_sends_at_once(receiver, api_for, make_member):
    alice, bob = make_member("alice"), make_member("bob")
    space = services.create_space(slug="den", name="Den", visibility="private", send_policy="open", actor=alice)
    services.add_member(space, bob, actor=alice)
    general = services.create_channel(space, "general", actor=alice)
    as_bob = api_for(bob)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    as_bob.post(f"/v0/webhook-endpoints/{endpoint}/verify")
    subscription = as_bob.post("/v0/spaces/den/webhook-subscriptions",
                               {"endpoint_id": endpoint, "debounce_ms": 0}).json()["subscription"]
    as_bob.post(f"/v0/spaces/den/webhook-subscriptions/{subscription['id']}/activate")
    send_message(general, body="for members", actor=alice)
    services.remove_member(space, bob, actor=alice)
    pump()
    assert receiver.wakes() == []
    assert Delivery.objects.get().state == "cancelled"


def test_removal_from_an_open_space_stops_its_wakes_until_the_member_joins_again(world, receiver, api_for):
    """Anyone reads an open space, the removed too, but removal stops all
    delivery from it (SPEC §3): bob's subscription stays, and wakes him
    again once he joins again."""
    alice, bob, general = world["alice"], world["bob"], world["general"]
    space, as_bob = general.space, api_for(bob)
    endpoint = as_bob.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    as_bob.post(f"/v0/webhook-endpoints/{endpoint}/verify")
    path = "/v0/spaces/lab/webhook-subscriptions"
    mine = as_bob.post(path, {"endpoint_id": endpoint, "debounce_ms": 0}).json()["subscription"]
    as_bob.post(f"{path}/{mine['id']}/activate")

    def bobs_wakes():
        return [w.json()["id"] for w in receiver.wakes() if w.json()["subscription"]["id"] == mine["id"]]

    # when: alice removes him while a wake of his is due
    send_message(general, body="for members", actor=alice)
    services.remove_member(space, bob, actor=alice)
    pump()
    # then: only alice is woken; his wake is cancelled, and he cannot subscribe anew
    assert bobs_wakes() == [] and len(receiver.wakes()) == 1
    assert Delivery.objects.get(subscription__public_id=mine["id"]).state == "cancelled"
    again = as_bob.post(path, {"endpoint_id": endpoint})
    assert again.status_code == 403 and error_code(again) == "FORBIDDEN"
    # when: he joins again
    services.join_space(space, actor=bob)
    send_message(general, body="welcome back", actor=alice)
    pump()
    # then: the same subscription wakes him
    assert len(bobs_wakes()) == 1


def test_a_rotated_key_stays_published_and_signs_no_more(world, receiver, anon):
    before = set(keys_of(anon))
    new = rotate_signing_key()
    listing = {k["key_id"]: k["status"] for k in anon.get("/v0/webhook-signing-keys").json()["keys"]}
    assert listing == {**{k: "retired" for k in before}, new.key_id: "active"}
    send_message(world["general"], body="after rotation", actor=world["bob"])
    pump()
    assert receiver.wakes()[0].headers["Webhook-Key-Id"] == new.key_id
    with freeze(now() + dt.timedelta(hours=2)):
        assert set(keys_of(anon)) == {new.key_id}


def test_history_shows_attempts_without_secrets(world, receiver):
    receiver.respond = lambda received: (500, {}, b"")
    send_message(world["general"], body="x", actor=world["bob"])
    pump()
    history = world["as_alice"].get(f"/v0/webhook-subscriptions/{world['subscription']['id']}/deliveries")
    (delivery,) = history.json()["deliveries"]
    (attempt,) = delivery["attempts"]
    assert delivery["state"] == "pending" and attempt["status_code"] == 500 and attempt["error_class"] is None
    assert set(attempt) == {"number", "at", "duration_ms", "status_code", "error_class"}
    text = json.dumps(history.json())
    assert SECRET not in text and receiver.url() not in text


def test_an_outcome_that_cannot_be_recorded_leaves_only_its_own_delivery(world, receiver, monkeypatch):
    # given: two due wakes of two subscriptions; suspending the first fails
    from webhooks.models import Delivery
    second = world["as_alice"].post("/v0/me/inbox-subscriptions", {"endpoint_id": world["subscription"]["endpoint_id"],
                                                                   "debounce_ms": 0}).json()["subscription"]
    world["as_alice"].post(f"/v0/me/inbox-subscriptions/{second['id']}/activate")
    receiver.respond = lambda received: (410, {}, b"") if "space" in received.json() else (202, {}, b"{}")

    def broken_suspend(subscription, *args, **kwargs):
        raise RuntimeError("the notice cannot be written")

    monkeypatch.setattr(engine, "suspend", broken_suspend)
    send_message(world["general"], body="hello @alice", actor=world["bob"])
    # when: the pump sends both and records them together
    sent = pump()
    # then: the pump lived; the inbox wake is delivered; the space wake stays
    # `sending`, to be claimed again when its lease runs out
    assert sent == 2
    states = dict(Delivery.objects.values_list("subscription__public_id", "state"))
    assert states == {second["id"]: "delivered", world["subscription"]["id"]: "sending"}


def test_the_admin_resumes_subscriptions_and_replays_deliveries(world, receiver, make_member):
    # given: a delivered wake, then the subscription suspended (not for good)
    from django.test import Client

    from webhooks.models import Delivery, Subscription
    send_message(world["general"], body="once", actor=world["bob"])
    pump()
    subscription = Subscription.objects.get(public_id=world["subscription"]["id"])
    with transaction.atomic():
        engine.suspend(subscription, "tests", "http_500", terminal=False)
    make_member("root", kind="human", is_admin=True, password="pw-for-tests-1")
    admin = Client()
    assert admin.login(username="root", password="pw-for-tests-1")
    # when
    admin.post("/admin/webhooks/subscription/", {"action": "resume_selected", "_selected_action": [subscription.pk]})
    delivery = Delivery.objects.get(state="delivered")
    admin.post("/admin/webhooks/delivery/", {"action": "replay_selected", "_selected_action": [delivery.pk]})
    pump()
    # then
    subscription.refresh_from_db()
    assert subscription.status == "active"
    ranges = [r.json()["event_range"] for r in receiver.wakes()]
    assert ranges.count(ranges[0]) == 2  # the first wake, and its replay
    assert Delivery.objects.filter(replay_of=delivery, state="delivered").exists()


def test_each_attempt_is_logged_with_the_request_ids_of_the_sends_it_wakes_for(world, receiver, api_for, caplog):
    # given: two sends through the API, each under its request id, into one wake; the receiver fails once
    as_bob = api_for(world["bob"])
    answers = iter([(500, {}, b""), (202, {}, b"{}")])
    receiver.respond = lambda received: next(answers)
    caplog.set_level(logging.INFO, logger="switchboard")
    path = f"/v0/spaces/lab/conversations/{world['general'].public_id}/messages"
    sent = [as_bob.post(path, {"body": f"step {n}"}, headers={"X-Request-Id": f"send-{n}"}) for n in (1, 2)]
    assert [(r.status_code, r["X-Request-Id"]) for r in sent] == [(201, "send-1"), (201, "send-2")], sent[0].json()
    # when: the first attempt, then the retry
    start = now()
    with freeze(start):
        pump()
    with freeze(start + dt.timedelta(seconds=7)):
        pump()
    # then: a line per send, under its request id...
    sends = [r for r in caplog.records if r.name == "switchboard.send"]
    assert [(r.request_id, r.message_id, r.space) for r in sends] == [
        ("send-1", sent[0].json()["message"]["id"], "lab"), ("send-2", sent[1].json()["message"]["id"], "lab")]
    # ...and a line per attempt, naming both sends, its range covering their events
    attempts = [r for r in caplog.records if r.name == "switchboard.wake"]
    assert [(r.attempt, r.outcome, r.status) for r in attempts] == [(1, "failed", 500), (2, "delivered", 202)]
    (wake_id,) = {r.headers["Webhook-Id"] for r in receiver.wakes()}
    for attempt in attempts:
        assert attempt.request_ids == ["send-1", "send-2"]
        assert (attempt.delivery_id, attempt.subscription_id) == (wake_id, world["subscription"]["id"])
        assert attempt.after < sends[0].event_position < sends[1].event_position == attempt.through
    # nothing secret on any of these lines
    printed = caplog.text + "".join(str(vars(r)) for r in sends + attempts)
    assert SECRET not in printed and "step 1" not in printed and "Webhook-Signature" not in printed
