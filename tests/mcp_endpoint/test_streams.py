"""Stream bookkeeping: how many a member may hold, who owns an inbox
stream, and which commits wake a space's stream."""
import asyncio

import pytest

from controlplane.live import Interest
from mcp_endpoint import sources
from mcp_endpoint.streams import MAX_PER_MEMBER, StreamOwner, TooManyStreams


class Member:
    def __init__(self, pk):
        self.pk, self.public_id = pk, f"mem_{pk:016d}"


async def inbox_streams_in_turn(member) -> tuple[StreamOwner, StreamOwner]:
    """Two consumers of `member`'s inbox items, the second started and
    claiming after the first."""
    item = sources.SOURCES["org.switchboard/inbox.item"]
    older, newer = StreamOwner(member, item, {}), StreamOwner(member, item, {})
    for owner in (older, newer):
        await owner.start()
        await owner.take_over()
    return older, newer


def test_a_member_holds_at_most_so_many_streams():
    async def story():
        work = sources.SOURCES["spaces.work.available"]
        owners = [StreamOwner(Member(1), work, {"space": "lab"}) for _ in range(MAX_PER_MEMBER)]
        for owner in owners:
            await owner.start()
        with pytest.raises(TooManyStreams):
            await StreamOwner(Member(1), work, {"space": "lab"}).start()
        other = StreamOwner(Member(2), work, {"space": "lab"})
        await other.start()  # another member is not affected
        await owners[0].stop()
        again = StreamOwner(Member(1), work, {"space": "lab"})
        await again.start()  # a stopped stream frees its place
        for owner in [*owners[1:], other, again]:
            await owner.stop()

    asyncio.run(story())


def test_a_stream_cancelled_with_its_client_still_gives_its_place_back():
    """The SDK ends a stream whose client went by cancelling its task, which
    interrupts the stream's cleanup at its first wait."""
    import contextlib

    async def story():
        work = sources.SOURCES["spaces.work.available"]
        # given: a member whose every place is taken
        owners = [StreamOwner(Member(7), work, {"space": "lab"}) for _ in range(MAX_PER_MEMBER)]
        for owner in owners:
            await owner.start()
        # when: one stream's cleanup is cancelled at its first wait
        stopping = asyncio.create_task(owners[0].stop())
        await asyncio.sleep(0)
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        # then: its place is free (on Redis once a worker thread has given it back)
        for _ in range(100):
            again = StreamOwner(Member(7), work, {"space": "lab"})
            try:
                await again.start()
                break
            except TooManyStreams:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("the cancelled stream kept its place")
        for owner in [*owners[1:], again]:
            await owner.stop()

    asyncio.run(story())


def test_a_start_that_loses_the_channel_layer_gives_its_place_back():
    class Lost:
        async def new_channel(self):
            raise ConnectionError("the channel layer is gone")

    async def story():
        work = sources.SOURCES["spaces.work.available"]
        # given: a member with every place but one taken
        owners = [StreamOwner(Member(6), work, {"space": "lab"}) for _ in range(MAX_PER_MEMBER - 1)]
        for owner in owners:
            await owner.start()
        # when: the last one's start fails after it took its place
        failed = StreamOwner(Member(6), work, {"space": "lab"})
        failed._layer = Lost()
        with pytest.raises(ConnectionError):
            await failed.start()
        # then: its place and its renewal are gone with it
        assert failed._renewal is None and not failed.counted
        last = StreamOwner(Member(6), work, {"space": "lab"})
        await last.start()
        for owner in [*owners, last]:
            await owner.stop()

    asyncio.run(story())


