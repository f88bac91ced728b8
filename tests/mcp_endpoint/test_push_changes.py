"""A push subscription while what it pushes changes: a grant revoked with
a push on its way, its member removed from the item's space, and
acknowledgements that change the pushed pending count."""
import pytest

from controlplane import services
from controlplane.clock import now
from grants import barrier
from grants.models import Grant
from inbox.models import InboxItem
from inbox.services import send_message
from tests.mcp_endpoint.test_push import SECRET, pump, pushes, subscribe
from webhooks import engine, mcp
from webhooks.models import Delivery
from webhooks.transport import Outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def under_a_grant(world):
    """bo's direct conversation with ada in vera's explicit_only space, and
    the pair grant bo sends to ada under: (ada, the conversation, the
    grant, vera). A grant is never made by the sender it governs."""
    from grants import services as grants

    ada, bo = world["ada"], world["bo"]
    owner = services.create_member("vera", actor=None)
    vault = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=owner)
    services.join_space(vault, actor=ada)
    services.join_space(vault, actor=bo)
    direct, _ = services.get_or_create_direct(vault, ada, actor=bo)
    grant = grants.create_grant(vault, grant_id="grt_pair", kind="pair", sender="@bo", recipient="@ada",
                                actor=owner)[0]
    return ada, direct, grant, owner


@pytest.mark.parametrize("answer", [204, 500])
def test_a_push_on_its_way_when_its_grant_is_revoked_is_kept_only_if_answered_2xx(world, receiver, answer):
    """SPEC §5: finishing the barrier keeps what was handed off (received by
    a webhook with a 2xx) and rejects the rest. The barrier withholds the
    pending item as it starts, while its push may already be on its way."""
    # given: ada's items pushed, from bo's direct conversation in an explicit_only space
    ada, direct, grant, owner = under_a_grant(world)
    subscribe(world)
    send_message(direct, body="one", actor=world["bo"])
    (job,) = engine.claim_due(10)
    # when: the barrier starts while the push is on its way, the receiver answers, the barrier finishes
    barrier.start_barrier(grant.pk, ending=Grant.Status.REVOKED, actor=owner)
    engine.record([engine.Result(job, Outcome(answer, None, 5), "whsec", now())])
    barrier.finish_barrier(grant.pk)
    # then
    item = InboxItem.objects.get(member=ada, message__body="one")
    if answer == 204:
        assert (item.state, item.admission) == (InboxItem.State.ACKNOWLEDGED, InboxItem.Admission.ADMITTED)
        assert Delivery.objects.get(pk=job.delivery_id).state == Delivery.State.DELIVERED
    else:
        assert (item.state, item.admission) == (InboxItem.State.REJECTED, InboxItem.Admission.WITHHELD)


def test_a_push_waiting_for_its_retry_when_its_grant_is_revoked_gives_way_to_the_rejection(world, receiver):
    """Not on its way but failed once and waiting: the barrier rejects the
    item, its retry is never sent, and the rejection is pushed in its place."""
    # given: ada's item from bo, under a pair grant, whose first push was answered 500
    ada, direct, grant, owner = under_a_grant(world)
    subscribe(world)
    send_message(direct, body="one", actor=world["bo"])
    (job,) = engine.claim_due(10)
    engine.record([engine.Result(job, Outcome(500, None, 5), "whsec", now())])
    Delivery.objects.filter(pk=job.delivery_id).update(due_at=now())
    # when: the grant is revoked before the retry, and the worker runs
    barrier.start_barrier(grant.pk, ending=Grant.Status.REVOKED, actor=owner)
    barrier.finish_barrier(grant.pk)
    pump()  # may send nothing: a retry it cancels offers the next item, due at once
    while pump():
        pass
    # then: the item is rejected, its push never sent again, and the rejection pushed instead
    assert InboxItem.objects.get(member=ada, message__body="one").state == InboxItem.State.REJECTED
    assert [r.json()["data"]["item"]["kind"] for r in pushes(receiver)] == ["rejected"]
    assert Delivery.objects.get(pk=job.delivery_id).state == Delivery.State.CANCELLED


