"""Live sockets, through the real ASGI router (session auth, origin check,
URL routing) and the configured channel layer: in-memory on SQLite, Redis
on the PostgreSQL + Redis run."""
import asyncio

import pytest
from channels.layers import get_channel_layer

from controlplane import services
from controlplane import topics
from controlplane.live import member_group
from controlplane.models import Member
from inbox.delivery import acknowledge_delivery
from inbox.models import InboxItem
from controlplane.db import db_call
from tests.web.sockets import (OPEN, frames_until_live, log_watcher_listening, open_socket, refusal, send,
                               stops_finished, watching)
from web.streams import streams

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("live_sockets")]


async def test_a_malformed_position_is_refused(room, ben):
    _, channel = room
    for after in ("-1", "%C2%B2", "x"):
        assert (await open_socket(f"/ws/conversations/{channel.public_id}/?after={after}", ben))[1] is False


async def test_a_page_too_far_behind_is_told_to_reload(room, ann, ben, settings, monkeypatch):
    _, channel = room
    monkeypatch.setattr("web.consumers.BACKFILL_BATCHES", 2)
    monkeypatch.setattr("web.messages.LIVE_BATCH", 3)
    for i in range(7):
        await send(channel, body=f"old {i}", actor=ann)
    socket = await watching(ben, channel)
    said = await refusal(socket)
    assert [f["type"] for f in said[:-1]] == ["message"] * 6 + ["resync"] and said[-1] == 4409


async def test_messages_sent_anywhere_arrive_once_and_in_order(room, ann, ben):
    _, channel = room
    socket = await watching(ben, channel)
    assert await frames_until_live(socket) == []
    # when
    sent = [(await send(channel, body=f"hello {i}", actor=ann)).message for i in range(3)]
    # then
    frames = [await socket.receive_json_from(timeout=5) for _ in sent]
    assert [f["id"] for f in frames] == [m.public_id for m in sent]
    assert [f["position"] for f in frames] == sorted(m.position for m in sent)
    assert "hello 2" in frames[2]["html"]
    assert await socket.receive_nothing(0.3)
    await socket.disconnect()


async def test_a_reconnect_backfills_exactly_what_was_missed(room, ann, ben):
    _, channel = room
    first = (await send(channel, body="before", actor=ann)).message
    socket = await watching(ben, channel)
    assert [f["id"] for f in await frames_until_live(socket)] == [first.public_id]
    await socket.disconnect()
    # when: two messages while the socket is down, then a reconnect from the last frame
    missed = [(await send(channel, body=f"missed {i}", actor=ann)).message for i in range(2)]
    socket = await watching(ben, channel, after=first.position)
    # then
    assert [f["id"] for f in await frames_until_live(socket)] == [m.public_id for m in missed]
    later = (await send(channel, body="after", actor=ann)).message
    assert (await socket.receive_json_from(timeout=5))["id"] == later.public_id
    assert await socket.receive_nothing(0.3)
    await socket.disconnect()


async def test_removal_from_the_space_closes_the_socket_at_once(room, ann, ben):
    space, channel = room
    socket = await watching(ben, channel)
    await frames_until_live(socket)
    # when
    await db_call(services.remove_member)(space, ben, actor=ann)
    # then
    assert await socket.receive_json_from(timeout=5) == {"type": "access.lost"}
    assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4403}
    await send(channel, body="not for ben any more", actor=ann)
    assert await socket.receive_nothing(0.3)


async def test_access_is_checked_again_before_every_frame(room, ann, ben):
    _, channel = room
    socket = await watching(ben, channel)
    await frames_until_live(socket)
    # when: ben is suspended (no event of the conversation), then a message arrives
    await db_call(Member.objects.filter(pk=ben.pk).update)(status=Member.Status.SUSPENDED)
    await send(channel, body="secret", actor=ann)
    # then
    assert await socket.receive_json_from(timeout=5) == {"type": "access.lost"}
    assert (await socket.receive_output(timeout=5))["code"] == 4403


async def test_the_inbox_socket_counts_pending_items_live(room, ann, ben):
    space, _ = room
    direct, _ = await db_call(services.get_or_create_direct)(space, ben, actor=ann)
    socket, connected = await open_socket("/ws/inbox/", ben)
    assert connected
    assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    # when / then
    await send(direct, body="for ben", actor=ann)
    assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 1}
    token = await db_call(lambda: InboxItem.objects.get(member=ben).token)()
    await db_call(acknowledge_delivery)(ben, token, actor=ben)
    assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    await socket.disconnect()
    assert await refusal((await open_socket("/ws/inbox/"))[0]) == [4401]


