"""Approval requests: the retained message, approve, deny (SPEC §5)."""
import pytest

from controlplane import services
from grants.models import ApprovalRequest, Grant
from inbox.models import InboxItem, Message
from tests.conftest import error_code
from tests.grants.conftest import send_path

BODY = "Deploy?\n```\nrm -rf build/  # @carol\n```\n\u00e9\u263a\U0001F680 trailing space "
KEY = {"Idempotency-Key": "deploy-0001"}


@pytest.fixture
def requested(bob_to_carol, as_bob):
    """bob's send to carol without a grant, asking for approval."""
    response = as_bob.post(send_path(bob_to_carol), {"body": BODY, "related_paths": ["src/app.py"],
                                                     "request_approval": True}, headers=KEY)
    assert response.status_code == 403 and error_code(response) == "GRANT_REQUIRED"
    return response.json()["error"]["details"]["approval_request"]


def inbox(api):
    return [entry["item"] for entry in api.get("/v0/me/inbox").json()["items"]]


def test_a_refused_send_can_ask_for_approval(requested, bob_to_carol):
    # then: the exact message is retained, nothing is sent
    assert requested | {"id": None, "created_at": None, "fingerprint": None} == {
        "id": None, "status": "pending", "space": "vault", "conversation": bob_to_carol.public_id,
        "sender": "@bob", "recipients": ["@carol"], "idempotency_key": "deploy-0001", "body": BODY,
        "reply_to": None, "related_paths": ["src/app.py"], "collective": None, "fingerprint": None, "created_at": None,
        "decided_by": None, "decided_at": None, "reason": None, "message": None}
    assert requested["id"].startswith("apr_") and len(requested["fingerprint"]) == 64
    assert not Message.objects.exists() and not InboxItem.objects.exists()


def test_asking_again_returns_the_same_request_and_changed_content_conflicts(requested, bob_to_carol, as_bob):
    # when
    again = as_bob.post(send_path(bob_to_carol), {"body": BODY, "related_paths": ["src/app.py"],
                                                  "request_approval": True}, headers=KEY)
    changed = as_bob.post(send_path(bob_to_carol), {"body": "something else", "request_approval": True},
                          headers=KEY)
    # then
    assert again.json()["error"]["details"]["approval_request"]["id"] == requested["id"]
    assert changed.status_code == 409 and error_code(changed) == "IDEMPOTENCY_CONFLICT"
    assert ApprovalRequest.objects.count() == 1


def test_approval_needs_an_idempotency_key(bob_to_carol, as_bob):
    response = as_bob.post(send_path(bob_to_carol), {"body": "hi", "request_approval": True})
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["message"]
    assert not ApprovalRequest.objects.exists()


def test_the_request_is_visible_to_its_sender_and_admins_only(requested, as_bob, as_carol, as_root):
    path = f"/v0/approval-requests/{requested['id']}"
    assert as_bob.get(path).json()["approval_request"] == requested
    assert as_root.get(path).json()["approval_request"] == requested
    assert as_carol.get(path).status_code == 404
    assert as_carol.get("/v0/approval-requests").status_code == 403
    queue = as_root.get("/v0/approval-requests", status="pending").json()
    assert [r["id"] for r in queue["approval_requests"]] == [requested["id"]]
    assert as_root.get("/v0/approval-requests", status="approved").json()["approval_requests"] == []
    assert as_root.get("/v0/approval-requests", status="maybe").status_code == 400


