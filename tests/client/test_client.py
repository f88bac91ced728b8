"""The client against a real server: typed results for each group of
routes, typed errors with their code, details and Retry-After, and the
async client."""
import asyncio

import pytest
from switchboard_client import (AsyncClient, AuthError, Client, ConflictError, NotFoundError, RateLimitError,
                                RequestError, RetryPolicy, errors, models)

from tests.client.conftest import member_token
from tests.conftest import clear_of_window_edge
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)


def test_spaces_conversations_and_messages_come_back_typed(clients):
    alice, bob = clients
    # when
    mine = alice.my_spaces()
    direct = bob.open_direct("lab", "alice")
    group = alice.create_group("lab", ["@alice", "@bob"])
    sent = bob.send("lab", direct.id, "hello @alice", related_paths=["docs/a.md"])
    status = alice.message(sent.id)
    body = alice.message_body(sent.id, max_bytes=5)
    # then
    assert [(s.slug, s.role, s.status) for s in mine] == [("lab", "owner", "active")]
    assert isinstance(mine.items[0], models.MySpace) and mine.raw["spaces"][0]["slug"] == "lab"
    assert alice.space("lab").visibility == "open"
    assert sorted(m.member for m in alice.space_members("lab")) == ["@alice", "@bob"]
    assert {c.kind for c in alice.conversations("lab")} == {"channel", "direct", "group"}
    assert set(direct.members) == {"@alice", "@bob"}
    assert group.kind == "group"
    assert isinstance(sent, models.Message) and sent.body == "hello @alice" and sent.related_paths == ("docs/a.md",)
    assert status.recipients[0].member == "@alice" and status.recipients[0].state == "pending"
    assert body.body == "hello" and body.has_more and body.total_bytes == 12
    assert alice.acknowledge_message(sent.id).recipients[0].state == "acknowledged"
    assert alice.resolve_message(sent.id, "done").recipients[0].result == "done"
    # the channel by name, as `#general`
    assert alice.send("lab", "#general", "to the channel").conversation == alice.conversations("lab").items[0].id
    # a resource is frozen, and keeps its raw answer
    with pytest.raises(AttributeError):
        sent.body = "changed"
    assert sent.raw["id"] == sent.id


def test_a_collective_request_is_answered_and_its_answers_read(clients):
    alice, bob = clients
    group = alice.create_group("lab", ["@alice", "@bob"])
    # when
    asked = alice.send("lab", group.id, "Ready?", collective={"op": "gather", "deadline_ms": 60_000})
    given = bob.answer(asked.id, "ready")
    read = alice.read_answers(asked.id)
    # then
    assert (given.member, given.body) == ("@bob", "ready")
    assert isinstance(read, models.CollectiveAnswers) and read.ended == "all_answered"
    assert [(a.member, a.answer, a.missing) for a in read.answers] == [("@bob", "ready", None)]


def test_inbox_feeds_snapshot_grants_tasks_and_webhooks_come_back_typed(clients):
    alice, bob = clients
    direct = bob.open_direct("lab", "alice")
    sent = bob.send("lab", direct.id, "for your inbox")
    # the inbox, its events and the snapshot
    (entry,) = alice.read_inbox().items
    assert isinstance(entry, models.InboxEntry) and entry.kind == "direct" and entry.token.startswith("dlv_")
    assert alice.read_event("evt_" + entry.token[4:]).item == entry.item
    assert [e.kind for e in alice.inbox_events()] == ["message.created"]
    assert "message.created" in [e.kind for e in alice.space_events("lab", limit=100)]
    snapshot = alice.snapshot()
    assert [u.message.id for u in snapshot.unresolved] == [sent.id] and snapshot.cursor
    assert alice.acknowledge(entry.token) is None and alice.read_inbox().items == ()
    assert alice.firewall() == () and alice.set_firewall([{"action": "allow", "sender": "@bob"}])[0]["action"] == \
        "allow"
    assert alice.held_items().items == ()
    # grants
    grant = alice.create_grant("lab", "grt_pair-1", "pair", sender="bob", recipient="alice")
    assert (grant.kind, grant.status, grant.sender, grant.recipient) == ("pair", "active", "@bob", "@alice")
    assert [g.id for g in alice.grants("lab")] == ["grt_pair-1"]
    assert alice.grant("grt_pair-1").sender == "@bob" and alice.grant("grt_pair-1", space="lab").id == grant.id
    assert alice.revoke_grant("grt_pair-1").status in ("revoking", "revoked")
    # tasks
    task = alice.create_task("lab", "write the docs", reviewer="alice")
    assert bob.task_action("lab", task.id, "claim").claimant == "@bob"
    assert bob.task_action("lab", task.id, "submit").status == "in_review"
    assert alice.update_task("lab", task.id, title="write better docs").title == "write better docs"
    cleared = alice.update_task("lab", task.id, reviewer=None)  # None clears (it was dropped, changing nothing)
    assert (cleared.reviewer, cleared.title) == (None, "write better docs")
    with pytest.raises(ValueError):
        bob.task_action("lab", task.id, "frobnicate")
    assert [t.id for t in alice.tasks("lab", status="in_review")] == [task.id]
    # credentials and members (alice is an admin)
    extra = bob.create_credential("laptop")
    assert extra.token.startswith("sbt_") and extra.id in [c.id for c in bob.credentials()]
    assert Client(bob.base_url, extra.token).me().handle == "@bob"
    assert bob.delete_credential(extra.id) is None
    assert alice.create_member("carol", kind="agent").handle == "@carol"
    # webhooks: what needs no receiver
    keys = bob.signing_keys()
    assert keys and keys[0].algorithm == "ed25519" and keys[0].status == "active"
    assert alice.endpoints().items == () and alice.inbox_subscriptions().items == ()


