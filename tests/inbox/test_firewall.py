"""SPEC §7, inbox firewall: ordered allow/hold rules, guidance, holds and
release, classification in conversation order outside the send."""
import threading

import pytest
from django.conf import settings
from django.db import connections

from controlplane import services
from controlplane.errors import ApiError
from inbox import firewall, reads
from controlplane.models import EventAddressee
from inbox.models import InboxItem, Mailbox, MailboxShare
from inbox.services import send_message
from tests.conftest import error_code


def inbox_contents(api):
    return [(e["item"]["content"], e.get("guidance")) for e in api.get("/v0/me/inbox").json()["items"]]


def test_rules_admit_with_guidance_or_hold(space, alice, bob, carol, as_bob, django_capture_on_commit_callbacks):
    # given
    response = as_bob.put("/v0/me/inbox/firewall", {"rules": [
        {"action": "hold", "content_pattern": "(?i)password"},
        {"action": "allow", "sender": "@carol", "guidance": "carol is a trusted reviewer"},
    ]})
    assert response.status_code == 200 and len(response.json()["rules"]) == 2
    assert response.json()["rules"][1]["sender"] == "@carol"
    to_alice, _ = services.get_or_create_direct(space, alice, actor=bob)
    to_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    # when: each send commits, and its after-commit kick classifies (tasks run in-process here)
    for conversation, body, author in [(to_alice, "here is my password: hunter2", alice),
                                       (to_carol, "LGTM", carol), (to_alice, "plain note", alice)]:
        with django_capture_on_commit_callbacks(execute=True):
            send_message(conversation, body=body, actor=author)
    # then
    assert inbox_contents(as_bob) == [("LGTM", "carol is a trusted reviewer"), ("plain note", None)]
    held = as_bob.get("/v0/me/inbox/held").json()["items"]
    assert [e["item"]["content"] for e in held] == ["here is my password: hunter2"]
    token = held[0]["deliveryToken"]
    assert error_code(as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})) == "UNKNOWN_DELIVERY"
    assert error_code(as_bob.get(f"/v0/inbox-events/evt_{token[4:]}")) == "UNKNOWN_EVENT"
    # when the owner releases it
    released = as_bob.post("/v0/me/inbox/held/release", {"deliveryToken": token})
    # then
    assert released.status_code == 200
    assert "here is my password: hunter2" in [c for c, _ in inbox_contents(as_bob)]


def test_held_content_leaves_the_mailbox_count(space, alice, bob, as_bob):
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="held", actor=alice)
    assert Mailbox.objects.get(member=bob).pending_bytes > 0
    firewall.classify_pending(bob.pk)
    assert Mailbox.objects.get(member=bob).pending_bytes == 0


def test_a_held_sender_fills_only_their_share_of_held_rows(settings, space, alice, bob, carol, as_bob):
    # given: bob holds everything alice sends; a share of two bodies
    settings.MAILBOX_SENDER_SHARE = 2 * 1024 + 1024
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "sender": "@alice"}]})
    from_alice, _ = services.get_or_create_direct(space, alice, actor=bob)
    from_carol, _ = services.get_or_create_direct(space, carol, actor=bob)
    for _ in range(2):
        send_message(from_alice, body="a" * 1024, actor=alice)
        firewall.classify_pending(bob.pk)
    # when: a third would pass alice's share, though her held items fill no mailbox
    with pytest.raises(ApiError) as refused:
        send_message(from_alice, body="a" * 1024, actor=alice)
    # then
    assert (refused.value.code, refused.value.details["reason"]) == ("MAILBOX_FULL", "sender_share")
    assert InboxItem.objects.filter(member=bob, admission="held").count() == 2
    assert Mailbox.objects.get(member=bob).pending_bytes == 0
    send_message(from_carol, body="c" * 1024, actor=carol)  # others are unaffected
    # when bob releases one and acknowledges it, alice has room again
    token = InboxItem.objects.filter(member=bob, admission="held").first().token
    as_bob.post("/v0/me/inbox/held/release", {"deliveryToken": token})
    as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": token})
    send_message(from_alice, body="a" * 1024, actor=alice)


