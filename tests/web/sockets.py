"""Live sockets under test: opened through the real ASGI router (session
auth, origin check, URL routing) and the configured channel layer, and the
helpers the `live_sockets` fixture (tests/web/conftest.py) uses to end them
with their test."""
import asyncio
import json

from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane import topics
from controlplane.asgi import router
from controlplane.db import db_call
from controlplane.live import LOG_TOPIC, log_watcher
from controlplane.models import Member
from controlplane.publishing import publisher
from inbox.services import send_message


def session_cookie(member: Member) -> str:
    client = Client()
    client.force_login(member.user)
    return client.cookies["sessionid"].value


OPEN: list[WebsocketCommunicator] = []


async def stops_finished() -> None:
    """Wait (up to 5 s) for the receives topics.heeding_cancellation is still
    stopping in the background."""
    if topics._stopping:
        await asyncio.wait(set(topics._stopping), timeout=5)


async def open_socket(path, member=None, origin=None, cookie=None, host="testserver", client=None):
    headers = [(b"host", host.encode())]
    if member is not None:
        cookie = await db_call(session_cookie)(member)
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    socket = WebsocketCommunicator(router, path, headers=headers)
    if client is not None:
        socket.scope["client"] = client
    OPEN.append(socket)
    connected, _ = await socket.connect(timeout=5)
    return socket, connected


async def watching(member, conversation, after=0):
    await log_watcher_listening()  # first, so its probes wake no socket
    socket, connected = await open_socket(f"/ws/conversations/{conversation.public_id}/?after={after}", member)
    assert connected
    return socket


async def log_watcher_listening():
    """Wait until this process's log watcher hears the log topic (as another
    process's commit reaches it: Redis pub/sub, or the in-memory layer's group)."""
    for _ in range(100):
        mark = log_watcher.mark()
        if topics.on_redis():
            await asyncio.to_thread(publisher.publish, LOG_TOPIC, {"type": "log.advanced"})
        else:
            await get_channel_layer().group_send(LOG_TOPIC, {"type": "log.advanced"})
        await log_watcher.wait(mark, 0.05)
        if mark.is_set():
            return
    raise AssertionError("the log watcher never heard the log topic")


async def frames_until_live(socket) -> list[dict]:
    frames = []
    while (frame := await socket.receive_json_from(timeout=5))["type"] != "live":
        frames.append(frame)
    return frames


send = db_call(send_message)


async def refusal(socket) -> list:
    """What a socket refused after the handshake says before it closes."""
    said = []
    while (output := await socket.receive_output(timeout=5))["type"] == "websocket.send":
        said.append(json.loads(output["text"]))
    return [*said, output.get("code")]
