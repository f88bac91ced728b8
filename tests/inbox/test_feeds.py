"""SPEC §6: space feed, inbox feed, cursors, retention (snapshots: test_snapshots.py; long-polling:
test_longpoll.py)."""
import datetime as dt
import os

import pytest

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.db import unprepared_rows
from controlplane.log import prune_events
from controlplane.models import LogHead
from inbox.services import send_message
from tests.conftest import error_code


def feed(api, path="/v0/spaces/lab/events", **params):
    response = api.get(path, **params)
    assert response.status_code == 200, response.json()
    return response.json()


def drain(api, path="/v0/spaces/lab/events", cursor=None, limit=100):
    events = []
    while True:
        page = feed(api, path, limit=limit, **({"cursor": cursor} if cursor else {}))
        events += page["events"]
        cursor = page["cursor"]
        if not page["has_more"]:
            return events, cursor


def test_space_feed_pages_in_position_order(general, as_alice, alice):
    # given
    for i in range(7):
        send_message(general, body=f"m{i}", actor=alice)
    # when
    first = feed(as_alice, limit=3)
    rest, cursor = drain(as_alice, cursor=first["cursor"], limit=3)
    # then
    events = first["events"] + rest
    positions = [e["position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [e["data"]["message"]["body"] for e in events if e["kind"] == "message.created"] == \
        [f"m{i}" for i in range(7)]
    assert set(events[0]) == {"id", "position", "kind", "space", "conversation", "actor", "created_at", "data"}
    empty = feed(as_alice, cursor=cursor)
    assert empty == {"events": [], "cursor": cursor, "has_more": False}


def test_space_feed_hides_conversations_you_are_not_in(space, general, alice, bob, as_carol, anon):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="private", actor=alice)
    send_message(general, body="public", actor=alice)
    # when
    carols, _ = drain(as_carol)
    anons, _ = drain(anon)
    # then
    for events in (carols, anons):
        assert all(e["conversation"] != direct.public_id for e in events)
        assert "private" not in str(events)
        assert any(e["kind"] == "message.created" and e["data"]["message"]["body"] == "public" for e in events)


def test_a_page_looks_at_so_many_events_and_its_cursor_moves_past_those_it_may_not_see(space, general, alice, bob,
                                                                                       as_carol, monkeypatch):
    # given: carol at the head of the feed; then alice and bob's direct messages, more than a page looks at
    from inbox import feeds

    monkeypatch.setattr(feeds, "SCAN_MAX", 10)
    start = feed(as_carol)["cursor"]
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for n in range(25):
        send_message(direct, body=f"just us {n}", actor=alice)
    send_message(general, body="for everyone", actor=alice)
    # when: carol reads on from where she was
    first = feed(as_carol, cursor=start)
    pages = [first]
    while pages[-1]["has_more"]:
        pages.append(feed(as_carol, cursor=pages[-1]["cursor"]))
    # then: pages of nothing she may see move her cursor on, ten events at a time, to what she may
    assert first["events"] == [] and first["has_more"] is True and first["cursor"] != start
    assert len(pages) == 3
    seen = [e["data"]["message"]["body"] for page in pages for e in page["events"] if e["kind"] == "message.created"]
    assert seen == ["for everyone"]
    assert feed(as_carol, cursor=pages[-1]["cursor"]) == {"events": [], "cursor": pages[-1]["cursor"],
                                                          "has_more": False}


@pytest.mark.parametrize("reader", ["carol", "anonymous"])
def test_others_direct_messages_do_not_move_a_readers_cursor(space, general, alice, bob, as_carol, anon, reader):
    """The cursor of an empty page moved past events the reader may not
    see: anyone polling an open space learnt when its members wrote to each
    other, and how often."""
    api = as_carol if reader == "carol" else anon
    # given: the reader at the head of the feed, having seen a public message
    send_message(general, body="for everyone", actor=alice)
    start = feed(api)["cursor"]
    # when: alice and bob write to each other, and a message elsewhere follows too
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for n in range(3):
        send_message(direct, body=f"just us {n}", actor=alice)
    # then: the reader's page is empty and its cursor the one it gave, as if nothing happened
    assert feed(api, cursor=start) == {"events": [], "cursor": start, "has_more": False}
    assert feed(api, cursor=start, wait_ms=300) == {"events": [], "cursor": start, "has_more": False}
    # and: the next public message follows, its cursor at it
    sent = send_message(general, body="for everyone again", actor=alice).message
    page = feed(api, cursor=start)
    assert [e["position"] for e in page["events"]] == [sent.position] and page["has_more"] is False
    assert feed(api, cursor=page["cursor"]) == {"events": [], "cursor": page["cursor"], "has_more": False}


def test_an_event_committed_while_a_page_is_read_is_in_the_next_page(space, general, alice, as_carol, monkeypatch):
    # given: carol's page is read, and a message commits between its two reads
    from inbox import feeds

    send_message(general, body="first", actor=alice)
    start = feed(as_carol)["cursor"]
    send_message(general, body="second", actor=alice)
    sent = []

    def meanwhile(query):
        if "MAX(" in query[0] and not sent:
            sent.append(send_message(general, body="committed meanwhile", actor=alice))
        return unprepared_rows(query)

    monkeypatch.setattr(feeds, "unprepared_rows", meanwhile)
    first = feed(as_carol, cursor=start, limit=5)
    monkeypatch.undo()
    # then: the page moved no further than what it read, and the next one has the rest
    later, _ = drain(as_carol, cursor=first["cursor"])
    bodies = [e["data"]["message"]["body"] for e in first["events"] + later if e["kind"] == "message.created"]
    assert sent and bodies == ["second", "committed meanwhile"]


def test_participants_see_their_direct_conversation_in_the_space_feed(space, alice, bob, as_bob):
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="private", actor=alice)
    events, _ = drain(as_bob)
    assert [e["kind"] for e in events if e["conversation"] == direct.public_id] == \
        ["conversation.created", "message.created"]