async def test_a_members_inbox_sockets_share_one_count_a_change(room, ann, ben, monkeypatch):
    """Every page holds an inbox socket, and each hears of every change:
    counting once per socket made one message to ben as many reads on the
    request threads as he had pages open (a hundred a process are allowed)."""
    from web import inbox_counts

    space, _ = room
    direct, _ = await db_call(services.get_or_create_direct)(space, ben, actor=ann)
    sockets = [(await open_socket("/ws/inbox/", ben))[0] for _ in range(20)]
    for socket in sockets:
        assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    counted, count = [], inbox_counts.pending_count
    monkeypatch.setattr(inbox_counts, "pending_count", lambda member: counted.append(member.pk) or count(member))
    # when
    await send(direct, body="for ben", actor=ann)
    # then: every socket has the new count, read once or twice (one read may have begun before the change)
    for socket in sockets:
        assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 1}
    assert 1 <= len(counted) <= 2 and set(counted) == {ben.pk}


@pytest.mark.parametrize("path", ["/ws/inbox/", "conversation"])
async def test_frames_from_the_page_are_ignored_and_log_nothing(room, ann, ben, path, caplog):
    """Both sockets are one-way: what a page sends, JSON or not, text or
    bytes, is dropped without an error (each one logged a traceback)."""
    space, channel = room
    path = f"/ws/conversations/{channel.public_id}/" if path == "conversation" else path
    socket, connected = await open_socket(path, ben)
    assert connected
    await socket.receive_output(timeout=5)  # its first frame: the count, or the catch-up's `live`
    for frame in ({"text_data": "not json"}, {"bytes_data": b"\x00"}, {"text_data": '{"type": "inbox"}'}):
        await socket.send_to(**frame)
    # then: it stays open and still says what it said before
    await send(channel, body="@ben still here", actor=ann)
    assert (await socket.receive_json_from(timeout=5))["type"] in ("inbox", "message")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    await socket.disconnect()


@pytest.mark.parametrize("path", ["/ws/inbox/", "conversation"])
async def test_both_sockets_speak_at_least_every_heartbeat(room, ben, path, settings):
    """A page finds a connection gone without a close by its silence, so a
    quiet socket still says something."""
    settings.LIVE_HEARTBEAT_SECONDS = 0.2
    _, channel = room
    path = f"/ws/conversations/{channel.public_id}/" if path == "conversation" else path
    socket, connected = await open_socket(path, ben)
    assert connected
    await socket.receive_output(timeout=5)  # the count, or the catch-up's `live`
    assert [await socket.receive_json_from(timeout=1) for _ in range(3)] == [{"type": "heartbeat"}] * 3
    await socket.disconnect()


async def test_many_sockets_on_one_conversation_each_get_every_message(room, ann, ben):
    _, channel = room
    sockets = [await watching(ben, channel) for _ in range(5)]
    for socket in sockets:
        await frames_until_live(socket)
    sent = (await send(channel, body="to all", actor=ann)).message
    received = await asyncio.gather(*(s.receive_json_from(timeout=5) for s in sockets))
    assert {f["id"] for f in received} == {sent.public_id}
    for socket in sockets:
        await socket.disconnect()



async def test_sockets_sharing_a_stream_keep_their_own_positions_and_access(room, ann, ben, human):
    space, channel = room
    cid = await db_call(human)("cid")
    await db_call(services.add_member)(space, cid, actor=ann)
    first = (await send(channel, body="first", actor=ann)).message
    from_start = await watching(ben, channel)
    from_first = await watching(cid, channel, after=first.position)
    assert [f["id"] for f in await frames_until_live(from_start)] == [first.public_id]
    assert await frames_until_live(from_first) == []
    # when: cid is removed, then another message
    await db_call(services.remove_member)(space, cid, actor=ann)
    assert await from_first.receive_json_from(timeout=5) == {"type": "access.lost"}
    second = (await send(channel, body="second", actor=ann)).message
    # then: ben's socket carries on alone
    assert (await from_start.receive_json_from(timeout=5))["id"] == second.public_id
    assert await from_start.receive_nothing(0.3)



