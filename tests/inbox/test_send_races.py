"""A send racing its author's or a recipient's removal
(controlplane.access.recheck_writes).

A send reads its author's role and its recipients once, early, without a
lock. A removal that commits between those reads and the send's write must
stop the send, or its delivery to the recipient removed: no message lands
after its author's `member.removed`, nor in the inbox of a recipient after
theirs. The write checks both again under the log head lock it holds, where
a removal committed before is seen and one committing later has to wait for
the head."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from controlplane import services
from controlplane.errors import Conflict, Forbidden
from controlplane.models import Event, EventAddressee, LogHead
from grants import services as grants
from inbox import services as inbox_services
from inbox import writes
from inbox.models import InboxItem, Message
from inbox.services import send_message

pytestmark = pytest.mark.django_db(transaction=True)


def members_and_space(policy: str):
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy=policy, actor=alice)
    for member in (bob, carol):
        services.join_space(space, actor=member)
    if policy == "explicit_only":
        grants.create_grant(space, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol", actor=alice)
    return alice, bob, carol, space


def refused_with_nothing_written(send, bob) -> None:
    with pytest.raises(Forbidden):
        send()
    assert not Message.objects.filter(author=bob).exists()
    assert not InboxItem.objects.filter(sender=bob).exists()
    assert Event.objects.order_by("-position").first().kind == "member.removed"


@pytest.mark.parametrize("policy", ["open", "explicit_only"])
def test_a_removal_committed_after_the_send_read_the_role_stops_the_send(policy, monkeypatch):
    # given: bob's direct conversation with carol, and bob removed by alice
    # once his send has read his role and is resolving its recipients
    alice, bob, carol, space = members_and_space(policy)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    resolve = inbox_services._recipients

    def removed_meanwhile(*args):
        services.remove_member(space, bob, actor=alice)
        return resolve(*args)

    monkeypatch.setattr(inbox_services, "_recipients", removed_meanwhile)
    # when / then: refused as a removed member's send is, and nothing written
    refused_with_nothing_written(lambda: send_message(direct, body="late", actor=bob), bob)


def sent_while_a_removal_holds_the_head(send, remove):
    """What `send()` (in a thread of its own) answers or raises when it
    reaches the log head while `remove()` holds it, in a transaction that
    commits once the send waits there: its statement started before the
    removal committed, so a check in the statement itself would read the
    membership as it was then."""
    outcome = []

    def sending():
        try:
            outcome.append(send())
        except Exception as error:
            outcome.append(error)
        finally:
            connection.close()

    with transaction.atomic():
        LogHead.objects.select_for_update().get(id=1)
        sender = threading.Thread(target=sending)
        sender.start()
        sender.join(1.0)
        assert sender.is_alive()  # past its checks, waiting for the head
        remove()
    sender.join(10)
    assert len(outcome) == 1, outcome
    return outcome[0]


@pytest.mark.postgres
def test_a_removal_committing_while_the_send_waits_for_the_log_head_stops_the_send():
    # given: bob's send to carol, waiting for the log head that alice's removal of bob holds
    alice, bob, carol, space = members_and_space("open")
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    # when
    outcome = sent_while_a_removal_holds_the_head(lambda: send_message(direct, body="late", actor=bob),
                                                  lambda: services.remove_member(space, bob, actor=alice))
    # then
    assert isinstance(outcome, Forbidden), outcome
    assert not Message.objects.filter(author=bob).exists()
    assert Event.objects.order_by("-position").first().kind == "member.removed"


@pytest.mark.postgres
def test_a_group_with_a_removed_party_rolls_back_and_each_write_answers_alone(monkeypatch):
    # given: three writes captured as one group, bob's to carol, carol's to bob and alice's to carol;
    # then bob is removed
    alice, bob, carol, space = members_and_space("open")
    bob_to_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    alice_to_carol, _ = services.get_or_create_direct(space, carol, actor=alice)
    group = []

    def capture(write):
        group.append(write)
        raise LookupError()

    monkeypatch.setattr(writes._group_commit, "write", capture)
    for conversation, author in ((bob_to_carol, bob), (bob_to_carol, carol), (alice_to_carol, alice)):
        with pytest.raises(LookupError):
            send_message(conversation, body="grouped", actor=author)
    monkeypatch.undo()
    services.remove_member(space, bob, actor=alice)
    # when: the group commits
    assert writes._commit_group(group) == []
    # then: nothing of it committed; alone, bob's write is refused, carol's to bob rolls back to be
    # sent again (to no one now) and alice's lands
    assert not Message.objects.filter(body="grouped").exists()
    bobs, carols, alices = group
    refused_with_nothing_written(lambda: writes._write_alone(bobs), bob)
    with pytest.raises(writes.RecipientsRemoved):
        writes._write_alone(carols)
    assert not InboxItem.objects.filter(member=bob).exists()
    writes._write_alone(alices)
    assert Message.objects.get(body="grouped").author == alice


def space_of(visibility: str):
    """alice's space (`visibility`) with bob, carol and dave in it, and their group."""
    alice, bob, carol, dave = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol", "dave"))
    space = services.create_space(slug="lab", name="Lab", visibility=visibility, send_policy="open", actor=alice)
    for member in (bob, carol, dave):
        services.add_member(space, member, actor=alice)
    group, _ = services.get_or_create_group(space, [bob, carol, dave], actor=bob)
    return alice, bob, carol, dave, space, group


