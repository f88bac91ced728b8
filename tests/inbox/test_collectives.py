"""Collective requests (SPEC §7b): gather and all_gather, deadlines,
failures, answers that go to nobody else."""
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.log import Event
from inbox import collectives
from inbox.models import Collective, InboxItem
from tests.conftest import error_code


def ask(api, group, op="gather", deadline_ms=60_000, body="Your estimate?"):
    return api.post(f"/v0/spaces/lab/conversations/{group.public_id}/messages",
                    {"body": body, "collective": {"op": op, "deadline_ms": deadline_ms}})


def items(member, kind):
    return [i.payload for i in InboxItem.objects.filter(member=member, kind=kind).order_by("position")]


def test_gather_with_every_answer_goes_to_the_requester_only(group, alice, bob, carol, as_alice, as_bob,
                                                            as_carol):
    # given
    sent = ask(as_alice, group)
    message = sent.json()["message"]["id"]
    # each other member has a request item
    (request,) = items(bob, "collective.request")
    assert request["collective"]["op"] == "gather" and request["content"] == "Your estimate?"
    assert items(carol, "collective.request") and not items(alice, "collective.request")
    # when: answered out of order
    carol_says = as_carol.post(f"/v0/messages/{message}/answer", {"body": "3 days"})
    bob_says = as_bob.post(f"/v0/messages/{message}/answer", {"body": "2 days"})
    # then
    assert sent.status_code == 201 and carol_says.status_code == bob_says.status_code == 201
    (result,) = items(alice, "collective.result")
    assert result["ended"] == "all_answered" and result["collective"]["message"] == message
    assert [(a["member"], a["answer"]) for a in result["answers"]] == [("@bob", "2 days"), ("@carol", "3 days")]
    assert items(bob, "collective.result") == items(carol, "collective.result") == []
    # answers are never anyone else's content: no item, no feed event carries them
    assert not InboxItem.objects.filter(member__in=[bob, carol], payload__content="3 days").exists()
    assert not any("2 days" in str(e.data) for e in Event.objects.exclude(kind="collective.completed"))
    assert Collective.objects.get().state == "completed"


def test_all_gather_goes_to_everyone(group, alice, bob, carol, as_alice, as_bob, as_carol):
    # given
    message = ask(as_alice, group, op="all_gather").json()["message"]["id"]
    # when
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    as_carol.post(f"/v0/messages/{message}/answer", {"body": "no"})
    # then
    for member in (alice, bob, carol):
        (result,) = items(member, "collective.result")
        assert [a["answer"] for a in result["answers"]] == ["yes", "no"]


def test_a_missing_answer_is_marked_at_the_deadline(group, alice, bob, as_alice, as_bob):
    # given
    message = ask(as_alice, group, deadline_ms=5_000).json()["message"]["id"]
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "here"})
    # when: before the deadline nothing finishes; after it the schedule does
    early = collectives.finish_due()
    with freeze(now() + dt.timedelta(seconds=6)):
        late = collectives.finish_due()
        again = collectives.finish_due()
    # then
    assert (early, late, again) == (0, 1, 0)
    (result,) = items(alice, "collective.result")
    assert result["ended"] == "deadline"
    assert result["answers"] == [{"member": "@bob", "answer": "here", "answered_at": result["answers"][0]["answered_at"]},
                                 {"member": "@carol", "missing": True}]


def test_one_run_of_the_schedule_finishes_a_burst_of_deadlines(monkeypatch, group, alice, as_alice):
    # given: more due operations than one batch
    monkeypatch.setattr(collectives, "DUE_PER_RUN", 2)
    for _ in range(5):
        ask(as_alice, group, deadline_ms=5_000)
    # when
    with freeze(now() + dt.timedelta(seconds=6)):
        finished = collectives.finish_due()
    # then: every one, in this run
    assert finished == 5 and not Collective.objects.filter(state="pending").exists()
    assert len(items(alice, "collective.result")) == 5


def test_a_read_of_the_message_finishes_a_due_operation(group, alice, as_alice):
    # given
    message = ask(as_alice, group, deadline_ms=1_000).json()["message"]["id"]
    # when
    with freeze(now() + dt.timedelta(seconds=2)):
        read = as_alice.get(f"/v0/messages/{message}")
    # then
    assert read.status_code == 200
    assert items(alice, "collective.result")[0]["answers"][1] == {"member": "@carol", "missing": True}


