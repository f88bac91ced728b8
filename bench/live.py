"""Live pages: send → WebSocket frame latency with many connected clients.

Per setup, a fresh open space with one channel, one sender (an agent with a
bearer token) and one reader (a human, signed in through /app/login/ for a
`sessionid` cookie); `manage.py serve --no-worker --workers 1` (its default server) on PostgreSQL,
with REDIS_URL as the other phases. `clients` aiohttp WebSockets, all with
the reader's cookie and no Origin header, open
`ws/conversations/<id>/?after=0` and wait for their `live` frame. Then
`sends` messages, one at a time: t0 just before `POST …/messages`; every
client stamps the arrival of the `message` frame carrying that id
(time.perf_counter in this process, so after aiohttp has parsed it); the
next send starts once every client has it (or after 5 s) and `gap` later,
so sends do not queue behind each other's fan-out.

Samples are arrival − t0 over all (send, client) pairs; "last client" is
the slowest client per send. Every client must get every message exactly
once: missing, duplicate and unknown frames are counted (an error).

Setups: one process with all clients; two processes with the clients split
between them and the sends going to the first (the other process hears of
the commit only through the Redis channel layer); one process with one
client (the same path without fan-out). Baselines in the same run: the
send's own HTTP round trip (t0 → response) and a raw channel-layer round
trip (group_send on channels-redis to a group whose member channel another
task of this process is receiving on, as LogWatcher does).
"""
from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import aiohttp

from bench.load import latency_summary
from bench.report import log_topic_subscribers
from bench.servers import PY, ROOT, Server

PASSWORD = "bench-live-password-0123456789"
FRAME_TIMEOUT = 5.0
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
# What a server process's command line holds: uvicorn's under `serve`, granian's, Daphne's.
SERVER_PROCESSES = ("controlplane.uvicorn_process", "controlplane.asgi", "daphne")


