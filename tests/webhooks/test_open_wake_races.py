"""One open wake per subscription (`one_open_delivery`), opened by writers
that do not all hold the log head (PostgreSQL: real concurrent
transactions)."""
import base64
import datetime as dt
import threading

import pytest
from django.db import connections, transaction

from controlplane import services
from controlplane.clock import now
from controlplane.log import log_head
from grants import services as grants
from grants.models import Grant
from inbox import mailbox
from inbox.delivery import acknowledge_items
from inbox.models import InboxItem
from inbox.services import send_message
from webhooks import crypto
from webhooks.mcp import PENDING
from tests.conftest import someone_waits_for_a_lock
from webhooks.models import Delivery, Endpoint, Subscription

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_an_event_for_a_member_whose_pushed_item_is_acknowledged_meanwhile_joins_that_wake(monkeypatch):
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)  # nothing is sent: the rows are under test
    # given carol's MCP inbox.pending push, and one pending item of hers, its wake sent
    alice, bob, carol = (services.create_member(h, actor=None) for h in ("alice", "bob", "carol"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    for member in (bob, carol):
        services.join_space(space, actor=member)
    endpoint = Endpoint.objects.create(owner=carol, url="https://127.0.0.1:9/hook", managed=True,
                                       secret=crypto.seal_secret("whsec_" + base64.b64encode(b"k" * 32).decode()))
    subscription = Subscription.objects.create(
        owner=carol, endpoint=endpoint, kind=Subscription.Kind.INBOX, status=Subscription.Status.ACTIVE,
        activation_position=log_head().position, debounce_ms=0, mcp_name=PENDING, mcp_arguments={},
        lease_expires_at=now() + dt.timedelta(hours=1))
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    send_message(direct, body="hello", actor=bob)
    Delivery.objects.filter(subscription=subscription).update(state=Delivery.State.DELIVERED)
    item = InboxItem.objects.get(member=carol)
    opened, release, errors = threading.Event(), threading.Event(), []

    def pushed_item_answered_2xx():
        # what webhooks.engine.record does with a pushed item's 2xx: its hook opens carol's pending-count wake
        try:
            with transaction.atomic():
                mailbox.lock([carol.pk])
                acknowledge_items([item.pk])
                opened.set()
                release.wait(10)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(("acknowledge", repr(exc)))
        finally:
            connections.close_all()

    def owner_grants():
        # an event addressed to carol, appended under the log head (not her mailbox's lock, as a send would take)
        try:
            opened.wait(10)
            grants.create_grant(space, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol",
                                actor=alice)
        except Exception as exc:  # noqa: BLE001
            errors.append(("grant", repr(exc)))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=pushed_item_answered_2xx), threading.Thread(target=owner_grants)]
    for thread in threads:
        thread.start()
    assert opened.wait(10)
    waited = someone_waits_for_a_lock()
    release.set()
    for thread in threads:
        thread.join(20)
    # when the grant's event found the open wake uncommitted, it waited for it
    assert waited
    # then both commit (the grant was a 500) and carol has one open wake, which carries the grant's event
    assert errors == [] and Grant.objects.filter(public_id="grt_pair").exists()
    wake = Delivery.objects.get(subscription=subscription, state=Delivery.State.OPEN)
    assert wake.through_position == log_head().position


def test_a_replay_racing_the_deletion_of_its_subscription_leaves_nothing_to_send(monkeypatch):
    """Deletion cancelled the unfinished deliveries, then marked the
    subscription deleted; a replay holding the subscription's lock added its
    copy between the two, and it stayed pending for good."""
    from webhooks import services as webhooks_services

    # given: alice's active subscription and a delivered wake of it
    alice = services.create_member("alice", actor=None)
    endpoint = Endpoint.objects.create(owner=alice, url="https://127.0.0.1:9/hook")
    subscription = Subscription.objects.create(owner=alice, endpoint=endpoint, kind=Subscription.Kind.INBOX,
                                               status=Subscription.Status.ACTIVE, activation_position=0)
    sent = Delivery.objects.create(subscription=subscription, after_position=0, through_position=1,
                                   state=Delivery.State.DELIVERED, due_at=now())
    copied, release, errors = threading.Event(), threading.Event(), []

    def pausing_kick():
        copied.set()  # the replay's copy is made, its transaction open, the subscription locked
        release.wait(10)

    monkeypatch.setattr("webhooks.due.kick_on_commit", pausing_kick)

    def replays():
        try:
            webhooks_services.replay(sent.public_id, alice)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(repr(exc))
        finally:
            connections.close_all()

    def deletes():
        try:
            copied.wait(10)
            webhooks_services.delete_subscription(Subscription.objects.get(pk=subscription.pk))
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=replays), threading.Thread(target=deletes)]
    for thread in threads:
        thread.start()
    assert copied.wait(10)
    waited = someone_waits_for_a_lock()
    release.set()
    for thread in threads:
        thread.join(20)
    # when the deletion found the subscription locked by the replay, it waited for it
    assert waited and errors == []
    # then: the subscription is deleted, and nothing of it is left to send
    assert Subscription.objects.get(pk=subscription.pk).status == Subscription.Status.DELETED
    assert sorted(Delivery.objects.values_list("state", flat=True)) == ["cancelled", "delivered"]
