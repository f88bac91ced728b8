"""Throughput under concurrency.

- `insert_baseline`: one-row INSERT transactions/s straight into PostgreSQL
  with psycopg 3 (autocommit off, one row and one COMMIT per transaction,
  fsync as configured), N clients as N threads with one connection each.
  This is the ceiling a send can never beat, measured in the same run.
- `pgbench_baseline`: the same INSERT from PostgreSQL's own C client, when
  `pgbench` is installed: how much of the psycopg figure is client overhead.
- `send_load`: sends/s through `POST /v0/spaces/{slug}/conversations/%23general/messages`
  with N concurrent aiohttp clients, each with its own credential and
  keep-alive connection; latency p50/p99 and errors of the requests that
  complete inside the measured window (after a warm-up).
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections import Counter

import aiohttp
import psycopg

BASELINE_TABLE = "bench_insert_baseline"
PAYLOAD = "x" * 100


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def latency_summary(seconds: list[float]) -> dict:
    values = sorted(seconds)
    ms = lambda v: round(v * 1000, 2) if v is not None else None  # noqa: E731
    return {"count": len(values), "p50_ms": ms(percentile(values, 0.50)), "p90_ms": ms(percentile(values, 0.90)),
            "p99_ms": ms(percentile(values, 0.99)), "max_ms": ms(values[-1] if values else None)}


# --- the database baseline ------------------------------------------------------

def prepare_baseline_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {BASELINE_TABLE} (id bigserial PRIMARY KEY, "
                     "payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")


def insert_baseline(dsn: str, clients: int, seconds: float) -> dict:
    prepare_baseline_table(dsn)
    conns = [psycopg.connect(dsn) for _ in range(clients)]  # autocommit off: BEGIN … INSERT … COMMIT
    counts = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(i: int) -> None:
        conn, lat = conns[i], latencies[i]
        cursor = conn.cursor()
        start.wait()
        while (t0 := time.perf_counter()) < deadline[0]:
            cursor.execute(f"INSERT INTO {BASELINE_TABLE} (payload) VALUES (%s)", (PAYLOAD,))
            conn.commit()
            lat.append(time.perf_counter() - t0)
            counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.wait()
    for t in threads:
        t.join(timeout=seconds + 30)
    elapsed = time.perf_counter() - began
    for conn in conns:
        conn.close()
    return {"clients": clients, "seconds": round(elapsed, 2), "transactions": sum(counts),
            "tx_per_s": round(sum(counts) / elapsed, 1),
            **latency_summary([v for lat in latencies for v in lat])}


def pgbench_baseline(dbname: str, clients: int, seconds: float, script_path) -> dict | None:
    """The same one-row INSERT with pgbench (autocommit: one statement per
    transaction); None when pgbench is not installed."""
    pgbench = shutil.which("pgbench")
    if not pgbench:
        return None
    prepare_baseline_table(f"postgresql://postgres@127.0.0.1:5432/{dbname}")
    script_path.write_text(f"INSERT INTO {BASELINE_TABLE} (payload) VALUES (repeat('x', 100));\n")
    argv = [pgbench, "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-n", "-c", str(clients),
            "-j", str(min(clients, 2)), "-T", str(max(1, round(seconds))), "-f", str(script_path), dbname]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    match = re.search(r"tps = ([\d.]+)", done.stdout)
    if done.returncode != 0 or not match:
        return {"clients": clients, "error": (done.stderr or done.stdout)[-500:]}
    return {"clients": clients, "tx_per_s": round(float(match.group(1)), 1), "command": " ".join(argv)}


# --- sends through the API ----------------------------------------------------------

def message_body(client: int, n: int, handles: list[str]) -> str:
    """About 100 bytes; every fourth message mentions the next member, so
    recipient and addressee rows are written like real traffic."""
    text = f"bench message {n} from client {client}: status nominal, queue drained, nothing to report"
    if n % 4 == 0:
        text += f" @{handles[(client + 1) % len(handles)]}"
    return text[:120]


async def send_load(base_url: str, slug: str, tokens: list[str], handles: list[str], *, clients: int,
                    warmup: float, seconds: float, run_id: str, idempotency_keys: bool = True) -> dict:
    url = f"{base_url}/v0/spaces/{slug}/conversations/%23general/messages"

    def request(i: int, n: int) -> tuple[str, str, dict, str]:
        headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}", "Content-Type": "application/json"}
        if idempotency_keys:
            headers["Idempotency-Key"] = f"bench-{run_id}-{i}-{n}"
        return "POST", url, headers, json.dumps({"body": message_body(i, n, handles)})

    result = await request_load(request, clients=clients, warmup=warmup, seconds=seconds, ok="201")
    return {**result, "idempotency_keys": idempotency_keys}


async def request_load(request, *, clients: int, warmup: float, seconds: float, ok: str) -> dict:
    """`clients` concurrent aiohttp clients on keep-alive connections, each
    sending one request at a time, `request(client, n)` → (method, url,
    headers, body), for `warmup + seconds`. Counted: the requests that
    complete inside the measured window; `ok` is the success status."""
    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
    timeout = aiohttp.ClientTimeout(total=30)
    latencies: list[float] = []
    statuses: Counter = Counter()
    error_samples: dict[str, str] = {}
    attempted = [0]

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup
        measure_to = measure_from + seconds

        async def client(i: int) -> None:
            n = 0
            while loop.time() < measure_to:
                n += 1
                method, url, headers, payload = request(i, n)
                began = loop.time()
                try:
                    async with session.request(method, url, data=payload, headers=headers) as response:
                        text = await response.text()
                        status = str(response.status)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    text, status = repr(exc), type(exc).__name__
                ended = loop.time()
                if measure_from <= ended <= measure_to:
                    attempted[0] += 1
                    statuses[status] += 1
                    if status == ok:
                        latencies.append(ended - began)
                    else:
                        error_samples.setdefault(status, text[:500])

        await asyncio.gather(*(client(i) for i in range(clients)))

    done = statuses.get(ok, 0)
    return {"clients": clients, "seconds": seconds, "warmup_seconds": warmup, "requests": attempted[0], "sends": done,
            "sends_per_s": round(done / seconds, 1), "errors": attempted[0] - done, "statuses": dict(statuses),
            "error_samples": error_samples, **latency_summary(latencies)}


async def idle_polls(base_url: str, slug: str, token: str, count: int, ready: asyncio.Event,
                     stop: asyncio.Event) -> dict:
    """`count` long-polls (`wait_ms` 30 s) on the feed of space `slug`, where
    nothing is sent: each catches up, then waits, and polls again when it is
    answered, until `stop`. `ready` is set once every one is waiting. A
    server that re-read every waiting feed on every commit anywhere pays for
    them on each send."""
    url, headers = f"{base_url}/v0/spaces/{slug}/events", {"Authorization": f"Bearer {token}"}
    waiting, answered = [0], [0]
    connector = aiohttp.TCPConnector(limit=count, limit_per_host=count)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def poll() -> None:
            cursor, caught_up = None, False
            while not stop.is_set():
                params = {"cursor": cursor} if cursor else {}
                if caught_up:
                    params["wait_ms"] = "30000"
                async with session.get(url, params=params, headers=headers) as response:
                    assert response.status == 200, f"{response.status} {await response.text()}"
                    page = await response.json()
                cursor = page["cursor"]
                if caught_up:
                    answered[0] += 1
                elif not page["has_more"]:
                    caught_up, waiting[0] = True, waiting[0] + 1
                    if waiting[0] == count:
                        asyncio.get_running_loop().call_later(3.0, ready.set)  # their waiting reads done

        tasks = [asyncio.create_task(poll()) for _ in range(count)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        failed = [r for r in await asyncio.gather(*tasks, return_exceptions=True)
                  if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    if failed:
        raise failed[0]
    return {"idle_polls": count, "answered_during_load": answered[0]}


async def send_load_with_idle_polls(base_url: str, slug: str, tokens: list[str], handles: list[str], *,
                                    idle_polls_in: str, idle: int, **send_args) -> dict:
    """`send_load`, with `idle` long-polls waiting on a quiet space's feed throughout."""
    if not idle:
        return await send_load(base_url, slug, tokens, handles, **send_args)
    ready, stop = asyncio.Event(), asyncio.Event()
    polls = asyncio.create_task(idle_polls(base_url, idle_polls_in, tokens[0], idle, ready, stop))
    await asyncio.wait([polls, asyncio.ensure_future(ready.wait())], return_when=asyncio.FIRST_COMPLETED, timeout=120)
    if polls.done():
        polls.result()  # raises what stopped them
    try:
        figures = await send_load(base_url, slug, tokens, handles, **send_args)
    finally:
        stop.set()
    return {**figures, **await polls}
