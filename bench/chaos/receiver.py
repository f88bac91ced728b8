"""The fault matrix's HTTPS receiver (its own process): answers verification
challenges, and every other POST by the behaviour its path names, logging
each request as a JSON line (path, Webhook-Id, what it names, the status it
answered) before answering.

    /hook/ok/N        202
    /hook/slow/N      202 after SLOW_SECONDS, every time
    /hook/flaky/N     every third request 500
    /hook/sometimes/N every SOMETIMES_EVERY-th request 500 (an item push is sent one at
                      a time: each failure holds the subscription's queue for a retry delay)
    /hook/throttle/N  every fourth request 429 with Retry-After: 1
    /hook/timeout/N   every fifth request answers after TIMEOUT_SECONDS (past the sender's read timeout)
    /hook/gone/N      202 for the first GONE_AFTER requests, then 410

    python -m bench.chaos.receiver CERT KEY PORT LOG
"""
from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from collections import Counter

from aiohttp import web

SLOW_SECONDS = 2.0
TIMEOUT_SECONDS = 12.0
GONE_AFTER = 5
# One item in flight and a first retry after 5 s: failing every 20th push
# drained 3–4 items/s, less than the load brings, and a long run left a
# backlog that outlasted the settle window. Every 200th drains ~30/s.
SOMETIMES_EVERY = 200


def decide(behaviour: str, n: int) -> tuple[int, float, dict]:
    """(status, delay before answering, extra headers) for the nth request (from 1) to a path."""
    if behaviour == "slow":
        return 202, SLOW_SECONDS, {}
    if (behaviour == "flaky" and n % 3 == 0) or (behaviour == "sometimes" and n % SOMETIMES_EVERY == 0):
        return 500, 0, {}
    if behaviour == "throttle" and n % 4 == 0:
        return 429, 0, {"Retry-After": "1"}
    if behaviour == "timeout" and n % 5 == 0:
        return 202, TIMEOUT_SECONDS, {}
    if behaviour == "gone" and n > GONE_AFTER:
        return 410, 0, {}
    return 202, 0, {}


def main(cert: str, key: str, port: int, log_path: str) -> None:
    counts: Counter = Counter()
    log = open(log_path, "a", buffering=1)

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        if data.get("type") in ("spaces.webhook.challenge", "verification"):
            return web.json_response({"challenge": data["challenge"]})
        behaviour = request.match_info["behaviour"]
        counts[request.path] += 1
        status, delay, headers = decide(behaviour, counts[request.path])
        log.write(json.dumps({"path": request.path, "id": request.headers.get("Webhook-Id", ""),
                              "mcp": request.headers.get("X-MCP-Subscription-Id"),
                              "event": (data.get("params") or {}).get("eventId") or data.get("eventId"),
                              "status": status, "late": delay >= TIMEOUT_SECONDS, "at": time.time()}) + "\n")
        if delay:
            await asyncio.sleep(delay)
        return web.Response(status=status, text="{}", content_type="application/json", headers=headers)

    app = web.Application()
    app.router.add_post("/hook/{behaviour}/{n}", hook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None, backlog=1024)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
