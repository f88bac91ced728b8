"""A send racing its author's removal (controlplane.access.recheck_senders).

A send reads its author's role once, early, without a lock. A removal that
commits between that read and the send's write must stop the send: no
message lands after its author's `member.removed`. The write checks the
author again under the log head lock it holds, where a removal committed
before is seen and one committing later has to wait for the head."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from controlplane import services
from controlplane.errors import Forbidden
from controlplane.models import Event, LogHead
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


@pytest.mark.postgres
def test_a_removal_committing_while_the_send_waits_for_the_log_head_stops_the_send():
    """The write's statement started before the removal committed: a check
    in the statement itself would read the membership as it was then."""
    # given: bob's send to carol, waiting for the log head that alice's removal of bob holds
    alice, bob, carol, space = members_and_space("open")
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    outcome = []

    def send():
        try:
            outcome.append(send_message(direct, body="late", actor=bob))
        except Exception as error:
            outcome.append(error)
        finally:
            connection.close()

    with transaction.atomic():
        LogHead.objects.select_for_update().get(id=1)
        sender = threading.Thread(target=send)
        sender.start()
        sender.join(1.0)
        assert sender.is_alive()  # past its role check, waiting for the head
        services.remove_member(space, bob, actor=alice)
    sender.join(10)
    # then
    assert len(outcome) == 1 and isinstance(outcome[0], Forbidden), outcome
    assert not Message.objects.filter(author=bob).exists()
    assert Event.objects.order_by("-position").first().kind == "member.removed"


@pytest.mark.postgres
def test_a_group_with_a_removed_author_rolls_back_and_each_write_answers_alone(monkeypatch):
    # given: two writes captured as one group, bob's and carol's; then bob is removed
    alice, bob, carol, space = members_and_space("open")
    to_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    to_bob, _ = services.get_or_create_direct(space, bob, actor=carol)
    group = []

    def capture(write):
        group.append(write)
        raise LookupError()

    monkeypatch.setattr(writes._group_commit, "write", capture)
    for conversation, author in ((to_carol, bob), (to_bob, carol)):
        with pytest.raises(LookupError):
            send_message(conversation, body="grouped", actor=author)
    monkeypatch.undo()
    services.remove_member(space, bob, actor=alice)
    # when: the group commits
    assert writes._commit_group(group) == []
    # then: nothing of it committed; alone, bob's write is refused and carol's lands
    assert not Message.objects.filter(body="grouped").exists()
    bobs, carols = group
    refused_with_nothing_written(lambda: writes._write_alone(bobs), bob)
    writes._write_alone(carols)
    assert Message.objects.get(body="grouped").author == carol
