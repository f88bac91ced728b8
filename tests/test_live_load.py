"""Under concurrent sends, every live socket and every long-poll sees every
message exactly once, through real `serve` processes: one on SQLite (its
in-memory channel layer), two sharing Redis in the PostgreSQL run, with the
sockets and polls split between them and the sends going to both. The
periodic re-read is pushed past the test, so only the nudges can deliver."""
import asyncio
import contextlib

import aiohttp
import httpx
import pytest

from bench.live import PASSWORD
from bench.live import _sign_in as sign_in
from tests.servers import member_token, serving
from tests.test_server import member_with_token

pytestmark = pytest.mark.django_db(transaction=True)

SENDERS, PER_SENDER = 8, 15
SOCKETS, LONG_POLLS = 8, 4
DEADLINE = 30.0  # seconds after the last send for every reader to have everything


async def exchange(nodes: list[str], senders: list[dict], reader: dict, conversation: str, cursor: str) -> dict:
    sent: list[str] = []
    seen: dict[str, list[str]] = {}
    done = asyncio.Event()

    def check() -> None:
        if len(sent) == SENDERS * PER_SENDER and all(len(set(ids)) >= len(sent) for ids in seen.values()):
            done.set()

    def saw(who: str, message_id: str) -> None:
        seen[who].append(message_id)
        check()

    session_id = await sign_in(nodes[0], "reader")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def socket(i: int, ready: asyncio.Event) -> None:
            base = nodes[i % len(nodes)].replace("http://", "ws://")
            async with http.ws_connect(f"{base}/ws/conversations/{conversation}/?after=0",
                                       headers={"Cookie": f"sessionid={session_id}"}) as ws:
                seen[f"socket {i}"] = []
                async for frame in ws:
                    data = frame.json()
                    if data["type"] == "live":
                        ready.set()
                    elif data["type"] == "message":
                        saw(f"socket {i}", data["id"])

        async def long_poll(i: int) -> None:
            base, after = nodes[i % len(nodes)], cursor
            seen[f"poll {i}"] = []
            while True:
                async with http.get(f"{base}/v0/spaces/lab/events", headers=reader,
                                    params={"cursor": after, "wait_ms": "20000"}) as response:
                    assert response.status == 200, await response.text()
                    page = await response.json()
                for event in page["events"]:
                    if event["kind"] == "message.created":
                        saw(f"poll {i}", event["data"]["message"]["id"])
                after = page["cursor"]

        async def sender(i: int) -> None:
            base = nodes[i % len(nodes)]
            for n in range(PER_SENDER):
                async with http.post(f"{base}/v0/spaces/lab/conversations/%23general/messages",
                                     json={"body": f"{i}:{n}"}, headers=senders[i]) as response:
                    assert response.status == 201, await response.text()
                    sent.append((await response.json())["message"]["id"])

        readies = [asyncio.Event() for _ in range(SOCKETS)]
        readers = [asyncio.create_task(socket(i, readies[i])) for i in range(SOCKETS)]
        readers += [asyncio.create_task(long_poll(i)) for i in range(LONG_POLLS)]
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readies)), 20)
        await asyncio.gather(*(sender(i) for i in range(SENDERS)))
        check()
        try:
            await asyncio.wait_for(done.wait(), DEADLINE)
        except TimeoutError:
            pass
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return {"sent": sent, "seen": seen}


def test_every_socket_and_long_poll_sees_every_message_under_concurrent_sends(settings):
    # given: an open channel, eight agents to send, one reader with a web session and a token
    owner = member_with_token("owner")
    senders = [member_with_token(f"sender{i}") for i in range(SENDERS)]
    reader = {"Authorization": f"Bearer {member_token('reader', kind='human', password=PASSWORD)}"}
    nodes = 2 if settings.REDIS_URL else 1
    with serving("--no-worker", FEED_RECHECK_SECONDS=600) as (node_a, _), \
            (serving("--no-worker", FEED_RECHECK_SECONDS=600) if nodes == 2
             else contextlib.nullcontext((node_a, None))) as (node_b, _):
        assert httpx.post(f"{node_a}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=owner).status_code == 201
        for member in (*senders, reader):
            assert httpx.post(f"{node_a}/v0/spaces/lab/join", headers=member).status_code == 201
        channel = httpx.post(f"{node_a}/v0/spaces/lab/channels", json={"name": "general"}, headers=owner).json()
        cursor = httpx.get(f"{node_a}/v0/spaces/lab/events", params={"limit": 100}, headers=reader).json()["cursor"]
        # when: 120 sends from 8 clients at once, to both nodes
        result = asyncio.run(exchange(sorted({node_a, node_b}), senders, reader,
                                      channel["conversation"]["id"], cursor))
    # then: each of the 12 readers saw each message once, none it was not sent
    assert len(result["sent"]) == SENDERS * PER_SENDER
    assert sorted(result["seen"]) == sorted([f"socket {i}" for i in range(SOCKETS)]
                                            + [f"poll {i}" for i in range(LONG_POLLS)])
    for who, ids in result["seen"].items():
        assert sorted(ids) == sorted(result["sent"]), f"{who}: {len(ids)} of {len(result['sent'])}"

