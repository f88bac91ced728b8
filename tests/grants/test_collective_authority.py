"""A collective request sent under a grant fails once the grant is revoked,
and one retained for approval goes as a collective once approved (SPEC §5, §7b)."""
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from grants import services as grants
from inbox import collectives
from grants.models import Grant
from inbox.models import Collective, CollectiveAnswer, InboxItem, Message
from tests.conftest import error_code


def test_revoked_authority_fails_the_operation(locked, alice, bob, carol, root, as_alice, as_bob):
    # given: an admin's project grant lets alice's collective request through
    project, _ = grants.create_grant(locked, grant_id="grt_project", kind="project", actor=root)
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    sent = as_alice.post(f"/v0/spaces/vault/conversations/{group.public_id}/messages",
                         {"body": "Vote?", "collective": {"op": "gather", "deadline_ms": 60_000}})
    assert sent.status_code == 201
    # when
    grants.revoke_grant(project, actor=alice)
    late = as_bob.post(f"/v0/messages/{sent.json()['message']['id']}/answer", {"body": "yes"})
    # then
    assert late.status_code == 409 and error_code(late) == "CONFLICT"
    assert late.json()["error"]["details"] == {"state": "failed", "reason": "authority_revoked"}
    assert Collective.objects.get().reason == "authority_revoked"
    (failed,) = InboxItem.objects.filter(member=alice, kind="operationFailed")
    assert failed.payload["reason"] == "authority_revoked"


def test_the_revocation_itself_fails_the_operation_and_tells_the_requester(locked, alice, bob, carol, root,
                                                                          as_alice):
    # given: an all_gather under a project grant, one answer in
    project, _ = grants.create_grant(locked, grant_id="grt_project", kind="project", actor=root)
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    sent = as_alice.post(f"/v0/spaces/vault/conversations/{group.public_id}/messages",
                         {"body": "Vote?", "collective": {"op": "all_gather", "deadline_ms": 3_600_000}})
    collectives.answer(Message.objects.get(public_id=sent.json()["message"]["id"]), "yes", actor=bob)
    # when: the grant is revoked, and nobody answers or reads the message
    grants.revoke_grant(project, actor=alice)
    # then: it failed at once, and everyone owed the outcome has the notice, after the rejections
    assert Collective.objects.get().reason == "authority_revoked"
    for member in (alice, bob, carol):
        (failed,) = InboxItem.objects.filter(member=member, kind="operationFailed")
        assert failed.payload["reason"] == "authority_revoked"
    (rejected,) = InboxItem.objects.filter(member=carol, kind="rejected")
    assert rejected.position < InboxItem.objects.get(member=carol, kind="operationFailed").position


def test_a_barrier_that_ended_without_failing_its_operations_has_them_failed_by_the_recovery(
        locked, alice, bob, carol, root, as_alice, monkeypatch):
    # given: a gather under a project grant whose barrier ended, its process stopped before failing it
    from grants import barrier

    project, _ = grants.create_grant(locked, grant_id="grt_project", kind="project", actor=root)
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    as_alice.post(f"/v0/spaces/vault/conversations/{group.public_id}/messages",
                  {"body": "Vote?", "collective": {"op": "gather", "deadline_ms": 3_600_000}})
    with monkeypatch.context() as stopped:
        stopped.setattr(collectives, "fail_under", lambda *args: None)
        grants.revoke_grant(project, actor=alice)
    assert Collective.objects.get().state == "pending"
    # when: the minute's recovery runs
    barrier.recover()
    # then
    assert Collective.objects.get().reason == "authority_revoked"
    assert InboxItem.objects.get(member=alice, kind="operationFailed").payload["reason"] == "authority_revoked"


def test_an_approved_collective_request_is_sent_as_a_collective(locked, alice, bob, carol, as_alice, as_root):
    # given: alice's collective request refused without grants, retained for approval
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    path = f"/v0/spaces/vault/conversations/{group.public_id}/messages"
    send = {"body": "Vote?", "collective": {"op": "all_gather", "deadline_ms": 60_000}, "request_approval": True}
    key = {"Idempotency-Key": "vote-0001"}
    refused = as_alice.post(path, send, headers=key)
    requested = refused.json()["error"]["details"]["approval_request"]
    assert refused.status_code == 403 and requested["collective"] == {"op": "all_gather", "deadline_ms": 60_000}
    # when: approved half a minute later
    with freeze(now() + dt.timedelta(seconds=30)):
        approved = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
        retry = as_alice.post(path, send, headers=key)
    # then: a collective whose deadline counts from the approval's send, requested of bob and carol
    assert approved.status_code == 200
    collective = Collective.objects.get()
    assert collective.message.public_id == approved.json()["approval_request"]["message"]
    assert (collective.op, collective.members) == ("all_gather", [bob.pk, carol.pk])
    assert collective.deadline_at == collective.message.created_at + dt.timedelta(seconds=60)
    for member in (bob, carol):
        (item,) = InboxItem.objects.filter(member=member).exclude(kind="approval")
        assert item.kind == "collective.request" and item.payload["collective"]["op"] == "all_gather"
    # and alice's retry returns the original
    assert retry.status_code == 200 and retry.json()["message"]["id"] == collective.message.public_id



