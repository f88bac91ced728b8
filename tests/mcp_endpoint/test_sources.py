"""What events/poll and events/stream read, in-process: the inbox feed's
items, held ones only once admitted, acknowledged ones skipped; under the
server on PostgreSQL, the same items read on the event loop."""
import asyncio
import datetime as dt

import pytest

from controlplane import services
from controlplane.clock import now
from controlplane.models import Event
from inbox import firewall
from inbox.delivery import acknowledge_delivery
from inbox.models import InboxItem
from inbox.services import send_message
from mcp_endpoint import sources
from tests.conftest import under_the_server

ITEM = sources.SOURCES["org.switchboard/inbox.item"]


@pytest.fixture
def pair(make_member):
    ada, bo = make_member("ada"), make_member("bo")
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=bo)
    services.join_space(space, actor=ada)
    direct, _ = services.get_or_create_direct(space, ada, actor=bo)
    return ada, bo, direct


def contents(batch) -> list[str]:
    return [e["data"]["item"]["content"] for e in batch.events]


def a_secret_held_and_a_hello(pair):
    """ada's firewall holds secrets; bo sends one, then a hello. The cursor before both."""
    ada, bo, direct = pair
    firewall.set_rules(ada, [{"action": "hold", "content_pattern": "secret"}], actor=ada)
    start = sources.read(ada, ITEM, {}, None, 50)
    send_message(direct, body="the secret", actor=bo)
    send_message(direct, body="hello", actor=bo)
    firewall.classify_pending(ada.pk)
    return start


def release_the_secret(ada) -> None:
    held = InboxItem.objects.get(member=ada, admission=InboxItem.Admission.HELD)
    firewall.release_item(ada, held.token, actor=ada)


