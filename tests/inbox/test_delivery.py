"""SPEC §7: inbox items, read_inbox, acknowledge_delivery, read_event."""
import base64
import re

import pytest

from controlplane import bearer, services
from controlplane.errors import MailboxFull
from inbox import delivery
from inbox.models import InboxItem
from inbox.services import send_message
from tests.conftest import error_code

TOKEN = re.compile(r"^dlv_[A-Za-z0-9_-]{43}$")


def read_all(api):
    items, cursor = [], None
    while True:
        page = api.get("/v0/me/inbox", **({"cursor": cursor} if cursor else {})).json()
        items += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return items


def test_every_recipient_gets_one_classified_item(space, general, alice, bob, carol, as_bob, as_carol, as_alice):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    group, _ = services.get_or_create_group(space, [carol, alice, bob], actor=alice)
    # when
    dm = send_message(direct, body="just you", actor=alice).message
    grp = send_message(group, body="all of us", actor=alice).message
    mention = send_message(general, body="hey @carol", actor=alice).message
    # then
    bobs = [e["item"] for e in read_all(as_bob)]
    carols = [e["item"] for e in read_all(as_carol)]
    assert bobs == [
        {"kind": "direct", "postId": dm.public_id, "conversation": direct.public_id, "sender": "@alice",
         "content": "just you"},
        {"kind": "group", "postId": grp.public_id, "conversation": group.public_id, "group": group.public_id,
         "members": ["@carol", "@alice", "@bob"], "sender": "@alice", "content": "all of us"},
    ]
    assert [i["kind"] for i in carols] == ["group", "mention"]
    assert carols[1] == {"kind": "mention", "postId": mention.public_id, "conversation": general.public_id,
                         "space": "lab", "sender": "@alice", "content": "hey @carol"}
    assert read_all(as_alice) == []  # the author is never offered its own post


def test_tokens_are_canonical_random_and_unique(space, alice, bob, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(20):
        send_message(direct, body=f"m{i}", actor=alice)
    tokens = [e["deliveryToken"] for e in read_all(as_bob)]
    assert len(set(tokens)) == 20 and all(TOKEN.match(t) for t in tokens)
    for token in tokens:
        raw = base64.urlsafe_b64decode(token[4:] + "=")
        assert len(raw) == 32 and base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == token[4:]


def test_pages_hold_at_most_50_items(space, alice, bob, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(53):
        send_message(direct, body=f"m{i}", actor=alice)
    first = as_bob.get("/v0/me/inbox").json()
    second = as_bob.get("/v0/me/inbox", cursor=first["nextCursor"]).json()
    assert len(first["items"]) == 50 and len(second["items"]) == 3 and second["nextCursor"] is None
    assert [e["item"]["content"] for e in first["items"] + second["items"]] == [f"m{i}" for i in range(53)]


def test_a_page_holds_at_most_the_limit_asked_for_from_1_to_50(space, alice, bob, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(5):
        send_message(direct, body=f"m{i}", actor=alice)
    first = as_bob.get("/v0/me/inbox", limit=2).json()
    second = as_bob.get("/v0/me/inbox", cursor=first["nextCursor"], limit=50).json()
    assert [e["item"]["content"] for e in first["items"]] == ["m0", "m1"]
    assert [e["item"]["content"] for e in second["items"]] == ["m2", "m3", "m4"] and second["nextCursor"] is None
    for bad in ("0", "51", "-1", "ten", "2.5"):
        response = as_bob.get("/v0/me/inbox", limit=bad)
        assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST", bad


def test_pages_hold_at_most_the_byte_limit(space, alice, bob, as_bob, monkeypatch):
    # given: items of ~1 KiB and a 2.5 KiB page
    monkeypatch.setattr(delivery, "PAGE_BYTES", 2560)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(5):
        send_message(direct, body=f"{i}" * 1000, actor=alice)
    # when
    first = as_bob.get("/v0/me/inbox").json()
    # then
    assert len(first["items"]) == 2
    assert len(read_all(as_bob)) == 5


def test_continuations_keep_the_first_pages_bound(space, alice, bob, as_bob, monkeypatch):
    # given
    monkeypatch.setattr(delivery, "PAGE_ITEMS", 2)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(3):
        send_message(direct, body=f"before {i}", actor=alice)
    first = as_bob.get("/v0/me/inbox").json()
    # when: an item arrives mid-traversal
    send_message(direct, body="during", actor=alice)
    rest = as_bob.get("/v0/me/inbox", cursor=first["nextCursor"]).json()
    # then: it belongs to the next read
    assert [e["item"]["content"] for e in rest["items"]] == ["before 2"] and rest["nextCursor"] is None
    assert [e["item"]["content"] for e in read_all(as_bob)][-1] == "during"


def test_reading_never_acknowledges(space, alice, bob, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="still here", actor=alice)
    assert len(read_all(as_bob)) == 1 and len(read_all(as_bob)) == 1


def test_acknowledge_is_idempotent_and_leaves_a_tombstone(space, alice, bob, as_bob):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="ack me", actor=alice)
    token = read_all(as_bob)[0]["deliveryToken"]
    # when
    first = as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})
    again = as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})
    # then
    assert first.status_code == 200 and first.json() == {}
    assert again.status_code == 200 and again.json() == {}
    assert read_all(as_bob) == []
    event = as_bob.get(f"/v0/inbox-events/evt_{token[4:]}")
    assert event.status_code == 200 and event.json()["item"]["content"] == "ack me"
    assert InboxItem.objects.get(token=token).state == "acknowledged"