def test_inbox_feed_has_only_addressed_events(space, general, alice, bob, carol, as_bob):
    # given
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    other = services.create_space(slug="other", name="Other", visibility="open", send_policy="open", actor=carol)
    services.join_space(other, actor=bob)
    elsewhere = services.create_channel(other, "general", actor=carol)
    send_message(general, body="no mention", actor=alice)
    send_message(general, body="hey @bob", actor=alice)
    send_message(direct, body="dm", actor=alice)
    send_message(group, body="group", actor=carol)
    send_message(elsewhere, body="@bob over here", actor=carol)
    send_message(direct, body="from me", actor=bob)
    # when
    events, _ = drain(as_bob, "/v0/me/inbox/events")
    # then
    assert [e["data"]["message"]["body"] for e in events] == ["hey @bob", "dm", "group", "@bob over here"]
    assert {e["kind"] for e in events} == {"message.created"}


def test_inbox_feed_drops_spaces_you_can_no_longer_read(private_direct, alice, bob, api_for):
    # given
    space, direct = private_direct
    send_message(direct, body="before removal", actor=alice)
    as_bob = api_for(bob)
    assert len(drain(as_bob, "/v0/me/inbox/events")[0]) == 1
    # when
    services.remove_member(space, bob, actor=alice)
    # then
    assert drain(as_bob, "/v0/me/inbox/events")[0] == []


def test_tampered_and_foreign_cursors_are_rejected(space, general, alice, as_alice, as_bob, anon):
    # given
    send_message(general, body="x", actor=alice)
    cursor = feed(as_alice, limit=1)["cursor"]
    other = services.create_space(slug="other", name="Other", visibility="open", send_policy="open", actor=alice)
    # then
    tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    for api, path, token in [
        (as_alice, "/v0/spaces/lab/events", tampered),
        (as_alice, "/v0/spaces/lab/events", cursor + "A"),
        (as_alice, "/v0/spaces/lab/events", "not-a-cursor!"),
        (as_bob, "/v0/spaces/lab/events", cursor),          # another caller
        (anon, "/v0/spaces/lab/events", cursor),            # anonymous
        (as_alice, f"/v0/spaces/{other.slug}/events", cursor),  # another space
        (as_alice, "/v0/me/inbox/events", cursor),          # another stream
    ]:
        response = api.get(path, cursor=token)
        assert response.status_code == 400, (path, token)
        assert error_code(response) == "INVALID_CURSOR"


@pytest.mark.parametrize("path, name", [("/v0/spaces/lab/events", "cursor"), ("/v0/me/inbox/events", "cursor"),
                                        ("/v0/me/inbox", "cursor"), ("/v0/me/inbox/held", "cursor"),
                                        ("/v0/spaces/lab/members", "cursor"), ("/v0/me/spaces", "cursor"),
                                        ("/v0/me/snapshot", "page")])
@pytest.mark.parametrize("token", ["A" * 201, "A" * 42 + "\x00", "é" * 10])
def test_a_cursor_of_any_length_or_characters_is_invalid_cursor_on_every_paged_read(space, as_alice, path, name,
                                                                                   token):
    # a client told INVALID_CURSOR starts afresh; INVALID_REQUEST would say its request was wrong
    response = as_alice.get(path, **{name: token})
    assert response.status_code == 400 and error_code(response) == "INVALID_CURSOR", response.json()


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 101}, {"limit": "x"}, {"wait_ms": -1},
                                    {"wait_ms": 30_001}])
