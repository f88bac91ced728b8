"""A live page's socket through a real `serve` process: what a browser may
send on it."""
import asyncio
import socket as sockets
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest

from bench.live import PASSWORD
from bench.live import _sign_in as sign_in
from controlplane.uvicorn_process import WS_MAX_BYTES
from tests.servers import member_token, serving
from tests.test_server import member_with_token

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_socket_frame_larger_than_a_live_page_needs_closes_that_socket_only():
    owner = member_with_token("owner")
    reader = {"Authorization": f"Bearer {member_token('reader', kind='human', password=PASSWORD)}"}

    async def story(base: str, conversation: str):
        session_id = await sign_in(base, "reader")
        socket_url = f"{base.replace('http://', 'ws://')}/ws/conversations/{conversation}/?after=0"
        async with aiohttp.ClientSession() as http:
            big, small = [await http.ws_connect(socket_url, headers={"Cookie": f"sessionid={session_id}"})
                          for _ in range(2)]
            for ws in (big, small):
                while (await ws.receive_json(timeout=10))["type"] != "live":
                    pass
            await big.send_str("x" * (WS_MAX_BYTES + 1))
            await small.send_str("x" * 100)  # ignored
            closed = await big.receive(timeout=10)
            async with http.post(f"{base}/v0/spaces/lab/conversations/{conversation}/messages",
                                 json={"body": "still here"}, headers=owner) as response:
                sent = (await response.json())["message"]["id"]
            while (frame := await small.receive_json(timeout=10))["type"] != "message":
                pass
            await small.close()
            return closed, frame["id"] == sent

    with serving("--no-worker", "--workers", "1") as (base, _):
        assert httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=owner).status_code == 201
        assert httpx.post(f"{base}/v0/spaces/lab/join", headers=reader).status_code == 201
        channel = httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=owner).json()
        closed, followed = asyncio.run(story(base, channel["conversation"]["id"]))
    # then: that socket is closed as too big; the other one still follows the channel
    assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1009
    assert followed


def stalled_socket(base: str, path: str, session_id: str) -> sockets.socket:
    """A live page's socket that, once open, never reads (a tiny receive buffer)."""
    address = urlsplit(base)
    raw = sockets.socket()
    raw.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVBUF, 2048)
    raw.connect((address.hostname, address.port))
    raw.sendall((f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 f"Sec-WebSocket-Version: 13\r\nCookie: sessionid={session_id}\r\n\r\n").encode())
    assert b" 101 " in raw.recv(200)
    return raw


def test_a_page_that_stops_reading_holds_up_no_other_page_of_its_conversation():
    # given: a reader's page following the channel, and a page of another member's that stops reading
    owner = member_with_token("owner")
    member_token("stalls", kind="human", password=PASSWORD)
    member_token("reader", kind="human", password=PASSWORD)

    async def story(base: str, conversation: str):
        path = f"/ws/conversations/{conversation}/?after=0"
        session_id = await sign_in(base, "reader")
        stalled = stalled_socket(base, path, await sign_in(base, "stalls"))
        async with aiohttp.ClientSession() as http, httpx.AsyncClient() as api:
            page = await http.ws_connect(f"{base.replace('http://', 'ws://')}{path}",
                                         headers={"Cookie": f"sessionid={session_id}"})
            while (await page.receive_json(timeout=10))["type"] != "live":
                pass
            # the stalled page's buffers fill with a megabyte of messages; then one more
            sent = [(await api.post(f"{base}/v0/spaces/lab/conversations/{conversation}/messages",
                                    json={"body": body}, headers=owner)).json()["message"]["id"]
                    for body in [f"{n} " + "<" * 8000 for n in range(120)] + ["ping"]]
            # when
            frames = []
            while not frames or frames[-1].get("id") != sent[-1]:
                frames.append(await page.receive_json(timeout=30))  # without the fix: never
            stalled.close()
            await page.close()
            return sent, frames

    with serving("--no-worker", "--workers", "1") as (base, _):
        assert httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=owner).status_code == 201
        channel = httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=owner).json()
        sent, frames = asyncio.run(story(base, channel["conversation"]["id"]))
    # then: the reader's page had every message, in order, the stalled page's allowance
    # (web.streams.SEND_SECONDS) after the stall at most
    assert [frame["id"] for frame in frames if frame["type"] == "message"] == sent


def test_a_socket_to_a_path_no_live_page_serves_is_refused_at_its_handshake():
    # given: paths no socket route serves, an id that is not one, a page's, and /mcp's
    paths = ["/ws/nope/", "/ws/conversations/garbage/", "/app/", "/mcp", "/"]

    async def handshakes(base: str) -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as http:
            for path in paths:
                try:
                    await (await http.ws_connect(base.replace("http://", "ws://") + path)).close()
                    statuses.append(101)
                except aiohttp.WSServerHandshakeError as refused:
                    statuses.append(refused.status)
        return statuses

    with serving("--no-worker", "--workers", "1") as (base, _):
        # then: each is refused as a foreign origin is (403), not a 500 that logs a traceback
        assert asyncio.run(handshakes(base)) == [403] * len(paths)
