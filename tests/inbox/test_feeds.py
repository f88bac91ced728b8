"""SPEC §6: space feed, inbox feed, cursors, retention, snapshots, long-polling."""
import asyncio
import datetime as dt

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from controlplane import services
from controlplane.clock import freeze, now
from controlplane.cursors import pack_cursor
from controlplane.live import log_watcher
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


@pytest.fixture
def private_direct(alice, bob):
    """A private space of alice's with bob in it, and their direct conversation."""
    space = services.create_space(slug="priv", name="Priv", visibility="private", send_policy="open", actor=alice)
    services.add_member(space, bob, actor=alice)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    return space, direct


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
    fresh, _ = drain(as_alice)
    assert [e["data"]["message"]["body"] for e in fresh if e["kind"] == "message.created"] == ["new"]
    assert all(e["position"] > LogHead.objects.get().floor for e in fresh)


def test_snapshot_pages_keep_their_watermark(space, alice, bob, as_bob, monkeypatch):
    # given
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 2)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    sent = [send_message(direct, body=f"task {i}", actor=alice).message for i in range(5)]
    as_bob.post(f"/v0/messages/{sent[1].public_id}/resolve", {"result": "done"})
    as_bob.post(f"/v0/messages/{sent[2].public_id}/acknowledge")
    # when
    first = as_bob.get("/v0/me/snapshot").json()
    send_message(direct, body="after the snapshot", actor=alice)
    pages = [first]
    while pages[-1]["next_page"]:
        pages.append(as_bob.get("/v0/me/snapshot", page=pages[-1]["next_page"]).json())
    # then
    assert len(pages) == 2
    assert {p["snapshot_id"] for p in pages} == {first["snapshot_id"]}
    assert {p["high_watermark"] for p in pages} == {first["high_watermark"]}
    bodies = [u["message"]["body"] for p in pages for u in p["unresolved"]]
    assert bodies == ["task 0", "task 2", "task 3", "task 4"]
    assert [u["state"] for p in pages for u in p["unresolved"]][1] == "acknowledged"
    since = drain(as_bob, "/v0/me/inbox/events", cursor=first["cursor"])[0]
    assert [e["data"]["message"]["body"] for e in since] == ["after the snapshot"]


def test_snapshot_page_tokens_are_bound_and_expire(space, alice, bob, as_bob, as_alice, monkeypatch):
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 1)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    for i in range(3):
        send_message(direct, body=f"task {i}", actor=alice)
    token = as_bob.get("/v0/me/snapshot").json()["next_page"]
    assert error_code(as_alice.get("/v0/me/snapshot", page=token)) == "INVALID_CURSOR"
    with freeze(now() + dt.timedelta(hours=2)):
        expired = as_bob.get("/v0/me/snapshot", page=token)
    assert expired.status_code == 410 and error_code(expired) == "RESYNC_REQUIRED"