def test_bad_feed_parameters(space, as_alice, params):
    response = as_alice.get("/v0/spaces/lab/events", **params)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"


def test_cursor_below_retention_floor_needs_resync(general, alice, as_alice):
    # given: an old event, a cursor before it, then a prune
    old_cursor = feed(as_alice, limit=1)["cursor"]
    with freeze(now() - dt.timedelta(days=40)):
        send_message(general, body="old", actor=alice)
    send_message(general, body="new", actor=alice)
    # when
    deleted = prune_events(older_than=now() - dt.timedelta(days=30))
    # then
    assert deleted >= 1
    gone = as_alice.get("/v0/spaces/lab/events", cursor=old_cursor)
    assert gone.status_code == 410 and error_code(gone) == "RESYNC_REQUIRED"
    assert gone.json()["error"]["details"]["reason"] == "pruned"
    fresh, _ = drain(as_alice)
    assert [e["data"]["message"]["body"] for e in fresh if e["kind"] == "message.created"] == ["new"]
    assert all(e["position"] > LogHead.objects.get().floor for e in fresh)


@pytest.mark.parametrize("runs", [1, 2])
def test_after_a_restore_readers_who_read_what_it_lost_resync_and_the_rest_miss_nothing(space, alice, bob, as_bob,
                                                                                       runs):
    """A database restored from a backup gave later events positions a
    reader had passed: read on, its cursor was an empty page for ever,
    skipping every new event. `manage.py restored` moves new positions past
    every one given out, and tells who read what the restore lost; run
    twice, the second run forgot what the first marked lost."""
    from django.core.management import call_command

    from controlplane.models import Event
    from mcp_endpoint import sources

    item = sources.SOURCES["org.switchboard/inbox.item"]
    paths = ("/v0/spaces/lab/events", "/v0/me/inbox/events")
    # given: bob has read both feeds, and polled, to the backup's end; then again past one more message
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    send_message(direct, body="before the backup", actor=alice)
    at_backup = {path: drain(as_bob, path)[1] for path in paths}
    polled_at_backup = sources.read(bob, item, {}, None, 50).cursor
    backup = LogHead.objects.get().position
    send_message(direct, body="lost in the restore", actor=alice)
    past_it = {path: drain(as_bob, path)[1] for path in paths}
    polled_past_it = sources.read(bob, item, {}, polled_at_backup, 50).cursor
    # when: the database is as the backup left it
    Event.objects.filter(position__gt=backup).delete()
    LogHead.objects.filter(id=1).update(position=backup)
    # then: before anyone marks the restore, a cursor past the restored log is told already
    for path, cursor in past_it.items():
        assert error_code(as_bob.get(path, cursor=cursor)) == "RESYNC_REQUIRED", path
    # when: it is marked, and the log goes on
    for _ in range(runs):
        call_command("restored", stdout=open(os.devnull, "w"))
    send_message(direct, body="after the restore", actor=alice)
    # then: who read what it lost is told so, however far the log goes; the rest read on and miss nothing
    for path in paths:
        gone = as_bob.get(path, cursor=past_it[path])
        assert (gone.status_code, error_code(gone)) == (410, "RESYNC_REQUIRED"), path
        assert gone.json()["error"]["details"]["reason"] == "restored" and "restored" in gone.json()["error"]["message"]
        read_on = drain(as_bob, path, cursor=at_backup[path])[0]
        assert [e["data"]["message"]["body"] for e in read_on if e["kind"] == "message.created"] == [
            "after the restore"], path
    assert sources.read(bob, item, {}, polled_past_it, 50).truncated is True
    assert sources.read(bob, item, {}, polled_at_backup, 50).truncated is False


def test_long_poll_times_out_with_the_same_cursor(space, as_alice):
    cursor = feed(as_alice)["cursor"]
    response = as_alice.get("/v0/spaces/lab/events", cursor=cursor, wait_ms=30)
    assert response.json() == {"events": [], "cursor": cursor, "has_more": False}


def test_the_inbox_feed_compiled_once_reads_each_members_own_events(private_direct, alice, bob, carol, api_for):
    # given: one query shape (the same page size) for every reader
    space, direct = private_direct
    services.add_member(space, carol, actor=alice)
    to_carol, _ = services.get_or_create_direct(space, carol, actor=alice)
    send_message(direct, body="for bob", actor=alice)
    send_message(to_carol, body="for carol", actor=alice)
    services.remove_member(space, bob, actor=alice)
    send_message(to_carol, body="for carol again", actor=alice)

    def bodies(member):
        return [e["data"]["message"]["body"] for e in drain(api_for(member), "/v0/me/inbox/events", limit=10)[0]]

    # then: each reader gets their own, as the read rule says now, whoever read first
    assert bodies(carol) == ["for carol", "for carol again"]
    assert bodies(bob) == []
    assert bodies(carol) == ["for carol", "for carol again"]


