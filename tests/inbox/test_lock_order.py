"""Lock order (PostgreSQL, inbox.mailbox.lock): every writer takes the
mailboxes it counts into or out of in member order, before the log head, as
a send's statement does, so no two writers wait for each other in a cycle.

Each test holds a lock on another connection as a concurrent writer would,
starts the writer under test in a thread, waits past PostgreSQL's
deadlock_timeout (1 s: a cycle would have been broken by then), takes the
concurrent writer's next lock, and checks that both finished."""
from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from controlplane import services
from controlplane.clock import now
from controlplane.models import LogHead
from inbox import writes
from inbox.models import Collective, Mailbox, Message
from inbox.services import send_message

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
MAILBOX = Mailbox._meta.db_table


class Captured(Exception):
    pass


def other_writer() -> psycopg.Connection:
    params = connection.get_connection_params()
    return psycopg.connect(host=params.get("host"), port=params.get("port"), user=params.get("user"),
                           dbname=params["dbname"])


def in_thread(work) -> tuple[threading.Thread, list]:
    """`work()` on its own connection; its results (or its exception) land in the list."""
    results = []

    def run():
        try:
            results.append(work())
        except Exception as error:  # a deadlock victim
            results.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(1.5)  # past deadlock_timeout
    return thread, results


def row_lock(table: str, value, *, column: str = "id", mode: str = "FOR NO KEY UPDATE") -> tuple[str, list]:
    """A statement taking one row's lock, for `crossing`."""
    return f"SELECT 1 FROM {table} WHERE {column} = %s {mode}", [value]


def crossing(held: tuple[str, list], work, then: tuple[str, list]) -> tuple[threading.Thread, list]:
    """This module's protocol: another writer runs `held`; `work()` starts on
    its own connection (`in_thread`, past deadlock_timeout); the other
    writer runs `then` and commits. Returns `work`'s thread, joined for up to
    10 s, and its results."""
    other = other_writer()
    other.execute(*held)
    thread, results = in_thread(work)
    other.execute(*then)
    other.commit()
    other.close()
    thread.join(10)
    return thread, results


def grouped_sends(monkeypatch, *, with_mailboxes: bool):
    """Two direct sends from `owner` (to high, then to low) captured as one
    group before they run; (low, high, the group)."""
    owner = services.create_member("owner", actor=None)
    low, high = (services.create_member(h, actor=None) for h in ("low", "high"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=owner)
    for member in (low, high):
        services.join_space(space, actor=member)
    to_low, _ = services.get_or_create_direct(space, low, actor=owner)
    to_high, _ = services.get_or_create_direct(space, high, actor=owner)
    if with_mailboxes:
        send_message(to_low, body="first", actor=owner)
        send_message(to_high, body="first", actor=owner)
    else:
        Mailbox.objects.filter(member__in=[low, high]).delete()
    group = []

    def capture(write):
        group.append(write)
        raise Captured()

    monkeypatch.setattr(writes._group_commit, "write", capture)
    for conversation in (to_high, to_low):
        with pytest.raises(Captured):
            send_message(conversation, body="grouped", actor=owner)
    monkeypatch.undo()
    return low, high, group


def test_a_group_sending_to_two_members_waits_for_an_acknowledgement_holding_both_in_order(monkeypatch):
    # given
    low, high, group = grouped_sends(monkeypatch, with_mailboxes=True)
    # when: an acknowledgement's transaction holds low's mailbox (taken first, in
    # member order) while the group starts, then takes high's
    _, results = crossing(row_lock(MAILBOX, low.pk, column="member_id", mode="FOR UPDATE"),
                          lambda: writes._commit_group(group),
                          row_lock(MAILBOX, high.pk, column="member_id", mode="FOR UPDATE"))
    # then: the acknowledgement got both rows, and the group committed whole
    assert len(results) == 1 and len(results[0]) == 2
    assert Message.objects.filter(body="grouped").count() == 2


def test_a_group_makes_its_new_mailboxes_in_member_order(monkeypatch):
    """Members no send has reached yet have no mailbox row: each statement
    of a group would make its own as it runs, in arrival order, while a
    single send making the same two rows goes in member order."""
    # given
    low, high, group = grouped_sends(monkeypatch, with_mailboxes=False)
    # when: another writer makes low's row (member order) while the group starts, then high's
    insert = f"INSERT INTO {MAILBOX} (member_id, pending_bytes, firewall) VALUES (%s, 0, false)"
    _, results = crossing((insert, [low.pk]), lambda: writes._commit_group(group), (insert, [high.pk]))
    # then: no cycle: the other writer made both rows and the group committed whole
    assert len(results) == 1 and len(results[0]) == 2
    assert Message.objects.filter(body="grouped").count() == 2


def test_a_suspension_notice_takes_its_owners_mailbox_before_the_log_head(receiver, api_for, monkeypatch):
    """The worker recording a 410 posts a notice into the owner's inbox; a
    send addressed to the owner holds that mailbox and wants the log head
    next. The notice must wait for the mailbox without holding the log head."""
    from webhooks import engine
    from webhooks.models import Subscription
    from webhooks.transport import Outcome

    # given: alice's space subscription has a delivery claimed by this "worker"
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)  # no engine runs on its own
    alice, bob = (services.create_member(h, actor=None) for h in ("alice", "bob"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    general = services.create_channel(space, "general", actor=alice)
    as_alice = api_for(alice)
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]
    as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    created = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                            {"endpoint_id": endpoint["id"], "debounce_ms": 0}).json()["subscription"]
    as_alice.post(f"/v0/spaces/lab/webhook-subscriptions/{created['id']}/activate")
    Mailbox.objects.get_or_create(member=alice)
    send_message(general, body="wake alice", actor=bob)
    (job,) = engine.claim_due(10)
    result = engine.Result(job, Outcome(status_code=410, error_class=None, duration_ms=3), "key", now())
    # when: a send to alice holds her mailbox while the worker records the 410
    # then: the send takes the log head next without a cycle, and both finish
    recording, results = crossing(row_lock(MAILBOX, alice.pk, column="member_id", mode="FOR UPDATE"),
                                  lambda: engine.record([result]),
                                  ("UPDATE controlplane_loghead SET position = position WHERE id = 1", []))
    assert results == [[]] and not recording.is_alive()  # recorded, nothing handed on
    assert Subscription.objects.get(public_id=created["id"]).status == "suspended"


