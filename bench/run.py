"""Switchboard benchmark harness: `make bench` or `.venv/bin/python bench/run.py [flags]`.

One run, every figure beside its baseline from the same run:

1. baseline: one-row INSERT transactions/s into the same PostgreSQL database
   (psycopg 3, autocommit off), 1 and --clients clients; pgbench if installed.
2. feeds: space and inbox feed page latency (limit 100) with 1,000 and with
   1,000,000 events in the log, and the ratio 1M / 1k (target <= 1.3).
3. inbox: read_inbox page time for members with 10, 10,000 and 1,000,000
   pending items (ratios, target <= 1.3), and acknowledge_delivery/s with
   --clients concurrent aiohttp clients beside the insert baseline.
4. sends: sends/s, p50/p99 latency, errors, peak resident memory and CPU per
   server setup (bench/servers.py: what `serve` starts, Daphne, uvicorn,
   granian, gunicorn), through the HTTP API with --clients concurrent aiohttp
   clients; growth: the same through `serve` with 1, 4, 16 and 64 clients on
   a log of 1M and of 1k events; peer: matrix-synapse with the same client
   (bench/peer.py).
5. live: send → WebSocket frame latency (p50/p99) with --live-clients sockets
   on one conversation, beside the send's own round trip and a raw
   channel-layer round trip (bench/live.py).
6. mentions: mention parsing of the costliest 8 KiB bodies beside ordinary
   prose, and its growth from 2 to 8 KiB (bench/mentions.py).
7. mcp: send → MCP `events/stream` event latency beside send → WebSocket
   frame on the same server, and pushed inbox items/s over 100 `inbox.item`
   subscriptions beside raw signed POSTs/s to the same receiver (bench/mcp.py,
   bench/push.py).
8. tasks: the claim sweep's time per scan over 1,000 and over 100,000 claimed
   tasks (bench/tasks.py).
9. statements: CPU per send, live pass and acknowledgement, in this process
   and its PostgreSQL backend, with prepared statements and with client-side
   binding, in alternating blocks on one connection (bench/statements.py).

It creates the database `switchboard_bench` from scratch (dropped at the end
unless --keep), migrates it, starts every server as a subprocess on a free
127.0.0.1 port, writes bench/results/<stamp>/results.json (plus each server's
stderr) and prints Markdown tables. See bench/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ itself is first on sys.path, where bench/mcp.py
# would shadow the `mcp` SDK: the project root takes its place.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, ROOT / "bench")]

import psycopg  # noqa: E402
import redis  # noqa: E402

from bench import feeds, fixture, inbox, live, load, mcp, mentions, peer, statements, tasks, webhooks  # noqa: E402
from bench.report import ADMIN_KEY, log_topic_subscribers, markdown  # noqa: E402
from bench.servers import PY, SETUPS, Server  # noqa: E402

DB_NAME = "switchboard_bench"
PG = "postgresql://postgres@127.0.0.1:5432"
DSN = f"{PG}/{DB_NAME}"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# growth runs before the webhook and MCP phases, whose subscriptions every later send would wake.
PHASES = ("baseline", "feeds", "inbox", "sends", "growth", "peer", "webhooks", "live", "mentions", "mcp", "tasks",
          "statements")
GROWTH_CLIENTS = (1, 4, 16, 64)
GROWTH_LOGS = {"1M": 1_000_000, "1k": 1_000}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per send setup (default 8)")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds before each send measurement")
    p.add_argument("--baseline-seconds", type=float, default=5.0, help="seconds per insert baseline (default 5)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--idle-polls", type=int, default=0,
                   help="long-polls waiting on a quiet space's feed during the send benchmark (default 0)")
    p.add_argument("--profile-sends", action="store_true",
                   help="record each send setup with py-spy (collapsed stacks and a flame graph beside the results)")
    p.add_argument("--only", action="append", choices=PHASES, help="run only this phase (repeatable)")
    p.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS), metavar="SETUP",
                   help="server setups for the send benchmark (default: all)")
    p.add_argument("--feed-server", choices=list(SETUPS), default="serve",
                   help="server that answers the feed and inbox benchmarks (default serve; see README)")
    p.add_argument("--feed-events", type=int, default=1_000_000, help="events in the big log (default 1,000,000)")
    p.add_argument("--feed-requests", type=int, default=200, help="sequential requests per feed and stage")
    p.add_argument("--inbox-items", type=int, default=1_000_000,
                   help="pending items of the biggest inbox (default 1,000,000)")
    p.add_argument("--ack-seconds", type=float, default=5.0, help="measured seconds of acknowledgements (default 5)")
    p.add_argument("--no-idempotency-key", action="store_true", help="send without an Idempotency-Key header")
    p.add_argument("--no-redis", action="store_true", help="run the servers without REDIS_URL")
    p.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                   help=f"REDIS_URL for the servers (default {DEFAULT_REDIS_URL})")
    p.add_argument("--webhook-workers", type=int, default=2,
                   help="delivery worker processes for the wakes/s figure (default 2)")
    p.add_argument("--webhook-sends", type=int, default=100,
                   help="sends, one at a time, for the send-to-receipt latency (default 100)")
    p.add_argument("--live-clients", type=int, default=50,
                   help="WebSocket clients on one conversation for the live phase (default 50)")
    p.add_argument("--live-sends", type=int, default=200,
                   help="sends, one at a time, for the send-to-frame latency (default 200)")
    p.add_argument("--live-gap", type=float, default=0.02,
                   help="seconds between one send's last frame and the next send (default 0.02)")
    p.add_argument("--mcp-sends", type=int, default=200,
                   help="sends, one at a time, for the send-to-stream-event latency and its baseline (default 200)")
    p.add_argument("--mcp-items", type=int, default=20,
                   help="pending items per pushed inbox.item subscription (100 subscriptions; default 20)")
    p.add_argument("--mcp-heavy-polls", type=int, default=0,
                   help="measure the stream again beside this many concurrent large polls of another agent "
                        "(default 0: not measured)")
    p.add_argument("--mcp-profile", action="store_true",
                   help="profile the push workers' database threads (bench/results/<stamp>/mcp-worker-*.prof)")
    p.add_argument("--keep", action="store_true", help=f"keep the {DB_NAME} database afterwards")
    args = p.parse_args(argv)
    args.phases = [ph for ph in PHASES if not args.only or ph in args.only]
    if args.idle_polls < 0:
        p.error("--idle-polls must not be negative")
    if args.clients < 1 or args.seconds <= 0 or args.ack_seconds <= 0 or not 0 < args.feed_requests <= 4000:
        p.error("--clients, --seconds and --ack-seconds must be positive; --feed-requests 1..4000")
    if args.live_clients < 1 or args.live_sends < 1 or args.live_gap < 0:
        p.error("--live-clients and --live-sends must be positive, --live-gap not negative")
    if not 1 <= args.mcp_sends <= 2000 or not 1 <= args.mcp_items <= 100 or args.webhook_workers < 1:
        p.error("--mcp-sends 1..2000, --mcp-items 1..100, --webhook-workers positive")
    if not 0 <= args.mcp_heavy_polls <= 64:
        p.error("--mcp-heavy-polls 0..64")
    if not 10_000 <= args.inbox_items <= 10_000_000:
        p.error("--inbox-items 10,000..10,000,000")
    return args


# Every request is counted against its member's rate limit, and every
# socket and waiting long-poll against its member's places, as in a
# deployment, with limits no phase reaches (idle long-polls are one member's).
RATE_LIMIT = "100000000"
WAITS_PER_MEMBER = "100000"


def server_env(args) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update({"DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}", "SERVER_ADMIN_KEY": ADMIN_KEY,
                "DEBUG": "0", "RATE_LIMIT_PER_MINUTE": RATE_LIMIT,
                "WAITS_PER_MEMBER": WAITS_PER_MEMBER, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"})
    if not args.no_redis:
        env["REDIS_URL"] = args.redis_url
    return env


def redis_up(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def recreate_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")


def clear_redis(url: str) -> int:
    """Forget what earlier runs left in Redis under the servers' namespace:
    rate-limit and verification counts and remembered lookups keyed by ids
    that the recreated database hands out again (a run's 100 subscriptions
    ran into an earlier run's hourly verification limit). Returns how many
    keys went."""
    from controlplane.keys import redis_namespace

    with redis.Redis.from_url(url, socket_timeout=10) as client:
        keys = list(client.scan_iter(match=f"*{redis_namespace(ADMIN_KEY)}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start:start + 1000])
    return len(keys)


def drop_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def machine_facts() -> dict:
    def first(path: str, prefix: str) -> str:
        try:
            with open(path) as f:
                return next((line.split(":", 1)[1].strip() for line in f if line.startswith(prefix)), "?")
        except OSError:
            return "?"

    with psycopg.connect(f"{PG}/postgres") as conn:
        pg_version = conn.execute("SELECT version()").fetchone()[0]
        pg_settings = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                        "('fsync', 'synchronous_commit', 'shared_buffers', 'max_connections')"))
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True)
    django_version = subprocess.run([PY, "-c", "import django; print(django.get_version())"],
                                    capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "mem_total": first("/proc/meminfo", "MemTotal"),
            "cpu_model": first("/proc/cpuinfo", "model name"), "kernel": platform.release(),
            "postgresql": pg_version, "postgresql_settings": pg_settings,
            "python": platform.python_version(), "django": django_version,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "git_commit": git.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")}


# --- phases -------------------------------------------------------------------------

def run_baseline(args, out_dir: Path) -> dict:
    result = {"psycopg": [load.insert_baseline(DSN, n, args.baseline_seconds) for n in sorted({1, args.clients})]}
    result["pgbench"] = load.pgbench_baseline(DB_NAME, args.clients, args.baseline_seconds,
                                              out_dir / "pgbench-insert.sql")
    return result


def run_feeds(args, env, fx, out_dir: Path) -> dict:
    with Server(args.feed_server, env, out_dir, "feeds") as server:
        asyncio.run(fixture.ensure_spaces(server.base_url, fx))
        result = asyncio.run(feeds.run(server.base_url, DSN, fx, requests=args.feed_requests,
                                       total_events=args.feed_events))
    result["server"] = args.feed_server
    result["server_log"] = server.log_summary()
    return result


def run_inbox(args, env, out_dir: Path, baseline: dict | None) -> dict:
    with Server(args.feed_server, env, out_dir, "inbox") as server:
        result = inbox.run(server.base_url, DSN, requests=args.feed_requests, largest=args.inbox_items,
                           clients=args.clients, warmup=args.warmup, seconds=args.ack_seconds)
    if not baseline or "psycopg" not in baseline:  # the baseline phase did not run: a quick one
        result["insert_baseline"] = load.insert_baseline(DSN, args.clients, 2.0)
    result["server"] = args.feed_server
    result["server_log"] = server.log_summary()
    return result


def busy_jiffies() -> int:
    """CPU time the whole machine has spent busy (every core, every process:
    the servers, PostgreSQL, Redis and this client), in clock ticks."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


def profile_start(server: Server, path: Path, seconds: float) -> subprocess.Popen:
    """py-spy over the server's process tree for `seconds`: collapsed stacks
    (one line per stack and its sample count, the input of any flame graph
    tool) at `path`; `bench/profile.py` summarizes them."""
    return subprocess.Popen([str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--pid", str(server.proc.pid),
                             "--subprocesses", "--nonblocking", "--gil", "--rate", "250", "--duration", str(max(1, round(seconds))),
                             "--format", "raw", "--output", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_sends(args, env, fx, out_dir: Path, run_id: str) -> dict:
    results = {}
    senders = fx.members[: args.clients]
    for name in args.setups:
        print(f"  sends: {name} …", file=sys.stderr, flush=True)
        try:
            with Server(name, env, out_dir, "sends") as server:
                asyncio.run(fixture.ensure_spaces(server.base_url, fx))
                subscribers_before = None if args.no_redis else log_topic_subscribers(args.redis_url)
                server.memory.start()
                profiler = profile_start(server, out_dir / f"sends-{name}.collapsed",
                                         args.warmup + args.seconds) if args.profile_sends else None
                client_cpu, machine_busy = time.process_time(), busy_jiffies()
                try:
                    figures = asyncio.run(load.send_load_with_idle_polls(
                        server.base_url, fixture.SEND_SPACE, [m.token for m in senders], [m.handle for m in fx.members],
                        idle_polls_in=fixture.FEED_SMALL, idle=args.idle_polls,
                        clients=args.clients, warmup=args.warmup, seconds=args.seconds,
                        run_id=f"{run_id}-{name}", idempotency_keys=not args.no_idempotency_key))
                finally:
                    processes = server.memory.stop()
                    client_cpu = time.process_time() - client_cpu
                    machine_busy = busy_jiffies() - machine_busy
                    if profiler:
                        profiler.wait(timeout=60)
            window = args.warmup + args.seconds
            results[name] = {**figures, "command": " ".join(server.argv), "startup_seconds": server.startup_seconds,
                             "processes": processes, "server_log": server.log_summary(),
                             "server_cpu_cores": round(sum(p["cpu_seconds"] for p in processes) / window, 2),
                             "client_cpu_cores": round(client_cpu / window, 2),
                             "machine_cpu_cores": round(machine_busy / os.sysconf("SC_CLK_TCK") / window, 2),
                             "log_topic_subscribers": {"before": subscribers_before, "after": None if args.no_redis
                                                       else log_topic_subscribers(args.redis_url)}}
        except Exception as exc:  # one broken setup must not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return results


def fill_log(events: int) -> int:
    """Empty the event log, then fill it with `events` events of no space
    (nothing reads them; they are the log a send appends to)."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '600s'")
        conn.execute("TRUNCATE controlplane_eventaddressee, controlplane_event")
        head = conn.execute("SELECT position FROM controlplane_loghead WHERE id = 1").fetchone()[0]
        conn.execute("INSERT INTO controlplane_event (position, kind, restricted, data, created_at) "
                     "SELECT %s + g, 'bench.filler', false, '{}'::jsonb, now() FROM generate_series(1, %s) g",
                     (head, events))
        conn.execute("UPDATE controlplane_loghead SET position = %s WHERE id = 1", (head + events,))
        conn.execute("VACUUM (ANALYZE) controlplane_event")
        conn.execute("CHECKPOINT")
        return conn.execute("SELECT count(*) FROM controlplane_event").fetchone()[0]


def run_growth(args, env, fx, out_dir: Path, run_id: str) -> dict:
    """Sends/s through `serve` with 1, 4, 16 and 64 clients (the 64 share the
    --clients senders), with a log of 1M and of 1k events."""
    stages = {}
    for stage, events in GROWTH_LOGS.items():
        in_log = fill_log(events)
        with Server("serve", env, out_dir, f"growth-{stage}") as server:
            asyncio.run(fixture.ensure_spaces(server.base_url, fx))
            rows = {}
            for clients in GROWTH_CLIENTS:
                print(f"  growth: {stage} log, {clients} clients …", file=sys.stderr, flush=True)
                rows[str(clients)] = asyncio.run(load.send_load(
                    server.base_url, fixture.SEND_SPACE, [m.token for m in fx.members[: args.clients]],
                    [m.handle for m in fx.members], clients=clients, warmup=args.warmup, seconds=args.seconds,
                    run_id=f"{run_id}-growth-{stage}-{clients}", idempotency_keys=not args.no_idempotency_key))
        stages[stage] = {"events_in_log": in_log, "sends": rows, "server_log": server.log_summary()}
    return stages


def main(argv=None) -> int:
    args = parse_args(argv)
    # Turn SIGTERM (e.g. from `timeout`) into SystemExit, so servers are stopped
    # and the database dropped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = ROOT / "bench" / "results" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_redis and not redis_up(args.redis_url):
        print(f"Redis is not answering at {args.redis_url}; start it or pass --no-redis.", file=sys.stderr)
        return 2
    env = server_env(args)
    started = time.monotonic()
    report = {"stamp": stamp, "machine": machine_facts(), "results": {},
              "config": {"seconds": args.seconds, "warmup": args.warmup, "baseline_seconds": args.baseline_seconds,
                         "clients": args.clients, "phases": args.phases, "setups": args.setups,
                         "feed_server": args.feed_server, "feed_events": args.feed_events,
                         "feed_requests": args.feed_requests, "inbox_items": args.inbox_items,
                         "ack_seconds": args.ack_seconds, "webhook_workers": args.webhook_workers,
                         "webhook_sends": args.webhook_sends, "live_clients": args.live_clients,
                         "live_sends": args.live_sends, "live_gap": args.live_gap,
                         "mcp_sends": args.mcp_sends, "mcp_items": args.mcp_items,
                         "mcp_heavy_polls": args.mcp_heavy_polls,
                         "redis": None if args.no_redis else args.redis_url,
                         "idempotency_keys": not args.no_idempotency_key, "database": DB_NAME,
                         "argv": sys.argv[1:]},
              "results_file": str((out_dir / "results.json").relative_to(ROOT))}
    results = report["results"]
    failed = False
    recreate_database()
    if not args.no_redis:
        clear_redis(args.redis_url)
    try:
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True, timeout=300)
        fixture.boot_django(env)
        fx = fixture.create_members(max(args.clients, 5))
        for phase in args.phases:
            print(f"{phase} …", file=sys.stderr, flush=True)
            phase_started = time.monotonic()
            try:
                if phase == "baseline":
                    results[phase] = run_baseline(args, out_dir)
                elif phase == "feeds":
                    results[phase] = run_feeds(args, env, fx, out_dir)
                elif phase == "inbox":
                    results[phase] = run_inbox(args, env, out_dir, results.get("baseline"))
                elif phase == "webhooks":
                    results[phase] = webhooks.run(env, out_dir, seconds=args.seconds, workers=args.webhook_workers,
                                                  latency_sends=args.webhook_sends)
                elif phase == "mentions":
                    results[phase] = mentions.run()
                elif phase == "tasks":
                    results[phase] = tasks.run(DSN)
                elif phase == "statements":
                    results[phase] = statements.run()
                elif phase == "mcp":
                    results[phase] = mcp.run(env, DSN, out_dir, sends=args.mcp_sends, gap=args.live_gap,
                                             items=args.mcp_items, workers=args.webhook_workers,
                                             seconds=args.seconds, profile=args.mcp_profile,
                                             heavy_polls=args.mcp_heavy_polls)
                elif phase == "peer":
                    results[phase] = peer.run(f"{PG}/postgres", out_dir, clients=args.clients, warmup=args.warmup,
                                              seconds=args.seconds)
                elif phase == "growth":
                    results[phase] = run_growth(args, env, fx, out_dir, stamp)
                elif phase == "live":
                    results[phase] = live.run(env, out_dir, clients=args.live_clients, sends=args.live_sends,
                                              gap=args.live_gap)
                else:
                    results[phase] = run_sends(args, env, fx, out_dir, stamp)
            except Exception as exc:
                failed = True
                results[phase] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                print(results[phase]["traceback"], file=sys.stderr)
            report.setdefault("phase_seconds", {})[phase] = round(time.monotonic() - phase_started, 1)
    finally:
        fixture.shutdown_django()
        if not args.keep:
            drop_database()
    report["total_seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    (out_dir / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(markdown(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
