"""A live stream's pass (web.streams.read_pass) runs after every commit for
every watched conversation: its cost must not grow with the number of
sockets, messages or members it answers for. Under the server on
PostgreSQL it runs on the event loop (next_pass) and takes no request
thread."""
import asyncio
import json

import pytest
import pytest_asyncio

from controlplane.models import Conversation, Space
from inbox.services import send_message
from tests.conftest import under_the_server
from web.streams import next_pass, read_pass


@pytest.mark.parametrize("watchers, sent", [(1, 1), (40, 30)])
def test_a_pass_is_one_query_whatever_it_answers_for(room, ann, ben, human, django_assert_num_queries,
                                                      watchers, sent):
    # given: `watchers` members (ann, ben and outsiders) and `sent` new messages
    space, channel = room
    outsiders = [human(f"out{i}") for i in range(watchers - 2)]
    for i in range(sent):
        send_message(channel, body=f"m{i}", actor=ann)
    # when: readers, the space's policy and the messages with their authors, in one query
    with django_assert_num_queries(1):
        result = read_pass(channel.pk, {ann.pk, ben.pk, *(m.pk for m in outsiders)}, after=0)
    # then
    assert result.readers == {ann.pk, ben.pk}
    assert [json.loads(frame)["id"] for _, frame in result.frames] == \
        list(channel.messages.order_by("position").values_list("public_id", flat=True))
    assert len(result.frames) == sent and not result.full


def test_a_pass_for_nobody_who_may_read_reads_no_messages(room, human, django_assert_num_queries):
    space, channel = room
    outsider = human("out")
    send_message(channel, body="hello", actor=space.memberships.first().member)
    with django_assert_num_queries(1):
        result = read_pass(channel.pk, {outsider.pk}, after=0)
    assert (result.readers, result.frames) == (set(), [])


def test_a_pass_in_an_explicit_only_space_asks_once_more_for_withheld_bodies(room, ann, ben,
                                                                           django_assert_num_queries):
    space, channel = room
    send_message(channel, body="hello", actor=ann)
    Space.objects.filter(pk=space.pk).update(send_policy=Space.SendPolicy.EXPLICIT_ONLY)
    with django_assert_num_queries(2):
        result = read_pass(channel.pk, {ann.pk, ben.pk}, after=0)
    assert result.readers == {ann.pk, ben.pk} and len(result.frames) == 1


def test_a_conversation_deleted_while_watched_has_no_readers_left(room, ann, ben):
    # Its sockets are then closed as for lost access (4403), not as a failed stream.
    space, channel = room
    send_message(channel, body="hello", actor=ann)
    Conversation.objects.filter(pk=channel.pk).delete()
    result = read_pass(channel.pk, {ann.pk, ben.pk}, after=0)
    assert (result.readers, result.frames) == (set(), [])


@pytest.fixture
def hello(room, ann):
    space, channel = room
    return channel, send_message(channel, body="hello from ann", actor=ann).message


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_live_pass_under_the_server_answers_while_every_request_thread_is_busy(
        hello, ann, ben, request_threads_busy):
    # given: a message committed, and every request thread of the server process busy
    channel, message = hello
    async with under_the_server():
        # when: a live stream's pass runs
        result = await asyncio.wait_for(next_pass(channel.pk, {ann.pk, ben.pk}, 0), 5)
    # then: it read the readers and the message on the loop's own connection
    assert result.readers == {ann.pk, ben.pk}
    assert [json.loads(text)["id"] for _, text in result.frames] == [message.public_id]
    assert "hello from ann" in json.loads(result.frames[0][1])["html"]


class Socket:
    """A live socket as a stream sees it (web.consumers.ConversationConsumer)."""

    def __init__(self, *, broken: bool = False, unsendable: bool = False, closing=None) -> None:
        self.member_pk, self.position, self.failed = 1, 0, False
        self.broken, self.unsendable = broken, unsendable  # cannot be closed; cannot be sent to
        self.closing = closing  # awaited while it closes

    async def deliver(self, frames, caught_up: bool) -> None:
        if self.unsendable:
            raise RuntimeError("the socket cannot be sent to")

    async def fail(self) -> None:
        if self.closing is not None:
            await self.closing()
        if self.broken:
            raise RuntimeError("the socket is already closed")
        self.failed = True


@pytest_asyncio.fixture
async def passes(monkeypatch):
    """Streams whose passes run on the loop, with what `answer()` returns or
    raises. The log watcher their streams start on the test's loop stops
    with it: a channels-redis receive can lose the loop's one cancellation
    at its close and keep it waiting."""

    from controlplane.live import log_watcher
    from web import streams as live_streams

    def use(answer):
        async def next_pass(*args):
            return answer()

        monkeypatch.setattr(live_streams, "next_pass", next_pass)
        return live_streams

    yield use
    await log_watcher.stop()


def the_database_went_away():
    raise RuntimeError("the database went away")


@pytest.mark.asyncio
async def test_a_failed_stream_closes_every_socket_even_when_one_cannot_be_closed(passes):
    # given: a stream of three sockets whose pass fails; the first socket is already gone and cannot be closed

    live_streams = passes(the_database_went_away)
    sockets = [Socket(broken=True), Socket(), Socket()]
    ended = asyncio.Event()
    stream = live_streams.ConversationStream(Conversation(pk=99, space_id=1), on_empty=lambda s: ended.set())
    stream.sockets = dict.fromkeys(sockets)  # a set, in this order: the one that cannot be closed comes first
    # when: its pass fails
    await asyncio.wait_for(ended.wait(), 5)
    # then: every other socket was closed, so its page reconnects instead of waiting on no stream
    assert [s.failed for s in sockets[1:]] == [True, True]


@pytest.mark.asyncio
async def test_a_socket_joining_while_a_failed_stream_closes_gets_a_stream_that_runs(passes):
    # given: a conversation's stream whose pass fails, with a socket that takes a while to close

    live_streams = passes(the_database_went_away)
    streams, conversation, joined = live_streams.Streams(), Conversation(pk=98, space_id=1), []
    late = Socket()

    async def a_page_reconnects_meanwhile():
        joined.append(streams.join(late, conversation))

    first = Socket(closing=a_page_reconnects_meanwhile)
    failed = streams.join(first, conversation)
    # when: the stream fails, and a socket joins while it is closing the first
    for _ in range(100):
        if late.failed:
            break
        await asyncio.sleep(0.01)
    # then: the late socket went to a new stream, which ran (and failed, closing it too), not to the ended one
    assert first.failed and joined and joined[0] is not failed
    assert late.failed


@pytest.mark.asyncio
async def test_a_socket_that_cannot_be_sent_to_is_closed_as_it_leaves(passes):
    # given: a stream whose pass has a frame for its socket, which cannot be sent to

    from web.streams import Pass

    live_streams = passes(lambda: Pass(readers={1}, frames=[(1, "{}")], full=False))
    socket, ended = Socket(unsendable=True), asyncio.Event()
    stream = live_streams.ConversationStream(Conversation(pk=97, space_id=1), on_empty=lambda s: ended.set())
    stream.join(socket)
    # when: the pass delivers
    await asyncio.wait_for(ended.wait(), 5)
    # then: it left the stream and was closed, so its page reconnects instead of hearing nothing more
    assert socket not in stream.sockets and socket.failed
