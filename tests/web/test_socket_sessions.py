"""Live sockets and the sessions and members they speak for: a sign-out,
a new password, another sign-in in the same browser, a session gone behind
every signal's back, a suspension, each ends the sockets it should at once,
and only those (through the real ASGI router and the configured channel
layer, as tests/web/test_consumers.py)."""
import asyncio

import pytest
from channels.layers import get_channel_layer
from django.test import Client

from controlplane import services, topics
from controlplane.db import db_call
from controlplane.models import Member
from tests.web.sockets import frames_until_live, log_watcher_listening, open_socket, refusal, send, watching

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("live_sockets")]


async def test_a_socket_open_past_the_group_expiry_still_counts_live_and_ends_with_its_member(
        room, ann, ben, monkeypatch):
    """The layer forgets a membership `group_expiry` after it was made (a
    day by default): a socket renews its own, so a page open for longer
    still hears of its inbox and is closed when its member is suspended."""
    monkeypatch.setattr(get_channel_layer(), "group_expiry", 2)
    monkeypatch.setattr(topics, "GROUP_READD_SECONDS", 0.5)
    space, _ = room
    direct, _ = await db_call(services.get_or_create_direct)(space, ben, actor=ann)
    socket, connected = await open_socket("/ws/inbox/", ben)
    assert connected and await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    # when: the socket has been open for longer than the expiry
    await asyncio.sleep(3.5)
    # then
    await send(direct, body="for ben", actor=ann)
    assert await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 1}
    await db_call(services.update_member)(ben, status=Member.Status.SUSPENDED, actor=ann)
    assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}


async def test_a_socket_whose_session_ended_with_no_sign_out_closes_at_its_next_renewal(room, ben, monkeypatch):
    # given: ben's page, its session then gone behind every signal's back (expired, or cleared from the store)
    from controlplane.models import UserSession as Session

    monkeypatch.setattr(topics, "GROUP_READD_SECONDS", 0.3)
    _, channel = room
    client = Client()
    await db_call(client.force_login)(ben.user)
    cookie = client.cookies["sessionid"].value
    socket, _ = await open_socket(f"/ws/conversations/{channel.public_id}/", cookie=cookie)
    await frames_until_live(socket)
    assert await socket.receive_nothing(timeout=1)  # renewals of a valid session leave it open
    # when
    await db_call(lambda: Session.objects.filter(session_key=cookie).delete())()
    # then: signed out at the next renewal
    assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}


async def live_pages_of(member, channel) -> tuple[Client, object, object]:
    """A browser signed in as `member`, with a live page of `channel` and
    the inbox's count open: (its client, the conversation's socket, the
    inbox's socket)."""
    await log_watcher_listening()
    client = Client()
    await db_call(client.force_login)(member.user)
    cookie = client.cookies["sessionid"].value
    conversation, _ = await open_socket(f"/ws/conversations/{channel.public_id}/", cookie=cookie)
    inbox, _ = await open_socket("/ws/inbox/", cookie=cookie)
    await frames_until_live(conversation)
    assert (await inbox.receive_json_from(timeout=5))["type"] == "inbox"
    return client, conversation, inbox


async def test_signing_out_closes_the_sessions_sockets(room, ben):
    _, channel = room
    client, conversation, inbox = await live_pages_of(ben, channel)
    # when
    await db_call(client.logout)()
    # then: each closes once, as signed out (the session's deletion that follows closes nothing twice)
    assert await refusal(conversation) == [4401]
    assert await refusal(inbox) == [4401]
    assert await conversation.receive_nothing(0.3) and await inbox.receive_nothing(0.3)