def test_approval_sends_the_retained_message_exactly(requested, as_root, as_bob, as_carol, root, bob, carol):
    # when
    approved = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: decided by whom and when, and the message sent is byte for byte the approved one
    outcome = approved.json()["approval_request"]
    assert approved.status_code == 200
    assert outcome["status"] == "approved" and outcome["decided_by"] == "@root" and outcome["decided_at"]
    message = Message.objects.get(public_id=outcome["message"])
    assert message.author == bob and message.idempotency_key == "deploy-0001"
    assert message.body.encode() == BODY.encode() and message.related_paths == ["src/app.py"]
    assert message.fingerprint == requested["fingerprint"]
    body = as_carol.get(f"/v0/messages/{message.public_id}/body").json()["body"]
    assert body == BODY
    # under a one-message grant, now consumed
    grant = Grant.objects.get(kind="one_message")
    assert (grant.sender, grant.recipient, grant.idempotency_key, grant.created_by) == (bob, carol, "deploy-0001",
                                                                                      root)
    assert grant.message == message
    # carol receives it; bob is told
    assert [item["content"] for item in inbox(as_carol)] == [BODY]
    assert inbox(as_bob) == [{"kind": "approval", "approvalRequest": requested["id"], "status": "approved",
                              "conversation": requested["conversation"], "idempotencyKey": "deploy-0001",
                              "postId": message.public_id, "decidedBy": "@root", "reason": None}]
    assert as_bob.get(f"/v0/approval-requests/{requested['id']}").json()["approval_request"] == outcome


def test_the_senders_retry_after_approval_returns_the_sent_message(requested, bob_to_carol, as_root, as_bob):
    # given
    sent = as_root.post(f"/v0/approval-requests/{requested['id']}/approve").json()["approval_request"]["message"]
    # when
    retry = as_bob.post(send_path(bob_to_carol), {"body": BODY, "related_paths": ["src/app.py"],
                                                  "request_approval": True}, headers=KEY)
    # then
    assert retry.status_code == 200 and retry.json()["message"]["id"] == sent
    assert Message.objects.count() == 1


def test_approving_twice_is_the_same_decision(requested, as_root):
    first = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    second = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    assert second.status_code == 200 and second.json() == first.json()
    assert Message.objects.count() == 1 and Grant.objects.count() == 1


def test_denial_records_who_and_why_and_tells_the_sender(requested, as_root, as_bob, as_carol):
    # when
    no_reason = as_root.post(f"/v0/approval-requests/{requested['id']}/deny", {"reason": ""})
    denied = as_root.post(f"/v0/approval-requests/{requested['id']}/deny", {"reason": "Not during the freeze."})
    then_approve = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then
    assert no_reason.status_code == 400
    outcome = denied.json()["approval_request"]
    assert (outcome["status"], outcome["decided_by"], outcome["reason"]) == ("denied", "@root",
                                                                             "Not during the freeze.")
    assert then_approve.status_code == 409 and error_code(then_approve) == "CONFLICT"
    assert not Message.objects.exists() and not Grant.objects.exists()
    assert inbox(as_carol) == []
    notice = inbox(as_bob)
    assert [(n["kind"], n["status"], n["reason"], n["postId"]) for n in notice] == [
        ("approval", "denied", "Not during the freeze.", None)]


def test_only_admins_decide(requested, as_alice, as_bob):
    # alice owns the space, but approvals are for admins
    for caller in (as_alice, as_bob):
        response = caller.post(f"/v0/approval-requests/{requested['id']}/approve")
        assert response.status_code == 403 and error_code(response) == "FORBIDDEN"
    assert ApprovalRequest.objects.get().status == "pending"


def test_approval_that_cannot_send_as_approved_changes_nothing(requested, locked, as_root, alice, bob):
    # given: the sender has since left the space
    services.remove_member(locked, bob, actor=bob)
    # when
    response = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then
    assert response.status_code == 409 and response.json()["error"]["details"]["cause"] == "FORBIDDEN"
    assert ApprovalRequest.objects.get().status == "pending"
    assert not Grant.objects.exists() and not Message.objects.exists()


def test_approval_whose_recipient_left_sends_nothing_and_leaves_no_grant(requested, locked, as_root, alice, carol):
    # given: carol, the retained recipient, has since been removed from the space
    services.remove_member(locked, carol, actor=alice)
    # when
    response = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: it would reach no one it was approved for; before, it was
    # "approved", sent to nobody, and its one-message grant stayed active
    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"cause": "CONFLICT", "recipients": ["@carol"]}
    assert ApprovalRequest.objects.get().status == "pending"
    assert not Grant.objects.exists() and not Message.objects.exists()