def test_the_migration_counts_items_held_before_in_their_senders_share(space, alice, bob, as_bob):
    # given: an item held the way it was before, out of its sender's share too
    import importlib

    from django.apps import apps
    migration = importlib.import_module("inbox.migrations.0008_held_items_in_shares")
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "sender": "@alice"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="a" * 1000, actor=alice)
    firewall.classify_pending(bob.pk)
    held = InboxItem.objects.get(member=bob, admission="held")
    MailboxShare.objects.filter(member=bob, sender=alice).update(pending_bytes=0)
    # when
    migration.count_held(apps, None)
    # then: released and acknowledged, it leaves the share at zero, not below
    assert MailboxShare.objects.get(member=bob, sender=alice).pending_bytes == held.content_bytes
    as_bob.post("/v0/me/inbox/held/release", {"deliveryToken": held.token})
    as_bob.post("/v0/me/inbox/acknowledge", {"deliveryToken": held.token})
    assert MailboxShare.objects.get(member=bob, sender=alice).pending_bytes == 0


def test_no_rules_means_admitted_at_once(space, alice, bob, as_bob):
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold"}]})
    as_bob.put("/v0/me/inbox/firewall", {"rules": []})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="straight in", actor=alice)
    assert InboxItem.objects.get(member=bob).admission == "admitted" and InboxItem.objects.get(
        member=bob).settled_at is None


@pytest.mark.parametrize("rules", [
    [{"action": "explode"}], [{"action": "hold", "content_pattern": "("}],
    [{"action": "hold", "conversation_kind": "room"}], [{"action": "hold", "unknown": 1}],
    [{"action": "hold", "min_bytes": "5"}], "hold",
    # a space is a slug (these were kept, and matched nothing)
    [{"action": "hold", "space": "LAB"}], [{"action": "hold", "space": " lab"}], [{"action": "hold", "space": ""}],
])
def test_bad_rules_are_400_and_change_nothing(as_bob, bob, rules):
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow"}]})
    response = as_bob.put("/v0/me/inbox/firewall", {"rules": rules})
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert as_bob.get("/v0/me/inbox/firewall").json()["rules"][0]["action"] == "allow"


