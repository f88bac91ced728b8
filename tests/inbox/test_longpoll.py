"""Long-polling (`wait_ms`, inbox/api/longpoll.py) and the process's log
watcher that wakes it (controlplane.live): woken by the commits a feed may
show and by nothing else, lost nudges found by one look at the log head,
and the watcher's group membership and listeners kept sound."""
import asyncio

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from controlplane import bearer, live, services
from controlplane.cursors import pack_cursor
from controlplane.live import log_watcher
from controlplane.models import LogHead
from inbox.services import send_message


async def alice_in_the_lab():
    """alice with a bearer token, the open space `lab` and its #general."""
    alice = await sync_to_async(services.create_member)("alice", actor=None)
    _, token = await sync_to_async(bearer.issue_credential)(alice, actor=None)
    space = await sync_to_async(services.create_space)(slug="lab", name="Lab", visibility="open",
                                                        send_policy="open", actor=alice)
    general = await sync_to_async(services.create_channel)(space, "general", actor=alice)
    return alice, token, space, general


def waits_observed(monkeypatch) -> asyncio.Event:
    """An event set when anything in this process starts waiting on the log watcher."""
    waiting = asyncio.Event()
    original_wait = log_watcher.wait

    async def observed_wait(event, timeout):
        waiting.set()
        await original_wait(event, timeout)

    monkeypatch.setattr(log_watcher, "wait", observed_wait)
    return waiting