def test_a_participant_away_when_the_send_was_retained_does_not_stop_its_approval(bob_to_carol, locked, alice, bob,
                                                                                   carol, as_bob, as_root, as_carol):
    """Away participants need a grant but get no copy (they read the
    conversation once back), so each such request was refused for good as
    if they had left since."""
    # given: carol left before bob asked for approval
    services.remove_member(locked, carol, actor=carol)
    refused = as_bob.post(send_path(bob_to_carol), {"body": "for when you are back", "request_approval": True},
                          headers=KEY)
    requested = refused.json()["error"]["details"]["approval_request"]
    assert refused.status_code == 403 and requested["recipients"] == ["@carol"]
    # when
    approved = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: sent under its one-message grant, and carol reads it once back
    assert approved.status_code == 200 and approved.json()["approval_request"]["status"] == "approved"
    message = Message.objects.get()
    assert Grant.objects.get().message_id == message.pk
    services.join_space(locked, actor=carol)
    read = as_carol.get(f"/v0/messages/{message.public_id}/body")
    assert read.status_code == 200 and read.json()["body"] == "for when you are back"


def test_in_a_group_only_who_left_since_the_request_stops_its_approval(locked, alice, bob, carol, as_alice, as_root):
    # given: alice's group with bob and carol; carol is away when alice asks
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    services.remove_member(locked, carol, actor=carol)
    refused = as_alice.post(send_path(group), {"body": "hi", "request_approval": True}, headers=KEY)
    requested = refused.json()["error"]["details"]["approval_request"]
    assert requested["recipients"] == ["@bob", "@carol"]
    # when: bob leaves after the request
    services.remove_member(locked, bob, actor=bob)
    gone = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: bob is named, carol is not; nothing changed
    assert gone.status_code == 409 and gone.json()["error"]["details"] == {"cause": "CONFLICT",
                                                                          "recipients": ["@bob"]}
    assert not Message.objects.exists() and ApprovalRequest.objects.get().status == "pending"
    # and: back, bob lets it go
    services.join_space(locked, actor=bob)
    assert as_root.post(f"/v0/approval-requests/{requested['id']}/approve").status_code == 200


def test_a_decision_on_a_channel_message_reaches_only_its_sender(locked, bob, carol, as_bob, as_root, anon):
    # given: bob asks for approval of a channel message mentioning carol
    channel = services.create_channel(locked, "ops", actor=bob)
    refused = as_bob.post(send_path(channel), {"body": "hi @carol", "request_approval": True}, headers=KEY)
    request_id = refused.json()["error"]["details"]["approval_request"]["id"]
    # when
    as_root.post(f"/v0/approval-requests/{request_id}/deny", {"reason": "not now"})
    # then: in bob's inbox feed, in no space feed (not even for anonymous readers)
    assert "approval.decided" in [e["kind"] for e in as_bob.get("/v0/me/inbox/events").json()["events"]]
    for api in (anon, as_bob):
        assert "approval.decided" not in [e["kind"] for e in api.get("/v0/spaces/vault/events").json()["events"]]


def test_a_sender_has_only_so_many_requests_waiting(bob_to_carol, as_bob, as_root, monkeypatch):
    # given: room for two pending requests
    from grants import approvals

    monkeypatch.setattr(approvals, "MAX_PENDING_PER_SENDER", 2)

    def ask(n):
        return as_bob.post(send_path(bob_to_carol), {"body": f"please {n}", "request_approval": True},
                           headers={"Idempotency-Key": f"ask-{n:08d}"})

    # when
    first, second, third = ask(1), ask(2), ask(3)
    again = ask(1)  # the same request again is no new one
    decided = first.json()["error"]["details"]["approval_request"]["id"]
    assert as_root.post(f"/v0/approval-requests/{decided}/deny", {"reason": "no"}).status_code == 200
    after_decision = ask(3)
    # then
    assert [error_code(r) for r in (first, second, again, after_decision)] == ["GRANT_REQUIRED"] * 4
    assert third.status_code == 409 and error_code(third) == "LIMIT_EXCEEDED"
    assert third.json()["error"]["details"] == {"max": 2, "recipients": ["@carol"]}
    assert ApprovalRequest.objects.count() == 3


