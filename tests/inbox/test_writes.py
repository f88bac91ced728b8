"""The two ways a message is written (one PostgreSQL statement, or the ORM)
give the same rows, run the same append hooks and publish the same
messages."""
from __future__ import annotations

import pytest
from django.forms.models import model_to_dict

from controlplane import live, log, services
from controlplane.publishing import publisher
from controlplane.models import Event, EventAddressee
from grants.services import create_grant
from inbox import delivery, firewall, writes
from inbox.models import InboxItem, Mailbox, MailboxShare, Message, Recipient
from inbox.services import send_message

pytestmark = pytest.mark.postgres


def _snapshot(message: Message, hooked: list, sent: list) -> dict:
    """Everything one send wrote and published, with what differs between
    any two sends (ids, tokens, positions, times) replaced by placeholders."""
    position = message.position

    def plain(row, *ignore) -> dict:
        data = model_to_dict(row)
        for name in ("id", "public_id", "token", "created_at", "message", *ignore):
            data.pop(name, None)
        return {k: ("P" if k == "position" and v == position else v) for k, v in data.items()}

    event = Event.objects.get(position=position)
    rendered = {**event.data, "message": {**event.data["message"], "id": "M", "created_at": "T", "position": "P"}}
    return {
        "message": plain(message),
        "recipients": [plain(r) for r in Recipient.objects.filter(message=message).order_by("member_id")],
        "items": [{**plain(i, "payload"), "payload": {k: "M" if v == message.public_id else v
                                                       for k, v in i.payload.items()}}
                  for i in InboxItem.objects.filter(message=message).order_by("member_id")],
        "event": {**plain(event, "data"), "data": rendered},
        "addressees": sorted(EventAddressee.objects.filter(event_id=position).values_list("member_id", "space_id")),
        "mailboxes": sorted(Mailbox.objects.values_list("member_id", "pending_bytes", "firewall")),
        "hooked": [(p == position, e.kind, e.addressees, e.restricted, e.space_id, e.conversation_id)
                   for p, e in hooked],
        "published": sorted([(group, {k: ("P" if v == position else "M" if v == message.public_id else v)
                               for k, v in note.items()} if isinstance(note, dict) else note)
                      for group, note in sent], key=repr),
    }


def test_both_insert_paths_write_and_publish_the_same(space, alice, bob, carol, make_member, monkeypatch,
                                                      django_capture_on_commit_callbacks):
    # given: an explicit_only space, a grant covering everyone, a firewalled
    # recipient, a recording append hook and publisher
    space.send_policy = "explicit_only"
    space.save()
    create_grant(space, grant_id="grt_all", kind="project", actor=make_member("root", is_admin=True))
    firewall.set_rules(carol, [{"action": "allow", "sender": "alice"}], actor=carol)
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    hooked, sent = [], []
    monkeypatch.setattr(log, "_APPEND_HOOKS", [*log._APPEND_HOOKS, hooked.extend])
    record = lambda group, note: sent.append((group, note))
    monkeypatch.setattr(publisher, "send", record)
    monkeypatch.setattr(publisher, "publish", record)  # topics
    # (the firewall's kick is recorded, not run: the rows stay as written)
    monkeypatch.setattr(writes, "kick_once_on_commit", lambda task, *args: sent.append((task, args)))
    snapshots = []
    for insert in (writes._insert_in_one_statement, writes._insert_with_orm):
        monkeypatch.setattr(writes, "_insert_in_one_statement", insert)
        hooked.clear(), sent.clear()
        Mailbox.objects.update(pending_bytes=0)
        # when
        with django_capture_on_commit_callbacks(execute=True):
            message = send_message(group, body="same rows, same messages", actor=alice).message
        snapshots.append(_snapshot(message, hooked, sent))
    # then
    one_statement, orm = snapshots
    differences = {part: (one_statement[part], orm[part]) for part in orm if one_statement[part] != orm[part]}
    assert not differences, repr(differences)
    assert [i["admission"] for i in orm["items"]] == ["admitted", "unclassified"]  # bob, carol
    assert all(r["grant"] is not None for r in orm["recipients"])
    # carol's firewall classifies first: the event is addressed to bob alone until then
    assert orm["hooked"] == [(True, "message.created", (bob.pk,), True, space.pk, group.pk)]
    assert orm["addressees"] == [(bob.pk, space.pk)]
    assert orm["published"] == sorted([
        (live.LOG_TOPIC, {"type": "log.advanced", "first": "P", "position": "P", "conversations": [group.pk],
                          "spaces": [space.pk], "access_spaces": [], "access_members": [],
                          "members": [bob.pk]}),
        (f"inbox.{bob.public_id}", {"type": "inbox.available", "items": 1, "message": "M"}),
        ("inbox.tasks.classify_pending", (carol.pk,)),
    ], key=repr)


