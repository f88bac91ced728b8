"""A live page's socket through a real `serve` process: what a browser may
send on it."""
import asyncio

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