def test_a_member_removed_mid_operation_fails_it_with_a_reason(space, group, alice, bob, carol, as_alice, as_bob):
    # given
    message = ask(as_alice, group, op="all_gather").json()["message"]["id"]
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    # when
    services.remove_member(space, carol, actor=alice)
    late = as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    # then
    (failed,) = items(alice, "operationFailed")
    assert failed["reason"] == "member_removed" and failed["collective"]["message"] == message
    assert items(bob, "operationFailed") == [failed]  # all_gather: the members were owed a result too
    assert items(carol, "operationFailed") == []  # not the member who left, though the open space is hers to read
    assert items(alice, "collective.result") == []
    assert Collective.objects.get().state == "failed"
    assert late.status_code == 200  # the same answer again is still the same answer
    # and a different answer now is told why it is too late
    changed = as_bob.post(f"/v0/messages/{message}/answer", {"body": "no"})
    assert changed.status_code == 409
    assert changed.json()["error"]["details"] == {"state": "failed", "reason": "member_removed"}


@pytest.mark.parametrize("op", ["gather", "all_gather"])
def test_a_member_who_answered_and_left_does_not_stop_the_operation(space, group, alice, bob, carol, as_alice,
                                                                   as_bob, as_carol, op):
    # given: bob answered, then left the space
    message = ask(as_alice, group, op=op).json()["message"]["id"]
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "2 days"})
    services.remove_member(space, bob, actor=alice)
    # when
    answered = as_carol.post(f"/v0/messages/{message}/answer", {"body": "3 days"})
    # then: it completes with every answer; bob, gone, is told nothing more
    assert answered.status_code == 201 and Collective.objects.get().state == "completed"
    (result,) = items(alice, "collective.result")
    assert [(a["member"], a["answer"]) for a in result["answers"]] == [("@bob", "2 days"), ("@carol", "3 days")]
    assert items(bob, "collective.result") == items(bob, "operationFailed") == []
    assert len(items(carol, "collective.result")) == (op == "all_gather")
    # nor can he read the answers, though the open space is his to read; carol, with all_gather, can
    assert as_bob.get(f"/v0/messages/{message}/answers").status_code == 403
    assert as_carol.get(f"/v0/messages/{message}/answers").status_code == (200 if op == "all_gather" else 403)


@pytest.mark.parametrize("headers", [{}, {"Idempotency-Key": "answer-0001"}], ids=["unkeyed", "keyed"])
def test_an_answer_that_finds_the_operation_failed_leaves_it_failed(group, alice, carol, as_alice, as_bob, headers):
    # given: carol suspended meanwhile (this test runs no commit hooks, so
    # the kick that settles her operations at once is not run: the next touch does)
    message = ask(as_alice, group, deadline_ms=3_600_000).json()["message"]["id"]
    services.update_member(carol, status="suspended", actor=None)
    # when: bob answers
    answered = as_bob.post(f"/v0/messages/{message}/answer", {"body": "2 days"}, headers=headers)
    # then: bob is told it failed, and it did: the requester is told why, now
    assert answered.status_code == 409 and answered.json()["error"]["details"]["state"] == "failed"
    assert Collective.objects.get().state == "failed"
    assert [i["reason"] for i in items(alice, "operationFailed")] == ["member_removed"]


def test_a_collective_no_one_is_left_to_answer_completes_as_it_is_sent(space, group, alice, bob, carol, as_alice,
                                                                      django_capture_on_commit_callbacks):
    # given: the group's other members both gone from the space
    services.remove_member(space, bob, actor=alice)
    services.remove_member(space, carol, actor=alice)
    # when
    with django_capture_on_commit_callbacks(execute=True):
        sent = ask(as_alice, group, deadline_ms=86_400_000)
    # then: every member has answered, none being left: done now, not in a day
    assert sent.status_code == 201 and Collective.objects.get().state == "completed"
    assert [(r["ended"], r["answers"]) for r in items(alice, "collective.result")] == [("all_answered", [])]


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_suspended_member_who_owes_an_answer_fails_the_operation_at_once(group, alice, carol, as_alice, when,
                                                                         django_capture_on_commit_callbacks):
    # given / when: carol suspended before the request, or while it waits for her
    with django_capture_on_commit_callbacks(execute=True):
        if when == "before":
            services.update_member(carol, status="suspended", actor=None)
        ask(as_alice, group, deadline_ms=86_400_000)
        if when == "during":
            services.update_member(carol, status="suspended", actor=None)
    # then: the requester is told now, not at the deadline a day later
    assert Collective.objects.get().state == "failed"
    assert [i["reason"] for i in items(alice, "operationFailed")] == ["member_removed"]


