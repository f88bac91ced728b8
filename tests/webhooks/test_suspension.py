"""Suspension of a subscription by its receiver's answers (SPEC §8): 410 and
413 for good, a hundred failed attempts over an hour until resumed, and what
a resume's catch-up covers."""
import datetime as dt

import pytest

from controlplane.clock import now
from inbox.services import send_message
from tests.webhooks.scene import pump
from webhooks.models import Attempt, Delivery, Subscription

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


@pytest.mark.parametrize("status", [410, 413])
def test_410_and_413_suspend_for_good_and_tell_the_owner(world, receiver, api_for, status):
    # given
    receiver.respond = lambda received: (status, {}, b"")
    send_message(world["general"], body="gone?", actor=world["bob"])
    # when
    pump()
    # then
    subscription = world["as_alice"].get(world["path"]).json()["subscription"]
    assert subscription["status"] == "suspended"
    assert subscription["suspended"]["terminal"] is True and subscription["suspended"]["last_error"] == f"http_{status}"
    (notice,) = world["as_alice"].get("/v0/me/inbox").json()["items"]
    assert notice["item"]["kind"] == "subscription.suspended"
    assert notice["item"]["subscription"] == world["subscription"]["id"]
    feed = world["as_alice"].get("/v0/me/inbox/events").json()["events"]
    assert [e["kind"] for e in feed] == ["subscription.suspended"]
    space_feed = api_for(world["bob"]).get("/v0/spaces/lab/events?limit=100").json()["events"]
    assert "subscription.suspended" not in [e["kind"] for e in space_feed]  # alice's business alone
    # resume cannot clear it, and nothing more is sent
    assert world["as_alice"].patch(world["path"], {"status": "active"}).status_code == 409
    send_message(world["general"], body="more", actor=world["bob"])
    pump()
    assert len(receiver.wakes()) == 1


@pytest.mark.parametrize("during_retries", [[], ["during retries"]], ids=["alone", "with-a-wake-behind-it"])
def test_suspension_after_100_attempts_spanning_an_hour(world, receiver, during_retries):
    receiver.respond = lambda received: (500, {}, b"")
    send_message(world["general"], body="down", actor=world["bob"])
    pump()
    for body in during_retries:  # a wake opened behind the failing one, waiting for it
        send_message(world["general"], body=body, actor=world["bob"])
    # 99 attempts over two hours so far
    Delivery.objects.filter(attempts=1).update(attempts=99, first_attempt_at=now() - dt.timedelta(hours=2),
                                               due_at=now())
    Attempt.objects.update(number=99)
    pump()
    subscription = Subscription.objects.get()
    assert subscription.status == "suspended" and not subscription.terminal
    assert subscription.suspended_error == "http_500"
    # an owner can resume a non-terminal suspension, and its one catch-up covers all the receiver missed
    send_message(world["general"], body="while suspended", actor=world["bob"])
    received = len(receiver.wakes())
    receiver.respond = None
    assert world["as_alice"].patch(world["path"], {"status": "active"}).status_code == 200
    pump()
    (catch_up,) = (wake.json() for wake in receiver.wakes()[received:])
    events = world["as_alice"].get("/v0/spaces/lab/events", cursor=catch_up["event_range"]["after"]).json()["events"]
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.created"] == [
        "down", *during_retries, "while suspended"]


def test_a_replay_whose_failures_suspend_gives_no_range_back(world, receiver):
    # given: two wakes delivered, then a replay of the first that fails into a suspension
    from webhooks import services as webhook_services

    for body in ("one", "two"):
        send_message(world["general"], body=body, actor=world["bob"])
        pump()
    first, second = Delivery.objects.order_by("id")
    receiver.respond = lambda received: (500, {}, b"")
    replay = webhook_services.replay(first.public_id, world["alice"])
    pump()
    Delivery.objects.filter(pk=replay.pk).update(attempts=99, first_attempt_at=now() - dt.timedelta(hours=2),
                                                 due_at=now())
    pump()
    assert Subscription.objects.get().status == "suspended"
    # when: resumed, with one more event
    send_message(world["general"], body="three", actor=world["bob"])
    receiver.respond = None
    world["as_alice"].patch(world["path"], {"status": "active"})
    pump()
    # then: the catch-up starts where the last wake ended, as a chain does
    catch_up = Delivery.objects.filter(replay_of=None).order_by("id").last()
    assert catch_up.after_position == second.through_position and catch_up.state == "delivered"


@pytest.mark.parametrize("status", [410, 413])
def test_a_replay_answered_410_or_413_suspends_for_good(world, receiver, status):
    # given: a delivered wake, replayed to a receiver that now answers 410 or 413
    from webhooks import services as webhook_services

    send_message(world["general"], body="one", actor=world["bob"])
    pump()
    receiver.respond = lambda received: (status, {}, b"")
    replay = webhook_services.replay(Delivery.objects.get().public_id, world["alice"])
    # when
    pump()
    # then: as any wake answered so: suspended for good, the replay failed, and a resume refused
    subscription = Subscription.objects.get()
    assert (subscription.status, subscription.terminal, subscription.suspended_error) == (
        "suspended", True, f"http_{status}")
    assert Delivery.objects.get(pk=replay.pk).state == "failed"
    assert world["as_alice"].patch(world["path"], {"status": "active"}).status_code == 409


def test_many_attempts_within_the_hour_do_not_suspend(world, receiver):
    receiver.respond = lambda received: (500, {}, b"")
    send_message(world["general"], body="down", actor=world["bob"])
    pump()
    Delivery.objects.update(attempts=150, first_attempt_at=now() - dt.timedelta(minutes=30), due_at=now())
    pump()
    assert Subscription.objects.get().status == "active"
