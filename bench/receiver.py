"""A fast HTTPS receiver for the webhook benchmarks (its own process):
answers verification challenges (Switchboard's and the MCP Events
extension's), every other POST with 202, and records the delivery id
(`Webhook-Id`), what the POST names (a wake's `through` cursor, or an MCP
push's `X-MCP-Subscription-Id`) and the receipt time; `GET /stats` returns
them, `GET /count` only how many there are (and how many distinct ids): what
a benchmark polls while it measures, so that its own looks cost next to
nothing on the cores it measures. `POST /reset` forgets them.

    python -m bench.receiver CERT KEY PORT
"""
from __future__ import annotations

import json
import ssl
import sys
import time

from aiohttp import web


def main(cert: str, key: str, port: int) -> None:
    received: list[tuple[str, str | None, float]] = []
    ids: set[str] = set()

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        at = time.time()
        try:
            wake = json.loads(body)
        except ValueError:
            wake = {}
        if wake.get("type") in ("spaces.webhook.challenge", "verification"):
            return web.json_response({"challenge": wake["challenge"]})
        named = wake.get("event_range", {}).get("through") or request.headers.get("X-MCP-Subscription-Id")
        received.append((request.headers.get("Webhook-Id", ""), named, at))
        ids.add(received[-1][0])
        return web.Response(status=202, text="{}", content_type="application/json")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"received": received})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"received": len(received), "unique": len(ids)})

    async def reset(request: web.Request) -> web.Response:
        received.clear()
        ids.clear()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/hook/{n}", hook)
    app.router.add_post("/hook", hook)
    app.router.add_get("/stats", stats)
    app.router.add_get("/count", count)
    app.router.add_post("/reset", reset)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None, backlog=1024)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
