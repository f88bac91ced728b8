"""iter_feed and drain_inbox against real servers: a feed followed across a
server restart, a feed past retention, and a drain whose handler fails; and
the pause between polls that do not wait."""
import datetime as dt
import threading
import time

import pytest
from switchboard_client import Client, DrainError, ResyncRequired

from controlplane.clock import now
from controlplane.log import prune_events
from tests.client.conftest import member_token
from tests.servers import free_port, serving

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(predicate, condition: threading.Condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with condition:
        while not predicate():
            remaining = deadline - time.monotonic()
            assert remaining > 0, "gave up waiting"
            condition.wait(remaining)


def test_iter_feed_follows_a_space_across_a_server_restart_losing_and_repeating_nothing():
    # given: a server on a port of our choosing, and alice following lab's feed in a thread
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    alice, bob = Client(base, member_token("alice")), Client(base, member_token("bob"))
    seen, arrived = [], threading.Condition()

    def follow(feed):
        for event in feed:
            with arrived:
                seen.append(event)
                arrived.notify_all()

    def messages():
        return [e.data["message"]["body"] for e in seen if e.kind == "message.created"]

    with serving(port=port):
        alice.create_space("lab", "Lab")
        bob.join_space("lab")
        general = alice.create_channel("lab", "general").id
        threading.Thread(target=follow, args=(alice.iter_feed(space="lab", wait_ms=2_000),), daemon=True).start()
        for n in range(3):
            bob.send("lab", general, f"before {n}")
        wait_until(lambda: len(messages()) == 3, arrived)
    # when: the server stops (the feed's long poll breaks, its retries find nobody) and starts again
    with serving(port=port):
        for n in range(3):
            bob.send("lab", general, f"after {n}")
        wait_until(lambda: len(messages()) == 6, arrived)
    # then: every message once, in order, and no event twice
    assert messages() == [f"before {n}" for n in range(3)] + [f"after {n}" for n in range(3)]
    positions = [e.position for e in seen]
    assert positions == sorted(set(positions))
    assert len({e.id for e in seen}) == len(seen)


def test_iter_feed_past_retention_raises_or_goes_on_from_the_cursor_on_resync_returns(clients):
    # given: alice's inbox feed cursor after bob's first message, then the log pruned past it
    alice, bob = clients
    direct = bob.open_direct("lab", "alice").id
    bob.send("lab", direct, "one")
    bob.send("lab", direct, "two")
    stale = alice.inbox_events(limit=1).cursor
    assert prune_events(older_than=now() + dt.timedelta(seconds=1)) > 0
    # when: without on_resync
    with pytest.raises(ResyncRequired) as gone:
        next(iter(alice.iter_feed(inbox=True, after=stale, wait_ms=0)))
    assert gone.value.status == 410 and "floor" in gone.value.details
    # when: with on_resync, which takes a fresh snapshot (holding "three", sent meanwhile)
    bob.send("lab", direct, "three")
    resyncs, snapshots = [], []

    def resync(error):
        resyncs.append(error)
        snapshots.append(alice.snapshot())
        bob.send("lab", direct, "four")  # after the snapshot: for the feed to bring
        return snapshots[-1].cursor

    feed = alice.iter_feed(inbox=True, after=stale, wait_ms=2_000, on_resync=resync)
    first = next(feed)
    # then: one resync; the snapshot has what the feed lost, and the feed goes on after it
    assert len(resyncs) == 1 and isinstance(resyncs[0], ResyncRequired)
    assert [u.message.body for u in snapshots[0].unresolved] == ["one", "two", "three"]
    assert first.data["message"]["body"] == "four"


def test_drain_inbox_leaves_a_failed_item_pending_and_acknowledges_the_others(clients):
    # given: three items in alice's inbox
    alice, bob = clients
    direct = bob.open_direct("lab", "alice").id
    for body in ("one", "boom", "three"):
        bob.send("lab", direct, body)
    calls = []

    def handler(entry):
        calls.append(entry.item["content"])
        if entry.item["content"] == "boom":
            raise RuntimeError("handler failed")

    # when
    with pytest.raises(DrainError) as failed:
        alice.drain_inbox(handler)
    # then: each handler ran once; the failed item is still pending, the others are acknowledged
    assert calls == ["one", "boom", "three"]
    assert isinstance(failed.value.__cause__, RuntimeError)
    report = failed.value.report
    assert [e.item["content"] for e in report.acknowledged] == ["one", "three"]
    assert [(e.item["content"], type(x)) for e, x in report.failed] == [("boom", RuntimeError)]
    assert [e.item["content"] for e in alice.read_inbox().items] == ["boom"]
    # and the next drain, with a handler that copes, acknowledges it
    later = alice.drain_inbox(lambda entry: None, raise_errors=False)
    assert [e.item["content"] for e in later.acknowledged] == ["boom"] and later.failed == []
    assert alice.read_inbox().items == ()


def test_a_synchronous_drain_leaves_pending_what_an_async_handler_would_have_handled(clients):
    # (the coroutine was dropped unrun, and the item acknowledged all the same)
    alice, bob = clients
    bob.send("lab", bob.open_direct("lab", "alice").id, "for an async handler")
    ran = []

    async def handler(entry):
        ran.append(entry)

    report = alice.drain_inbox(handler, raise_errors=False)
    assert report.acknowledged == [] and [type(x) for _, x in report.failed] == [TypeError] and ran == []
    assert [e.item["content"] for e in alice.read_inbox().items] == ["for an async handler"]


def test_a_feed_that_does_not_wait_pauses_between_empty_polls():
    """With wait_ms=0 an empty page was asked for again at once, as fast as
    the server answered (its rate limit the only brake)."""
    from switchboard_client.feeds import EMPTY_POLL_PAUSE, Feed
    from switchboard_client.models import Page

    class Server:  # two empty pages, then one with an event
        def __init__(self):
            self.pages = [Page((), "c1", False), Page((), "c2", False), Page(("event",), "c3", False)]
            self.asked = []

        def inbox_events(self, **params):
            self.asked.append((params["cursor"], params["wait_ms"]))
            return self.pages.pop(0)

    server, slept = Server(), []
    feed = Feed(server, sleep=slept.append, space=None, inbox=True, after="c0", wait_ms=0, limit=None,
                on_resync=None)
    assert next(feed) == "event" and feed.cursor == "c3"
    assert server.asked == [("c0", 0), ("c1", 0), ("c2", 0)] and slept == [EMPTY_POLL_PAUSE] * 2


def test_a_feed_away_from_its_server_for_half_a_day_goes_on_waiting():
    """The 1,024th failure in a row (about 10.6 hours of a stopped server)
    doubled the wait past what a float holds: OverflowError, not a wait."""
    from switchboard_client import RetryPolicy, errors
    from switchboard_client.feeds import RECONNECT_MAX, Feed
    from switchboard_client.models import Page

    class Server:  # away for 2,000 polls, then back with an event
        polls = 0

        def inbox_events(self, **params):
            Server.polls += 1
            if Server.polls <= 2000:
                raise errors.ConnectionFailed("refused", details={"sent": False})
            return Page(("event",), "c1", False)

    slept = []
    feed = Feed(Server(), sleep=slept.append, space=None, inbox=True, after="c0", wait_ms=30_000, limit=None,
                on_resync=None)
    assert next(feed) == "event"
    assert len(slept) == 2000 and max(slept) <= RECONNECT_MAX * 1.2 and min(slept[-100:]) >= RECONNECT_MAX * 0.8
    # and a retry policy that tries practically forever waits at most its longest wait
    assert RetryPolicy(attempts=5000, max_backoff=20.0).wait(1100, None) <= 24.0


def test_an_async_feed_takes_a_page_size_and_a_sleep_as_the_sync_one_does():
    """AsyncFeed had no settable `limit` and always slept with asyncio.sleep."""
    import asyncio

    from switchboard_client.feeds import EMPTY_POLL_PAUSE, AsyncFeed
    from switchboard_client.models import Page

    class Server:  # an empty page, then one with an event
        def __init__(self):
            self.pages = [Page((), "c1", False), Page(("event",), "c2", False)]
            self.asked = []

        async def inbox_events(self, **params):
            self.asked.append((params["cursor"], params["limit"]))
            return self.pages.pop(0)

    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    server = Server()
    feed = AsyncFeed(server, sleep=sleep, space=None, inbox=True, after="c0", wait_ms=0, limit=None, on_resync=None)
    feed.limit = 5
    assert asyncio.run(feed.__anext__()) == "event" and feed.cursor == "c2" and feed.limit == 5
    assert server.asked == [("c0", 5), ("c1", 5)] and slept == [EMPTY_POLL_PAUSE]
