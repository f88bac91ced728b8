"""explicit_only: every recipient of a send needs a grant (SPEC §5)."""
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from grants.models import Grant
from inbox.models import InboxItem, Recipient
from tests.conftest import error_code
from tests.grants.conftest import send_path


def test_discovery_creates_no_authority(bob_to_carol, as_bob):
    # when: bob, a member who can see carol, messages her without a grant
    response = as_bob.post(send_path(bob_to_carol), {"body": "hi"})
    # then: refused, nothing stored
    assert response.status_code == 403 and error_code(response) == "GRANT_REQUIRED"
    assert response.json()["error"]["details"]["recipients"] == ["@carol"]
    assert not Recipient.objects.exists() and not InboxItem.objects.exists()


def test_a_project_grant_lets_any_member_send_to_any_other(locked, bob_to_carol, as_bob, as_carol, grant, bob, carol):
    # given
    project = grant("grt_project", "project")
    back, _ = services.get_or_create_direct(locked, bob, actor=carol)
    # when
    there = as_bob.post(send_path(bob_to_carol), {"body": "hi"})
    reply = as_carol.post(send_path(back), {"body": "hello"})
    # then: each recipient's copy records the grant and its generation
    assert there.status_code == 201 and reply.status_code == 201
    rows = Recipient.objects.order_by("id")
    assert [(r.member, r.grant_id, r.grant_generation) for r in rows] == [(carol, project.pk, 1), (bob, project.pk, 1)]
    assert set(InboxItem.objects.values_list("grant_id", flat=True)) == {project.pk}


def test_a_pair_grant_covers_one_direction(locked, bob_to_carol, as_bob, as_carol, grant, bob, carol):
    # given: bob → carol only
    pair = grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    back, _ = services.get_or_create_direct(locked, bob, actor=carol)
    # when
    there = as_bob.post(send_path(bob_to_carol), {"body": "hi"})
    reply = as_carol.post(send_path(back), {"body": "hello"})
    # then
    assert there.status_code == 201
    assert Recipient.objects.get(member=carol).grant == pair
    assert reply.status_code == 403 and error_code(reply) == "GRANT_REQUIRED"


def test_a_one_message_grant_authorizes_exactly_one_message(bob_to_carol, as_bob, grant, carol):
    # given
    once = grant("grt_once", "one_message", sender="@bob", recipient="@carol", idempotency_key="key-00001")
    # when
    wrong_key = as_bob.post(send_path(bob_to_carol), {"body": "hi"}, headers={"Idempotency-Key": "key-00002"})
    first = as_bob.post(send_path(bob_to_carol), {"body": "hi"}, headers={"Idempotency-Key": "key-00001"})
    retry = as_bob.post(send_path(bob_to_carol), {"body": "hi"}, headers={"Idempotency-Key": "key-00001"})
    next_one = as_bob.post(send_path(bob_to_carol), {"body": "again"}, headers={"Idempotency-Key": "key-00003"})
    reuse = as_bob.post(send_path(bob_to_carol), {"body": "other"}, headers={"Idempotency-Key": "key-00001"})
    # then: only the exact key works, the grant is consumed by its message,
    # a retry replays it, and it authorizes nothing else
    assert wrong_key.status_code == 403
    assert first.status_code == 201 and retry.status_code == 200
    assert retry.json() == first.json()
    once.refresh_from_db()
    assert once.message.public_id == first.json()["message"]["id"]
    assert Recipient.objects.get(member=carol).grant == once
    assert next_one.status_code == 403 and error_code(next_one) == "GRANT_REQUIRED"
    assert reuse.status_code == 409 and error_code(reuse) == "IDEMPOTENCY_CONFLICT"


def test_the_narrowest_grant_is_used(bob_to_carol, as_bob, grant, carol):
    # given: a project grant and a one-message grant both cover the send
    grant("grt_project", "project")
    once = grant("grt_once", "one_message", sender="@bob", recipient="@carol", idempotency_key="key-00001")
    # when
    as_bob.post(send_path(bob_to_carol), {"body": "hi"}, headers={"Idempotency-Key": "key-00001"})
    # then: the one-message grant is consumed rather than left unused
    assert Recipient.objects.get(member=carol).grant == once


def test_an_expired_grant_authorizes_nothing_even_before_the_sweep(bob_to_carol, as_bob, grant):
    # given
    grant("grt_brief", "pair", sender="@bob", recipient="@carol", expires_at=now() + dt.timedelta(minutes=5))
    # when: the expiry passes before the schedule has run
    with freeze(now() + dt.timedelta(minutes=6)):
        response = as_bob.post(send_path(bob_to_carol), {"body": "hi"})
    # then
    assert response.status_code == 403
    assert Grant.objects.get(public_id="grt_brief").status == "active"  # the barrier runs on the schedule


def test_group_sends_name_every_uncovered_recipient(locked, as_bob, grant, alice, bob, carol):
    # given: bob may reach alice but not carol
    grant("grt_pair", "pair", sender="@bob", recipient="@alice")
    group, _ = services.get_or_create_group(locked, [bob, alice, carol], actor=bob)
    # when
    response = as_bob.post(send_path(group), {"body": "all of you"})
    # then: all or nothing
    assert response.status_code == 403
    assert response.json()["error"]["details"]["recipients"] == ["@carol"]
    assert not Recipient.objects.exists()


def test_a_channel_message_without_mentions_needs_no_grant(locked, as_bob, bob):
    # given
    channel = services.create_channel(locked, "news", actor=bob)
    # when
    plain = as_bob.post(send_path(channel), {"body": "announcement"})
    mention = as_bob.post(send_path(channel), {"body": "ping @carol"})
    # then: nobody is addressed by the first; the mention needs a grant
    assert plain.status_code == 201
    assert mention.status_code == 403 and mention.json()["error"]["details"]["recipients"] == ["@carol"]


@pytest.mark.parametrize("body", [{"body": "hi", "request_approval": "yes"}, {"body": "hi", "request_approval": 1}])
def test_request_approval_must_be_a_boolean(bob_to_carol, as_bob, body):
    response = as_bob.post(send_path(bob_to_carol), body)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"


def test_a_participant_away_from_the_space_needs_a_grant_too(locked, bob_to_carol, as_bob, as_carol, grant, alice,
                                                             bob, carol):
    """carol, away from the space when bob writes, gets no copy, but reads
    the conversation again once she is back: without a grant for her the
    send was 201 with no recipient, and she read it afterwards."""
    # given: carol removed from the space
    services.remove_member(locked, carol, actor=alice)
    # when
    refused = as_bob.post(send_path(bob_to_carol), {"body": "while you were out"})
    # then
    assert refused.status_code == 403 and error_code(refused) == "GRANT_REQUIRED"
    assert refused.json()["error"]["details"]["recipients"] == ["@carol"]
    # and with one the message goes, to no one now, and is hers to read once she is back
    grant("grt_pair", "pair", sender="@bob", recipient="@carol")
    sent = as_bob.post(send_path(bob_to_carol), {"body": "while you were out"})
    message_id = sent.json()["message"]["id"]
    assert sent.status_code == 201 and not Recipient.objects.filter(message__public_id=message_id).exists()
    services.add_member(locked, carol, actor=alice)
    assert as_carol.get(f"/v0/messages/{message_id}/body").json()["body"] == "while you were out"