@pytest_asyncio.fixture(autouse=True)
async def watcher_stops():
    """This process's log watcher, started on the test's event loop by
    whatever waits, leaves the log group and stops with the test."""
    yield
    await log_watcher.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_long_poll_wakes_when_an_event_commits(monkeypatch, settings):
    # given: a waiting poll that only a wake (not the periodic recheck) can answer in time
    settings.FEED_RECHECK_SECONDS = 120
    alice, token, space, general = await alice_in_the_lab()
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    cursor = pack_cursor((head,), caller=alice.public_id, stream=f"space:{space.public_id}")
    waiting = waits_observed(monkeypatch)
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
    _, token = await sync_to_async(bearer.issue_credential)(bob, actor=None)
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
    # when: someone else joins a space (what they may read changed, not what bob may)
    await sync_to_async(services.join_space)(spaces["elsewhere"], actor=carol)
    await asyncio.sleep(0.5)
    # then: bob's inbox was not read again (anyone's membership change woke every inbox waiter of the host)
    assert reads == {"lab": 1, "inbox": 1}
    # when: bob joins it himself: his inbox feed may show older events of it now
    await sync_to_async(services.join_space)(spaces["elsewhere"], actor=bob)
    await asyncio.sleep(0.5)
    # then: it looked again (and found nothing)
    assert reads == {"lab": 1, "inbox": 2} and not inbox.done()
    # when: a direct message to carol in the lab
    await sync_to_async(send_message)(to_carol, body="for carol only", actor=alice)
    await asyncio.sleep(0.5)
    # then: the lab's feed looked (and found nothing bob may see); bob's inbox did not
    assert reads == {"lab": 2, "inbox": 2} and not lab.done() and not inbox.done()
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
    alice, token, space, general = await alice_in_the_lab()
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
    monkeypatch.setattr("controlplane.log.announce_on_commit", lambda message: None)
    await sync_to_async(send_message)(general, body="unannounced", actor=alice)
    # then: the watcher's look at the log head finds it, long before the poll's 20 s
    response = await asyncio.wait_for(poll, 3)
    assert [e["data"]["message"]["body"] for e in response.json()["events"]] == ["unannounced"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_lost_nudge_is_found_even_when_a_later_commit_elsewhere_was_announced(monkeypatch, settings):
    # given: a long-poll waiting on a quiet space, a watcher that looks at the log head every 0.2 s,
    # and another space whose commits the poll does not wait for
    settings.FEED_RECHECK_SECONDS = 0.2
    alice, token, space, general = await alice_in_the_lab()
    elsewhere = await sync_to_async(services.create_space)(slug="elsewhere", name="Elsewhere", visibility="open",
                                                           send_policy="open", actor=alice)
    elsewhere_general = await sync_to_async(services.create_channel)(elsewhere, "general", actor=alice)
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    waiting = waits_observed(monkeypatch)
    cursor = pack_cursor((head,), caller=alice.public_id, stream=f"space:{space.public_id}")
    poll = asyncio.create_task(AsyncClient().get("/v0/spaces/lab/events", {"cursor": cursor, "wait_ms": 20_000},
                                                 headers={"Authorization": f"Bearer {token}"}))
    await asyncio.wait([poll, asyncio.ensure_future(waiting.wait())], timeout=10,
                       return_when=asyncio.FIRST_COMPLETED)
    assert not poll.done(), poll.result().json()
    # when: a send in the lab whose nudge is lost, then one in the other space whose nudge is heard
    from controlplane import log
    announce = log.announce_on_commit
    monkeypatch.setattr(log, "announce_on_commit", lambda message: None)
    await sync_to_async(send_message)(general, body="unannounced", actor=alice)
    monkeypatch.setattr(log, "announce_on_commit", announce)
    await sync_to_async(send_message)(elsewhere_general, body="announced", actor=alice)
    # then: the later announcement does not hide the lost one: a look or two at the log head finds it
    response = await asyncio.wait_for(poll, 3)
    assert [e["data"]["message"]["body"] for e in response.json()["events"]] == ["unannounced"]


def nudge(first: int, last: int) -> dict:
    return {"type": "log.advanced", "first": first, "position": last}


def test_the_positions_announced_are_counted_whatever_the_order_the_nudges_come_in():
    # given: someone waits, from position 10
    announced = live.AnnouncedPositions()
    announced.heard(nudge(1, 10))
    announced.follow()
    # when: commits 11–13 (a group), 14 and 15 are heard out of order, 14 twice (its own process and the broker)
    for message in (nudge(14, 14), nudge(15, 15), nudge(11, 13), nudge(14, 14)):
        announced.heard(message)
    # then: everything up to each head read is accounted for
    assert not announced.missed(12) and not announced.missed(15)
    # when: 16 is lost, 17 heard before the look that read the head, and 18 after it
    announced.heard(nudge(17, 17))
    head = 18
    announced.heard(nudge(18, 18))
    # then: the look finds 16 behind the later announcements, once
    assert announced.missed(head)
    assert not announced.missed(head)


def test_a_nudge_without_its_first_position_covers_only_its_own():
    # given: someone waits, from position 10
    announced = live.AnnouncedPositions()
    announced.heard(nudge(10, 10))
    announced.follow()
    # when: an older process announces a group commit of 11–13 by its last position alone
    announced.heard({"type": "log.advanced", "position": 13})
    # then: 11 and 12 count as lost (everyone wakes: never a sleep)
    assert announced.missed(13)


def test_the_count_starts_at_the_highest_position_heard_when_waiting_begins_and_stops_with_it():
    # given: nobody waits while 1–20 are heard and 21 is lost
    announced = live.AnnouncedPositions()
    announced.heard(nudge(1, 20))
    # when: someone starts waiting, and 22 is heard
    announced.follow()
    announced.heard(nudge(22, 22))
    # then: what committed before the wait began is no one's to find; 21 is
    assert not announced.missed(20) and announced.missed(22)
    # when: nobody waits any more
    announced.forget()
    announced.heard(nudge(23, 23))
    # then: nothing is kept, nor counted
    assert announced.checked is None and not announced._ranges and not announced.missed(30)


def test_the_ranges_kept_between_two_looks_are_bounded(monkeypatch):
    # given: a bound of 10 ranges, and someone waiting from position 0
    monkeypatch.setattr(live, "RANGES_KEPT", 10)
    announced = live.AnnouncedPositions()
    announced.follow()
    # when: a hundred consecutive commits are heard
    for position in range(1, 101):
        announced.heard(nudge(position, position))
    # then: they are merged, and all accounted for
    assert len(announced._ranges) <= 10 and not announced.missed(100)
    # when: every other nudge of the next hundred is lost
    for position in range(102, 201, 2):
        announced.heard(nudge(position, position))
    # then: the count is given up, bounded: the next look wakes everyone
    assert len(announced._ranges) <= 10 and announced.missed(200)


@pytest.mark.asyncio
async def test_log_watcher_renews_its_group_membership_under_steady_traffic(monkeypatch):
    # given: memberships expire after 1 s, renewed every 0.3 s, and a commit every 0.1 s
    from channels.layers import InMemoryChannelLayer

    from controlplane import topics
    layer = InMemoryChannelLayer(group_expiry=1)
    monkeypatch.setattr(topics, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(topics, "GROUP_READD_SECONDS", 0.3)
    watcher = live.LogWatcher()
    watcher.mark()
    for _ in range(100):  # until the listener has joined the group
        if layer.groups.get(live.LOG_TOPIC):
            break
        await asyncio.sleep(0.01)
    wakes = 0
    # when: traffic runs for longer than the expiry
    for _ in range(25):
        mark = watcher.mark()
        await layer.group_send(live.LOG_TOPIC, {"type": "log.advanced"})
        await watcher.wait(mark, 0.5)
        wakes += mark.is_set()
        await asyncio.sleep(0.1)
    await watcher.stop()
    # then: every commit still woke the watcher
    assert wakes == 25


@pytest.mark.asyncio
async def test_a_commit_wakes_its_own_process_at_once_and_the_brokers_copy_is_skipped(monkeypatch):
    # given: a watcher listening on a layer of its own, and two interests
    from channels.layers import InMemoryChannelLayer

    from controlplane import topics

    layer = InMemoryChannelLayer()
    monkeypatch.setattr(topics, "get_channel_layer", lambda: layer)
    watcher = live.LogWatcher()
    mine, other = watcher.watch(conversations={7}), watcher.watch(conversations={8})
    for _ in range(100):  # until the listener has joined the group
        if layer.groups.get(live.LOG_TOPIC):
            break
        await asyncio.sleep(0.01)
    advance = {"type": "log.advanced", "position": 41, "conversations": [7], "spaces": [1], "access_spaces": [],
               "members": []}
    try:
        # when: a request thread of this process announces its commit (nothing goes through the layer)
        origin = await asyncio.to_thread(watcher.wake_here, advance)
        await asyncio.wait_for(mine.event.wait(), 1)
        # then: only the interest it names woke, and its broker copy is marked as this process's own
        assert origin and not other.event.is_set()
        # when: the broker's copy arrives
        mine.event.clear()
        await layer.group_send(live.LOG_TOPIC, {**advance, "origin": origin})
        await asyncio.sleep(0.2)
        # then: it is skipped; another process's advance still wakes
        assert not mine.event.is_set()
        await layer.group_send(live.LOG_TOPIC, {**advance, "origin": "another process"})
        await asyncio.wait_for(mine.event.wait(), 1)
    finally:
        await watcher.stop()
    # and a process whose watcher does not run (a management command) announces through the layer alone
    assert live.LogWatcher().wake_here(advance) is None


@pytest.mark.asyncio
async def test_a_group_listener_stops_when_cancelled_under_a_stream_of_messages(monkeypatch):
    # given: a layer that always has a message ready (a busy group), and a listener on it
    from controlplane import topics

    class Flooded:
        async def new_channel(self):
            return "specific.flooded"

        async def group_add(self, group, channel):
            pass

        async def group_discard(self, group, channel):
            pass

        async def receive(self, channel):
            return {"type": "webhooks.due"}

    monkeypatch.setattr(topics, "get_channel_layer", Flooded)
    heard = []
    listener = asyncio.create_task(topics.listen("busy", heard.append))
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
    from controlplane import topics
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
    await asyncio.wait_for(topics.stop_task(task), 5)
    # then
    assert task.cancelled() and swallowed == [0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_member_past_their_cap_of_waiting_long_polls_is_answered_429_at_once(monkeypatch, settings):
    # given: a cap of one waiting request a member, and alice's long-poll waiting
    from controlplane import holding

    settings.WAITS_PER_MEMBER, settings.FEED_RECHECK_SECONDS = 1, 120
    alice, token, space, general = await alice_in_the_lab()
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    cursor = pack_cursor((head,), caller=alice.public_id, stream=f"space:{space.public_id}")
    auth, query = {"Authorization": f"Bearer {token}"}, {"cursor": cursor, "wait_ms": 20_000}
    waiting = waits_observed(monkeypatch)
    first = asyncio.create_task(AsyncClient().get("/v0/spaces/lab/events", query, headers=auth))
    await asyncio.wait_for(waiting.wait(), 10)
    # when: she long-polls again while it waits; a poll with no wait_ms is not held
    second = await asyncio.wait_for(AsyncClient().get("/v0/spaces/lab/events", query, headers=auth), 5)
    plain = await AsyncClient().get("/v0/spaces/lab/events", {"cursor": cursor}, headers=auth)
    # then: the second is refused at once, in the contract's shape; the first still waits
    assert second.status_code == 429 and second["Retry-After"] == "1"
    assert second.json()["error"]["code"] == "RATE_LIMITED"
    assert plain.status_code == 200 and not first.done()
    # and: once the first is answered its place is given back
    await sync_to_async(send_message)(general, body="wake up", actor=alice)
    assert (await asyncio.wait_for(first, 15)).status_code == 200
    assert holding.held(alice.pk) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_long_poll_behind_more_unseen_events_than_a_page_looks_at_answers_at_once(monkeypatch, settings):
    # given: bob's cursor behind others' direct messages, more than a page looks at
    from inbox import feeds

    monkeypatch.setattr(feeds, "SCAN_MAX", 5)
    settings.FEED_RECHECK_SECONDS = 120
    alice, token, space, general = await alice_in_the_lab()
    bob, carol = [await sync_to_async(services.create_member)(handle, actor=None) for handle in ("bob", "carol")]
    for member in (bob, carol):
        await sync_to_async(services.join_space)(space, actor=member)
    _, bobs = await sync_to_async(bearer.issue_credential)(bob, actor=None)
    head = await sync_to_async(lambda: LogHead.objects.get().position)()
    to_carol, _ = await sync_to_async(services.get_or_create_direct)(space, carol, actor=alice)
    for n in range(8):
        await sync_to_async(send_message)(to_carol, body=f"not for bob {n}", actor=alice)
    cursor = pack_cursor((head,), caller=bob.public_id, stream=f"space:{space.public_id}")
    # when
    response = await asyncio.wait_for(AsyncClient().get("/v0/spaces/lab/events", {"cursor": cursor, "wait_ms": 20_000},
                                                        headers={"Authorization": f"Bearer {bobs}"}), 10)
    # then: nothing he may see, a cursor past what it looked at, and more to read, at once
    page = response.json()
    assert page["events"] == [] and page["has_more"] is True and page["cursor"] != cursor