def test_errors_are_typed_with_their_code_and_details(clients, server):
    alice, bob = clients
    direct = bob.open_direct("lab", "alice")
    # 401: a bad token
    with pytest.raises(errors.Unauthenticated) as unauthenticated:
        Client(server, "sbt_" + "x" * 43).me()
    assert isinstance(unauthenticated.value, AuthError) and unauthenticated.value.status == 401
    # 404, the same for absent and invisible
    with pytest.raises(errors.NotFound) as missing:
        bob.message("msg_aaaaaaaaaaaaaaaa")
    assert isinstance(missing.value, NotFoundError) and missing.value.code == "NOT_FOUND"
    with pytest.raises(errors.UnknownDelivery):
        bob.acknowledge("dlv_" + "A" * 43)
    # 400 with the offending fields in details
    with pytest.raises(errors.InvalidRequest) as invalid:
        alice.set_firewall([{"action": "maybe"}])
    assert isinstance(invalid.value, RequestError) and "rules" in invalid.value.details["fields"]
    with pytest.raises(errors.InvalidCursor):
        bob.space_events("lab", cursor="not-a-cursor")
    with pytest.raises(errors.BodyTooLarge) as large:
        bob.send("lab", direct.id, "x" * 9000)
    assert large.value.status == 413
    # 422: text that is not valid Unicode (bytes a shell could not decode), the server's to refuse
    with pytest.raises(errors.InvalidBody) as invalid_text:
        bob.send("lab", direct.id, "a\ud800b")
    assert invalid_text.value.status == 422
    # 409: the same key with another body
    bob.send("lab", direct.id, "first", idempotency_key="same-key-1")
    with pytest.raises(errors.IdempotencyConflict) as conflict:
        bob.send("lab", direct.id, "second", idempotency_key="same-key-1")
    assert isinstance(conflict.value, ConflictError) and conflict.value.status == 409
    # 403 GRANT_REQUIRED, with the approval request it asked for in details
    alice.create_space("strict", "Strict", send_policy="explicit_only")
    bob.join_space("strict")
    strict = bob.open_direct("strict", "alice")
    with pytest.raises(errors.GrantRequired) as required:
        bob.send("strict", strict.id, "may I?", request_approval=True)
    request_id = required.value.details["approval_request"]["id"]
    # which the admin approves: the retained message is sent
    assert [r.id for r in alice.approval_requests(status="pending")] == [request_id]
    approved = alice.approve(request_id)
    assert approved.status == "approved" and approved.message
    assert bob.approval_request(request_id).message == approved.message


def test_rate_limited_carries_retry_after_and_is_retried_after_it():
    # given: a server allowing each member 3 requests a minute
    with serving(RATE_LIMIT_PER_MINUTE="3") as (base, _):
        token = member_token("alice")
        waits = []
        patient = Client(base, token, retry=RetryPolicy(attempts=2), sleep=waits.append)  # records, never waits
        clear_of_window_edge(margin=5)
        impatient = Client(base, token, retry=RetryPolicy(attempts=1))
        for _ in range(3):
            impatient.me()
        # when
        with pytest.raises(errors.RateLimited) as limited:
            impatient.me()
        with pytest.raises(errors.RateLimited):
            patient.me()
    # then
    error = limited.value
    assert isinstance(error, RateLimitError) and error.status == 429 and error.code == "RATE_LIMITED"
    assert error.retry_after >= 1 and error.details["retry_after"] == error.retry_after
    assert len(waits) == 1 and waits[0] >= 1  # it waited what Retry-After said, once, then gave up


def test_the_async_client_does_what_the_sync_one_does(clients, server):
    alice, bob = clients
    direct = bob.open_direct("lab", "alice").id

    async def story():
        async with AsyncClient(server, alice.transport.token) as a, AsyncClient(server, bob.transport.token) as b:
            feed = a.iter_feed(inbox=True, wait_ms=5_000)
            sent = await asyncio.gather(*(b.send("lab", direct, f"async {n}") for n in range(3)))
            events = [await feed.__anext__() for _ in range(3)]
            seen = []
            report = await a.drain_inbox(lambda entry: seen.append(entry.item["content"]))
            missing = None
            try:
                await a.message("msg_aaaaaaaaaaaaaaaa")
            except errors.NotFound as error:
                missing = error
            spaces = [s.slug async for s in a.pages(a.my_spaces, limit=1)]
            return sent, events, seen, report, missing, spaces

    sent, events, seen, report, missing, spaces = asyncio.run(story())
    assert sorted(e.data["message"]["id"] for e in events) == sorted(m.id for m in sent)
    assert sorted(seen) == ["async 0", "async 1", "async 2"] and len(report.acknowledged) == 3
    assert alice.read_inbox().items == ()
    assert missing is not None and missing.status == 404
    assert spaces == ["lab"]
