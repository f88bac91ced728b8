"""The run: start everything, drive the load and the faults, settle, count."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

import bench.chaos
from bench.chaos.checks import behind, check, feed_heads, settled
from bench.chaos.common import (CONCURRENCY, FAULTS, HEALTHCHECK_SECONDS, LEASE_SECONDS, PY, READERS, ROOT,
                               SETTLE_TIMEOUT, Api, Book)
from bench.chaos.faults import Faults, supervise
from bench.chaos.load import boot, granted, members, reader, sender, sign_in, socket, spaces, subscribe_webhooks
from bench.chaos.services import Postgres
from controlplane.cluster import Child, Proxy, Supervisor, free_port, node_command, worker_command


async def drive(args, work: Path, env: dict, people: dict, supervisor: Supervisor, nodes: list[Child],
                workers: list[Child], pg: Postgres, redis: Child, receiver: str, book: Book) -> dict:
    proxy = Proxy([("127.0.0.1", int(n.argv[n.argv.index("--bind") + 1].rsplit(":", 1)[1])) for n in nodes])
    proxy_port = free_port()
    await proxy.start("127.0.0.1", proxy_port)
    base = f"http://127.0.0.1:{proxy_port}"
    node_bases = [f"http://{n.argv[n.argv.index('--bind') + 1]}" for n in nodes]
    stop_super = asyncio.Event()
    super_task = asyncio.create_task(supervise(supervisor, stop_super))
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        api = Api(session, base, book)
        conversations = await spaces(api, people)
        await asyncio.to_thread(subscribe_webhooks, people, receiver)
        session_id = await sign_in(node_bases[0])
        stop_load, stop_sockets = asyncio.Event(), asyncio.Event()
        sockets = [asyncio.create_task(socket(f"socket@node{i}", b, session_id, conversations["#general"], book,
                                              stop_sockets)) for i, b in enumerate(node_bases)]
        stop_readers = asyncio.Event()
        readers = [asyncio.create_task(reader(api, who, people[who][1], stop_readers)) for who in READERS]
        grants = asyncio.create_task(granted(api, people, conversations, stop_load))
        counter = iter(range(10 ** 9))
        started = time.monotonic()
        faults = Faults(nodes, workers, pg, redis, book)
        stop_faults = asyncio.Event()
        faults_task = asyncio.create_task(faults.run(args.faults, args.fault_interval, stop_faults))
        senders = [asyncio.create_task(sender(api, people, conversations, counter, args.sends, faults_task))
                   for _ in range(CONCURRENCY)]
        progress = asyncio.create_task(_progress(book, args.sends))
        await asyncio.gather(*senders)
        load_seconds = time.monotonic() - started
        await faults_task  # the schedule runs to its end
        progress.cancel()
        stop_load.set()
        await grants
        print(f"  load done: {len(book.accepted)} sends in {load_seconds:.0f} s; settling", flush=True)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        heads = {}
        while True:
            try:
                done, why = await asyncio.to_thread(settled, people)
                if done:
                    heads = await feed_heads(api, people)
                    late = await asyncio.to_thread(behind, heads)
                    done, why = not late, f"{', '.join(late)} behind"
            except Exception as exc:  # the database restarting: look again
                done, why = False, repr(exc)
            if done or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        settle_seconds = SETTLE_TIMEOUT - (deadline - time.monotonic())
        print(f"  settled in {settle_seconds:.0f} s" if done
              else f"  not settled after {SETTLE_TIMEOUT:.0f} s: {why}", flush=True)
        stop_readers.set()  # each reads on until a pass finds nothing
        await asyncio.gather(*readers)
        await _sockets_caught_up(book, conversations, len(nodes))
        stop_sockets.set()
        for task in sockets:
            task.cancel()
        for ended in await asyncio.gather(*sockets, return_exceptions=True):
            if isinstance(ended, Exception):  # the client itself failed: its frames would read as lost
                print(f"  a socket client failed: {ended!r}", flush=True)
                book.refused["socket client failed"] += 1
    stop_super.set()
    await super_task
    await proxy.close()
    return {"load_seconds": round(load_seconds, 1), "settle_seconds": round(settle_seconds, 1)}, conversations, heads


async def _progress(book: Book, total: int) -> None:
    while True:
        await asyncio.sleep(10)
        print(f"  {len(book.accepted)}/{total} sends, {book.operations['acknowledgements']} acks, "
              f"{book.retries} retries", flush=True)


async def _sockets_caught_up(book: Book, conversations: dict, sockets: int, timeout: float = 60) -> None:
    from inbox.models import Message

    def last() -> int:
        from django.db import connections

        connections.close_all()
        m = Message.objects.filter(conversation__public_id=conversations["#general"]).order_by("-position").first()
        return m.position if m else 0

    head = await asyncio.to_thread(last)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(book.frames) == sockets and all(f and f[-1][0] >= head for f in book.frames.values()):
            return
        await asyncio.sleep(0.5)


def table(book: Book, counts: dict[str, Counter]) -> tuple[str, int]:
    rows = ["| | count |", "| --- | ---: |"]
    rows += [f"| fault: {kind} | {book.faults[kind]} |" for kind in FAULTS]
    rows.append(f"| faults injected | {sum(book.faults.values())} |")
    rows.append(f"| points armed and not reached (tried again) | {sum(book.faults_missed.values())} |")
    rows += [f"| {name} | {value} |" for name, value in book.operations.items()]
    rows.append(f"| client retries | {book.retries} |")
    rows.append(f"| socket reconnects | {book.reconnects} |")
    rows.append(f"| socket connections lost with an error | {sum(book.socket_errors.values())}"
                f"{' (' + ', '.join(f'{k} {v}' for k, v in book.socket_errors.items()) + ')' if book.socket_errors else ''} |")
    bad = 0
    for heading, counter in counts.items():
        total = sum(counter.values())
        bad += total
        detail = ", ".join(f"{k} {v}" for k, v in counter.items() if v)
        rows.append(f"| **{heading}** | **{total}**{' (' + detail + ')' if detail else ''} |")
    refused = sum(book.refused.values())
    bad += refused
    rows.append(f"| **refused** | **{refused}**{' (' + dict(book.refused).__repr__() + ')' if refused else ''} |")
    return "\n".join(rows), bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=bench.chaos.__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=10_000)
    parser.add_argument("--faults", type=int, default=33)  # three of each kind
    parser.add_argument("--fault-interval", type=float, default=6.0, help="mean seconds between faults")
    parser.add_argument("--out", type=Path, default=None, help="keep logs and the result here")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="leave the database running and the scratch directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10 ** 6)
    random.seed(seed)
    work = Path(tempfile.mkdtemp(prefix="switchboard-chaos-"))
    os.chmod(work, 0o755)
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    print(f"chaos: {args.sends} sends, {args.faults} faults, seed {seed}, logs in {out}", flush=True)
    pg = Postgres(work)
    supervisor = Supervisor()
    database_url = None
    try:
        database_url = pg.init()
        redis_port = free_port()
        redis = supervisor.add(Child("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                               "--save", "", "--appendonly", "no"], dict(os.environ),
                                     out / "redis.log"))
        from webhooks.example_receiver import make_ca_and_certificate

        ca, cert, key = (str(p) for p in make_ca_and_certificate(work))
        receiver_port = free_port()
        receiver_log = out / "receiver.jsonl"
        supervisor.add(Child("receiver", [PY, "-m", "bench.chaos.receiver", cert, key, str(receiver_port),
                                          str(receiver_log)], dict(os.environ), out / "receiver.log"))
        env = {"DATABASE_URL": database_url, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DEBUG": "1",
               "SERVER_ADMIN_KEY": secrets.token_urlsafe(32), "RATE_LIMIT_PER_MINUTE": "0",
               "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1", "WEBHOOK_CA_BUNDLE": ca, "LOG_LEVEL": "WARNING",
               "WEBHOOK_LEASE_SECONDS": str(LEASE_SECONDS), "SWITCHBOARD_VAR_DIR": str(work / "var"),
               "SERVE_HEALTHCHECK_SECONDS": str(HEALTHCHECK_SECONDS)}
        child_env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"} | env
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=child_env, check=True)
        boot(env)
        people = members()
        nodes, workers = [], []
        for name, argv in [(f"node{i}", node_command(free_port())) for i in range(2)] + \
                          [(f"worker{i}", worker_command()) for i in range(2)]:
            faults_dir = work / "faults" / name
            faults_dir.mkdir(parents=True)
            child = supervisor.add(Child(name, argv, {**child_env, "SWITCHBOARD_FAULTS": str(faults_dir)},
                                         out / f"{name}.log"))
            (nodes if name.startswith("node") else workers).append(child)
        _wait_ready([f"http://{n.argv[n.argv.index('--bind') + 1]}" for n in nodes])
        book = Book()
        figures, conversations, heads = asyncio.run(drive(args, work, env, people, supervisor, nodes, workers, pg,
                                                          redis, f"https://127.0.0.1:{receiver_port}", book))
        counts = check(book, people, conversations, receiver_log, heads)
        text, bad = table(book, counts)
        print(text)
        (out / "result.md").write_text(f"seed {seed}, {figures}\n\n{text}\n")
        (out / "result.json").write_text(json.dumps({"seed": seed, **figures, "faults": book.faults,
                                                     "operations": book.operations,
                                                     **{k: v for k, v in counts.items()}}, indent=1))
        return 1 if bad else 0
    finally:
        supervisor.stop()
        if args.out and pg.log.exists():
            shutil.copy(pg.log, args.out / "postgres.log")
        if args.keep:
            print(f"kept: PostgreSQL at {database_url}, data in {work}")
        else:
            pg.stop()
            shutil.rmtree(work, ignore_errors=True)


def _wait_ready(bases: list[str], timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    for base in bases:
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{base} did not become ready")
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
