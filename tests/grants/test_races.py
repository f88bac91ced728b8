"""Races closed in the database, on PostgreSQL with real concurrent
transactions: a send racing a revocation is admitted before the fence or
refused, never half."""
import threading

import pytest
from django.db import connections

from controlplane import services
from controlplane.errors import GrantRequired
from grants import barrier
from grants import services as grants
from grants.models import Grant
from inbox.models import InboxItem, Message, Recipient
from inbox.services import send_message

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
SENDERS = 6


def test_sends_racing_a_revocation_are_admitted_before_the_fence_or_refused():
    # given: bob may message carol under a pair grant
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    pair, _ = grants.create_grant(space, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol",
                                  actor=alice)
    refused, errors, admitted_enough = [], [], threading.Event()

    def keep_sending(worker: int):
        # Each sender sends until it is refused: some sends commit before the
        # fence, some race it, the last one of each comes after it.
        try:
            for n in range(500):
                try:
                    send_message(direct, body=f"{worker}:{n}", actor=bob)
                except GrantRequired:
                    refused.append(worker)
                    return
                if Message.objects.count() >= 2 * SENDERS:
                    admitted_enough.set()
            errors.append(f"sender {worker} was never refused")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=keep_sending, args=(w,)) for w in range(SENDERS)]
    for thread in threads:
        thread.start()
    # when: the owner revokes while the senders are going
    assert admitted_enough.wait(30)
    barrier.revoke(Grant.objects.get(pk=pair.pk), actor=alice)
    for thread in threads:
        thread.join(60)
    # then: every sender was refused exactly once, with nothing stored for it
    assert errors == [] and sorted(refused) == list(range(SENDERS))
    messages = list(Message.objects.order_by("position"))
    assert len(messages) >= 2 * SENDERS
    # every admitted message is whole: one handling row and one item, under the grant
    assert Recipient.objects.filter(grant=pair).count() == len(messages)
    assert InboxItem.objects.filter(grant=pair).count() == len(messages)
    # and the barrier settled every one of them: nothing was acknowledged, so all are rejected
    assert set(Recipient.objects.values_list("state", flat=True)) == {"rejected"}
    assert set(InboxItem.objects.filter(grant=pair).values_list("state", flat=True)) == {"rejected"}
    notices = list(InboxItem.objects.filter(kind="rejected").order_by("position", "id"))
    assert [n.payload["postId"] for n in notices] == [m.public_id for m in messages]
    assert Grant.objects.get(pk=pair.pk).status == "revoked"


def test_concurrent_sends_consume_a_one_message_grant_once():
    # given: a one-message grant, and the same send retried from several clients at once
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    grants.create_grant(space, grant_id="grt_once", kind="one_message", sender="@bob", recipient="@carol",
                        idempotency_key="key-00001", actor=alice)
    results, start = [], threading.Barrier(SENDERS)

    def send():
        try:
            start.wait(10)
            results.append(send_message(direct, body="once", idempotency_key="key-00001", actor=bob))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # then: one message; every caller got it back, exactly one as its creator
    assert Message.objects.count() == 1
    assert all(not isinstance(r, Exception) for r in results), results
    assert {r.message.pk for r in results} == {Message.objects.get().pk}
    assert sum(r.created for r in results) == 1
    assert Grant.objects.get(public_id="grt_once").message_id == Message.objects.get().pk


def test_answers_to_two_collectives_read_each_others_answerers_grants_without_deadlocking():
    """Each answer reads the grants of every answer before it (its result
    carries them). Two answers, each the last of one gather and the first
    of the other's answerer, held each one answerer's grants and waited for
    the other's: a deadlock (503) until an answer took them all at once."""
    from django.db.models.signals import post_save

    from inbox import collectives
    from inbox.models import Collective, CollectiveAnswer
    from tests.conftest import at_once, meeting_point

    # given: two gathers of alice's to bob and carol, who may each answer her; bob answered the first,
    # carol the second
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    root = services.create_member("root", is_admin=True, actor=None)
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    for n, (sender, recipient) in enumerate([("alice", "bob"), ("alice", "carol"), ("bob", "alice"),
                                             ("carol", "alice")]):
        grants.create_grant(space, grant_id=f"grt_{n}", kind="pair", sender=f"@{sender}", recipient=f"@{recipient}",
                            actor=root)
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    first, second = (send_message(group, body=f"Vote {n}?", actor=alice,
                                  collective={"op": "gather", "deadline_ms": 3_600_000}).message for n in (1, 2))
    collectives.answer(first, "bob on 1", actor=bob)
    collectives.answer(second, "carol on 2", actor=carol)
    # when: each answers the other at once, the two meeting once each has written its answer
    meet = meeting_point(2)

    def met(sender, **kwargs):
        meet()

    def answering(message, member):
        def answer():
            try:
                collectives.answer(message, f"{member.handle} again", actor=member)
                return "ok"
            except Exception as error:  # noqa: BLE001 (the deadlock, as the test's failure)
                return f"{type(error).__name__}: {error}"
        return answer

    post_save.connect(met, sender=CollectiveAnswer)
    try:
        outcomes = at_once(answering(first, carol), answering(second, bob))
    finally:
        post_save.disconnect(met, sender=CollectiveAnswer)
    # then: both answered, and both operations completed with both answers
    assert outcomes == ["ok", "ok"]
    assert list(Collective.objects.values_list("state", flat=True)) == ["completed", "completed"]
