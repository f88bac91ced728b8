"""A live stream's pass (web.streams.read_pass) runs after every commit for
every watched conversation: its cost must not grow with the number of
sockets, messages or members it answers for."""
import json

import pytest

from controlplane.models import Conversation, Space
from inbox.services import send_message
from web.streams import read_pass


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


@pytest.mark.asyncio
async def test_a_failed_stream_closes_every_socket_even_when_one_cannot_be_closed(monkeypatch):
    # given: a stream of three sockets whose pass fails; the first socket is already gone and cannot be closed
    import asyncio

    from web import streams as live_streams

    class Socket:
        def __init__(self, broken: bool) -> None:
            self.member_pk, self.position, self.broken, self.failed = 1, 0, broken, False

        async def fail(self) -> None:
            if self.broken:
                raise RuntimeError("the socket is already closed")
            self.failed = True

    def failing_pass(*args):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(live_streams, "read_pass", failing_pass)
    monkeypatch.setattr(live_streams, "db_call", lambda fn: lambda *a: asyncio.sleep(0, result=fn(*a)))
    sockets = [Socket(broken=True), Socket(broken=False), Socket(broken=False)]
    ended = asyncio.Event()
    conversation = Conversation(pk=99, space_id=1)
    stream = live_streams.ConversationStream(conversation, on_empty=lambda s: ended.set())
    stream.sockets = dict.fromkeys(sockets)  # a set, in this order: the one that cannot be closed comes first
    # when: its pass fails
    await asyncio.wait_for(ended.wait(), 5)
    # then: every other socket was closed, so its page reconnects instead of waiting on no stream
    assert [s.failed for s in sockets[1:]] == [True, True]