@pytest.mark.postgres  # with REDIS_URL: the shared deployment
def test_on_redis_a_members_streams_are_counted_across_processes(monkeypatch):
    """Places another process holds count here; a place its process no
    longer renews (killed) frees itself; a stopped stream gives its back,
    for good."""
    import time

    from controlplane.cache import raw_redis
    from mcp_endpoint import streams

    work = sources.SOURCES["spaces.work.available"]
    client, key = raw_redis("mcp-streams:41")
    client.delete(key)

    async def story():
        # given: another process holds all but one of member 41's places, and one that lapsed
        client.zadd(key, {f"elsewhere-{n}": time.time() + 60 for n in range(MAX_PER_MEMBER - 1)})
        client.zadd(key, {"killed": time.time() - 1})
        # when / then: one more stream here, and no other
        here = StreamOwner(Member(41), work, {"space": "lab"})
        await here.start()
        with pytest.raises(TooManyStreams):
            await StreamOwner(Member(41), work, {"space": "lab"}).start()
        assert client.zcard(key) == MAX_PER_MEMBER and client.zscore(key, "killed") is None
        # and a stream renews its place while it is open, and gives it back when it stops
        monkeypatch.setattr(streams, "PLACE_SECONDS", 0.3)
        renewal = here._renewal
        here._renewal = asyncio.get_running_loop().create_task(here._renew())
        await streams.stop_task(renewal)
        await asyncio.sleep(0.25)
        assert time.time() < client.zscore(key, here.token) <= time.time() + 0.35  # was a minute ahead
        await here.stop()
        for _ in range(100):  # given back on a worker thread
            if client.zscore(key, here.token) is None:
                break
            await asyncio.sleep(0.01)
        assert client.zcard(key) == MAX_PER_MEMBER - 1
        # and a renewal that was on its way when the stream stopped does not place it again
        await streams.places.renew(41, here.token)
        assert client.zscore(key, here.token) is None

    try:
        asyncio.run(story())
    finally:
        client.delete(key, raw_redis("mcp-streams-gone:41")[1])


@pytest.mark.postgres  # with REDIS_URL: the shared deployment
def test_on_redis_claims_are_ordered_by_redis_not_by_the_processes_clocks(monkeypatch):
    # given: a server process whose clock runs backwards
    from mcp_endpoint import streams

    ticks = iter(range(10**18, 0, -10**9))
    monkeypatch.setattr(streams.time, "time_ns", lambda: next(ticks))

    async def story():
        older, newer = await inbox_streams_in_turn(Member(42))
        replaced, kept = await older.wait(2.0), await newer.wait(0.2)
        await older.stop()
        await newer.stop()
        return replaced, kept

    # then: the later claim owns the stream
    assert asyncio.run(story()) == ("replaced", None)


@pytest.mark.postgres  # with REDIS_URL: the shared deployment
def test_on_redis_a_claim_after_the_counter_was_lost_is_still_the_newest():
    from controlplane.cache import raw_redis
    from mcp_endpoint import streams

    client, key = raw_redis("mcp-stream-claims")
    before = [asyncio.run(streams._claim_order()) for _ in range(2)]
    client.delete(key)  # Redis restarted, or evicted it
    after = asyncio.run(streams._claim_order())
    assert before[0] < before[1] < after


def test_of_two_inbox_streams_the_newer_owns_it_and_the_older_is_told():
    async def story():
        older, newer = await inbox_streams_in_turn(Member(3))
        replaced = await older.wait(2.0)
        kept = await newer.wait(0.2)
        await older.stop()  # the older one's cleanup leaves the newer one alone
        await asyncio.sleep(0.05)
        still = not newer.replaced.is_set()
        await newer.stop()
        return replaced, kept, still

    replaced, kept, still = asyncio.run(story())
    assert replaced == "replaced" and kept is None and still is True


def test_an_older_consumer_that_joins_after_the_newer_claimed_is_still_told():
    """The older claim reaches the newer consumer only: it answers with its
    own again, which the older one hears."""
    async def story():
        item = sources.SOURCES["org.switchboard/inbox.item"]
        older, newer = StreamOwner(Member(6), item, {}), StreamOwner(Member(6), item, {})
        older.claim = (1, older.token)  # claimed, but not yet listening to the owner group
        await newer.start()
        await newer.take_over()
        await older.start()
        await older._announce()  # its claim goes out only now
        replaced = await older.wait(2.0)
        kept = await newer.wait(0.2)
        await older.stop()
        await newer.stop()
        return replaced, kept

    assert asyncio.run(story()) == ("replaced", None)