def test_recording_a_batch_does_not_hold_what_a_sends_commit_checks_its_keys_against(receiver, api_for, monkeypatch):
    """A send's transaction inserts deliveries for the subscriptions it wakes;
    at its COMMIT, PostgreSQL checks their (deferred) foreign keys with a
    key-share lock on each subscription. A worker recording a batch must not
    hold its subscriptions' rows against that while it waits for a mailbox
    the send holds."""
    from webhooks import engine
    from webhooks.models import Delivery, Subscription
    from webhooks.transport import Outcome

    # given: alice's subscription has a delivery claimed by this "worker", answered 500
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)
    alice, bob = (services.create_member(h, actor=None) for h in ("alice", "bob"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    general = services.create_channel(space, "general", actor=alice)
    as_alice = api_for(alice)
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]
    as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    created = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                            {"endpoint_id": endpoint["id"], "debounce_ms": 0}).json()["subscription"]
    as_alice.post(f"/v0/spaces/lab/webhook-subscriptions/{created['id']}/activate")
    Mailbox.objects.get_or_create(member=alice)
    send_message(general, body="wake alice", actor=bob)
    (job,) = engine.claim_due(10)
    result = engine.Result(job, Outcome(status_code=500, error_class=None, duration_ms=3), "key", now())
    subscription = Subscription.objects.get(public_id=created["id"])
    # when: a send holds alice's mailbox while the worker records, then commits
    recording, results = crossing(row_lock(MAILBOX, alice.pk, column="member_id", mode="FOR UPDATE"),
                                  lambda: engine.record([result]),
                                  row_lock(Subscription._meta.db_table, subscription.pk, mode="FOR KEY SHARE"))
    # then: both finished; the delivery waits for its retry
    assert results == [[]] and not recording.is_alive()  # recorded, nothing handed on
    assert Delivery.objects.get(pk=job.delivery_id).state == "pending"