def test_a_suspended_requester_fails_their_operations_at_once(group, alice, bob, as_alice,
                                                              django_capture_on_commit_callbacks):
    """Only operations waiting for the suspended member's answer failed: the
    requester's own waited for the next answer or the deadline, a day."""
    # given / when: alice's request, then alice suspended
    with django_capture_on_commit_callbacks(execute=True):
        ask(as_alice, group, op="all_gather", deadline_ms=86_400_000)
        services.update_member(alice, status="suspended", actor=None)
    # then: it failed now, and the members who were asked are told why
    assert Collective.objects.get().state == "failed"
    assert [i["reason"] for i in items(bob, "operationFailed")] == ["requester_gone"]


def test_an_observer_answers_nothing_they_could_not_send(space, group, alice, carol, as_alice, as_carol):
    # given: carol made an observer after the request
    message = ask(as_alice, group, op="all_gather").json()["message"]["id"]
    services.add_member(space, carol, role="observer", actor=alice)
    # when
    sent = as_carol.post(f"/v0/spaces/lab/conversations/{group.public_id}/messages", {"body": "hi"})
    answered = as_carol.post(f"/v0/messages/{message}/answer", {"body": "free text to every member"})
    # then: refused as her send is
    assert sent.status_code == answered.status_code == 403 and error_code(answered) == "FORBIDDEN"
    assert not collectives.CollectiveAnswer.objects.exists()


def test_an_archived_space_takes_no_answer_and_its_operations_fail(space, group, alice, bob, as_alice, as_bob,
                                                                   as_carol):
    # given: bob answered, then the space was archived
    message = ask(as_alice, group, op="all_gather").json()["message"]["id"]
    as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    space.archived = True
    space.save(update_fields=["archived"])
    # when
    answered = as_carol.post(f"/v0/messages/{message}/answer", {"body": "new content after archival"})
    retried = as_bob.post(f"/v0/messages/{message}/answer", {"body": "yes"})
    with freeze(now() + dt.timedelta(seconds=61)):
        finished = collectives.finish_due()
    # then: a new answer is refused as a send is (a retry of one given before is answered again);
    # at its deadline the operation fails, with no result
    assert answered.status_code == 409 and error_code(answered) == "CONFLICT" and retried.status_code == 200
    assert finished == 1 and Collective.objects.get().reason == "space_archived"
    assert not InboxItem.objects.filter(kind="collective.result").exists()
    assert [i["reason"] for i in items(bob, "operationFailed")] == ["space_archived"]


def test_answers_are_idempotent_bounded_and_only_the_others_answer(group, alice, bob, as_alice, as_bob, as_carol,
                                                                  make_member, api_for, space):
    # given
    message = ask(as_alice, group).json()["message"]["id"]
    stranger = make_member("dan")
    services.join_space(space, actor=stranger)
    # when
    first = as_bob.post(f"/v0/messages/{message}/answer", {"body": "A"})
    same = as_bob.post(f"/v0/messages/{message}/answer", {"body": "A"})
    changed = as_bob.post(f"/v0/messages/{message}/answer", {"body": "B"})
    own = as_alice.post(f"/v0/messages/{message}/answer", {"body": "me"})
    outsider = api_for(stranger).post(f"/v0/messages/{message}/answer", {"body": "me"})
    too_big = as_carol.post(f"/v0/messages/{message}/answer", {"body": "x" * (8 * 1024 + 1)})
    empty = as_carol.post(f"/v0/messages/{message}/answer", {"body": ""})
    # then
    assert first.status_code == 201 and same.status_code == 200 and same.json() == first.json()
    assert changed.status_code == 409 and error_code(changed) == "CONFLICT"
    assert own.status_code == 403 and error_code(own) == "FORBIDDEN"
    assert outsider.status_code == 404  # not a participant: the message is not visible to them
    assert too_big.status_code == 413 and error_code(too_big) == "BODY_TOO_LARGE"
    assert empty.status_code == 422 and error_code(empty) == "INVALID_BODY"
    assert Collective.objects.get().state == "pending"