def _members(env: dict, stamp: str) -> tuple[str, str, str]:
    """(sender token, reader handle, reader token), made with the real commands."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("createmember", f"live{stamp}s", kind="agent", stdout=io.StringIO())
    call_command("issuecredential", f"live{stamp}s", stdout=out)
    reader = f"live{stamp}r"
    subprocess.run([PY, "manage.py", "createmember", reader, "--kind", "human", "--password-stdin"], cwd=ROOT,
                   env=env, input=PASSWORD + "\n", check=True, capture_output=True, text=True)
    token = io.StringIO()
    call_command("issuecredential", reader, stdout=token)
    return out.getvalue().strip(), reader, token.getvalue().strip()


def _serve(env: dict, out_dir: Path, label: str) -> Server:
    server = Server("daphne-1", env, out_dir, "live")  # port, start, /healthz, stop, memory: the harness's
    server.name = f"serve-{label}"
    # One server process per `serve` (its --server: SERVE_SERVER in the environment, uvicorn by default).
    server.argv = [PY, "manage.py", "serve", "--no-worker", "--workers", "1", "--bind", f"127.0.0.1:{server.port}"]
    server.stdout_path, server.stderr_path = (out_dir / f"live-{label}.{s}.log" for s in ("stdout", "stderr"))
    return server


async def _api(http, base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    async with http.request(method, base + path, json=body or {},
                            headers={"Authorization": f"Bearer {token}"}) as response:
        data = await response.json(content_type=None)
        assert response.status in (200, 201), f"{method} {path}: {response.status} {data}"
        return data


async def _sign_in(base: str, handle: str) -> str:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/app/login/") as response:
            form = CSRF_FIELD.search(await response.text()).group(1)
        async with http.post(f"{base}/app/login/", allow_redirects=False, headers={"Referer": f"{base}/app/login/"},
                             data={"username": handle, "password": PASSWORD, "csrfmiddlewaretoken": form}) as response:
            assert response.status == 302 and "sessionid" in response.cookies, f"sign-in: {response.status}"
            return response.cookies["sessionid"].value


async def _measure(bases: list[str], slug: str, conversation: str, session_id: str, token: str, *, clients: int,
                   sends: int, gap: float) -> dict:
    """Connect `clients` sockets (round robin over `bases`), send to bases[0], time the frames."""
    by_id: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    complete: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    live = [asyncio.Event() for _ in range(clients)]
    closes: list[str] = []  # sockets the server closed before the end
    ending = False

    async def reader(i: int, ws) -> None:
        async for frame in ws:
            arrived = time.perf_counter()
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            data = frame.json()
            if data["type"] == "message":
                by_id[data["id"]][i].append(arrived)
                if len(by_id[data["id"]]) == clients:
                    complete[data["id"]].set()
            elif data["type"] == "live":
                live[i].set()
        if not ending:
            closes.append(f"client {i}: {ws.close_code}")

    polled: dict[str, float] = {}  # message id -> arrival through the long-poll

    async def long_poll(http, cursor: str | None) -> None:
        """The space feed as a long-polling client reads it (wait_ms), from the end of the log."""
        url = f"{bases[0]}/v0/spaces/{slug}/events"
        auth = {"Authorization": f"Bearer {token}"}
        while not ending:
            params = {"limit": "100", **({"cursor": cursor, "wait_ms": "30000"} if cursor else {})}
            async with http.get(url, params=params, headers=auth) as response:
                page = await response.json(content_type=None)
            arrived = time.perf_counter()
            for event in page.get("events", []):
                if event["kind"] == "message.created" and cursor:
                    polled.setdefault(event["data"]["message"]["id"], arrived)
            cursor = page.get("cursor", cursor)
            while page.get("has_more"):  # catch up to the end before waiting
                async with http.get(url, params={"limit": "100", "cursor": cursor}, headers=auth) as response:
                    page = await response.json(content_type=None)
                cursor = page["cursor"]

    path = f"/ws/conversations/{conversation}/?after=0"
    sent: list[tuple[str, float, float]] = []  # (message id, t0, response)
    timeouts = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as wss, \
            aiohttp.ClientSession() as http:
        sockets = [await wss.ws_connect(bases[i % len(bases)].replace("http://", "ws://") + path,
                                        headers={"Cookie": f"sessionid={session_id}"})
                   for i in range(clients)]
        tasks = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(sockets)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in live)), 30)
        poller = asyncio.create_task(long_poll(http, None))
        await asyncio.sleep(0.5)  # the poller has caught up and waits
        url = f"{bases[0]}/v0/spaces/{slug}/conversations/{conversation}/messages"
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for n in range(sends):
            body = f'{{"body": "live frame {n}: status nominal, queue drained, nothing to report"}}'
            t0 = time.perf_counter()
            async with http.post(url, data=body, headers=headers) as response:
                data = await response.json(content_type=None)
                assert response.status == 201, f"send {n}: {response.status} {data}"
            sent.append((data["message"]["id"], t0, time.perf_counter()))
            try:
                await asyncio.wait_for(complete[sent[-1][0]].wait(), FRAME_TIMEOUT)
            except (asyncio.TimeoutError, TimeoutError):
                timeouts += 1
            await asyncio.sleep(gap)
        await asyncio.sleep(1.0)  # late or duplicate frames
        ending = True
        poller.cancel()
        for ws in sockets:
            await ws.close()
        await asyncio.gather(*tasks, poller, return_exceptions=True)

    samples, by_server, first, last, missing, duplicates = [], defaultdict(list), [], [], 0, 0
    for message_id, t0, _ in sent:
        got = by_id.get(message_id, {})
        for i in range(clients):
            times = got.get(i, [])
            missing += not times
            duplicates += max(0, len(times) - 1)
            if times:
                samples.append(times[0] - t0)
                by_server["same" if i % len(bases) == 0 else "other"].append(times[0] - t0)
        if len(got) == clients:
            first.append(min(times[0] for times in got.values()) - t0)
            last.append(max(times[0] for times in got.values()) - t0)
    unknown = len(set(by_id) - {m for m, _, _ in sent})
    result = {"clients": clients, "servers": len(bases), "sends": len(sent), "expected_frames": len(sent) * clients,
              "frames": len(samples), "missing": missing, "duplicates": duplicates,
              "unknown_frames": unknown, "timeouts": timeouts, "errors": missing + duplicates + unknown + len(closes),
              "early_closes": closes,
              "frame": latency_summary(samples), "first_client": latency_summary(first),
              "last_client": latency_summary(last),
              "send_response": latency_summary([done - t0 for _, t0, done in sent]),
              "long_poll": latency_summary([polled[m] - t0 for m, t0, _ in sent if m in polled]),
              "long_poll_missing": sum(m not in polled for m, _, _ in sent)}
    if len(bases) > 1:
        result["frame_by_server"] = {k: latency_summary(v) for k, v in by_server.items()}
    return result


async def _layer_round_trip(redis_url: str | None, rounds: int, gap: float) -> dict:
    """group_send → receive on a channel in the group, another task of this process."""
    if redis_url:
        from channels_redis.core import RedisChannelLayer
        layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 30}], prefix="switchboard-bench")
    else:
        from channels.layers import InMemoryChannelLayer
        layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("bench.live", channel)
    arrivals: asyncio.Queue = asyncio.Queue()

    async def receiver() -> None:
        while True:
            message = await layer.receive(channel)
            arrivals.put_nowait((message["n"], time.perf_counter()))

    task = asyncio.create_task(receiver())
    samples = []
    try:
        for n in range(rounds + 10):  # 10 warm-up rounds
            t0 = time.perf_counter()
            await layer.group_send("bench.live", {"type": "log.advanced", "n": n, "conversations": [1], "spaces": [1]})
            got, arrived = await asyncio.wait_for(arrivals.get(), FRAME_TIMEOUT)
            assert got == n
            if n >= 10:
                samples.append(arrived - t0)
            await asyncio.sleep(gap)
    finally:
        task.cancel()
        await layer.group_discard("bench.live", channel)
        if hasattr(layer, "close_pools"):
            await layer.close_pools()
    return {"layer": type(layer).__name__, **latency_summary(samples)}


def _setup(env: dict, out_dir: Path, label: str, count: int, clients: int, members: tuple, stamp: str, *,
           sends: int, gap: float) -> dict:
    sender, reader, reader_token = members
    servers = [_serve(env, out_dir, f"{label}-{i}") for i in range(count)]
    try:
        for server in servers:
            server.__enter__()
        bases = [s.base_url for s in servers]

        async def prepare() -> tuple[str, str, str]:
            async with aiohttp.ClientSession() as http:
                slug = f"live{stamp}-{label}"
                await _api(http, bases[0], sender, "POST", "/v0/spaces",
                           {"slug": slug, "name": slug, "visibility": "open", "send_policy": "open"})
                await _api(http, bases[0], reader_token, "POST", f"/v0/spaces/{slug}/join")
                data = await _api(http, bases[0], sender, "POST", f"/v0/spaces/{slug}/channels", {"name": "live"})
            return slug, data["conversation"]["id"], await _sign_in(bases[-1], reader)

        slug, conversation, session_id = asyncio.run(prepare())
        subscribers_before = log_topic_subscribers(env.get("REDIS_URL"))
        for server in servers:
            server.memory.start()
        started = time.monotonic()
        figures = asyncio.run(_measure(bases, slug, conversation, session_id, sender, clients=clients,
                                       sends=sends, gap=gap))
        wall = time.monotonic() - started
        processes = [p for s in servers for p in s.memory.stop()]
    finally:
        for server in servers:
            server.stop()
    return {**figures, "commands": [" ".join(s.argv) for s in servers], "processes": processes,
            "server": env.get("SERVE_SERVER", "uvicorn"),
            "server_peak_rss_mib": max((p["peak_rss_mib"] for p in processes
                                        if any(name in p["cmdline"] for name in SERVER_PROCESSES)), default=None),
            "server_cpu_cores": round(sum(p["cpu_seconds"] for p in processes) / wall, 2),
            "log_topic_subscribers_before": subscribers_before, "server_logs": [s.log_summary() for s in servers]}


def run(env: dict, out_dir: Path, *, clients: int, sends: int, gap: float) -> dict:
    redis_url = env.get("REDIS_URL")
    stamp = time.strftime("%H%M%S")
    members = _members(env, stamp)
    results = {"clients": clients, "sends": sends, "gap_ms": round(gap * 1000), "setups": {},
               "layer_round_trip": asyncio.run(_layer_round_trip(redis_url, sends, gap))}
    setups = [("1proc", 1, clients), ("2proc", 2, clients), ("1proc-1client", 1, 1)]
    if not redis_url:  # without Redis another process hears of a commit only at its periodic re-check
        setups = [s for s in setups if s[1] == 1]
    layer = results["layer_round_trip"]
    for label, count, n_clients in setups:
        print(f"  live: {label} …", file=sys.stderr, flush=True)
        try:
            r = _setup(env, out_dir, label, count, n_clients, members, stamp, sends=sends, gap=gap)
        except Exception as exc:  # one broken setup must not hide the others
            results["setups"][label] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            continue
        r["ratios"] = {f"{q}_to_{name}": round(r["frame"][f"{q}_ms"] / base[f"{q}_ms"], 1)
                       for q in ("p50", "p99") for name, base in (("send", r["send_response"]), ("layer", layer))
                       if r["frame"][f"{q}_ms"] and base[f"{q}_ms"]}
        results["setups"][label] = r
    return results