def test_long_poll_times_out_with_the_same_cursor(space, as_alice):
    cursor = feed(as_alice)["cursor"]
    response = as_alice.get("/v0/spaces/lab/events", cursor=cursor, wait_ms=30)
    assert response.json() == {"events": [], "cursor": cursor, "has_more": False}


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_long_poll_wakes_when_an_event_commits(monkeypatch, settings):
    # given: a waiting poll that only a wake (not the periodic recheck) can answer in time
    settings.FEED_RECHECK_SECONDS = 120
    alice = await sync_to_async(services.create_member)("alice", actor=None)
    _, token = await sync_to_async(services.issue_credential)(alice, actor=None)
    space = await sync_to_async(services.create_space)(slug="lab", name="Lab", visibility="open",
                                                        send_policy="open", actor=alice)
    general = await sync_to_async(services.create_channel)(space, "general", actor=alice)
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    cursor = pack_cursor((head,), caller=alice.public_id, stream=f"space:{space.public_id}")
    waiting = asyncio.Event()
    original_wait = log_watcher.wait

    async def observed_wait(mark, timeout):
        waiting.set()
        await original_wait(mark, timeout)

    monkeypatch.setattr(log_watcher, "wait", observed_wait)
    poll = asyncio.create_task(AsyncClient().get("/v0/spaces/lab/events", {"cursor": cursor, "wait_ms": 20_000},
                                                 headers={"Authorization": f"Bearer {token}"}))
    await asyncio.wait([poll, asyncio.ensure_future(waiting.wait())], timeout=10,
                       return_when=asyncio.FIRST_COMPLETED)
    assert not poll.done(), poll.result().json()
    # when
    await sync_to_async(send_message)(general, body="wake up", actor=alice)
    response = await asyncio.wait_for(poll, 15)
    # then
    events = response.json()["events"]
    assert [e["data"]["message"]["body"] for e in events] == ["wake up"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_waiting_feed_is_read_again_only_for_commits_it_may_show(monkeypatch, settings):
    # given: bob long-polls the lab's feed and his inbox; nothing but a wake can answer them in time
    settings.FEED_RECHECK_SECONDS = 120
    create = sync_to_async(services.create_member)
    alice, bob, carol = await create("alice", actor=None), await create("bob", actor=None), await create("carol",
                                                                                                        actor=None)
    _, token = await sync_to_async(services.issue_credential)(bob, actor=None)
    spaces = {}
    for slug in ("lab", "elsewhere"):
        spaces[slug] = await sync_to_async(services.create_space)(slug=slug, name=slug, visibility="open",
                                                                  send_policy="open", actor=alice)
    lab_general = await sync_to_async(services.create_channel)(spaces["lab"], "general", actor=alice)
    elsewhere = await sync_to_async(services.create_channel)(spaces["elsewhere"], "general", actor=alice)
    for member in (bob, carol):
        await sync_to_async(services.join_space)(spaces["lab"], actor=member)
    to_carol, _ = await sync_to_async(services.get_or_create_direct)(spaces["lab"], carol, actor=alice)
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    reads = {"lab": 0, "inbox": 0}
    original_wait = log_watcher.wait

    async def counted_wait(mark, timeout):  # every read that found nothing is followed by a wait
        feed = "lab" if "lab" in asyncio.current_task().get_name() else "inbox"
        reads[feed] += 1
        await original_wait(mark, timeout)

    monkeypatch.setattr(log_watcher, "wait", counted_wait)

    def poll(path, stream, name):
        cursor = pack_cursor((head,), caller=bob.public_id, stream=stream)
        return asyncio.create_task(AsyncClient().get(path, {"cursor": cursor, "wait_ms": 20_000},
                                                     headers={"Authorization": f"Bearer {token}"}), name=name)

    lab = poll("/v0/spaces/lab/events", f"space:{spaces['lab'].public_id}", "lab")
    inbox = poll("/v0/me/inbox/events", "inbox", "inbox")
    for _ in range(500):
        if reads == {"lab": 1, "inbox": 1}:
            break
        await asyncio.sleep(0.01)
    # when: commits in another space
    for n in range(5):
        await sync_to_async(send_message)(elsewhere, body=f"not for bob {n}", actor=alice)
    await asyncio.sleep(0.5)
    # then: neither feed was read again
    assert reads == {"lab": 1, "inbox": 1} and not lab.done() and not inbox.done()
    # when: a direct message to carol in the lab
    await sync_to_async(send_message)(to_carol, body="for carol only", actor=alice)
    await asyncio.sleep(0.5)
    # then: the lab's feed looked (and found nothing bob may see); bob's inbox did not
    assert reads == {"lab": 2, "inbox": 1} and not lab.done() and not inbox.done()
    # when: a message in the lab that mentions bob
    await sync_to_async(send_message)(lab_general, body="hello @bob", actor=alice)
    # then: both answer with it
    answers = [(await asyncio.wait_for(task, 15)).json()["events"] for task in (lab, inbox)]
    assert [[e["data"]["message"]["body"] for e in events] for events in answers] == [["hello @bob"]] * 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_lost_nudge_is_found_by_one_look_at_the_log_head_not_by_every_poll(monkeypatch, settings):
    # given: a long-poll waiting on a quiet space, and a watcher that looks at the log head every 0.2 s
    settings.FEED_RECHECK_SECONDS = 0.2
    alice = await sync_to_async(services.create_member)("alice", actor=None)
    _, token = await sync_to_async(services.issue_credential)(alice, actor=None)
    space = await sync_to_async(services.create_space)(slug="lab", name="Lab", visibility="open",
                                                        send_policy="open", actor=alice)
    general = await sync_to_async(services.create_channel)(space, "general", actor=alice)
    # the watcher has heard of the newest commit (one it never heard of would wake everyone once)
    for n in range(100):
        mark = log_watcher.mark()
        await sync_to_async(send_message)(general, body=f"before {n}", actor=alice)
        await log_watcher.wait(mark, 0.1)
        if mark.is_set():
            break
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    reads = [0]
    original_wait = log_watcher.wait

    async def counted_wait(event, timeout):
        reads[0] += 1
        await original_wait(event, timeout)

    monkeypatch.setattr(log_watcher, "wait", counted_wait)
    cursor = pack_cursor((head,), caller=alice.public_id, stream=f"space:{space.public_id}")
    poll = asyncio.create_task(AsyncClient().get("/v0/spaces/lab/events", {"cursor": cursor, "wait_ms": 20_000},
                                                 headers={"Authorization": f"Bearer {token}"}))
    for _ in range(500):
        if reads[0]:
            break
        await asyncio.sleep(0.01)
    # when: five of the watcher's looks pass with nothing committed
    await asyncio.sleep(1.0)
    # then: the poll was not read again on a timer of its own
    assert reads[0] == 1 and not poll.done()
    # when: a send whose nudge is lost
    monkeypatch.setattr("controlplane.log.group_send_on_commit", lambda group, message: None)
    await sync_to_async(send_message)(general, body="unannounced", actor=alice)
    # then: the watcher's look at the log head finds it, long before the poll's 20 s
    response = await asyncio.wait_for(poll, 3)
    assert [e["data"]["message"]["body"] for e in response.json()["events"]] == ["unannounced"]


def test_snapshot_forgets_spaces_you_were_removed_from(private_direct, alice, bob, api_for):
    # given
    space, direct = private_direct
    send_message(direct, body="secret plan for bob", actor=alice)
    as_bob = api_for(bob)
    assert len(as_bob.get("/v0/me/snapshot").json()["unresolved"]) == 1
    # when
    services.remove_member(space, bob, actor=alice)
    # then
    snapshot = as_bob.get("/v0/me/snapshot").json()
    assert snapshot["unresolved"] == [] and "secret" not in str(snapshot)


@pytest.mark.asyncio
async def test_log_watcher_renews_its_group_membership_under_steady_traffic(monkeypatch):
    # given: memberships expire after 1 s, renewed every 0.3 s, and a commit every 0.1 s
    from channels.layers import InMemoryChannelLayer

    from controlplane import live
    layer = InMemoryChannelLayer(group_expiry=1)
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(live, "GROUP_READD_SECONDS", 0.3)
    watcher = live.LogWatcher()
    watcher.mark()
    for _ in range(100):  # until the listener has joined the group
        if layer.groups.get(live.LOG_GROUP):
            break
        await asyncio.sleep(0.01)
    wakes = 0
    # when: traffic runs for longer than the expiry
    for _ in range(25):
        mark = watcher.mark()
        await layer.group_send(live.LOG_GROUP, {"type": "log.advanced"})
        await watcher.wait(mark, 0.5)
        wakes += mark.is_set()
        await asyncio.sleep(0.1)
    await watcher.stop()
    # then: every commit still woke the watcher
    assert wakes == 25


@pytest.mark.asyncio
async def test_a_group_listener_stops_when_cancelled_under_a_stream_of_messages(monkeypatch):
    # given: a layer that always has a message ready (a busy group), and a listener on it
    from controlplane import live

    class Flooded:
        async def new_channel(self):
            return "specific.flooded"

        async def group_add(self, group, channel):
            pass

        async def group_discard(self, group, channel):
            pass

        async def receive(self, channel):
            return {"type": "webhooks.due"}

    monkeypatch.setattr(live, "get_channel_layer", Flooded)
    heard = []
    listener = asyncio.create_task(live.listen("busy", heard.append))
    await asyncio.sleep(0.05)
    # when
    listener.cancel()
    # then: it stops (a cancellation that met a ready message is not lost)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(listener, 2)
    assert heard


@pytest.mark.asyncio
async def test_a_task_that_loses_a_cancellation_is_still_stopped():
    """channels-redis's receive can lose a cancellation that comes while the
    layer's receive lock passes to it; `stop_task` cancels again until the
    task has ended, where awaiting it once would wait for ever."""
    # given: a task that swallows the first cancellation it gets
    from controlplane import live
    swallowed = []

    async def forgetful():
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(asyncio.current_task().uncancel())

    task = asyncio.create_task(forgetful())
    await asyncio.sleep(0)
    # when
    await asyncio.wait_for(live.stop_task(task), 5)
    # then
    assert task.cancelled() and swallowed == [0]


def test_every_snapshot_page_reads_the_moment_it_was_taken(space, alice, bob, as_bob, monkeypatch):
    # given: a snapshot of three unresolved messages, one per page
    monkeypatch.setattr("inbox.feeds.SNAPSHOT_PAGE_MAX", 1)
    direct, _ = services.get_or_create_direct(space, bob, actor=alice)
    sent = [send_message(direct, body=f"task {i}", actor=alice).message for i in range(3)]
    first = as_bob.get("/v0/me/snapshot").json()
    # when: while bob pages, he resolves the second and acknowledges the third
    as_bob.post(f"/v0/messages/{sent[1].public_id}/resolve", {"result": "done"})
    as_bob.post(f"/v0/messages/{sent[2].public_id}/acknowledge")
    pages = [first]
    while pages[-1]["next_page"]:
        pages.append(as_bob.get("/v0/me/snapshot", page=pages[-1]["next_page"]).json())
    # then: the later pages show them as they were when the snapshot was taken
    unresolved = [u for p in pages for u in p["unresolved"]]
    assert [(u["message"]["body"], u["state"], u["acknowledged_at"]) for u in unresolved] == [
        ("task 0", "pending", None), ("task 1", "pending", None), ("task 2", "pending", None)]