def test_another_answer_under_the_first_ones_key_is_an_idempotency_conflict_before_its_record_is_stored(
        group, as_alice, as_bob):
    """The route stores its key's record after its work (controlplane.idempotency,
    `atomic=False`): two first attempts at once under one key found no record,
    and the later one was answered CONFLICT, not IDEMPOTENCY_CONFLICT."""
    from controlplane.models import IdempotencyRecord

    # given: bob's answer under a key, its record not stored yet (as while the first request finishes)
    message = ask(as_alice, group).json()["message"]["id"]
    path = f"/v0/messages/{message}/answer"
    assert as_bob.post(path, {"body": "A"}, headers={"Idempotency-Key": "answer-key-1"}).status_code == 201
    IdempotencyRecord.objects.all().delete()
    # when / then: the same key with another answer, another key, and none
    assert error_code(as_bob.post(path, {"body": "B"}, headers={"Idempotency-Key": "answer-key-1"})) == (
        "IDEMPOTENCY_CONFLICT")
    assert error_code(as_bob.post(path, {"body": "B"}, headers={"Idempotency-Key": "answer-key-2"})) == "CONFLICT"
    assert error_code(as_bob.post(path, {"body": "B"})) == "CONFLICT"
    assert as_bob.post(path, {"body": "A"}, headers={"Idempotency-Key": "answer-key-1"}).status_code == 200


@pytest.mark.parametrize("collective", [
    {"op": "scatter", "deadline_ms": 5000}, {"op": "gather", "deadline_ms": 999},
    {"op": "gather", "deadline_ms": 86_400_001}, {"op": "gather", "deadline_ms": "5000"}, {"op": "gather"},
    {"op": "gather", "deadline_ms": 5000, "extra": 1},
])
def test_bad_collectives_are_400_and_send_nothing(group, as_alice, collective):
    # when
    response = as_alice.post(f"/v0/spaces/lab/conversations/{group.public_id}/messages",
                             {"body": "q", "collective": collective})
    # then
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Collective.objects.exists() and not InboxItem.objects.exists()


def test_a_collective_needs_a_group_conversation(general, as_alice):
    # when
    response = as_alice.post("/v0/spaces/lab/conversations/%23general/messages",
                             {"body": "q @bob", "collective": {"op": "gather", "deadline_ms": 5000}})
    # then
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert not Collective.objects.exists()


def test_a_plain_message_is_not_answerable(group, as_alice, as_bob):
    # given
    message = as_alice.post(f"/v0/spaces/lab/conversations/{group.public_id}/messages",
                            {"body": "hi"}).json()["message"]["id"]
    # when
    response = as_bob.post(f"/v0/messages/{message}/answer", {"body": "hello"})
    # then
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_operations_lock_leaves_its_space_and_requester_rows_free(space, group, alice, as_alice):
    # given: the operation locked, as an answer or a read at its deadline locks it
    import threading

    from django.db import DatabaseError, connections, transaction

    from controlplane.models import Member, Space
    from inbox.models import Message

    ask(as_alice, group)
    taken = []

    def lock_elsewhere():
        try:
            for model, pk in ((Space, space.pk), (Member, alice.pk)):
                try:
                    with transaction.atomic():
                        model.objects.select_for_update(nowait=True, no_key=True).filter(pk=pk).first()
                    taken.append(model.__name__)
                except DatabaseError:
                    pass
        finally:
            connections.close_all()

    with transaction.atomic():
        assert collectives._locked(Message.objects.get()) is not None
        # when: another connection locks the space's and the requester's rows meanwhile
        other = threading.Thread(target=lock_elsewhere)
        other.start()
        other.join(20)
    # then: both were free (the join's rows are not locked with the operation's)
    assert taken == ["Space", "Member"]