def _pairs(space, root, *pairs):
    for n, (sender, recipient) in enumerate(pairs):
        grants.create_grant(space, grant_id=f"grt_pair{n}", kind="pair", sender=f"@{sender.handle}",
                            recipient=f"@{recipient.handle}", actor=root)


def _ask(as_alice, group, op: str) -> str:
    sent = as_alice.post(f"/v0/spaces/vault/conversations/{group.public_id}/messages",
                         {"body": "Vote?", "collective": {"op": op, "deadline_ms": 3_600_000}})
    assert sent.status_code == 201
    return sent.json()["message"]["id"]


@pytest.mark.parametrize("op, reached", [("gather", {"@alice"}), ("all_gather", {"@alice", "@carol"})])
def test_an_answer_needs_a_grant_covering_everyone_its_result_reaches(locked, alice, bob, carol, root, as_alice,
                                                                      as_bob, op, reached):
    # given: alice may ask bob and carol, and bob may send no one anything
    _pairs(locked, root, (alice, bob), (alice, carol))
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    message_id = _ask(as_alice, group, op)
    # when: bob answers
    refused = as_bob.post(f"/v0/messages/{message_id}/answer", {"body": "BOB TO EVERYONE"})
    # then: refused as his send to them would be, and nothing is kept
    assert refused.status_code == 403 and error_code(refused) == "GRANT_REQUIRED"
    assert set(refused.json()["error"]["details"]["recipients"]) == reached
    assert not CollectiveAnswer.objects.exists() and Collective.objects.get().state == "pending"
    # and with grants to whom the result goes (one-message grants cover no answer), he may
    grants.create_grant(locked, grant_id="grt_once", kind="one_message", sender="@bob", recipient="@alice",
                        idempotency_key="answer-0001", actor=root)
    keyed = as_bob.post(f"/v0/messages/{message_id}/answer", {"body": "yes"},
                        headers={"Idempotency-Key": "answer-0001"})
    assert keyed.status_code == 403 and error_code(keyed) == "GRANT_REQUIRED"
    for n, handle in enumerate(sorted(reached)):
        grants.create_grant(locked, grant_id=f"grt_bob{n}", kind="pair", sender="@bob", recipient=handle, actor=root)
    assert as_bob.post(f"/v0/messages/{message_id}/answer", {"body": "yes"}).status_code == 201


def test_a_result_leaves_out_for_each_reader_the_answers_no_grant_covers_any_more(locked, alice, bob, carol, root,
                                                                                   as_alice, as_carol):
    # given: an all_gather whose members may each send to everyone; bob answers
    _pairs(locked, root, (alice, bob), (alice, carol), (bob, alice), (bob, carol), (carol, alice), (carol, bob))
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    message_id = _ask(as_alice, group, "all_gather")
    message = Message.objects.get(public_id=message_id)
    collectives.answer(message, "BOB'S ANSWER", actor=bob)
    # when: bob's grant to carol is revoked, and carol's answer completes the operation
    grants.revoke_grant(Grant.objects.get(sender=bob, recipient=carol), actor=root)
    collectives.answer(message, "CAROL'S ANSWER", actor=carol)
    # then: alice's and bob's results hold both answers, and carol's leaves bob's out, marked
    results = {item.member.handle: item.payload["answers"]
               for item in InboxItem.objects.filter(kind="collective.result").select_related("member")}
    both = [{"member": "@bob", "answer": "BOB'S ANSWER"}, {"member": "@carol", "answer": "CAROL'S ANSWER"}]
    assert [{k: a[k] for k in ("member", "answer")} for a in results["alice"]] == both
    assert [{k: a[k] for k in ("member", "answer")} for a in results["bob"]] == both
    assert results["carol"][0] == {"member": "@bob", "missing": True, "reason": "grant_required"}
    assert results["carol"][1]["answer"] == "CAROL'S ANSWER"
    # and reading the answers shows carol the same
    read = as_carol.get(f"/v0/messages/{message_id}/answers")
    assert read.status_code == 200 and read.json()["answers"][0] == results["carol"][0]
    assert "BOB'S ANSWER" not in read.content.decode()