async def test_a_grants_barrier_tells_the_pages_showing_its_space_that_bodies_were_withheld(ann, ben, human,
                                                                                             browser_of):
    from grants import services as grants
    from grants.models import Grant

    # given: ben's page of his direct conversation with cy in ann's explicit_only space shows a message sent under
    # the grant ann gave cy
    cy = await db_call(human)("cy")
    space = await db_call(services.create_space)(slug="vault", name="Vault", visibility="private",
                                                 send_policy="explicit_only", actor=ann)
    for member in (ben, cy):
        await db_call(services.add_member)(space, member, actor=ann)
    direct, _ = await db_call(services.get_or_create_direct)(space, ben, actor=cy)
    grant, _ = await db_call(grants.create_grant)(space, grant_id="grt_pair", kind="pair", sender="@cy",
                                                  recipient="@ben", actor=ann)
    sent = (await send(direct, body="secret plans", actor=cy)).message
    socket = await watching(ben, direct)
    assert [f["id"] for f in await frames_until_live(socket)] == [sent.public_id]
    history = f"/app/spaces/vault/{direct.public_id}/history?withheld_from={sent.position}"
    page = await db_call(browser_of)(ben)
    assert (await db_call(page.get)(history)).json() == {"rows": []}
    # when
    await db_call(grants.revoke_grant)(await db_call(Grant.objects.get)(pk=grant.pk), actor=ann)
    # then: the page is told, and the history it then asks for shows the message withheld
    assert await socket.receive_json_from(timeout=5) == {"type": "withheld"}
    rows = (await db_call(page.get)(history)).json()["rows"]
    assert [r["id"] for r in rows] == [sent.public_id]
    assert "secret plans" not in rows[0]["html"] and "Withheld" in rows[0]["html"]
    bad = await db_call(page.get)(history.replace(f"={sent.position}", "=-1"), HTTP_ACCEPT="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"


async def test_only_membership_events_wake_a_spaces_other_conversations():
    from controlplane.live import Interest

    interest = Interest(conversations={1}, spaces={7})
    assert interest.matches({"conversations": [1], "access_spaces": []})
    assert interest.matches({"conversations": [], "access_spaces": [7]})  # e.g. member.removed
    assert not interest.matches({"conversations": [2], "access_spaces": []})  # a message elsewhere in space 7
    assert interest.matches({"type": "log.advanced"})  # a nudge that names nothing wakes everyone
    assert not interest.withheld
    assert interest.matches({"conversations": [], "spaces": [], "members": [], "withheld_spaces": [7]})
    assert interest.withheld
    assert not Interest(conversations={2}, spaces={8}).matches({"conversations": [], "withheld_spaces": [7]})


async def test_a_socket_whose_channel_layer_fails_still_leaves_its_groups_and_stream(room, ben, monkeypatch):
    # given: ben's live page, whose channel's receive from the layer can be made to fail (Redis lost)
    _, channel = room
    layer, joined, left, failing = get_channel_layer(), set(), set(), asyncio.Event()
    add, discard, receive = layer.group_add, layer.group_discard, layer.receive

    async def group_add(group, name):
        joined.add((group, name))
        await add(group, name)

    async def group_discard(group, name):
        left.add((group, name))
        await discard(group, name)

    def pages():
        return {n for group, n in joined if group == member_group(ben)}

    async def receive_until_lost(name):
        got, lost = asyncio.ensure_future(receive(name)), asyncio.ensure_future(failing.wait())
        await asyncio.wait({got, lost}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        if got.done() or name not in pages():  # (the log watcher's channel goes on)
            return await got
        got.cancel()
        raise ConnectionError("the channel layer went away")

    monkeypatch.setattr(layer, "group_add", group_add)
    monkeypatch.setattr(layer, "group_discard", group_discard)
    monkeypatch.setattr(layer, "receive", receive_until_lost)
    socket = await watching(ben, channel)
    await frames_until_live(socket)
    assert streams.running() == 1 and pages()
    # when: the receive fails, so the consumer ends without a disconnect
    failing.set()
    with pytest.raises(ConnectionError):
        await socket.wait(timeout=5)
    OPEN.remove(socket)
    # then: it left every group it joined (no renewal keeps a dead channel there), and its stream ended
    assert pages() and {(g, n) for g, n in joined if n in pages()} <= left
    for _ in range(100):
        if not streams.running():
            break
        await asyncio.sleep(0.01)
    assert not streams.running()


async def test_a_socket_ends_even_when_its_channel_layer_loses_the_cancellation_of_a_receive(room, ben, monkeypatch):
    # given: a channel layer that is lost while ben's page connects (its groups cannot be joined),
    # and whose receive lets the first cancellation pass, as channels-redis's can while Redis is away
    _, channel = room
    layer, page, stuck = get_channel_layer(), set(), asyncio.Event()
    add, receive = layer.group_add, layer.receive

    async def group_add(group, name):
        if group == member_group(ben):
            page.add(name)
            raise ConnectionError("the channel layer went away")
        await add(group, name)

    async def receive_losing_a_cancellation(name):
        try:
            return await receive(name)
        except asyncio.CancelledError:
            if name not in page:  # (the log watcher's channel is stopped as usual)
                raise
            stuck.set()
            return await receive(name)  # waits on, until cancelled again

    monkeypatch.setattr(layer, "group_add", group_add)
    monkeypatch.setattr(layer, "receive", receive_losing_a_cancellation)
    await log_watcher_listening()
    socket, connected = await open_socket(f"/ws/conversations/{channel.public_id}/", ben)
    # when: its connect fails after the handshake, so its dispatch loop cancels the pending receive
    assert connected
    # then: the page's application ends by itself (the server closes its connection, and the page
    # reconnects) instead of waiting on the receive, open and out of any stream
    await asyncio.wait({socket.future}, timeout=2)
    assert socket.future.done()
    with pytest.raises(ConnectionError):
        await socket.wait()
    OPEN.remove(socket)
    # and the receive that lost the first cancellation was ended by another: within the socket's
    # STOP_WAIT_SECONDS mostly, else in the background (on a busy machine a real receive can lose
    # the next cancellation too, and stop_task cancels it again every 0.5 s)
    await stops_finished()
    assert stuck.is_set() and not topics._stopping