def delivered_to_the_rest_only(sent, carol, dave) -> None:
    """`sent` landed after carol's removal, in dave's inbox and not in hers."""
    removal = Event.objects.get(kind="member.removed")
    assert sent.message.position > removal.position
    assert InboxItem.objects.filter(message=sent.message, member=dave).exists()
    assert not InboxItem.objects.filter(member=carol).exists()
    assert "@carol" not in Event.objects.get(position=sent.message.position).data["message"]["mentions"]
    assert not EventAddressee.objects.filter(member=carol).exists()


@pytest.mark.parametrize("visibility", ["open", "private"])
@pytest.mark.parametrize("kind", ["group", "channel mention"])
def test_a_recipient_removed_after_the_send_looked_them_up_gets_nothing(visibility, kind, monkeypatch):
    # given: bob's send to carol and dave; carol is removed once the send has looked its recipients up
    alice, bob, carol, dave, space, group = space_of(visibility)
    conversation = group if kind == "group" else services.create_channel(space, "general", actor=alice)
    resolve, lookups = inbox_services._recipients, []

    def removed_once_looked_up(*args):
        found = resolve(*args)
        if not lookups:
            services.remove_member(space, carol, actor=alice)
        lookups.append([m.handle for m in found])
        return found

    monkeypatch.setattr(inbox_services, "_recipients", removed_once_looked_up)
    # when
    sent = send_message(conversation, body="for @carol and @dave", actor=bob)
    # then: written again, to whom it goes now
    assert lookups == [["carol", "dave"], ["dave"]]
    delivered_to_the_rest_only(sent, carol, dave)


@pytest.mark.postgres
def test_a_recipients_removal_committing_while_the_send_waits_for_the_log_head_stops_their_delivery():
    # given: bob's send to carol and dave, waiting for the log head that alice's removal of carol holds
    alice, bob, carol, dave, space, group = space_of("private")
    # when
    outcome = sent_while_a_removal_holds_the_head(lambda: send_message(group, body="late", actor=bob),
                                                  lambda: services.remove_member(space, carol, actor=alice))
    # then
    assert not isinstance(outcome, Exception), outcome
    delivered_to_the_rest_only(outcome, carol, dave)


def test_a_send_that_finds_recipients_removed_every_time_is_a_conflict_and_writes_nothing(monkeypatch):
    alice, bob, carol, dave, space, group = space_of("open")
    monkeypatch.setattr(writes, "recheck_writes", lambda authors, recipients: {recipients[0]})
    with pytest.raises(Conflict):
        send_message(group, body="never", actor=bob)
    assert not Message.objects.filter(body="never").exists() and not InboxItem.objects.exists()