def test_approving_a_group_message_sends_it_once_to_every_uncovered_recipient(locked, alice, bob, carol, as_alice,
                                                                              as_root, as_bob, as_carol):
    # given: alice's group message refused for bob and carol alike, retained for approval
    group, _ = services.get_or_create_group(locked, [alice, bob, carol], actor=alice)
    refused = as_alice.post(send_path(group), {"body": "hi", "request_approval": True}, headers=KEY)
    requested = refused.json()["error"]["details"]["approval_request"]
    assert refused.status_code == 403 and requested["recipients"] == ["@bob", "@carol"]
    # when
    approved = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: one message, each recipient's copy under its own one-message grant, now bound to it
    assert approved.status_code == 200
    message = Message.objects.get()
    assert approved.json()["approval_request"]["message"] == message.public_id
    grants = Grant.objects.filter(kind="one_message").order_by("recipient__handle")
    assert [(g.recipient, g.message) for g in grants] == [(bob, message), (carol, message)]
    assert [item["content"] for item in inbox(as_bob)] == ["hi"]
    assert [item["content"] for item in inbox(as_carol)] == ["hi"]


def test_an_admin_does_not_approve_their_own_request(locked, root, as_root, carol):
    # given: an admin who is a member asks for approval of their own send
    services.join_space(locked, actor=root)
    direct, _ = services.get_or_create_direct(locked, carol, actor=root)
    asked = as_root.post(send_path(direct), {"body": "let me", "request_approval": True},
                         headers={"Idempotency-Key": "self-00001"})
    request_id = asked.json()["error"]["details"]["approval_request"]["id"]
    # when
    refused = as_root.post(f"/v0/approval-requests/{request_id}/approve")
    # then
    assert error_code(refused) == "FORBIDDEN"
    assert ApprovalRequest.objects.get(public_id=request_id).status == "pending" and not Grant.objects.exists()


def test_approving_a_message_already_sent_leaves_no_unused_grant(locked, bob_to_carol, as_alice, as_bob, as_root):
    # given: bob asks for approval, then sends the same message under a pair grant, with the same key
    asked = as_bob.post(send_path(bob_to_carol), {"body": "hello", "request_approval": True}, headers=KEY)
    request_id = asked.json()["error"]["details"]["approval_request"]["id"]
    as_alice.post("/v0/spaces/vault/grants", {"id": "grt_pair", "kind": "pair", "sender": "@bob",
                                              "recipient": "@carol"})
    sent = as_bob.post(send_path(bob_to_carol), {"body": "hello"}, headers=KEY)
    # when an admin approves the request
    approved = as_root.post(f"/v0/approval-requests/{request_id}/approve")
    # then: the request names that message, and no one-message grant is left in force unused
    assert sent.status_code == 201 and approved.status_code == 200
    assert approved.json()["approval_request"]["message"] == sent.json()["message"]["id"]
    assert not Grant.objects.filter(kind="one_message").exists()


def test_approving_a_message_sent_under_an_owners_grant_of_its_key_leaves_no_unused_grant(
        requested, bob_to_carol, as_alice, as_root, as_carol):
    # given: while bob's request waits, the space's owner makes a one-message grant for its key
    made = as_alice.post("/v0/spaces/vault/grants", {"id": "grt_owners", "kind": "one_message", "sender": "@bob",
                                                      "recipient": "@carol", "idempotency_key": KEY["Idempotency-Key"]})
    # when an admin approves the request
    approved = as_root.post(f"/v0/approval-requests/{requested['id']}/approve")
    # then: the message went under the owner's grant, the older one, and the approval's own is gone: it was
    # left in force for good, unusable (its key spent), its creation told to both parties
    message = approved.json()["approval_request"]["message"]
    assert made.status_code == 201 and approved.status_code == 200
    assert list(Grant.objects.values_list("public_id", "message__public_id")) == [("grt_owners", message)]
    created = [e["data"]["grant"]["id"] for e in as_carol.get("/v0/me/inbox/events").json()["events"]
               if e["kind"] == "grant.created"]
    assert created == ["grt_owners"]