def test_held_items_appear_only_once_released_after_the_cursor_moved_on(pair):
    # given: ada's firewall holds secrets; she has read past both sends
    ada = pair[0]
    start = a_secret_held_and_a_hello(pair)
    first = sources.read(ada, ITEM, {}, start.cursor, 50)
    # when: the held one is released
    release_the_secret(ada)
    later = sources.read(ada, ITEM, {}, first.cursor, 50)
    # then
    assert start.events == [] and contents(first) == ["hello"] and contents(later) == ["the secret"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_under_the_server_a_stream_reads_the_same_items_on_its_event_loop(pair, request_threads_busy):
    # given: a plain item and one a firewall held, then released (found through its admission)
    ada = pair[0]
    start = a_secret_held_and_a_hello(pair)
    release_the_secret(ada)
    on_thread = sources.read(ada, ITEM, {}, start.cursor, 50)

    async def read_as_a_stream():
        async with under_the_server():
            return await asyncio.wait_for(sources.read_on_loop(ada, ITEM, {}, start.cursor, 50), 5)

    # when: a stream reads them while every request thread of its process is busy
    on_loop = asyncio.run(read_as_a_stream())
    # then: it read them on the loop, and read what a request thread reads
    assert contents(on_loop) == ["hello", "the secret"]
    assert on_loop == on_thread


def old_and_new(pair):
    """bo sent ada one message an hour ago, and one now. The cursor before both."""
    ada, bo, direct = pair
    start = sources.read(ada, ITEM, {}, None, 50)
    old = send_message(direct, body="an hour ago", actor=bo).message
    Event.objects.filter(position__lte=old.position).update(created_at=now() - dt.timedelta(hours=1))
    send_message(direct, body="just now", actor=bo)
    return start


def test_max_age_bounds_what_a_cursor_replays_and_says_so(pair):
    ada = pair[0]
    start = old_and_new(pair)
    # when: from the same cursor, without a bound, with one of a minute, of a day, and from now
    unbounded = sources.read(ada, ITEM, {}, start.cursor, 50)
    minute = sources.read(ada, ITEM, {}, start.cursor, 50, max_age_ms=60_000)
    day = sources.read(ada, ITEM, {}, start.cursor, 50, max_age_ms=86_400_000)
    longest = sources.read(ada, ITEM, {}, start.cursor, 50, max_age_ms=10**18)
    fresh = sources.read(ada, ITEM, {}, None, 50, max_age_ms=60_000)
    # then: a bound that skips an event says truncated (SEP-3415), one that skips none does not
    assert (contents(unbounded), unbounded.truncated) == (["an hour ago", "just now"], False)
    assert (contents(minute), minute.truncated) == (["just now"], True)
    assert (contents(day), day.truncated) == (["an hour ago", "just now"], False)
    assert contents(longest) == ["an hour ago", "just now"]
    assert fresh.events == [] and not fresh.truncated  # no cursor: from now, whatever the bound


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_under_the_server_max_age_is_read_on_the_event_loop_too(pair, request_threads_busy):
    ada = pair[0]
    start = old_and_new(pair)

    async def read_as_a_stream():
        async with under_the_server():
            return await asyncio.wait_for(sources.read_on_loop(ada, ITEM, {}, start.cursor, 50, 60_000), 5)

    on_loop = asyncio.run(read_as_a_stream())
    assert (contents(on_loop), on_loop.truncated) == (["just now"], True)


def test_acknowledged_items_are_skipped_and_pages_continue(pair):
    ada, bo, direct = pair
    start = sources.read(ada, ITEM, {}, None, 50)
    for n in range(3):
        send_message(direct, body=f"m{n}", actor=bo)
    acknowledge_delivery(ada, InboxItem.objects.get(member=ada, payload__content="m1").token, actor=ada)
    first = sources.read(ada, ITEM, {}, start.cursor, 1)
    rest = sources.read(ada, ITEM, {}, first.cursor, 50)
    assert contents(first) == ["m0"] and first.has_more is True
    assert contents(rest) == ["m2"] and rest.has_more is False


def test_a_batch_of_items_holds_a_mebibyte_at_most_and_the_next_goes_on_from_there(pair):
    """Fifty items of the largest messages, each character one JSON writes
    as six, made one poll answer of megabytes, held while it was written."""
    import json

    from inbox.feeds import PAGE_BYTES

    # given: 30 messages to ada as large as they come
    ada, bo, direct = pair
    start = sources.read(ada, ITEM, {}, None, 50)
    for n in range(30):
        send_message(direct, body=f"{n}:" + "\x01" * 8000, related_paths=["\x01" * 1000] * 8, actor=bo)
    # when
    first = sources.read(ada, ITEM, {}, start.cursor, 50)
    batches = [first]
    while batches[-1].has_more:
        batches.append(sources.read(ada, ITEM, {}, batches[-1].cursor, 50))
    # then: the first fits, says there is more, and the batches together hold every item once, in order
    assert len(json.dumps(first.events, ensure_ascii=False).encode()) <= PAGE_BYTES and first.has_more
    assert [c.split(":")[0] for b in batches for c in contents(b)] == [str(n) for n in range(30)]
    assert 1 < len(first.events) < 30


def test_space_events_need_a_space_the_caller_can_read(pair, make_member):
    from controlplane.errors import NotFound

    ada, bo, _ = pair
    services.create_space(slug="vault", name="Vault", visibility="private", send_policy="open", actor=bo)
    work = sources.SOURCES["spaces.work.available"]
    assert sources.read(bo, work, {"space": "vault"}, None, 50).events == []
    with pytest.raises(NotFound):
        sources.read(ada, work, {"space": "vault"}, None, 50)


def test_work_narrowed_to_a_task_sees_only_that_task(pair):
    from controlplane.errors import NotFound
    from coordination import services as tasks

    # given
    ada, bo, direct = pair
    space = direct.space
    mine, other = (tasks.create_task(space, title=t, actor=bo) for t in ("mine", "other"))
    work = sources.SOURCES["spaces.work.available"]
    narrowed = {"space": "lab", "task_id": mine.public_id}
    start = sources.read(ada, work, narrowed, None, 50)
    # when: only the other task moves
    tasks.claim_task(space, other.public_id, actor=ada)
    quiet = sources.read(ada, work, narrowed, start.cursor, 50)
    tasks.claim_task(space, mine.public_id, actor=ada)
    woken = sources.read(ada, work, narrowed, quiet.cursor, 50)
    # then
    assert quiet.events == []
    (event,) = woken.events
    assert event["data"]["task_id"] == mine.public_id and event["data"]["space"] == "lab"
    # a cursor of the whole space's stream is not this one's
    whole = sources.read(ada, work, {"space": "lab"}, None, 50)
    with pytest.raises(Exception, match="cursor"):
        sources.read(ada, work, narrowed, whole.cursor, 50)
    with pytest.raises(NotFound):
        sources.read(ada, work, {"space": "lab", "task_id": "tsk_aaaaaaaaaaaaaaaa"}, None, 50)


def test_the_pending_count_is_told_when_it_changes_and_its_cursor_holds_the_last_one_told(pair):
    from controlplane.errors import InvalidCursor

    # given: ada has one pending item
    ada, bo, direct = pair
    pending = sources.SOURCES["org.switchboard/inbox.pending"]
    send_message(direct, body="hello", actor=bo)
    # when: a read from now, then from its cursor with nothing changed, then after one more item
    start = sources.read(ada, pending, {}, None, 50)
    quiet = sources.read(ada, pending, {}, start.cursor, 50)
    send_message(direct, body="again", actor=bo)
    changed = sources.read(ada, pending, {}, quiet.cursor, 50)
    send_message(direct, body="to bo, not ada", actor=ada)  # the log moves on; ada's inbox does not
    retried = sources.read(ada, pending, {}, quiet.cursor, 50)  # a client that lost the answer asks again
    # then: nothing from now or while unchanged (SEP-3415), the new count once it changed
    assert start.events == [] and start.cursor and quiet.events == [] and quiet.cursor == start.cursor
    assert [e["data"] for e in changed.events] == [{"pendingCount": 2}] and changed.cursor != quiet.cursor
    assert changed.events[0]["cursor"] == changed.cursor
    assert retried.events[0]["eventId"] == changed.events[0]["eventId"]  # the same change, the same id
    assert sources.read(ada, pending, {}, changed.cursor, 50).events == []
    # another stream's cursor, or a forged one, is refused
    for cursor in ("garbage", sources.read(ada, ITEM, {}, None, 50).cursor):
        with pytest.raises(InvalidCursor):
            sources.read(ada, pending, {}, cursor, 50)


@pytest.mark.parametrize("admitted_by", ["classification", "release"])
def test_a_screened_collective_result_reaches_poll_once_admitted(pair, make_member, admitted_by):
    """A result its member's firewall judges first sits at a screened event
    that reaches no one; its admission's event reaches the member, and the
    result with it, as read_inbox has it."""
    from inbox import collectives, delivery

    # given: ada's firewall judges everything (and holds "yes" when releasing is the way in)
    ada, bo, _ = pair
    cy = make_member("cy")
    space = bo.memberships.get().space
    services.join_space(space, actor=cy)
    rule = {"action": "hold", "content_pattern": "yes"} if admitted_by == "release" else {
        "action": "allow", "content_pattern": "zzz-never"}
    firewall.set_rules(ada, [rule], actor=ada)
    group, _ = services.get_or_create_group(space, [ada, bo, cy], actor=ada)
    start = sources.read(ada, ITEM, {}, None, 50).cursor
    asked = send_message(group, body="Ready?", collective={"op": "gather", "deadline_ms": 30_000}, actor=ada).message
    collectives.answer(asked, "yes", actor=bo)
    collectives.answer(asked, "no", actor=cy)
    # when
    firewall.classify_pending(ada.pk)
    if admitted_by == "release":
        release_the_secret(ada)
    # then
    assert [i.payload["kind"] for i in delivery.read_inbox(ada).items] == ["collective.result"]
    assert [e["data"]["item"]["kind"] for e in sources.read(ada, ITEM, {}, start, 50).events] == ["collective.result"]


def test_items_behind_a_withheld_one_wait_for_its_barrier_and_come_in_read_inbox_order(make_member):
    from grants import barrier
    from grants import services as grants
    from grants.models import Grant
    from inbox import delivery

    # given: bob sends carol a message under a one-message grant, then one under a pair grant
    alice, bob, carol = (make_member(h) for h in ("alice", "bob", "carol"))
    vault = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    for member in (bob, carol):
        services.join_space(vault, actor=member)
    once = grants.create_grant(vault, grant_id="grt_once", kind="one_message", sender="@bob", recipient="@carol",
                               idempotency_key="key-00001", actor=alice)[0]
    grants.create_grant(vault, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol", actor=alice)
    direct, _ = services.get_or_create_direct(vault, carol, actor=bob)
    start = sources.read(carol, ITEM, {}, None, 50).cursor
    send_message(direct, body="first", idempotency_key="key-00001", actor=bob)
    send_message(direct, body="second", actor=bob)
    # when: the first one's grant is being revoked
    barrier.start_barrier(once.pk, ending=Grant.Status.REVOKED, actor=None)
    # then: nothing is handed out, read after read, as read_inbox hands out nothing
    while_withheld = sources.read(carol, ITEM, {}, start, 50)
    assert while_withheld.events == [] and delivery.read_inbox(carol).items == []
    assert sources.read(carol, ITEM, {}, while_withheld.cursor, 50).events == []
    # when the barrier settles: the rejection in the first one's place, then the second
    barrier.finish_barrier(once.pk)
    settled = sources.read(carol, ITEM, {}, while_withheld.cursor, 50).events

    def shown(payloads):
        return [f"{p['kind']}:{p.get('content', '-')}" for p in payloads]

    assert shown(e["data"]["item"] for e in settled) == shown(i.payload for i in delivery.read_inbox(carol).items)
    assert shown(e["data"]["item"] for e in settled) == ["rejected:-", "direct:second"]


@pytest.fixture
def vault(make_member):
    """carol's inbox in an explicit_only space under bob's grants, and dave
    writing to her in an open one."""
    from grants import services as grants

    alice, bob, carol, dave = (make_member(h) for h in ("alice", "bob", "carol", "dave"))
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    lab = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=dave)
    for member in (bob, carol):
        services.join_space(space, actor=member)
    services.join_space(lab, actor=carol)
    grant = grants.create_grant(space, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol",
                                actor=alice)[0]
    return {"carol": carol, "grant": grant, "bob_to_carol": services.get_or_create_direct(space, carol, actor=bob)[0],
            "dave_to_carol": services.get_or_create_direct(lab, carol, actor=dave)[0], "bob": bob, "dave": dave}


def drain(member, cursor) -> tuple[list[dict], str]:
    events = []
    while batch := sources.read(member, ITEM, {}, cursor, 50).events:
        events, cursor = events + batch, batch[-1]["cursor"]
    return events, cursor


def test_a_withheld_item_holds_back_its_own_conversation_only(vault):
    from grants import barrier
    from grants.models import Grant
    from inbox import delivery

    # given: two messages to carol under a grant, then its revocation begins; then dave writes to her elsewhere
    carol = vault["carol"]
    start = sources.read(carol, ITEM, {}, None, 50).cursor
    for body in ("first", "second"):
        send_message(vault["bob_to_carol"], body=body, actor=vault["bob"])
    barrier.start_barrier(vault["grant"].pk, ending=Grant.Status.REVOKED, actor=None)
    send_message(vault["dave_to_carol"], body="elsewhere", actor=vault["dave"])
    # when / then: dave's item is offered now, as read_inbox hands it out (the whole stream waited for the barrier)
    while_withheld, cursor = drain(carol, start)
    assert [e["data"]["item"]["content"] for e in while_withheld] == ["elsewhere"]
    assert [i.payload["content"] for i in delivery.read_inbox(carol).items] == ["elsewhere"]
    assert drain(carol, cursor)[0] == []
    # when the barrier settles: each rejection in its item's place, once, and nothing else again
    barrier.finish_barrier(vault["grant"].pk)
    settled, cursor = drain(carol, cursor)
    assert [e["data"]["item"]["kind"] for e in settled] == ["rejected", "rejected"]
    assert drain(carol, cursor)[0] == []


def test_each_rejection_is_offered_once_however_far_its_event_is_from_its_place(vault):
    from grants import barrier
    from grants.models import Grant

    # given: more items under the grant than a feed page and a cursor's marks hold, withheld, then rejected
    carol = vault["carol"]
    start = sources.read(carol, ITEM, {}, None, 50).cursor
    for n in range(sources.FEED_PAGE + 20):
        send_message(vault["bob_to_carol"], body=f"n{n}", actor=vault["bob"])
    barrier.start_barrier(vault["grant"].pk, ending=Grant.Status.REVOKED, actor=None)
    assert drain(carol, start)[0] == []
    barrier.finish_barrier(vault["grant"].pk)
    # when: the stream is read from before them all, and from a cursor taken mid-way
    settled, end = drain(carol, start)
    # then: every rejection once (some offered in place, the rest at their events: a cursor remembers few)
    notices = [e["data"]["item"]["postId"] for e in settled]
    assert len(notices) == len(set(notices)) == sources.FEED_PAGE + 20
    assert {e["data"]["item"]["kind"] for e in settled} == {"rejected"} and drain(carol, end)[0] == []
    middle = settled[30]["cursor"]
    assert [e["eventId"] for e in drain(carol, middle)[0]] == [e["eventId"] for e in settled[31:]]


def test_a_members_reads_take_turns_and_others_pass_them(pair, monkeypatch):
    """One member's many polls read READS_AT_ONCE at a time per process;
    another member's read does not wait behind them."""
    ada, bo, _ = pair
    started, release = [], asyncio.Event()

    async def slow_read(steps):
        steps.close()
        started.append(steps)
        await release.wait()
        return sources.Batch()

    monkeypatch.setattr(sources.loop_reads, "run", slow_read)

    async def story():
        ada_reads = [asyncio.ensure_future(sources.read_on_loop(ada, ITEM, {}, None, 50)) for _ in range(5)]
        await asyncio.sleep(0.05)
        reading_at_once = len(started)
        bo_read = asyncio.ensure_future(sources.read_on_loop(bo, ITEM, {}, None, 50))
        await asyncio.sleep(0.05)
        passed = len(started) - reading_at_once
        release.set()
        await asyncio.gather(bo_read, *ada_reads)
        return reading_at_once, passed, len(started)

    # when
    reading_at_once, passed, read = asyncio.run(story())
    # then: two of ada's five read while three wait, bo's read starts at once, and all end
    assert (reading_at_once, passed, read) == (sources.READS_AT_ONCE, 1, 6)
