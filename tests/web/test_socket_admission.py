"""Who may open a live socket, and how many: the handshake refuses the
signed out, outsiders, other sites' pages and hosts this server does not
serve, and a member past their rate limit or their cap of open sockets."""
import asyncio

import pytest

from controlplane.db import db_call
from tests.web.sockets import frames_until_live, open_socket, refusal

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("live_sockets")]


async def test_signed_out_and_outsiders_are_told_why_and_closed_at_connect(room, human):
    _, channel = room
    cid = await db_call(human)("cid")
    path = f"/ws/conversations/{channel.public_id}/"
    anonymous, _ = await open_socket(path)
    outsider, _ = await open_socket(path, cid)
    unknown, _ = await open_socket("/ws/conversations/cnv_aaaaaaaaaaaaaaaa/", cid)
    assert await refusal(anonymous) == [4401]
    assert await refusal(outsider) == [{"type": "access.lost"}, 4403]
    assert await refusal(unknown) == [{"type": "access.lost"}, 4403]


async def test_opening_sockets_counts_against_the_members_rate_limit(room, ben, settings):
    # given: a budget of three requests a minute
    from tests.conftest import clear_of_window_edge

    settings.RATE_LIMIT_PER_MINUTE = 3
    _, channel = room
    clear_of_window_edge()
    # when: ben opens a conversation socket, an inbox socket, and two more
    opened = [(await open_socket(path, ben))[1]
              for path in (f"/ws/conversations/{channel.public_id}/", "/ws/inbox/",
                           f"/ws/conversations/{channel.public_id}/", "/ws/inbox/")]
    # then: the handshake past the budget is refused
    assert opened == [True, True, True, False]


async def test_signed_out_handshakes_count_against_the_client_address(room, settings):
    # given: a budget of three requests a minute
    from tests.conftest import clear_of_window_edge

    settings.RATE_LIMIT_PER_MINUTE = 3
    _, channel = room
    clear_of_window_edge()
    # when: four handshakes with no session, as anonymous HTTP requests are counted
    opened = [(await open_socket(path))[1] for path in (f"/ws/conversations/{channel.public_id}/", "/ws/inbox/") * 2]
    # then: each is accepted to be told it is signed out, until the address's budget is spent
    assert opened == [True, True, True, False]


async def test_a_member_holds_at_most_their_cap_of_sockets_open_in_a_process(room, ben, settings):
    # given: a cap of two open sockets (and long-polls) a member
    from controlplane import holding

    settings.WAITS_PER_MEMBER = 2
    _, channel = room
    conversation = f"/ws/conversations/{channel.public_id}/"
    first, _ = await open_socket(conversation, ben)
    second, _ = await open_socket("/ws/inbox/", ben)
    # when: ben opens a third; then closes one and tries again
    _, third = await open_socket(conversation, ben)
    await first.disconnect()
    fourth, again = await open_socket(conversation, ben)
    # then: the third was refused at its handshake, the fourth took the place given back
    assert (third, again) == (False, True)
    assert await frames_until_live(fourth) == []
    await second.disconnect()
    await fourth.disconnect()
    assert holding.held(ben.pk) == 0


async def test_sockets_opened_by_another_sites_page_are_refused(room, ben):
    _, channel = room
    path = f"/ws/conversations/{channel.public_id}/"
    assert (await open_socket(path, ben, origin="https://evil.example"))[1] is False
    socket, connected = await open_socket(path, ben, origin="http://testserver")
    assert connected
    await socket.disconnect()


async def test_sockets_on_a_host_this_server_does_not_serve_are_refused(room, ben, settings):
    """A name of the attacker's that resolves to this server (DNS
    rebinding) makes its page same-origin with the socket: the Host must be
    one of ALLOWED_HOSTS, as for every HTTP request and for `/mcp`."""
    # given: a production host list
    settings.ALLOWED_HOSTS = ["switchboard.example"]
    _, channel = room
    path = f"/ws/conversations/{channel.public_id}/"
    # when / then: the rebound name is refused with or without an Origin; the served host is not
    assert (await open_socket(path, ben, origin="http://rebound.example", host="rebound.example"))[1] is False
    assert (await open_socket(path, ben, host="rebound.example"))[1] is False
    socket, connected = await open_socket(path, ben, origin="https://switchboard.example",
                                          host="switchboard.example")
    assert connected
    await socket.disconnect()


async def test_a_sockets_work_on_the_request_threads_takes_its_addresss_turns(room, ben, monkeypatch):
    """As an HTTP request's does (controlplane.turns, controlplane.db.in_pool):
    a socket's reads took a thread ahead of every request waiting for its
    address's turn, so a member's hundred pages, each counting their inbox
    on every change, held back everyone else's requests."""
    from controlplane import turns
    from web import inbox_counts

    callers, counting = [], inbox_counts.pending

    async def count(member_pk):
        callers.append(turns.caller.get())
        return await counting(member_pk)

    monkeypatch.setattr(inbox_counts, "pending", count)
    socket, connected = await open_socket("/ws/inbox/", ben, client=("203.0.113.9", 50000))
    assert connected and await socket.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    assert callers == ["203.0.113.9"]


async def test_a_conversations_stream_takes_no_one_sockets_turns(room, ben, monkeypatch):
    """A stream is made by the first socket to join it, for every socket
    that follows: in that socket's turns, its passes would wait out any
    backlog of that one address."""
    from controlplane import turns
    from web import streams

    _, channel = room
    callers, reading = [], streams.next_pass

    async def next_pass(*args):
        callers.append(turns.caller.get())
        return await reading(*args)

    monkeypatch.setattr(streams, "next_pass", next_pass)
    socket, connected = await open_socket(f"/ws/conversations/{channel.public_id}/", ben,
                                          client=("203.0.113.9", 50000))
    assert connected
    await frames_until_live(socket)
    assert callers and set(callers) == {None}


async def test_the_work_a_socket_starts_for_every_socket_takes_no_one_sockets_turns(room, ben, settings,
                                                                                    monkeypatch):
    """The log watcher's look at the log head (the lost-wake safety net) is
    started by the first waiter of a process, and a member's inbox count by
    the first of their sockets to ask: in that socket's turns, they would
    wait out any backlog of its address for as long as they run."""
    from controlplane import log, turns
    from web import inbox_counts

    settings.FEED_RECHECK_SECONDS = 0.1
    _, channel = room
    heads, counts = [], []
    reading, counting = log.head_position, inbox_counts._count
    monkeypatch.setattr(log, "head_position", lambda: heads.append(turns.caller.get()) or reading())
    monkeypatch.setattr(inbox_counts, "_count", lambda pk: counts.append(turns.caller.get()) or counting(pk))
    conversation, _ = await open_socket(f"/ws/conversations/{channel.public_id}/", ben,
                                        client=("203.0.113.9", 50000))
    inbox, _ = await open_socket("/ws/inbox/", ben, client=("203.0.113.9", 50000))
    assert await inbox.receive_json_from(timeout=5) == {"type": "inbox", "pending": 0}
    for _ in range(50):
        if len(heads) >= 2:
            break
        await asyncio.sleep(0.1)
    assert heads and set(heads) == {None}
    assert counts == [f"member {ben.pk}"]
