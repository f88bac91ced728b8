"""The publisher on Redis (controlplane.publishing.publisher): group messages
sent after commits, a burst larger than the connection pool, and only to
groups that have a member."""
import os
import signal
import threading
import time

import pytest

from controlplane.publishing import publisher

on_redis = pytest.mark.postgres  # with REDIS_URL: the production path


@on_redis
def test_a_burst_of_nudges_over_redis_loses_none(monkeypatch, settings):
    """More after-commit group messages at once than the Redis pool has
    connections: each waits its turn (none fails with MaxConnectionsError)
    and every one arrives."""
    # given: a channels-redis layer whose pool (40) is far smaller than the burst (300)
    import asyncio

    from channels_redis.core import RedisChannelLayer

    from controlplane import publishing
    layer = RedisChannelLayer(hosts=[{"address": settings.REDIS_URL, "max_connections": 40, "socket_timeout": 30}],
                              prefix="switchboard-burst", capacity=1000)
    monkeypatch.setattr(publishing, "get_channel_layer", lambda: layer)
    channel = asyncio.run(layer.new_channel())

    async def join():
        for i in range(300):
            await layer.group_add(f"burst{i}", channel)

    asyncio.run(join())
    failures = []
    monkeypatch.setattr(publishing, "_log_failure", lambda future: future.exception() and failures.append(future.exception()))
    # when: 300 sends, all handed to the publisher at once
    for i in range(300):
        publishing.publisher.send(f"burst{i}", {"type": "burst", "i": i})

    async def collect():
        received = []
        try:
            while len(received) < 300:
                received.append((await asyncio.wait_for(layer.receive(channel), 10))["i"])
        except TimeoutError:
            pass
        return sorted(received)

    # then
    received = asyncio.run(collect())
    assert failures == []
    assert received == list(range(300))


@on_redis
def test_the_publisher_sends_only_to_groups_with_a_member(monkeypatch, settings):
    """On Redis, one pipelined read tells the groups with a member from the
    empty ones (most inbox groups, most of the time), which get no
    `group_send` of their own."""
    # given: a channels-redis layer with a channel in one group
    import asyncio

    from channels_redis.core import RedisChannelLayer

    from controlplane import publishing
    layer = RedisChannelLayer(hosts=[{"address": settings.REDIS_URL, "socket_timeout": 30}],
                              prefix="switchboard-listened")
    monkeypatch.setattr(publishing, "get_channel_layer", lambda: layer)
    channel = asyncio.run(layer.new_channel())
    asyncio.run(layer.group_add("listened", channel))
    sent_to = []
    group_send = layer.group_send

    async def spy(group, message):
        sent_to.append(group)
        await group_send(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    # when: a message to each of two groups, one of them empty
    for group in ("empty", "listened"):
        publishing.publisher.send(group, {"type": "note", "group": group})

    # then: the listened group's member gets its message, and only that group got a send
    received = asyncio.run(asyncio.wait_for(layer.receive(channel), 10))
    assert received["group"] == "listened"
    time.sleep(0.2)  # room for a send that should not happen
    assert sent_to == ["listened"]


@on_redis
def test_messages_handed_over_while_the_publisher_is_busy_wake_its_loop_once(monkeypatch, settings):
    """What one thread hands over before the publisher's loop takes it
    (a push worker's record announces every acknowledged item) goes over in
    one wake-up of that loop, not one each, and all of it arrives."""
    # given: a channels-redis layer with a channel in one group, and the publisher's loop busy
    import asyncio
    import threading

    from channels_redis.core import RedisChannelLayer

    from controlplane import publishing
    layer = RedisChannelLayer(hosts=[{"address": settings.REDIS_URL, "socket_timeout": 30}],
                              prefix="switchboard-handed", capacity=1000)
    monkeypatch.setattr(publishing, "get_channel_layer", lambda: layer)
    channel = asyncio.run(layer.new_channel())
    asyncio.run(layer.group_add("handed", channel))
    loop = publishing.publisher._background_loop()
    busy, wakes = threading.Event(), []
    loop.call_soon_threadsafe(busy.wait, 10)
    wake = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *args: wakes.append(args) or wake(*args))
    # when: 100 messages handed over meanwhile, then the loop free again
    for i in range(100):
        publishing.publisher.send("handed", {"type": "note", "i": i})
    busy.set()

    async def collect():
        return [(await asyncio.wait_for(layer.receive(channel), 10))["i"] for _ in range(100)]

    # then: one wake-up, and every message arrived
    assert sorted(asyncio.run(collect())) == list(range(100))
    assert len(wakes) == 1


def test_a_child_forked_while_another_thread_held_the_publishers_lock_can_still_publish(monkeypatch):
    """django-q2 forks its workers from a process that may be publishing:
    the child must not inherit a held lock that nobody will release, nor a
    batch the parent's loop was sending (its flusher never finishes there,
    and no other would start)."""
    # given: another thread holds the publisher's lock, and a batch is being flushed
    class Flushing:
        def done(self):
            return False

    monkeypatch.setitem(publisher._flushers, "layer", Flushing())
    held, release = threading.Event(), threading.Event()

    def hold():
        with publisher._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    # when: the process forks meanwhile, and the child hands something to its publisher's loop
    child = os.fork()
    if child == 0:
        try:  # the child never returns into the test session
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler: a hung child dies
            signal.alarm(5)
            # run on the child's own publisher loop: exits 0 if no flusher came along
            publisher._hand_over(lambda: os._exit(2 if "layer" in publisher._flushers else 0))
            time.sleep(10)
        finally:
            os._exit(1)
    release.set()
    holder.join()
    # then: the child's own loop ran what it was handed, with nothing of the parent's
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