def test_foreign_and_unknown_tokens_are_unknown_delivery(space, alice, bob, as_carol, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="for bob", actor=alice)
    token = read_all(as_bob)[0]["deliveryToken"]
    for api, value in ((as_carol, token), (as_bob, "dlv_" + "A" * 43)):
        response = api.post("/v0/me/inbox/acknowledge", {"deliveryToken": value})
        assert response.status_code == 404 and error_code(response) == "UNKNOWN_DELIVERY"
    assert InboxItem.objects.get(token=token).state == "pending"


@pytest.mark.parametrize("body", [{}, {"deliveryToken": "nope"}, {"deliveryToken": 5},
                                  {"deliveryToken": "dlv_" + "A" * 43, "extra": True}])
def test_acknowledge_accepts_exactly_a_delivery_token(space, as_bob, body):
    response = as_bob.post("/v0/me/inbox/acknowledge", body)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"


def test_event_ids_must_be_canonical(space, alice, bob, as_bob, as_carol):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="x", actor=alice)
    token = read_all(as_bob)[0]["deliveryToken"]
    encoded = token[4:]
    # an alias: the last character carries 2 unused bits; flipping them decodes to the same bytes
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    alias = encoded[:-1] + alphabet[alphabet.index(encoded[-1]) ^ 1]
    assert base64.urlsafe_b64decode(alias + "=") == base64.urlsafe_b64decode(encoded + "=")
    # then
    for bad in (f"evt_{alias}", "evt_short", f"dlv_{encoded}", f"evt_{encoded}=", "evt_" + "!" * 43):
        response = as_bob.get(f"/v0/inbox-events/{bad}")
        assert response.status_code == 400 and error_code(response) == "INVALID_EVENT_ID", bad
    assert error_code(as_carol.get(f"/v0/inbox-events/evt_{encoded}")) == "UNKNOWN_EVENT"
    assert as_bob.get(f"/v0/inbox-events/evt_{'A' * 43}").status_code == 404
    assert as_bob.get(f"/v0/inbox-events/evt_{encoded}").status_code == 200
    assert InboxItem.objects.get(token=token).state == "pending"  # no side effect


def test_a_full_mailbox_rejects_the_whole_send(space, alice, bob, carol, as_bob, monkeypatch):
    # given: room for two ~100-byte items per recipient
    from controlplane.models import Event
    from inbox import mailbox
    from inbox.models import Mailbox, Message
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="first", actor=alice)
    size = InboxItem.objects.get(member=bob).content_bytes
    # a group item is about 80 bytes larger (group address and members)
    monkeypatch.setattr(mailbox, "MAILBOX_LIMIT_BYTES", size * 2 + 150)
    send_message(direct, body="secnd", actor=alice)
    before = (Message.objects.count(), InboxItem.objects.count(), Event.objects.count(),
              Mailbox.objects.get(member=carol).pending_bytes if Mailbox.objects.filter(member=carol).exists() else 0)
    # when: bob is full; carol is not
    response = send(alice, group.public_id, "to everyone")
    # then: 507, and nothing of the send is stored, for anyone
    assert response.status_code == 507 and error_code(response) == "MAILBOX_FULL"
    assert response.json()["error"]["details"]["recipients"] == ["@bob"]
    assert (Message.objects.count(), InboxItem.objects.count(), Event.objects.count(),
            Mailbox.objects.get(member=carol).pending_bytes if Mailbox.objects.filter(member=carol).exists() else 0) \
        == before
    # when bob acknowledges an item, there is room again
    token = read_all(as_bob)[0]["deliveryToken"]
    as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})
    assert send(alice, group.public_id, "to everyone").status_code == 201


def send(member, conversation_id, body):
    from tests.conftest import Api
    _, token = bearer.issue_credential(member, actor=None)
    return Api(member, token).post(f"/v0/spaces/lab/conversations/{conversation_id}/messages", {"body": body})


