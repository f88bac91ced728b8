"""The official SDK's client against a real `/mcp`, with the Events
extension of the example client: its frames arrive on `events.frames`,
and `call` sends any request (the SDK's Client has verbs for the core
methods only)."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_endpoint.example_client import Events as _Events
from mcp_endpoint.example_client import Params, Request, Result


class Events(_Events):
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