def test_a_started_stream_that_has_not_taken_over_ends_no_consumer():
    async def story():
        item = sources.SOURCES["org.switchboard/inbox.item"]
        owner, refused = StreamOwner(Member(7), item, {}), StreamOwner(Member(7), item, {})
        await owner.start()
        await owner.take_over()
        await refused.start()  # its first read is refused: it stops without taking over
        await refused.stop()
        kept = await owner.wait(0.3)
        await owner.stop()
        return kept

    assert asyncio.run(story()) is None


def test_a_suspension_ends_every_stream_of_the_member():
    from channels.layers import get_channel_layer

    from controlplane.live import member_group

    async def story():
        work = sources.SOURCES["spaces.work.available"]
        owner = StreamOwner(Member(4), work, {"space": "lab"})
        await owner.start()
        await get_channel_layer().group_send(member_group(Member(4)), {"type": "session.ended"})
        ended = await owner.wait(2.0)
        await owner.stop()
        return ended

    assert asyncio.run(story()) == "suspended"


def test_an_inbox_stream_open_past_the_group_expiry_is_still_told_it_was_replaced(monkeypatch):
    """The layer forgets a membership `group_expiry` after it was made (a
    day by default): a stream renews its own, so a consumer that has held the
    inbox stream for longer still hears of its replacement."""
    from channels.layers import get_channel_layer

    from controlplane import topics

    monkeypatch.setattr(get_channel_layer(), "group_expiry", 2)
    monkeypatch.setattr(topics, "GROUP_READD_SECONDS", 0.5)

    async def story():
        item = sources.SOURCES["org.switchboard/inbox.item"]
        older, newer = StreamOwner(Member(5), item, {}), StreamOwner(Member(5), item, {})
        await older.start()
        await older.take_over()
        await asyncio.sleep(3.5)  # past the expiry of its first joins
        await newer.start()
        await newer.take_over()
        replaced = await older.wait(2.0)
        await older.stop()
        await newer.stop()
        return replaced

    assert asyncio.run(story()) == "replaced"


@pytest.mark.django_db
def test_a_work_stream_is_woken_only_by_commits_in_its_space(monkeypatch):
    from controlplane import services
    from inbox.services import send_message

    # given: every log nudge the commits send, kept; ada's work stream's interest in the lab
    nudges = []
    monkeypatch.setattr("controlplane.log.announce_on_commit", nudges.append)
    ada, bo = (services.create_member(handle, actor=None) for handle in ("ada", "bo"))
    channels = {}
    for slug in ("lab", "elsewhere"):
        space = services.create_space(slug=slug, name=slug, visibility="open", send_policy="open", actor=ada)
        channels[slug] = services.create_channel(space, "general", actor=ada)
    interest = Interest(**sources.interest(ada, sources.SOURCES["spaces.work.available"], {"space": "lab"}))

    def wakes(commit) -> bool:
        nudges.clear()
        commit()
        assert nudges  # the commit was announced
        return any(interest.matches(nudge) for nudge in nudges)

    # then: commits elsewhere do not wake it; a message or a change of readers in the lab does
    assert not wakes(lambda: send_message(channels["elsewhere"], body="not here", actor=ada))
    assert not wakes(lambda: services.join_space(channels["elsewhere"].space, actor=bo))
    assert wakes(lambda: send_message(channels["lab"], body="here", actor=ada))
    assert wakes(lambda: services.join_space(channels["lab"].space, actor=bo))