def test_one_sender_fills_only_its_share_of_a_mailbox(space, alice, bob, carol, as_bob, settings):
    # given: a share of about three items
    from inbox.models import Mailbox, MailboxShare
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="x" * 100, actor=alice)
    size = InboxItem.objects.get(member=bob).content_bytes
    settings.MAILBOX_SENDER_SHARE = size * 3
    send_message(direct, body="x" * 100, actor=alice)
    send_message(direct, body="x" * 100, actor=alice)
    # when: alice sends a fourth
    response = send(alice, direct.public_id, "x" * 100)
    # then: refused for alice's share alone, nothing stored
    assert response.status_code == 507 and error_code(response) == "MAILBOX_FULL"
    assert response.json()["error"]["details"] == {"recipients": ["@bob"], "reason": "sender_share"}
    assert InboxItem.objects.filter(member=bob).count() == 3
    # and carol, another sender, still gets through
    from_carol, _ = services.get_or_create_direct(space, bob, actor=carol)
    assert send(carol, from_carol.public_id, "hello bob").status_code == 201
    # and once bob acknowledges one of alice's, she may send again
    token = read_all(as_bob)[0]["deliveryToken"]
    as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})
    assert send(alice, direct.public_id, "x" * 100).status_code == 201
    assert MailboxShare.objects.get(member=bob, sender=alice).pending_bytes == size * 3
    assert Mailbox.objects.get(member=bob).pending_bytes == sum(
        InboxItem.objects.filter(member=bob, state="pending").values_list("content_bytes", flat=True))


def test_recipients_inbox_groups_hear_of_new_items_after_commit(space, alice, bob, carol, monkeypatch,
                                                                 django_capture_on_commit_callbacks):
    # given
    from controlplane.publishing import publisher
    sent = []
    record = lambda group, message: sent.append((group, message))
    monkeypatch.setattr(publisher, "send", record)
    monkeypatch.setattr(publisher, "publish", record)  # topics
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    # when
    with django_capture_on_commit_callbacks(execute=True):
        message = send_message(group, body="hello both", actor=alice).message
    # then: one announcement per recipient, ids and counts only
    inbox = sorted((g, m) for g, m in sent if g.startswith("inbox."))
    assert inbox == sorted([(f"inbox.{m.public_id}", {"type": "inbox.available", "items": 1,
                                                      "message": message.public_id}) for m in (bob, carol)])


def test_a_rejected_send_announces_nothing(space, alice, bob, monkeypatch, django_capture_on_commit_callbacks):
    from controlplane.publishing import publisher
    from inbox import mailbox
    sent = []
    record = lambda group, message: sent.append(group)
    monkeypatch.setattr(publisher, "send", record)
    monkeypatch.setattr(publisher, "publish", record)  # topics
    monkeypatch.setattr(mailbox, "MAILBOX_LIMIT_BYTES", 10)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(MailboxFull):
            send_message(direct, body="too big for the box", actor=alice)
    assert sent == []


@pytest.mark.postgres
def test_the_next_pending_item_is_read_through_the_pending_index_whatever_plan_postgresql_keeps(make_member):
    # A prepared statement may run one generic plan for any parameters: the
    # item a push offers next (and an inbox page) must still be found through
    # `inboxitem_pending`, not by walking every item the member ever had.
    import json
    import re

    from django.db import connection
    from psycopg.sql import Literal

    from inbox import delivery
    # given: 5,000 items, the last one pending, the table analysed
    member = make_member("ada")
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO inbox_inboxitem (member_id, token, kind, payload, content_bytes, position, state, "
                       "created_at, admission) SELECT %s, 'dlv_probe_' || n, 'message', '{}'::jsonb, 1, n, "
                       "CASE WHEN n = 5000 THEN 'pending' ELSE 'acknowledged' END, now(), 'admitted' "
                       "FROM generate_series(1, 5000) n", [member.pk])
        cursor.execute("ANALYZE inbox_inboxitem")
        # when: the statement is prepared and planned generically
        sql, params = delivery._FIRSTS.sql([member.pk])
        numbered = iter(range(1, len(params) + 1))
        types = ", ".join("bigint" if isinstance(value, int) else "text" for value in params)
        cursor.execute(f"PREPARE next_item ({types}) AS " + re.sub("%s", lambda _: f"${next(numbered)}", sql))
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        arguments = ", ".join(Literal(value).as_string() for value in params)
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE next_item({arguments})")
        plan = json.dumps(cursor.fetchone()[0])
        cursor.execute("DEALLOCATE next_item")
    # then
    assert "inboxitem_pending" in plan
    assert delivery.oldest_pending([member.pk])[member.pk].position == 5000