def test_an_owners_acknowledgement_takes_its_mailbox_before_the_item(api_for):
    """A push worker's record holds the mailboxes of the items it settles
    (taken first, in member order) and then takes the items. The owner
    acknowledging one of those items by token must wait for the mailbox
    without holding the item."""
    from inbox.models import InboxItem

    # given: bob has one pending item from alice
    alice, bob = (services.create_member(h, actor=None) for h in ("alice", "bob"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="for bob", actor=alice)
    item, as_bob = InboxItem.objects.get(member=bob), api_for(bob)
    # when: a record holds bob's mailbox while bob acknowledges, then takes the item
    acknowledging, results = crossing(
        row_lock(MAILBOX, bob.pk, column="member_id"),
        lambda: as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": item.token}).status_code,
        row_lock(InboxItem._meta.db_table, item.pk))
    # then: no cycle: both finished, and the item is acknowledged
    assert results == [200] and not acknowledging.is_alive()
    item.refresh_from_db()
    assert item.state == InboxItem.State.ACKNOWLEDGED


def test_a_revocation_barrier_takes_its_recipients_mailboxes_before_their_items():
    """An acknowledgement holds its owner's mailbox and then takes the item
    (inbox.delivery._settle_sql). The barrier settling a revoked grant's
    items must wait for the mailbox without holding them: a reader
    acknowledging an item read just before the grant was revoked deadlocked
    against it (the fault matrix, docs/reliability.md)."""
    from grants import barrier
    from grants import services as grants
    from grants.models import Grant
    from inbox.models import InboxItem

    # given: an item bob sent carol under a pair grant, withheld as the revocation starts
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    for member in (bob, carol):
        services.join_space(space, actor=member)
    grant = grants.create_grant(space, grant_id="grt_pair", kind="pair", actor=alice, sender="@bob",
                                recipient="@carol")[0]
    conversation, _ = services.get_or_create_direct(space, carol, actor=bob)
    send_message(conversation, body="under the grant", actor=bob)
    item = InboxItem.objects.get(member=carol, grant=grant)
    barrier.start_barrier(grant.pk, ending=Grant.Status.REVOKED, actor=alice)
    # when: carol's acknowledgement holds her mailbox while the barrier settles, then takes the item
    _, results = crossing(row_lock(MAILBOX, carol.pk, column="member_id"),
                          lambda: barrier.finish_barrier(grant.pk),
                          row_lock(InboxItem._meta.db_table, item.pk))
    # then: no cycle: both finished, the grant is revoked and the item rejected
    assert len(results) == 1 and isinstance(results[0], Grant) and results[0].status == Grant.Status.REVOKED
    item.refresh_from_db()
    assert item.state == InboxItem.State.REJECTED


def test_deleting_a_subscription_takes_its_deliveries_before_itself():
    """A worker recording a failure holds the delivery, then locks its
    subscription to suspend it: a delete must not hold the subscription
    while it waits for the delivery."""
    from webhooks import services as webhooks_services
    from webhooks.models import Delivery, Endpoint, Subscription

    # given: a subscription with a delivery being recorded
    owner = services.create_member("owner", actor=None)
    endpoint = Endpoint.objects.create(owner=owner, url="https://receiver.example/hook")
    subscription = Subscription.objects.create(owner=owner, endpoint=endpoint, kind=Subscription.Kind.INBOX,
                                               status=Subscription.Status.ACTIVE)
    delivery = Delivery.objects.create(subscription=subscription, after_position=0, through_position=1,
                                       state=Delivery.State.SENDING, due_at=now())
    # when: the owner deletes the subscription meanwhile, and the worker goes on to suspend it
    _, results = crossing(row_lock(Delivery._meta.db_table, delivery.pk),
                          lambda: webhooks_services.delete_subscription(subscription),
                          row_lock(Subscription._meta.db_table, subscription.pk))
    # then: no cycle: both finished, and the delivery is cancelled with its subscription
    assert results == [None]
    delivery.refresh_from_db()
    subscription.refresh_from_db()
    assert (delivery.state, subscription.status) == (Delivery.State.CANCELLED, Subscription.Status.DELETED)


def test_deleting_an_endpoint_while_a_worker_records_its_attempt(receiver, api_for, monkeypatch):
    """A worker recording a batch inserts its attempts (their foreign keys
    checked at COMMIT), then finishes the deliveries it holds. An owner
    deleting the endpoint meanwhile must wait for that record and keep what
    it recorded: a delete that removed the delivery failed at its own
    COMMIT on the attempt's foreign key (a 500)."""
    from webhooks import engine
    from webhooks.models import Attempt, Delivery

    # given: alice's delivery claimed by a worker, whose record inserted its attempt and finished it
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)
    alice = services.create_member("alice", actor=None)
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    general = services.create_channel(space, "general", actor=alice)
    as_alice = api_for(alice)
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url()}).json()["endpoint"]["id"]
    as_alice.post(f"/v0/webhook-endpoints/{endpoint}/verify")
    created = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                            {"endpoint_id": endpoint, "debounce_ms": 0}).json()["subscription"]
    as_alice.post(f"/v0/spaces/lab/webhook-subscriptions/{created['id']}/activate")
    send_message(general, body="wake alice", actor=alice)
    (job,) = engine.claim_due(10)
    recorded = (f"WITH attempt AS (INSERT INTO {Attempt._meta.db_table} "
                f"(delivery_id, number, started_at, duration_ms, status_code, key_id) "
                f"VALUES (%s, %s, now(), 5, 202, 'key')) "
                f"UPDATE {Delivery._meta.db_table} SET state = 'delivered', finished_at = now(), claimed_until = NULL "
                f"WHERE id = %s AND state = 'sending' AND attempts = %s",
                [job.delivery_id, job.number, job.delivery_id, job.number])
    # when: alice deletes the endpoint meanwhile, and the worker commits
    deleting, results = crossing(recorded, lambda: as_alice.delete(f"/v0/webhook-endpoints/{endpoint}").status_code,
                                 ("SELECT 1", []))
    # then: the delete succeeded, and the delivery is recorded as delivered with its attempt
    assert results == [204] and not deleting.is_alive()
    assert Delivery.objects.get(pk=job.delivery_id).state == Delivery.State.DELIVERED
    assert Attempt.objects.filter(delivery_id=job.delivery_id).count() == 1


