"""Long-polls of every caller the feeds take: anonymous readers of an open
space wait as members do, in places counted by their client address, and a
method that is no read (OPTIONS) never waits."""
import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from controlplane import holding
from inbox.services import send_message
from tests.inbox.test_longpoll import alice_in_the_lab, waits_observed, watcher_stops  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_an_anonymous_long_poll_waits_in_its_addresss_places(monkeypatch, settings):
    # given: a cap of one waiting request, and the open space's feed at its head
    settings.WAITS_PER_MEMBER, settings.FEED_RECHECK_SECONDS = 1, 120
    alice, _, space, general = await alice_in_the_lab()
    cursor = (await AsyncClient().get("/v0/spaces/lab/events")).json()["cursor"]
    query = {"cursor": cursor, "wait_ms": 20_000}
    waiting = waits_observed(monkeypatch)
    # when: an anonymous caller long-polls, and again from the same address while it waits
    first = asyncio.create_task(AsyncClient().get("/v0/spaces/lab/events", query))
    await asyncio.wait_for(waiting.wait(), 10)
    second = await asyncio.wait_for(AsyncClient().get("/v0/spaces/lab/events", query), 5)
    # then: the first waits, holding its address's place; the second is refused at once
    assert not first.done() and holding.held("address:127.0.0.1") == 1
    assert second.status_code == 429 and second.json()["error"]["code"] == "RATE_LIMITED"
    # and a send wakes the first, which gives its place back
    await sync_to_async(send_message)(general, body="hello, anyone", actor=alice)
    woken = await asyncio.wait_for(first, 15)
    assert woken.status_code == 200 and [e["kind"] for e in woken.json()["events"]] == ["message.created"]
    assert holding.held("address:127.0.0.1") == 0


async def test_options_on_a_long_polling_feed_answers_at_once(monkeypatch):
    # given
    alice, token, space, general = await alice_in_the_lab()
    waiting = waits_observed(monkeypatch)
    client = AsyncClient(raise_request_exception=False)
    # when
    answers = [await asyncio.wait_for(client.options(path, headers=headers), 5)
               for path in ("/v0/spaces/lab/events?wait_ms=20000", "/v0/me/inbox/events?wait_ms=20000")
               for headers in ({"Authorization": f"Bearer {token}"}, {})]
    # then: DRF's description of the route for a caller, 401 for an anonymous one on the inbox; nothing waited
    assert [a.status_code for a in answers] == [200, 200, 200, 401]
    assert not waiting.is_set()
