"""Every state change names its actor: the changes no event records leave
an audit entry (never with a secret in it)."""
from __future__ import annotations

import pytest

from controlplane import bearer, services
from controlplane.errors import UnknownDelivery
from controlplane.models import AuditEntry
from inbox import firewall
from inbox.delivery import acknowledge_delivery
from inbox.models import InboxItem
from inbox.services import send_message
from webhooks import services as webhooks


def _entries(target: str) -> list[tuple[str, str | None]]:
    return [(e.action, e.actor.handle if e.actor else None)
            for e in AuditEntry.objects.filter(target=target).order_by("id")]


def test_member_and_credential_changes_record_their_actor(make_member, alice):
    # when
    bob = services.create_member("bob", actor=alice)
    credential, token = bearer.issue_credential(bob, actor=alice)
    bearer.revoke_credential(credential, actor=bob)
    # then
    assert _entries(bob.public_id) == [("member.created", "alice"), ("credential.issued", "alice"),
                                       ("credential.revoked", "bob")]
    assert all(token not in str(e.detail) for e in AuditEntry.objects.all())


def test_firewall_changes_and_releases_record_their_actor(space, alice, bob):
    # given
    firewall.set_rules(bob, [{"action": "hold", "sender": "alice"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="held for bob", actor=alice)
    firewall.classify_pending(bob.pk)
    held = InboxItem.objects.get(member=bob, admission=InboxItem.Admission.HELD)
    # when
    firewall.release_item(bob, held.token, actor=bob)
    # then
    assert _entries(bob.public_id)[-2:] == [("inbox.firewall_rules_set", "bob"), ("inbox.item_released", "bob")]


def test_receivers_record_who_created_them(db, receiver, alice):
    endpoint = webhooks.create_endpoint(alice, receiver.url(), None, actor=alice)
    assert _entries(endpoint.public_id) == [("webhook.endpoint_created", "alice")]
    assert "whsec" not in str(AuditEntry.objects.get(target=endpoint.public_id).detail)


def test_only_the_inbox_owner_acknowledges(space, alice, bob):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="for bob", actor=alice)
    item = InboxItem.objects.get(member=bob)
    # when: someone else tries, then bob
    with pytest.raises(UnknownDelivery):
        acknowledge_delivery(bob, item.token, actor=alice)
    acknowledge_delivery(bob, item.token, actor=bob)
    # then
    item.refresh_from_db()
    assert item.state == InboxItem.State.ACKNOWLEDGED and item.acknowledged_at is not None