@pytest.mark.postgres
def test_a_small_spaces_feed_is_planned_for_its_space_on_every_read(general, alice, as_bob, monkeypatch):
    # given: a busy space's 20,000 events after a small space's one, statistics taken
    from django.db import connection

    from inbox import feeds

    busy = services.create_space(slug="busy", name="Busy", visibility="open", send_policy="open", actor=alice)
    chatter = services.create_channel(busy, "chatter", actor=alice)
    send_message(general, body="the small space's", actor=alice)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO controlplane_event (position, kind, space_id, conversation_id, actor_id, "
                       "restricted, data, created_at) SELECT 1000 + g, 'message.created', %s, %s, %s, false, "
                       "'{}'::jsonb, now() FROM generate_series(1, 20000) g", [busy.pk, chatter.pk, alice.pk])
        cursor.execute("ANALYZE controlplane_event")
    reads = []
    monkeypatch.setattr(feeds, "unprepared_rows", lambda query: reads.append(query) or unprepared_rows(query))
    # when: its feed is read more often than a statement takes to be prepared and its plan to go generic
    pages = [feed(as_bob)["events"] for _ in range(12)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
                       ['%"controlplane_event"."space_id" = $%'])
        prepared = cursor.fetchall()
        cursor.execute("EXPLAIN " + reads[-2][0], reads[-2][1])  # the page's read (the other: how far it looked)
        plan = "\n".join(line for line, in cursor.fetchall())
    # then: every read found its page, none as a prepared statement, each planned through the space's index in order
    assert all([e["data"]["message"]["body"] for e in page if e["kind"] == "message.created"] == ["the small space's"]
               for page in pages)
    assert len(reads) == 24 and prepared == []
    assert "event_space_position" in plan and "Sort" not in plan, plan


def test_an_inbox_feed_page_is_two_round_trips_whatever_it_holds(private_direct, alice, bob,
                                                                 django_assert_num_queries):
    # given: a cursor, and messages addressed to bob after it
    from inbox import feeds

    space, direct = private_direct
    after = feeds.inbox_feed(bob, None, 100).position
    for n in range(5):
        send_message(direct, body=f"m{n}", actor=alice)
    # when: a page is read from the cursor, its events' space, conversation and actor used
    with django_assert_num_queries(2):  # the events with their positions; the retention floor
        page = feeds.inbox_feed(bob, after, 3)
        shown = [(e.kind, e.space.slug, e.conversation.public_id, e.actor.handle, e.data["message"]["body"])
                 for e in page.events]
    # then
    assert shown == [("message.created", space.slug, direct.public_id, alice.handle, f"m{n}") for n in range(3)]
    assert page.has_more and page.position == page.events[-1].position
    rest = feeds.inbox_feed(bob, page.position, 3)
    assert [e.data["message"]["body"] for e in rest.events] == ["m3", "m4"] and not rest.has_more


@pytest.mark.parametrize("read", ["space feed, anonymously", "inbox feed"])
def test_a_page_holds_a_mebibyte_of_events_at_most_and_the_next_goes_on_from_there(space, general, alice, bob, anon,
                                                                                   as_bob, read):
    """A hundred of the largest messages, each character one JSON writes as
    six, made one page of 9.6 MB for anyone reading an open space."""
    from inbox.feeds import PAGE_BYTES

    # given: 30 messages as large as they come, to bob
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(30):
        send_message(direct if read == "inbox feed" else general, body=f"{i}:" + "\x01" * 8000,
                     related_paths=["\x01" * 1000] * 8, actor=alice)
    api, path = (anon, "/v0/spaces/lab/events") if read != "inbox feed" else (as_bob, "/v0/me/inbox/events")
    # when
    first = api.get(path, limit=100)
    events, _ = drain(api, path, cursor=first.json()["cursor"])
    # then: the first page fits, says there is more, and the pages together hold every message once, in order
    assert len(first.content) <= PAGE_BYTES + 1024 and first.json()["has_more"]
    bodies = [e["data"]["message"]["body"].split(":")[0] for e in first.json()["events"] + events
              if e["kind"] == "message.created"]
    assert bodies == [str(i) for i in range(30)] and len(first.json()["events"]) < 30