@pytest.mark.django_db
def test_an_inbox_stream_is_woken_by_commits_addressed_to_its_member(monkeypatch):
    from controlplane import services
    from inbox.services import send_message

    # given: every log nudge the commits send, kept; ada's inbox stream's interest
    nudges = []
    monkeypatch.setattr("controlplane.log.announce_on_commit", nudges.append)
    ada, bo, cy = (services.create_member(handle, actor=None) for handle in ("ada", "bo", "cy"))
    space = services.create_space(slug="lab", name="lab", visibility="open", send_policy="open", actor=bo)
    for member in (ada, cy):
        services.join_space(space, actor=member)
    to_ada, _ = services.get_or_create_direct(space, ada, actor=bo)
    to_cy, _ = services.get_or_create_direct(space, cy, actor=bo)
    interests = [Interest(**sources.interest(ada, sources.SOURCES[name], {}))
                 for name in ("org.switchboard/inbox.item", "org.switchboard/inbox.pending")]

    def wakes(commit) -> bool:
        nudges.clear()
        commit()
        assert nudges  # the commit was announced
        return all(any(interest.matches(nudge) for nudge in nudges) for interest in interests)

    # then: a message to someone else does not wake it; one to ada does
    assert not wakes(lambda: send_message(to_cy, body="not for ada", actor=bo))
    assert wakes(lambda: send_message(to_ada, body="for ada", actor=bo))


class FirstReceiveLost:
    """The channel layer, but a stream's first receive fails (Redis lost a
    moment): a listener that died of it heard nothing more, ever."""

    def __init__(self, layer):
        self._layer, self.failed = layer, False

    def __getattr__(self, name):
        return getattr(self._layer, name)

    async def receive(self, channel):
        if not self.failed:
            self.failed = True
            raise ConnectionError("the channel layer is gone a moment")
        return await self._layer.receive(channel)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("then", ["replaced", "suspended"])
def test_a_stream_whose_channel_layer_was_lost_a_moment_still_hears_what_ends_it(make_member, then):
    from channels.layers import get_channel_layer

    from controlplane.models import Member as Row

    ada = make_member("ada")
    item = sources.SOURCES["org.switchboard/inbox.item"]

    async def story():
        # given: ada's inbox stream, whose listener loses the channel layer at once
        older = StreamOwner(ada, item, {})
        older._layer = FirstReceiveLost(get_channel_layer())
        await older.start()
        await older.take_over()
        await asyncio.sleep(0.1)
        # when: a newer consumer takes over, or ada is suspended behind the layer's back, while it is deaf
        newer = None
        if then == "replaced":
            newer = StreamOwner(ada, item, {})
            await newer.start()
            await newer.take_over()
        else:
            await asyncio.to_thread(Row.objects.filter(pk=ada.pk).update, status=Row.Status.SUSPENDED)
        # then: once it listens again (after a second), it ends as it should
        ended = await older.wait(3.0)
        for owner in (older, newer):
            if owner is not None:
                await owner.stop()
        return ended

    assert asyncio.run(story()) == then


def test_a_stream_whose_stop_is_cancelled_at_its_first_wait_still_leaves_its_groups():
    import contextlib

    from channels.layers import get_channel_layer

    async def story():
        owner = StreamOwner(Member(33), sources.SOURCES["org.switchboard/inbox.item"], {})
        await owner.start()
        await owner.take_over()
        memberships = owner._memberships
        # when: the SDK cancels the stream's cleanup at its first wait
        stopping = asyncio.create_task(owner.stop())
        await asyncio.sleep(0)
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        await asyncio.sleep(0.2)
        # then: its channel is in none of its groups (it hears nothing sent there), and nothing joins it again
        layer = get_channel_layer()
        for group in owner.groups:
            await layer.group_send(group, {"type": "probe"})
        try:
            heard = await asyncio.wait_for(layer.receive(owner._channel), 0.5)
        except asyncio.TimeoutError:
            heard = None
        return heard, memberships._renewal

    assert asyncio.run(story()) == (None, None)
