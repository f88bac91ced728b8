"""An agent's loop on Switchboard's MCP endpoint, with the official SDK.

    SWITCHBOARD_TOKEN=sbt_… python -m mcp_endpoint.example_client [--url http://127.0.0.1:8000/mcp] [--seconds N]

It opens an `events/stream` of `org.switchboard/inbox.item` first (so
nothing that arrives meanwhile is missed), then drains the inbox with
`read_inbox`, then prints every item the stream brings, acknowledging each
with `acknowledge_delivery` once it has been handled (printed). Each line
it prints is one JSON object: `{"item": …}` per item, `{"frame": kind}` for
the stream's other frames.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client

EVENTS = "io.modelcontextprotocol/events"
ITEM = "org.switchboard/inbox.item"


class Params(types.RequestParams):
    model_config = {"extra": "allow"}


class Request(types.Request[Params, str]):
    method: str
    params: Params


class Result(types.Result):
    model_config = {"extra": "allow"}


class Frame(types.NotificationParams):
    model_config = {"extra": "allow"}


class Events(ClientExtension):
    """Declares the Events extension and queues its stream's frames."""

    identifier = EVENTS

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()

    def notifications(self):
        def binding(kind: str) -> NotificationBinding:
            async def handle(params: Frame) -> None:
                await self.frames.put((kind, params.model_dump(by_alias=True)))
            return NotificationBinding(method=f"notifications/events/{kind}", params_type=Frame, handler=handle)
        return [binding(kind) for kind in ("active", "event", "heartbeat", "error", "terminated")]


def show(line: dict) -> None:
    print(json.dumps(line, ensure_ascii=False), flush=True)


async def handle(client: Client, entry: dict) -> None:
    """Your agent's work goes here; this one prints the item, then hands it off."""
    show({"item": entry["item"]})
    await client.call_tool("acknowledge_delivery", {"deliveryToken": entry["deliveryToken"]})


async def run(url: str, token: str, seconds: float | None) -> None:
    events = Events()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http, \
            Client(streamable_http_client(url, http_client=http), extensions=[events]) as client:
        stream = asyncio.ensure_future(client.session.send_request(
            Request(method="events/stream", params=Params(name=ITEM)), Result))
        kind, _ = await events.frames.get()  # `active`: the stream is on, now read what was there before
        show({"frame": kind})
        cursor = None
        while True:
            page = (await client.call_tool("read_inbox", {"cursor": cursor} if cursor else {})).structured_content
            for entry in page["items"]:
                await handle(client, entry)
            if not (cursor := page["nextCursor"]):
                break
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        try:
            while deadline is None or loop.time() < deadline:
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    kind, frame = await asyncio.wait_for(events.frames.get(), timeout)
                except TimeoutError:
                    break
                if kind == "event" and frame["data"]["kind"] == "item":
                    await handle(client, frame["data"])
                elif kind == "event":  # too large to carry: fetch it by its event id
                    item = (await client.call_tool("read_event", {"eventId": frame["eventId"]})).structured_content
                    await handle(client, {**item, "deliveryToken": frame["data"]["deliveryToken"]})
                else:
                    show({"frame": kind})
                    if kind == "terminated":
                        break
        finally:
            stream.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/mcp")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until Ctrl-C)")
    args = parser.parse_args()
    token = os.environ.get("SWITCHBOARD_TOKEN")
    if not token:
        sys.exit("Set SWITCHBOARD_TOKEN to a bearer token (manage.py issuecredential HANDLE).")
    try:
        asyncio.run(run(args.url, token, args.seconds))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
