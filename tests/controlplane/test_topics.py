"""Topics on Redis (controlplane.topics, published by controlplane.publishing): what every process listens to once
(the log's advances, new due deliveries) goes out as one PUBLISH and is
heard through one pub/sub subscription per listener."""
from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from controlplane import topics
from controlplane.publishing import publisher

pytestmark = pytest.mark.postgres  # with REDIS_URL: the production path


async def _subscribed(listeners: int, channel: str) -> None:
    import redis.asyncio

    async with redis.asyncio.Redis.from_url(settings.REDIS_URL) as client:
        for _ in range(200):
            if dict(await client.pubsub_numsub(channel))[channel.encode()] >= listeners:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"{listeners} listeners never subscribed to {channel}")


@pytest.mark.asyncio
async def test_one_publish_from_a_committing_thread_reaches_every_listener(monkeypatch):
    # given: two listeners to a topic (as two processes' watchers are), and a
    # channel layer that must not be used for it
    topic = "switchboard.test.reaches"
    layer = get_channel_layer()

    async def no_group_send(group, message):
        raise AssertionError(f"a topic went through the layer's group {group}")

    monkeypatch.setattr(layer, "group_send", no_group_send)
    heard: list[list[dict]] = [[], []]
    listeners = [asyncio.create_task(topics.listen(topic, got.append)) for got in heard]
    try:
        await _subscribed(2, topics.redis_channel(topic))
        # when: a request thread publishes once
        await asyncio.to_thread(publisher.publish, topic, {"type": "log.advanced", "position": 7,
                                                                 "conversations": [3], "members": None})
        for _ in range(100):
            if all(heard):
                break
            await asyncio.sleep(0.02)
        # then: each listener got the message as it was sent
        assert heard == [[{"type": "log.advanced", "position": 7, "conversations": [3], "members": None}]] * 2
    finally:
        for task in listeners:
            await topics.stop_task(task)


@pytest.mark.asyncio
async def test_a_listener_whose_connection_redis_dropped_subscribes_again():
    # given: a listener to a topic
    import redis.asyncio

    topic = "switchboard.test.dropped"
    channel = topics.redis_channel(topic)
    heard: list[dict] = []
    listener = asyncio.create_task(topics.listen(topic, heard.append))
    try:
        await _subscribed(1, channel)
        # when: Redis drops its connection (a restart, a failover: found by its name)
        async with redis.asyncio.Redis.from_url(settings.REDIS_URL) as admin:
            ids = [c["id"] for c in await admin.client_list() if c.get("name") == channel]
            assert len(ids) == 1
            await admin.client_kill_filter(_id=ids[0])
        # then: it subscribes again and hears what is published after that
        for _ in range(300):
            await asyncio.to_thread(publisher.publish, topic, {"type": "again"})
            if heard:
                break
            await asyncio.sleep(0.05)
        assert heard and heard[0] == {"type": "again"}
    finally:
        await topics.stop_task(listener)
    # and a stopped listener's subscription is gone with it
    await asyncio.sleep(0.1)
    async with redis.asyncio.Redis.from_url(settings.REDIS_URL) as admin:
        assert dict(await admin.pubsub_numsub(channel))[channel.encode()] == 0


@pytest.mark.asyncio
async def test_a_cancelled_listener_ends_though_its_subscription_never_finishes_closing(monkeypatch):
    """A close that waits on its cancelled read kept the task, and with it
    the shutdown of its event loop, waiting for ever: a long-poll run on a
    loop of its own was never answered."""
    import redis.asyncio.client

    async def never_closes(self):
        await asyncio.Event().wait()

    topic = "switchboard.test.unclosed"
    listener = asyncio.create_task(topics.listen(topic, lambda message: None))
    await _subscribed(1, topics.redis_channel(topic))
    monkeypatch.setattr(redis.asyncio.client.PubSub, "aclose", never_closes)
    monkeypatch.setattr(topics, "CLOSE_SECONDS", 0.2, raising=False)
    # when
    listener.cancel()
    # then
    done, _ = await asyncio.wait([listener], timeout=5)
    assert done == {listener} and listener.cancelled()