def test_both_acknowledgement_paths_settle_and_publish_the_same(space, alice, bob, carol, monkeypatch,
                                                                 django_capture_on_commit_callbacks):
    # given: bob sends alice and carol two direct messages each; a recording publisher
    sent = []
    record = lambda group, note: sent.append((group, note))
    monkeypatch.setattr(publisher, "send", record)
    monkeypatch.setattr(publisher, "publish", record)  # topics
    for reader in (alice, carol):
        direct, _ = services.get_or_create_direct(space, reader, actor=bob)
        for n in range(2):
            send_message(direct, body=f"item {n} for {reader.handle}", actor=bob)
    snapshots = []
    for reader, acknowledge in ((alice, delivery._acknowledge_in_one_statement),
                                (carol, delivery._acknowledge_with_orm)):
        first, second = InboxItem.objects.filter(member=reader).order_by("position").values_list("token", flat=True)
        other = alice if reader == carol else carol
        foreign = InboxItem.objects.filter(member=other).values_list("token", flat=True).first()
        sent.clear()
        # when: one token acknowledged twice, an unknown and a foreign one
        with django_capture_on_commit_callbacks(execute=True):
            found = [acknowledge(reader, token) for token in (first, first, "dlv_" + "x" * 43, foreign)]
        # then
        items = InboxItem.objects.filter(member=reader).order_by("position")
        snapshots.append({
            "found": found,
            "items": [(i.token == first, i.state, i.acknowledged_at is not None) for i in items],
            "mailbox": Mailbox.objects.get(member=reader).pending_bytes == items.get(token=second).content_bytes,
            "share": MailboxShare.objects.get(member=reader, sender=bob).pending_bytes,
            "published": [(group == f"inbox.{reader.public_id}", note) for group, note in sent],
        })
    one_statement, orm = snapshots
    assert one_statement == orm
    assert orm["found"] == [True, True, False, False]
    assert orm["items"] == [(True, "acknowledged", True), (False, "pending", False)]
    assert orm["mailbox"] is True
    assert orm["published"] == [(True, {"type": "inbox.acknowledged"})]


def test_both_batch_acknowledgement_paths_settle_and_publish_the_same(space, alice, bob, carol, monkeypatch,
                                                                       django_capture_on_commit_callbacks):
    # given: bob sends alice three and carol two direct messages; a recording publisher
    from django.db import transaction

    from inbox import mailbox

    sent = []
    record = lambda group, note: sent.append((group, note))
    monkeypatch.setattr(publisher, "send", record)
    monkeypatch.setattr(publisher, "publish", record)  # topics
    for reader, count in ((alice, 3), (carol, 2)):
        direct, _ = services.get_or_create_direct(space, reader, actor=bob)
        for n in range(count):
            send_message(direct, body=f"item {n} for {reader.handle}" + "x" * n, actor=bob)
    snapshots = []
    for settle in (delivery._acknowledge_items_in_one_statement, delivery._acknowledge_items_with_orm):
        Mailbox.objects.update(pending_bytes=0)  # the debits, as differences from zero
        MailboxShare.objects.update(pending_bytes=0)
        InboxItem.objects.update(state=InboxItem.State.PENDING, acknowledged_at=None)
        items = {reader: list(InboxItem.objects.filter(member=reader).order_by("position"))
                 for reader in (alice, carol)}
        # two of alice's (one of them twice) and one of carol's in one batch; then carol's again with her other
        batches = [[items[alice][0].pk, items[alice][2].pk, items[alice][0].pk, items[carol][0].pk],
                   [items[carol][0].pk, items[carol][1].pk]]
        sent.clear()
        # when
        for batch in batches:
            with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
                mailbox.lock([alice.pk, carol.pk])
                settle(batch)
        # then
        snapshots.append({
            "states": [(i.member_id, i.position, i.state, i.acknowledged_at is not None)
                       for i in InboxItem.objects.order_by("member_id", "position")],
            "mailboxes": sorted(Mailbox.objects.filter(member__in=[alice, carol])
                                .values_list("member_id", "pending_bytes")),
            "shares": sorted(MailboxShare.objects.filter(sender=bob).values_list("member_id", "pending_bytes")),
            "published": sorted(sent, key=repr),
        })
    one_statement, orm = snapshots
    assert one_statement == orm
    sizes = {reader: [i.content_bytes for i in items[reader]] for reader in (alice, carol)}
    assert dict(orm["mailboxes"]) == {alice.pk: -(sizes[alice][0] + sizes[alice][2]), carol.pk: -sum(sizes[carol])}
    assert dict(orm["shares"]) == dict(orm["mailboxes"])
    assert [state for _, _, state, _ in orm["states"]].count("acknowledged") == 4
    assert orm["published"] == sorted([(f"inbox.{alice.public_id}", {"type": "inbox.acknowledged"}),
                                       (f"inbox.{carol.public_id}", {"type": "inbox.acknowledged"}),
                                       (f"inbox.{carol.public_id}", {"type": "inbox.acknowledged"})], key=repr)
