"""A pushed item's next one is handed off as its 2xx is recorded, claimed
for the recording worker at once (webhooks.engine._hand_off): the room it
takes, of the worker's and of its member's share."""
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import now
from inbox.services import send_message
from tests.mcp_endpoint.test_push import SECRET
from webhooks import engine, mcp
from webhooks.models import Delivery, Endpoint, Subscription
from webhooks.transport import Outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def test_a_record_keeps_room_free_only_while_something_else_is_due(world, receiver, make_member):
    # given: two members' inboxes pushed, three items each, their first items claimed
    space = world["direct"].space
    members = [world["ada"], make_member("cy")]
    services.join_space(space, actor=members[1])
    for member in members:
        mcp.subscribe(member, mcp.ITEM, {}, world["url"], SECRET, ttl_ms=None)
        direct, _ = services.get_or_create_direct(space, member, actor=world["bo"])
        for n in range(3):
            send_message(direct, body=f"item {n}", actor=world["bo"])
    jobs = engine.claim_due(10)

    def answered(jobs):
        return [engine.Result(job, Outcome(204, None, 5), "whsec", now()) for job in jobs]

    # when / then: with nothing else due, both next items are handed off, the room to keep free unused
    handed = engine.record(answered(jobs), hand_off=2, keep_free=1)
    assert len(handed) == 2 and not Delivery.objects.filter(state=Delivery.State.OPEN).exists()
    # and with a wake due, one is handed off and the other offered, for the claim that takes the wake too
    mcp.subscribe(world["bo"], mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    send_message(world["direct"], body="to bo", actor=world["ada"])
    (kept,) = engine.record(answered(handed), hand_off=2, keep_free=1)
    offered = Delivery.objects.get(state=Delivery.State.OPEN, subscription__kind=Subscription.Kind.ITEM)
    assert {kept.mcp_subscription_id, offered.subscription.public_id} == {j.mcp_subscription_id for j in handed}
    pending = Subscription.objects.get(owner=world["bo"], mcp_name=mcp.PENDING)
    assert {job.mcp_subscription_id for job in engine.claim_due(10)} == {pending.public_id,
                                                                        offered.subscription.public_id}


def test_a_members_hand_offs_take_only_the_places_left_of_their_share(world, receiver, monkeypatch):
    """A hand-off was claimed at once whatever the member had in flight: one
    member's push chains held 20 places beyond the 32 their claims may."""
    # given: ada's two pushed inboxes with items waiting, a share of two, and a wake of hers in flight
    monkeypatch.setattr(engine, "PER_OWNER", 2)
    ada = world["ada"]
    for path in ("/a", "/b"):
        mcp.subscribe(ada, mcp.ITEM, {}, receiver.url(path), SECRET, ttl_ms=None)
    for n in range(4):
        send_message(world["direct"], body=f"item {n}", actor=world["bo"])
    jobs = engine.claim_due(10)
    assert len(jobs) == 2
    space = world["direct"].space
    waking = Subscription.objects.create(owner=ada, endpoint=Endpoint.objects.create(owner=ada, url=world["url"]),
                                         kind="space", space=space, status="active", activation_position=0)
    Delivery.objects.create(subscription=waking, after_position=0, through_position=1, state="sending",
                            due_at=now(), claimed_until=now() + dt.timedelta(seconds=30))
    # when: both pushes are answered 2xx
    handed = engine.record([engine.Result(job, Outcome(204, None, 5), "whsec", now()) for job in jobs], hand_off=10)
    # then: one next item is handed off (her wake and it fill her share); the other is offered, for a claim
    assert len(handed) == 1
    offered = Delivery.objects.get(state=Delivery.State.OPEN, subscription__kind=Subscription.Kind.ITEM)
    assert offered.subscription.public_id != handed[0].mcp_subscription_id