@pytest.mark.parametrize("path", ["/ws/inbox/", "conversation"])
async def test_a_sign_out_between_a_handshake_and_its_groups_closes_the_socket(room, ben, path, monkeypatch):
    """The sign-out's message reaches the session's group before the socket
    is in it: the socket must not go on for an hour (GROUP_READD_SECONDS)."""
    from web.consumers import SessionSocket

    _, channel = room
    client = Client()
    await db_call(client.force_login)(ben.user)
    joining = SessionSocket.join

    async def signed_out_first(self, *groups):
        await db_call(client.logout)()  # its session.ended goes out to no one yet
        monkeypatch.setattr(SessionSocket, "join", joining)
        await joining(self, *groups)

    monkeypatch.setattr(SessionSocket, "join", signed_out_first)
    socket, accepted = await open_socket(path if path.startswith("/") else f"/ws/conversations/{channel.public_id}/",
                                         cookie=client.cookies["sessionid"].value)
    assert accepted and await refusal(socket) == [4401]


async def test_signing_in_as_someone_else_in_the_same_browser_reconnects_the_old_sessions_sockets(room, ben, human):
    # given: ben's live pages; then the same browser signs in as an outsider (Django's login gives a new key)
    _, channel = room
    client, conversation, inbox = await live_pages_of(ben, channel)
    outsider = await db_call(human)("eve")
    # when
    await db_call(client.force_login)(outsider.user)
    # then: both close to reconnect, at once (they went on as ben's until the hour's renewal),
    # and the page's handshake on the browser's new session finds the channel is not the outsider's
    for socket in (conversation, inbox):
        assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 1011}
    again, _ = await open_socket(f"/ws/conversations/{channel.public_id}/", cookie=client.cookies["sessionid"].value)
    assert (await refusal(again))[-1] == 4403


async def test_a_new_password_ends_the_live_sockets_of_the_sessions_it_ends(room, ann, ben):
    # given: two sessions of ben's, each with a live page; then his password is changed from the first
    # (Django keeps the session that changed it and ends the others)
    from django.contrib.auth import update_session_auth_hash

    _, channel = room
    await log_watcher_listening()
    mine, stolen = Client(), Client()
    for client in (mine, stolen):
        await db_call(client.force_login)(ben.user)
    cookies = [client.cookies["sessionid"].value for client in (mine, stolen)]
    sockets = [(await open_socket(f"/ws/conversations/{channel.public_id}/", cookie=c))[0] for c in cookies]
    for socket in sockets:
        await frames_until_live(socket)

    def change_password():
        ben.user.set_password("a new password 123")
        ben.user.save()
        request = type("Request", (), {"session": mine.session, "user": ben.user})()
        update_session_auth_hash(request, ben.user)  # under a new key, as the browser's cookie then says
        request.session.save()
        return request.session.session_key

    # when
    cookies[0] = await db_call(change_password)()
    # then: both pages are told to reconnect, before the next message; the stolen session's page is
    # signed out at its handshake, and the page of the session that made the change follows on
    for socket in sockets:
        assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 1011}
    await send(channel, body="secret plans", actor=ann)
    again = [(await open_socket(f"/ws/conversations/{channel.public_id}/", cookie=c))[0] for c in cookies]
    assert [frame["type"] for frame in await frames_until_live(again[0])][-1] == "message"
    assert await refusal(again[1]) == [4401]


async def test_a_last_login_saved_ends_no_socket(room, ben):
    _, channel = room
    socket = await watching(ben, channel)
    await frames_until_live(socket)
    await db_call(lambda: ben.user.save(update_fields=["last_login"]))()
    await db_call(lambda: ben.user.save())()  # nothing changed
    assert await socket.receive_nothing(timeout=0.5)


async def test_suspending_a_member_closes_all_their_sockets_at_once(room, ann, ben):
    # given: ben watches a conversation and his inbox
    _, channel = room
    conversation = await watching(ben, channel)
    await frames_until_live(conversation)
    inbox, connected = await open_socket("/ws/inbox/", ben)
    assert connected and await inbox.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    # when: he is suspended (nothing happens in the conversation)
    await db_call(services.update_member)(ben, status=Member.Status.SUSPENDED, actor=ann)
    # then: both close as signed out, without waiting for a message
    for socket in (conversation, inbox):
        assert (await socket.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}