def test_the_sweep_settles_what_a_lost_kick_left(space, alice, bob, as_bob, monkeypatch):
    # given: kicks go nowhere
    monkeypatch.setattr("controlplane.live.kick_on_commit", lambda *a: None)
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow", "guidance": "ok"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="waiting", actor=alice)
    assert inbox_contents(as_bob) == []
    # when
    from inbox.tasks import classify_all
    assert classify_all() == 1
    # then
    assert inbox_contents(as_bob) == [("waiting", "ok")]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_slow_decision_holds_no_lock_and_nothing_overtakes(monkeypatch):
    # given: bob's firewall, two items in one conversation, kicks disabled
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)
    alice, bob = (services.create_member(h, actor=None) for h in ("alice", "bob"))
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="first", actor=alice)
    send_message(direct, body="second", actor=alice)
    entered, proceed = threading.Event(), threading.Event()
    original = firewall.decide

    def slow_decide(rules, item):
        if item.payload["content"] == "first" and threading.current_thread().name == "stuck":
            entered.set()
            assert proceed.wait(30)
        return original(rules, item)

    monkeypatch.setattr(firewall, "decide", slow_decide)
    worker = threading.Thread(target=lambda: (firewall.classify_pending(bob.pk), connections.close_all()),
                              name="stuck")
    # when: one worker is stuck deciding the first item
    worker.start()
    assert entered.wait(30)
    # then: it holds no lock (on SQLite, not the write lock): a send commits meanwhile
    send_message(direct, body="third", actor=alice)
    # and another worker settles everything, in order
    assert firewall.classify_pending(bob.pk) == 3
    proceed.set()
    worker.join(30)
    # and the stuck worker, finding its item settled, settles nothing twice
    items = list(InboxItem.objects.filter(member=bob).order_by("settled_at", "id"))
    assert [i.payload["content"] for i in items] == ["first", "second", "third"]
    assert {i.admission for i in items} == {"admitted"}
    assert EventAddressee.objects.filter(member=bob, event__kind="message.admitted").count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_admit_every_conversation_in_order_once(monkeypatch):
    # given: 3 members with firewalls, 2 conversations each, 15 items per conversation
    monkeypatch.setattr("inbox.writes.kick_once_on_commit", lambda *a: None)
    sender = services.create_member("sender", actor=None)
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=sender)
    members = [services.create_member(f"r{i}", actor=None) for i in range(3)]
    others = [services.create_member(f"o{i}", actor=None) for i in range(3)]
    for m in members + others:
        services.join_space(space, actor=m)
    for member in members:
        firewall.set_rules(member, [{"action": "hold", "content_pattern": "odd"}], actor=member)
    conversations = []
    for member, other in zip(members, others):
        conversations += [services.get_or_create_direct(space, member, actor=sender)[0],
                          services.get_or_create_group(space, [sender, member, other], actor=sender)[0]]
    for i in range(15):
        for conversation in conversations:
            send_message(conversation, body=f"{i} {'odd' if i % 2 else 'even'}", actor=sender)
    decisions = []
    original = firewall.decide
    monkeypatch.setattr(firewall, "decide", lambda rules, item: decisions.append(item.pk) or original(rules, item))
    errors = []

    def work():
        try:
            for _ in range(3):
                for member in members:
                    firewall.classify_pending(member.pk)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    # when
    workers = [threading.Thread(target=work) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    # then
    assert not errors
    items = InboxItem.objects.filter(member__in=members)
    assert items.count() == len(set(decisions)) == 3 * 2 * 15
    # each allowed item admitted exactly once (a worker that lost a race decides again, never settles twice)
    admitted = EventAddressee.objects.filter(member__in=members, event__kind="message.admitted")
    assert admitted.count() == items.filter(admission="admitted").count() == 3 * 2 * 8
    assert not items.filter(admission="unclassified").exists()
    for member in members:
        for conversation_id in set(items.filter(member=member).values_list("conversation_id", flat=True)):
            settled = list(items.filter(member=member, conversation_id=conversation_id).order_by("settled_at", "id")
                           .values_list("position", flat=True))
            assert settled == sorted(settled)


def inbox_paths(get) -> dict[str, list[str]]:
    """What each of the inbox's read paths shows of message bodies; `get`
    answers a path with its JSON (the test client's, or a real server's)."""
    feed = get("/v0/me/inbox/events")["events"]
    return {
        "read_inbox": [e["item"]["content"] for e in get("/v0/me/inbox")["items"]],
        "inbox feed": [e["data"]["message"]["body"] for e in feed if "message" in e["data"]],
        "snapshot": [m["message"]["body"] for m in get("/v0/me/snapshot")["unresolved"]],
    }


@pytest.mark.parametrize("ending", ["unclassified", "held", "held then released", "allowed"])
def test_every_inbox_read_path_sees_only_admitted_items(space, alice, bob, as_bob, ending):
    # given: bob's firewall holds "secret", allows the rest; the sweep has not run yet
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "content_pattern": "secret"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    body = "the secret plan" if ending.startswith("held") else "an ordinary note"
    send_message(direct, body=body, actor=alice)
    # when
    if ending != "unclassified":
        firewall.classify_pending(bob.pk)
    if ending == "held then released":
        held = as_bob.get("/v0/me/inbox/held").json()["items"]
        assert as_bob.post("/v0/me/inbox/held/release", {"deliveryToken": held[0]["deliveryToken"]}).status_code == 200
    # then: every path agrees, and shows the body only once it is admitted
    admitted = ending in ("held then released", "allowed")
    paths = inbox_paths(lambda path: as_bob.get(path).json())
    assert paths == {path: [body] if admitted else [] for path in paths}


def test_an_admission_reaches_a_feed_reader_who_read_past_the_send(space, alice, bob, as_bob):
    # given: bob reads his feed to the end while alice's message waits for classification
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow", "guidance": "fine"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    sent = send_message(direct, body="waiting", actor=alice).message
    first = as_bob.get("/v0/me/inbox/events").json()
    assert first["events"] == []
    # when
    firewall.classify_pending(bob.pk)
    # then: the next read after his cursor has it, as message.admitted
    events = as_bob.get("/v0/me/inbox/events", cursor=first["cursor"]).json()["events"]
    assert [(e["kind"], e["data"]["message"]["id"]) for e in events] == [("message.admitted", sent.public_id)]


def test_inbox_subscriptions_are_woken_only_by_admitted_items(space, alice, bob, monkeypatch):
    # given: bob's active inbox subscription (rows only: no receiver is called here)
    from controlplane.models import LogHead
    from webhooks.models import Delivery, Endpoint, Subscription
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)
    endpoint = Endpoint.objects.create(owner=bob, url="https://hooks.example/bob")
    Subscription.objects.create(owner=bob, endpoint=endpoint, kind=Subscription.Kind.INBOX,
                                status=Subscription.Status.ACTIVE, debounce_ms=0,
                                activation_position=LogHead.objects.get().position)
    firewall.set_rules(bob, [{"action": "hold", "content_pattern": "secret"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    # when: one message is held, one allowed
    held = send_message(direct, body="the secret", actor=alice).message
    assert not Delivery.objects.exists()  # nothing wakes while unclassified
    allowed = send_message(direct, body="hello", actor=alice).message
    firewall.classify_pending(bob.pk)
    # then: one wake, covering the admission of the allowed one only
    (wake,) = Delivery.objects.all()
    admitted = list(EventAddressee.objects.filter(member=bob, event_id__gt=wake.after_position,
                                                  event_id__lte=wake.through_position)
                    .values_list("event__kind", "event__data__message__id"))
    assert admitted == [("message.admitted", allowed.public_id)]
    assert held.public_id not in str(admitted)


@pytest.mark.timeout(60)
def test_a_backtracking_pattern_is_matched_in_linear_time(space, alice, bob, as_bob):
    # given: the pattern that made a backtracking engine run for a minute on one item
    assert as_bob.put("/v0/me/inbox/firewall", {"rules": [
        {"action": "hold", "content_pattern": r"^(\w+\s?)*$"}]}).status_code == 200
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="a" * 8000 + "!", actor=alice)
    send_message(direct, body="words and more words", actor=alice)
    # when
    firewall.classify_pending(bob.pk)
    # then: both decided (the first does not match, the second does)
    assert inbox_contents(as_bob) == [("a" * 8000 + "!", None)]
    assert [e["item"]["content"] for e in as_bob.get("/v0/me/inbox/held").json()["items"]] == ["words and more words"]


@pytest.mark.parametrize("pattern", [r"(a)\1", r"foo(?=bar)", r"(?<!x)y"])
def test_patterns_a_linear_engine_cannot_match_are_400(as_bob, bob, pattern):
    response = as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold", "content_pattern": pattern}]})
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert "RE2" in response.json()["error"]["message"]
    assert not firewall.FirewallRule.objects.filter(member=bob).exists()


def test_a_rule_that_cannot_be_evaluated_holds_the_item_and_says_so(space, alice, bob, as_bob):
    # given: a stored rule RE2 refuses (written before this server matched with RE2)
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    firewall.FirewallRule.objects.filter(member=bob).update(content_pattern=r"(a)\1")
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="anything", actor=alice)
    # when
    firewall.classify_pending(bob.pk)
    # then: held, with guidance saying why, never stuck unclassified
    (held,) = as_bob.get("/v0/me/inbox/held").json()["items"]
    assert held["guidance"] == firewall.UNDECIDABLE.format(n=1)


def test_read_event_gives_the_guidance_beside_the_item(space, alice, bob, as_bob):
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "allow", "guidance": "alice is a reviewer"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="please look", actor=alice)
    firewall.classify_pending(bob.pk)
    (entry,) = as_bob.get("/v0/me/inbox").json()["items"]
    read = as_bob.get(f"/v0/inbox-events/evt_{entry['deliveryToken'][4:]}").json()
    assert read == {"item": entry["item"], "guidance": "alice is a reviewer"}


