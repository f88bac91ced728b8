"""The official SDK's client against a real `/mcp`, with the Events
extension: its notifications arrive on `frames`, and `call` sends any
request (the SDK's Client has verbs for the core methods only)."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client

FRAMES = ("active", "event", "heartbeat", "error", "terminated")


class Params(types.RequestParams):
    model_config = {"extra": "allow"}


class Request(types.Request[Params, str]):
    method: str
    params: Params


class Result(types.Result):
    model_config = {"extra": "allow"}


class FrameParams(types.NotificationParams):
    model_config = {"extra": "allow"}


class Events(ClientExtension):
    identifier = "io.modelcontextprotocol/events"

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()

    def notifications(self):
        def binding(kind):
            async def handle(params: FrameParams) -> None:
                await self.frames.put((kind, params.model_dump(by_alias=True, exclude_none=True)))
            return NotificationBinding(method=f"notifications/events/{kind}", params_type=FrameParams, handler=handle)
        return [binding(kind) for kind in FRAMES]

    async def next(self, timeout: float = 10.0) -> tuple[str, dict]:
        return await asyncio.wait_for(self.frames.get(), timeout)


async def call(client: Client, method: str, **params: Any) -> dict:
    result = await client.session.send_request(Request(method=method, params=Params(**params)), Result)
    return result.model_dump(by_alias=True, exclude_none=True)


@contextlib.asynccontextmanager
async def connect(base: str, token: str, *, mode: str = "auto"):
    """(client, events) for the member behind `token`."""
    events = Events()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode,
                            extensions=[events]) as client:
        yield client, events
