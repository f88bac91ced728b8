"""MCP: send → `events/stream` event latency, and pushed inbox items/s.

1. stream: one `manage.py serve --no-worker --workers 1` on PostgreSQL and
   Redis; a sender (agent), a reader (human, signed in for a session
   cookie) and an agent share an open space, and the sender has a direct
   conversation with each. The agent holds an `events/stream` of
   `org.switchboard/inbox.item` through the official SDK client
   (tests/mcp_endpoint/client.py). `sends` direct messages to the agent, one
   at a time: t0 just before `POST …/messages`; stopped when the stream's
   `event` frame carrying that message arrives (stamped by a task that reads
   the SDK's frame queue); the next send starts once it did (or after 5 s)
   and `gap` later. Baseline on the same server, just before: bench/live.py's
   send → WebSocket frame measurement with one client, the reader's socket
   on its direct conversation with the sender (the same kind of send).
   With `heavy_polls`, the stream is measured once more while another
   agent runs that many `events/poll`s at once, again and again, each
   reading the same page of about 800 KB of its inbox (50 items of 8,000
   escaped quotes): what one member's large reads cost another's stream.
2. push: pushed `inbox.item` items/s (bench/push.py).
"""
from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import aiohttp

from bench import inbox, live, push
from bench.load import latency_summary
from bench.push import ITEM

WARMUP_SENDS = 10
HEAVY_ITEMS = 50
# --- 1. send → stream event beside send → WebSocket frame -------------------------------

