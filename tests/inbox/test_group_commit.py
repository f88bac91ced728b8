"""Group commit (inbox.writes._GroupCommit): concurrent sends of one process
share one transaction on PostgreSQL, and a group with a failing send falls
back to each send on its own, so every sender gets exactly the answer it
would have had alone. The commit-order guarantee under grouped writers is
tests/test_commit_order.py."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from controlplane import log, services
from controlplane.errors import ApiError
from controlplane.tracing import begin_request, end_request
from inbox import mailbox, writes
from inbox.models import InboxItem, Mailbox, Message, Recipient
from inbox.services import send_message
from webhooks.models import Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def lab():
    owner = services.create_member("owner", actor=None)
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=owner)
    channel = services.create_channel(space, "general", actor=owner)
    senders = [services.create_member(f"sender{i}", actor=None) for i in range(4)]
    for member in senders:
        services.join_space(space, actor=member)
    return channel, owner, senders


class HeldFirstGroup:
    """An append hook that holds the first group's transaction (its log head
    lock) until `waiting` more writes have queued behind it, so the next
    group is known to hold them all; it records every group's entries."""

    def __init__(self, waiting: int) -> None:
        self.waiting, self.groups = waiting, []

    def __call__(self, entries) -> None:
        if not self.groups:
            deadline = time.monotonic() + 10
            while len(writes._group_commit._queue) < self.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
        self.groups.append([position for position, _ in entries])


def _send_all(calls) -> list:
    """Run each call in its own thread, the first one first; their results
    (or the exceptions they raised), in call order."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    threads[0].start()
    time.sleep(0.05)  # the first leads (and is held by the hook) before the others queue
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(20)
    return results


def test_sends_queued_behind_a_commit_share_the_next_one(lab, monkeypatch):
    # given: a hook that holds the first group until three sends queue behind it
    channel, owner, senders = lab
    hook = HeldFirstGroup(waiting=3)
    monkeypatch.setattr(log, "_APPEND_HOOKS", [*log._APPEND_HOOKS, hook])
    # when: four members send at once, each mentioning the owner
    results = _send_all([lambda m=m: send_message(channel, body=f"@owner from {m.handle}", actor=m)
                         for m in senders])
    # then: the first commits alone, the other three in one group, at consecutive positions
    assert all(result.created for result in results), results
    positions = [result.message.position for result in results]
    assert hook.groups[0] == [positions[0]]
    assert sorted(hook.groups[1]) == sorted(positions[1:]) and len(hook.groups) == 2
    assert hook.groups[1] == list(range(hook.groups[1][0], hook.groups[1][0] + 3))
    # and: every message has the rows a lone send writes
    for result in results:
        message = Message.objects.get(pk=result.message.pk)
        assert message.position == result.message.position
        assert list(Recipient.objects.filter(message=message).values_list("member_id", flat=True)) == [owner.pk]
        assert InboxItem.objects.filter(message=message, member=owner, state="pending").count() == 1
    box = Mailbox.objects.get(member=owner)
    assert box.pending_bytes == sum(i.content_bytes for i in InboxItem.objects.filter(member=owner))


def test_a_full_mailbox_in_a_group_fails_only_its_own_send(lab, monkeypatch):
    # given: the owner's mailbox is full; sender1's message is for the owner,
    # the others' for sender0
    channel, owner, senders = lab
    Mailbox.objects.update_or_create(member=owner, defaults={"pending_bytes": mailbox.MAILBOX_LIMIT_BYTES})
    hook = HeldFirstGroup(waiting=3)
    monkeypatch.setattr(log, "_APPEND_HOOKS", [*log._APPEND_HOOKS, hook])
    bodies = ["@sender1 first", "@owner full", "@sender0 third", "@sender0 fourth"]
    # when
    results = _send_all([lambda m=m, b=b: send_message(channel, body=b, actor=m) for m, b in zip(senders, bodies)])
    # then: the full mailbox's send is MAILBOX_FULL, the others are stored
    assert isinstance(results[1], ApiError) and results[1].code == "MAILBOX_FULL"
    assert [r.created for i, r in enumerate(results) if i != 1] == [True, True, True]
    assert not Message.objects.filter(body="@owner full").exists()
    # and: the failed group rolled back whole, so its counters are those of the sends that landed
    assert Mailbox.objects.get(member=owner).pending_bytes == mailbox.MAILBOX_LIMIT_BYTES
    box = Mailbox.objects.get(member=senders[0])
    assert box.pending_bytes == sum(i.content_bytes for i in InboxItem.objects.filter(member=senders[0]))
    assert InboxItem.objects.filter(member=senders[0]).count() == 2


def test_one_key_twice_in_a_group_stores_one_message(lab, monkeypatch):
    # given
    channel, owner, senders = lab
    hook = HeldFirstGroup(waiting=2)
    monkeypatch.setattr(log, "_APPEND_HOOKS", [*log._APPEND_HOOKS, hook])
    first, retrier = senders[0], senders[1]
    # when: the same request twice (same sender, key and body) queues in one group
    results = _send_all([lambda: send_message(channel, body="hello", actor=first),
                         lambda: send_message(channel, body="again", idempotency_key="k1", actor=retrier),
                         lambda: send_message(channel, body="again", idempotency_key="k1", actor=retrier)])
    # then: one message under the key; the other answer replays it
    stored = Message.objects.filter(author=retrier, idempotency_key="k1")
    assert stored.count() == 1
    assert {results[1].message.pk, results[2].message.pk} == {stored.get().pk}
    assert sorted([results[1].created, results[2].created]) == [False, True]


def test_a_group_keeps_each_sends_request_id_for_the_wake_it_causes(lab, monkeypatch):
    # given: the owner's space subscription, and a hook that holds the first group until three sends queue
    channel, owner, senders = lab
    endpoint = Endpoint.objects.create(owner=owner, url="https://receiver.example/hook")
    subscription = Subscription.objects.create(owner=owner, endpoint=endpoint, kind=Subscription.Kind.SPACE,
                                               space=channel.space, status=Subscription.Status.ACTIVE,
                                               activation_position=0, debounce_ms=60_000)
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)  # nothing is sent here
    hook = HeldFirstGroup(waiting=3)
    monkeypatch.setattr(log, "_APPEND_HOOKS", [*log._APPEND_HOOKS, hook])

    def send_under(request_id, member):
        _, token = begin_request(request_id)
        try:
            return send_message(channel, body="status", actor=member)
        finally:
            end_request(token)

    # when: four members send at once, each under its own request id
    results = _send_all([lambda n=n, m=m: send_under(f"req-{n}", m) for n, m in enumerate(senders)])
    # then: the last three committed together, in the leader's thread, and the wake names every send
    assert not [r for r in results if isinstance(r, Exception)]
    assert [len(group) for group in hook.groups] == [1, 3]
    wake = Delivery.objects.get(subscription=subscription)
    assert sorted(wake.request_ids.split()) == ["req-0", "req-1", "req-2", "req-3"]