@pytest.mark.parametrize("visibility", ["private", "open"])
@pytest.mark.parametrize("when", ["before its first push", "before its retry"])
def test_removal_from_a_space_stops_pushing_its_items_and_the_next_ones_come(world, receiver, when, visibility):
    """SPEC §3: removal stops all delivery from the space at once, from an
    open space too (which its removed members still read: its items went on
    being pushed). The item stays in the inbox (read_inbox shows it,
    docs/decisions.md) but is not pushed."""
    from inbox.delivery import read_inbox

    # given: ada in bo's space `den`; an item from there, then one from the lab
    ada, bo = world["ada"], world["bo"]
    den = services.create_space(slug="den", name="Den", visibility=visibility, send_policy="open", actor=bo)
    services.add_member(den, ada, actor=bo)
    in_den, _ = services.get_or_create_direct(den, ada, actor=bo)
    subscribe(world)
    send_message(in_den, body="den plans", actor=bo)
    send_message(world["direct"], body="lab news", actor=bo)
    if when == "before its retry":
        (job,) = engine.claim_due(10)
        engine.record([engine.Result(job, Outcome(500, None, 5), "whsec", now())])
        receiver.requests.clear()
        Delivery.objects.filter(pk=job.delivery_id).update(due_at=now())
    # when: bo removes ada from the den, and the worker runs
    services.remove_member(den, ada, actor=bo)
    pump()  # may send nothing: a retry it cancels offers the next item, due at once
    while pump():
        pass
    # then: only the lab's item is pushed; the den's stays pending in her inbox
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["lab news"]
    assert [i.payload["content"] for i in read_inbox(ada).items] == ["den plans"]
    # and: the sweep offers nothing for it
    assert mcp.offer_waiting() == 0


def test_a_member_who_joins_again_has_the_items_that_waited_pushed_at_once(world, receiver):
    """They waited for the minute's sweep: the offers made while she was
    away found nothing deliverable."""
    # given: ada removed from bo's open space `den` with an item of it pending, unpushed
    ada, bo = world["ada"], world["bo"]
    den = services.create_space(slug="den", name="Den", visibility="open", send_policy="open", actor=bo)
    services.join_space(den, actor=ada)
    in_den, _ = services.get_or_create_direct(den, ada, actor=bo)
    send_message(in_den, body="den plans", actor=bo)
    services.remove_member(den, ada, actor=bo)
    subscribe(world)
    while pump():
        pass
    assert pushes(receiver) == []
    # when: she joins again
    services.join_space(den, actor=ada)
    # then: the next run pushes it
    pump()
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver)] == ["den plans"]


@pytest.mark.parametrize("by", ["its owner", "an item push's 2xx"])
def test_an_acknowledgement_pushes_the_new_pending_count(world, receiver, by):
    """An acknowledgement appends no event: the pushed count followed new
    items only, and stayed at its highest while the inbox drained."""
    from inbox.delivery import acknowledge_delivery

    # given: ada's pending count pushed, and two items she received
    ada = world["ada"]
    mcp.subscribe(ada, mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    sent = [send_message(world["direct"], body=f"item {n}", actor=world["bo"]).message for n in range(2)]
    while pump():
        pass
    # when: they are acknowledged, by ada or by her item push's receiver
    if by == "its owner":
        for message in sent:
            acknowledge_delivery(ada, InboxItem.objects.get(member=ada, message=message).token, actor=ada)
    else:
        subscribe(world)
    while pump():
        pass
    # then: the last count pushed is the inbox's
    counts = [r.json()["data"]["pendingCount"] for r in pushes(receiver) if r.path == "/pending"]
    assert counts[0] == 2 and counts[-1] == 0, counts
    assert len([r for r in pushes(receiver) if r.path == "/items"]) == (2 if by != "its owner" else 0)


def test_removal_from_an_open_space_stops_pushing_its_work(world, receiver):
    """An open space's work is pushed as a space subscription's wakes are:
    not to a member removed from it (SPEC §3), who still reads its feed."""
    from controlplane.errors import Forbidden

    # given: ada's pushed work of the open lab
    ada, bo, lab = world["ada"], world["bo"], world["direct"].space
    mcp.subscribe(ada, mcp.WORK, {"space": "lab"}, receiver.url("/work"), SECRET, ttl_ms=None)
    # when: bo removes her, and writes in the lab
    services.remove_member(lab, ada, actor=bo)
    send_message(services.create_channel(lab, "news", actor=bo), body="news", actor=bo)
    while pump():
        pass
    # then: nothing is pushed, and she cannot subscribe anew until she joins again
    assert pushes(receiver) == []
    with pytest.raises(Forbidden):
        mcp.subscribe(ada, mcp.WORK, {"space": "lab"}, receiver.url("/work2"), SECRET, ttl_ms=None)
    services.join_space(lab, actor=ada)
    send_message(world["direct"], body="welcome back", actor=bo)
    while pump():
        pass
    assert [r.path for r in pushes(receiver)] == ["/work"]