def test_every_held_item_can_be_listed_page_by_page(space, alice, bob, as_bob, as_alice,
                                                    django_capture_on_commit_callbacks):
    # given: more held items than one page of three (`limit` was taken, and every page was 50)
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold"}]})
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    for i in range(7):
        with django_capture_on_commit_callbacks(execute=True):
            send_message(direct, body=f"held {i}", actor=alice)
    # when
    seen, cursor, pages = [], None, 0
    while True:
        page = as_bob.get("/v0/me/inbox/held", limit=3, **({"cursor": cursor} if cursor else {})).json()
        seen += [e["item"]["content"] for e in page["items"]]
        pages, cursor = pages + 1, page["nextCursor"]
        if cursor is None:
            break
    # then
    assert seen == [f"held {i}" for i in range(7)] and pages == 3
    assert error_code(as_alice.get("/v0/me/inbox/held", cursor=page_cursor(as_bob))) == "INVALID_CURSOR"


def page_cursor(api) -> str:
    return api.get("/v0/me/inbox/held", limit=1).json()["nextCursor"]


@pytest.mark.postgres
def test_the_held_page_reads_held_items_only(space, alice, bob, as_bob, django_capture_on_commit_callbacks):
    # given: held items beside admitted ones (and every acknowledged tombstone a member ever had)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    send_message(direct, body="admitted", actor=alice)
    as_bob.put("/v0/me/inbox/firewall", {"rules": [{"action": "hold"}]})
    for i in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            send_message(direct, body=f"held {i}", actor=alice)
    # when: the held page's query is planned (sequential scans ruled out, as on a big table)
    with connections["default"].cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = reads.held_after(bob, 0, 0).explain()
    # then: it walks the held items' own index, in page order, not the member's whole inbox
    assert "inboxitem_held" in plan and "Sort" not in plan
    assert [e["item"]["content"] for e in as_bob.get("/v0/me/inbox/held").json()["items"]] == [
        f"held {i}" for i in range(3)]


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: the shared deployment's cache")
def test_a_firewalled_member_has_one_classification_queued_at_a_time(space, alice, bob, monkeypatch,
                                                                      django_capture_on_commit_callbacks):
    # given: bob's firewall, and the task queue recorded
    from controlplane import live
    from inbox import tasks

    queued = []
    monkeypatch.setattr(live, "kick", lambda task, *args: queued.append((task, args)))
    firewall.set_rules(bob, [{"action": "allow"}], actor=bob)
    direct, _ = services.get_or_create_direct(space, alice, actor=bob)
    # when: five sends before the queued run starts
    for n in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            send_message(direct, body=f"note {n}", actor=alice)
    # then: one run is queued; once it starts, the next send queues another
    assert queued == [("inbox.tasks.classify_pending", (bob.pk,))]
    assert tasks.classify_pending(bob.pk) == 5
    with django_capture_on_commit_callbacks(execute=True):
        send_message(direct, body="note 5", actor=alice)
    assert len(queued) == 2