async def _stream(base: str, slug: str, conversation: str, sender: str, agent: str, *, sends: int,
                  gap: float) -> dict:
    from tests.mcp_endpoint.client import call, connect

    arrivals: dict[str, list[float]] = defaultdict(list)
    seen: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    other_frames: Counter = Counter()
    sent: list[tuple[str, float, float]] = []  # (message id, t0, response)
    timeouts = 0
    async with connect(base, agent) as (client, events):
        stream = asyncio.ensure_future(call(client, "events/stream", name=ITEM))
        kind, _ = await events.next(30)
        assert kind == "active", f"stream: {kind}"

        async def reader() -> None:
            while True:
                kind, frame = await events.frames.get()
                arrived = time.perf_counter()
                if kind == "event":
                    post = frame["data"].get("item", {}).get("postId")
                    arrivals[post].append(arrived)
                    seen[post].set()
                else:
                    other_frames[kind] += 1

        frames = asyncio.create_task(reader())
        url = f"{base}/v0/spaces/{slug}/conversations/{conversation}/messages"
        headers = {"Authorization": f"Bearer {sender}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            for n in range(sends):
                body = f'{{"body": "live frame {n}: status nominal, queue drained, nothing to report"}}'
                t0 = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as response:
                    data = await response.json(content_type=None)
                    assert response.status == 201, f"send {n}: {response.status} {data}"
                sent.append((data["message"]["id"], t0, time.perf_counter()))
                try:
                    await asyncio.wait_for(seen[sent[-1][0]].wait(), live.FRAME_TIMEOUT)
                except TimeoutError:
                    timeouts += 1
                await asyncio.sleep(gap)
        await asyncio.sleep(1.0)  # late or duplicate frames
        frames.cancel()
        stream.cancel()
        await asyncio.gather(frames, stream, return_exceptions=True)
    ids = {m for m, _, _ in sent}
    missing = sum(not arrivals.get(m) for m in ids)
    duplicates = sum(max(0, len(arrivals.get(m, [])) - 1) for m in ids)
    unknown = len(set(arrivals) - ids)
    return {"sends": len(sent), "events": sum(len(arrivals[m]) for m in ids if m in arrivals),
            "missing": missing, "duplicates": duplicates, "unknown_events": unknown, "timeouts": timeouts,
            "errors": missing + duplicates + unknown, "other_frames": dict(other_frames),
            "event": latency_summary([arrivals[m][0] - t0 for m, t0, _ in sent if arrivals.get(m)]),
            "send_response": latency_summary([done - t0 for _, t0, done in sent])}


async def _beside_heavy_polls(base: str, heavy: str, cursor: str, polls: int, measure) -> dict:
    """`measure()` (a coroutine) while `polls` of the heavy agent's
    `events/poll`s from `cursor` run at once, each followed by the next."""
    from tests.mcp_endpoint.client import call, connect

    stop, read = asyncio.Event(), []

    async def polling(client) -> None:
        while not stop.is_set():
            page = await call(client, "events/poll", name=ITEM, cursor=cursor, maxEvents=HEAVY_ITEMS)
            read.append(len(page["events"]))

    async with connect(base, heavy) as (client, _):
        pollers = [asyncio.ensure_future(polling(client)) for _ in range(polls)]
        started = time.perf_counter()
        try:
            figures = await measure()
        finally:
            stop.set()
            await asyncio.gather(*pollers, return_exceptions=True)
    figures["heavy_polls"] = {"at_once": polls, "polls": len(read), "events_per_poll": max(read, default=0),
                              "polls_per_second": round(len(read) / (time.perf_counter() - started), 1)}
    return figures


async def _heavy_inbox(base: str, slug: str, sender: str, heavy) -> str:
    """The heavy agent's direct conversation with the sender, HEAVY_ITEMS
    large items in its inbox, and a poll cursor from before them."""
    from tests.mcp_endpoint.client import call, connect

    async with aiohttp.ClientSession() as http, connect(base, heavy.token) as (client, _):
        await live._api(http, base, heavy.token, "POST", f"/v0/spaces/{slug}/join")
        conversation = (await live._api(http, base, sender, "POST", f"/v0/spaces/{slug}/direct",
                                        {"member": f"@{heavy.handle}"}))["conversation"]["id"]
        cursor = (await call(client, "events/poll", name=ITEM))["cursor"]
        for _ in range(HEAVY_ITEMS):
            await live._api(http, base, sender, "POST", f"/v0/spaces/{slug}/conversations/{conversation}/messages",
                            {"body": '"' * 8000})
    return cursor


def _stream_phase(env: dict, out_dir: Path, *, sends: int, gap: float, heavy_polls: int = 0) -> dict:
    stamp = time.strftime("%H%M%S")
    sender, reader, reader_token = live._members(env, f"m{stamp}")
    agent = inbox.create_member(f"mcp{stamp}a")
    server = live._serve(env, out_dir, "mcp")
    with server:
        base = server.base_url

        async def prepare() -> tuple[str, ...]:
            async with aiohttp.ClientSession() as http:
                slug = f"mcp{stamp}"
                await live._api(http, base, sender, "POST", "/v0/spaces",
                                {"slug": slug, "name": slug, "visibility": "open", "send_policy": "open"})
                directs = []
                for handle, token in ((reader, reader_token), (agent.handle, agent.token)):
                    await live._api(http, base, token, "POST", f"/v0/spaces/{slug}/join")
                    data = await live._api(http, base, sender, "POST", f"/v0/spaces/{slug}/direct",
                                           {"member": f"@{handle}"})
                    directs.append(data["conversation"]["id"])
                # A socket replays its conversation from the start: the warm-up sends go elsewhere.
                data = await live._api(http, base, sender, "POST", f"/v0/spaces/{slug}/channels", {"name": "warm"})
            return slug, *directs, data["conversation"]["id"], await live._sign_in(base, reader)

        slug, to_reader, to_agent, warm, session_id = asyncio.run(prepare())

        def measure_websocket(conversation: str, n: int) -> dict:
            return asyncio.run(live._measure([base], slug, conversation, session_id, sender, clients=1, sends=n,
                                             gap=gap))

        def measure_stream(n: int) -> dict:
            return asyncio.run(_stream(base, slug, to_agent, sender, agent.token, sends=n, gap=gap))

        measure_websocket(warm, WARMUP_SENDS)  # first requests, connections and code paths: not counted
        measure_stream(WARMUP_SENDS)
        server.memory.start()
        started = time.monotonic()
        websocket, stream = measure_websocket(to_reader, sends), measure_stream(sends)
        wall = time.monotonic() - started
        processes = server.memory.stop()
        if heavy_polls:
            heavy = inbox.create_member(f"mcp{stamp}h")
            cursor = asyncio.run(_heavy_inbox(base, slug, sender, heavy))
            stream["beside_heavy_polls"] = asyncio.run(_beside_heavy_polls(
                base, heavy.token, cursor, heavy_polls,
                lambda: _stream(base, slug, to_agent, sender, agent.token, sends=sends, gap=gap)))
    ratios = {q: round(stream["event"][f"{q}_ms"] / websocket["frame"][f"{q}_ms"], 2)
              for q in ("p50", "p99") if stream["event"][f"{q}_ms"] and websocket["frame"][f"{q}_ms"]}
    return {"sends": sends, "gap_ms": round(gap * 1000), "stream": stream, "websocket": websocket,
            "ratios": ratios, "command": " ".join(server.argv),
            "server_peak_rss_mib": max((p["peak_rss_mib"] for p in processes), default=None),
            "server_cpu_cores": round(sum(p["cpu_seconds"] for p in processes) / wall, 2),
            "server_log": server.log_summary()}


def run(env: dict, dsn: str, out_dir: Path, *, sends: int, gap: float, items: int, workers: int,
        seconds: float, profile: bool = False, heavy_polls: int = 0) -> dict:
    results = {}
    for name, phase in (("stream", lambda: _stream_phase(env, out_dir, sends=sends, gap=gap,
                                                         heavy_polls=heavy_polls)),
                        ("push", lambda: push.phase(env, dsn, out_dir, items=items, workers=workers,
                                                    seconds=seconds, profile=profile))):
        print(f"  mcp: {name} …", file=sys.stderr, flush=True)
        try:
            results[name] = phase()
        except Exception as exc:  # one broken figure must not hide the other
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return results