def test_a_keyed_decision_answers_its_retry_and_a_malformed_key_decides_nothing(requested, as_root):
    # given
    approve = f"/v0/approval-requests/{requested['id']}/approve"
    deny = f"/v0/approval-requests/{requested['id']}/deny"
    # when
    malformed = as_root.post(approve, headers={"Idempotency-Key": "short"})
    still = ApprovalRequest.objects.get().status
    approved = as_root.post(approve, headers={"Idempotency-Key": "decide-0001"})
    retry = as_root.post(approve, headers={"Idempotency-Key": "decide-0001"})
    denied = as_root.post(deny, {"reason": "too late"}, headers={"Idempotency-Key": "decide-0002"})
    # then
    assert malformed.status_code == 400 and error_code(malformed) == "INVALID_IDEMPOTENCY_KEY"
    assert still == "pending"
    assert approved.status_code == 200 and retry.json() == approved.json()
    assert denied.status_code == 409 and Message.objects.count() == 1


def test_a_denial_retried_with_another_reason_under_its_key_conflicts(requested, as_root):
    deny = f"/v0/approval-requests/{requested['id']}/deny"
    first = as_root.post(deny, {"reason": "not now"}, headers={"Idempotency-Key": "deny-0001"})
    other = as_root.post(deny, {"reason": "never"}, headers={"Idempotency-Key": "deny-0001"})
    assert first.status_code == 200 and first.json()["approval_request"]["reason"] == "not now"
    assert other.status_code == 409 and error_code(other) == "IDEMPOTENCY_CONFLICT"
    assert ApprovalRequest.objects.get().reason == "not now"


def test_an_owner_who_made_a_one_message_grant_learns_nothing_of_its_message(locked, grant, as_alice, as_bob,
                                                                             as_carol, as_root, bob, carol):
    # given: alice, an owner but no participant, grants bob one message to carol, which he sends
    direct, _ = services.get_or_create_direct(locked, carol, actor=bob)
    grant("grt_once", "one_message", sender="@bob", recipient="@carol", idempotency_key="once-0001")
    sent = as_bob.post(f"/v0/spaces/{locked.slug}/conversations/{direct.public_id}/messages", {"body": "private"},
                       headers={"Idempotency-Key": "once-0001"}).json()["message"]["id"]
    as_alice.post("/v0/grants/grt_once/revoke")
    # then: the grant and its events name the message to its parties only
    assert as_alice.get(f"/v0/messages/{sent}").status_code == 404
    assert as_alice.get("/v0/grants/grt_once").json()["grant"]["message"] is None
    assert sent not in str(as_alice.get("/v0/me/inbox/events").json())
    for party in (as_bob, as_carol):
        assert party.get("/v0/grants/grt_once").json()["grant"]["message"] == sent
    # the space's list too: alice sees no message, an admin does
    listed = {g["id"]: g["message"] for g in as_alice.get(f"/v0/spaces/{locked.slug}/grants").json()["grants"]}
    assert listed["grt_once"] is None
    listed = {g["id"]: g["message"] for g in as_root.get(f"/v0/spaces/{locked.slug}/grants").json()["grants"]}
    assert listed["grt_once"] == sent


def test_an_approvals_grant_is_an_event_for_its_parties_as_any_grant_is(requested, as_root, as_bob, as_carol):
    # when
    outcome = as_root.post(f"/v0/approval-requests/{requested['id']}/approve").json()["approval_request"]
    # then: sender, recipient and the approving admin each hear of the one-message grant, consumed by the message
    grant = Grant.objects.get(kind="one_message")
    for api in (as_bob, as_carol, as_root):
        events = [e for e in api.get("/v0/me/inbox/events").json()["events"] if e["kind"].startswith("grant.")]
        assert [(e["kind"], e["actor"], e["data"]["grant"]["id"], e["data"]["grant"]["message"]) for e in events] == [
            ("grant.created", "@root", grant.public_id, outcome["message"])]
