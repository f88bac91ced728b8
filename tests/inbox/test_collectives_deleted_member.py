"""A collective request whose member is deleted (from a shell: one who
never wrote a message may be). `Collective.members` lists ids, not
foreign keys: finishing the request must not lock or count into a mailbox
of a member who is gone, nor name them in the outcome."""
from __future__ import annotations

import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from inbox import collectives
from inbox.models import Collective
from tests.inbox.test_collectives import ask


def asked(api, conversation, op: str, deadline_ms: int) -> str:
    response = ask(api, conversation, op=op, deadline_ms=deadline_ms)
    assert response.status_code == 201
    return response.json()["message"]["id"]


def test_the_answers_leave_out_a_member_deleted_since(group, carol, as_alice, as_bob):
    # given: a gather that ended at its deadline, carol silent, then deleted
    message = asked(as_alice, group, "gather", 1_000)
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    with freeze(now() + dt.timedelta(seconds=2)):
        collectives.finish_due()
    carol.delete()
    # when
    response = as_alice.get(f"/v0/messages/{message}/answers")
    # then
    assert response.status_code == 200, response.content[:300]
    assert [a["member"] for a in response.json()["answers"]] == ["@bob"]


@pytest.mark.django_db(transaction=True)
def test_a_removal_in_the_space_finishes_an_all_gather_whose_member_was_deleted(group, carol, as_alice):
    # given: a pending all_gather over bob and carol; carol then deleted
    message = asked(as_alice, group, "all_gather", 3_600_000)
    carol.delete()
    # when: alice removes bob, which fails the request
    removed = as_alice.delete("/v0/spaces/lab/members/bob")
    # then
    assert removed.status_code in (200, 204), removed.content[:300]
    assert Collective.objects.get(message__public_id=message).state == "failed"


@pytest.mark.django_db(transaction=True)
def test_the_schedule_finishes_every_request_past_one_whose_member_was_deleted(space, group, alice, bob,
                                                                              carol, as_alice, as_bob):
    # given: alice's all_gather (carol then deleted), and bob's later, unrelated gather
    asked(as_alice, group, "all_gather", 1_000)
    other, _ = services.get_or_create_group(space, [bob, alice], actor=bob)
    asked(as_bob, other, "gather", 2_000)
    carol.delete()
    # when: the minute schedule runs after both deadlines
    with freeze(now() + dt.timedelta(seconds=5)):
        collectives.finish_due()
    # then: both finished
    assert dict(Collective.objects.values_list("requester__handle", "state")) == {
        "alice": "failed", "bob": "completed"}
