"""SPEC §6 commit-order guarantee under concurrent writers, on PostgreSQL.

Writers commit concurrently, some holding their transaction open after
writing; a poller reads the feed throughout. No event may ever appear
behind a cursor the poller has already been given."""
import random
import threading
import time

import pytest
from django.db import connections, transaction

from controlplane import services
from controlplane.log import NewEvent, append_events
from inbox.feeds import space_feed
from inbox.services import send_message

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WRITERS = 6
SENDS_PER_WRITER = 40
SLOW_WRITERS = 2
SLOW_EVENTS = 15


def _in_thread(target, errors):
    def run():
        try:
            target()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)
        finally:
            connections.close_all()

    return threading.Thread(target=run)


def test_poller_sees_every_event_once_in_position_order():
    # given
    owner = services.create_member("owner", actor=None)
    space = services.create_space(slug="race", name="Race", visibility="open", send_policy="open", actor=owner)
    channel = services.create_channel(space, "general", actor=owner)
    writers = [services.create_member(f"writer{i}", actor=None) for i in range(WRITERS)]
    for writer in writers:
        services.join_space(space, actor=writer)
    start = space_feed(space, owner, None, 100)
    cursor = start.position
    while True:  # skip the set-up events
        page = space_feed(space, owner, cursor, 100)
        cursor = page.position
        if not page.has_more:
            break
    done = threading.Event()
    errors: list[BaseException] = []

    def fast_writer(member):
        def run():
            for i in range(SENDS_PER_WRITER):
                send_message(channel, body=f"{member.handle} {i}", actor=member)
        return run

    def slow_writer():
        # Holds its transaction open after taking its position, widening the
        # window in which a sequence-based log would commit out of order.
        rng = random.Random(7)
        for _ in range(SLOW_EVENTS):
            with transaction.atomic():
                append_events([NewEvent("test.slow", {}, space_id=space.pk, actor_id=owner.pk)])
                time.sleep(rng.uniform(0.001, 0.02))

    seen: list[int] = []

    def poller():
        after = cursor
        while True:
            finished = done.is_set()
            page = space_feed(space, owner, after, 100)
            for event in page.events:
                # then (continuously): strictly after everything already returned
                assert event.position > after, (event.position, after)
                seen.append(event.position)
                after = event.position
            assert page.position == after
            if finished and not page.has_more:
                return

    threads = [_in_thread(fast_writer(w), errors) for w in writers]
    threads += [_in_thread(slow_writer, errors) for _ in range(SLOW_WRITERS)]
    reader = _in_thread(poller, errors)
    # when
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    reader.join(120)
    # then
    assert not errors, errors
    expected = WRITERS * SENDS_PER_WRITER + SLOW_WRITERS * SLOW_EVENTS
    assert len(seen) == expected
    assert len(set(seen)) == expected
    assert seen == sorted(seen)