def pending_gather():
    """alice's gather to her group with bob and carol, pending; dave shares
    the space (a sender to alice). (alice, bob, carol, dave, the space, the
    operation)"""
    alice, bob, carol, dave = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol", "dave"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    for member in (bob, carol, dave):
        services.join_space(space, actor=member)
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    send_message(group, body="Vote?", collective={"op": "gather", "deadline_ms": 600_000}, actor=alice)
    return alice, bob, carol, dave, space, Collective.objects.get()


def test_removing_a_member_of_a_pending_collective_takes_the_requesters_mailbox_before_the_log_head():
    """A removal fails the operations that count on the member and tells
    their requesters. A send addressed to the requester holds her mailbox
    and wants the log head next: the removal must wait for the mailbox
    without holding the log head (it failed them from an append hook, under
    the log head, and deadlocked)."""
    # given: alice's gather counts on bob; dave writes to alice
    alice, bob, _, dave, space, collective = pending_gather()
    to_alice, _ = services.get_or_create_direct(space, alice, actor=dave)
    send_message(to_alice, body="hi", actor=dave)
    # when: dave's send holds alice's mailbox while bob is removed, then takes the log head
    removing, results = crossing(row_lock(MAILBOX, alice.pk, column="member_id"),
                                 lambda: services.remove_member(space, bob, actor=alice),
                                 row_lock(LogHead._meta.db_table, 1))
    # then: no cycle: the removal finished and the operation failed
    assert results == [None] and not removing.is_alive()
    collective.refresh_from_db()
    assert (collective.state, collective.reason) == ("failed", "member_removed")


def test_removing_a_member_of_a_collective_being_finished_takes_the_operation_before_the_log_head():
    """The minute schedule finishing an operation (or its last answer) holds
    its row and then appends the result: a removal failing the same
    operation must wait for the row without holding the log head."""
    # given: alice's gather counts on carol
    alice, _, carol, _, space, collective = pending_gather()
    # when: a finisher holds the operation's row while carol is removed, then takes the log head
    removing, results = crossing(row_lock(Collective._meta.db_table, collective.pk),
                                 lambda: services.remove_member(space, carol, actor=alice),
                                 row_lock(LogHead._meta.db_table, 1))
    # then: no cycle: the removal finished and the operation failed once
    assert results == [None] and not removing.is_alive()
    collective.refresh_from_db()
    assert (collective.state, collective.reason) == ("failed", "member_removed")


def test_an_approval_takes_its_senders_mailbox_before_the_log_head():
    """Approving sends the retained message and posts the sender's notice in
    one transaction; a send addressed to the sender holds their mailbox and
    wants the log head next. The approval must wait for that mailbox before
    its send takes the log head."""
    from controlplane.errors import GrantRequired
    from grants import approvals

    # given: bob's send to carol in an explicit_only space, retained for approval
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    root = services.create_member("root", actor=None, is_admin=True)
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    for member in (bob, carol):
        services.join_space(space, actor=member)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    with pytest.raises(GrantRequired) as refused:
        send_message(direct, body="please", idempotency_key="please-0001", request_approval=True, actor=bob)
    request = approvals.visible_approval_request(refused.value.details["approval_request"]["id"], root)
    Mailbox.objects.get_or_create(member=bob)
    # when: a send to bob holds his mailbox while the approval runs, then takes the log head
    approving, results = crossing(row_lock(MAILBOX, bob.pk, column="member_id", mode="FOR UPDATE"),
                                  lambda: approvals.approve(request, actor=root),
                                  ("UPDATE controlplane_loghead SET position = position WHERE id = 1", []))
    # then: no cycle: both finished, the message went and bob has his notice
    assert not approving.is_alive() and [r.status for r in results] == ["approved"]
    assert Message.objects.filter(body="please").count() == 1
