"""Pushed `inbox.item` items/s beside raw signed POSTs/s (bench/mcp.py's
second figure).

PUSH_SUBSCRIPTIONS agent members, each with `items` pending items
(bulk-loaded as in bench/inbox.py) and an `inbox.item` subscription
(webhooks.mcp.subscribe, in this process: the receiver answers the
verification challenge) to the local HTTPS receiver of the webhook phase
(bench/receiver.py, its own process, a throwaway CA); `workers` worker processes
run the delivery engine (webhooks.pump) from a go signal; items/s is the
items received over the time from the go signal to the last receipt,
and warm items/s the same from the moment every subscription has had its
first item (the workers' connections to the receiver open, as a running
worker's are) to the last. Each 2xx acknowledges its item and only then is the subscription's
next item offered, so each subscription is sequential. Baseline in the
same run: raw signed POSTs/s to the same receiver, half just before the
pushes and half just after (bench/webhooks.py, `raw_around`). Then the
same pushes through `serve`'s worker cluster, as a deployment with Redis
sends them: the timer, and the helper run it asks for
(`_push_through_cluster`).

The engine's kicks (django-q2 tasks queued after each commit, for a
cluster that this phase does not run) go to a queue of the bench's own
(KICK_QUEUE, same Redis, same cost), deleted at the end, so no stale tasks
are left for the next `serve`.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import redis

from bench import inbox
from bench.servers import PY, ROOT
from bench.webhooks import (_reset, _stats, _wait_for_receipts, finished_runs, https_receiver, raw_around,
                            worker_cluster)

ITEM = "org.switchboard/inbox.item"  # the MCP event pushed here, and streamed in bench/mcp.py
PUSH_SUBSCRIPTIONS = 100
KICK_QUEUE = "switchboard-bench-mcp"  # django-q2 cluster (queue) name for the engine's kicks
PUSH_TIMEOUT = 120.0

# A worker: the delivery timer (one run, as in `serve`) from the go file to
# the stop file. Every call on the engine's database thread is timed
# (written to go.calls.<pid> as [name, start (epoch s), seconds] rows) and,
# with BENCH_MCP_PROFILE=<path prefix>, profiled (<prefix>-<pid>.prof).
WORKER_SCRIPT = """
import asyncio, cProfile, json, os, threading, time
from django.conf import settings
from django_q.conf import Conf
from controlplane import live, processes
from webhooks import engine, pump
from webhooks.models import Delivery
Conf.CLUSTER_NAME = {queue!r}
settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True  # the receiver is on loopback; the env flag needs DEBUG=1
go, profile = os.environ["BENCH_MCP_GO"], os.environ.get("BENCH_MCP_PROFILE")
profiler, calls = cProfile.Profile() if profile else None, []
def timed(fn, *args):
    started, wall = time.perf_counter(), time.time()
    try:
        return profiler.runcall(fn, *args) if profiler else fn(*args)
    finally:
        calls.append((fn.__name__, wall, time.perf_counter() - started))
pump._Database.__call__ = lambda self, fn, *args: asyncio.get_running_loop().run_in_executor(
    self._executor, timed, fn, *args)
sends, send = [], pump._send
def counted(transport, signer, job):
    sends.append((job.subscription_id, time.time()))
    return send(transport, signer, job)
pump._send = counted
Delivery.objects.exists()  # connected before the go
live.shared_layer()  # the channel layer's modules loaded (110 ms) before the go, as in a worker that has run before
open(go + ".ready." + str(os.getpid()), "w").close()
deadline = time.monotonic() + {timeout}
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
stop = processes.share_stop_with_forks()
def watch():
    while not os.path.exists(go + ".stop") and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
threading.Thread(target=watch, daemon=True).start()
asyncio.run(pump.run(seconds={timeout}, wait=True))
with open(go + ".calls." + str(os.getpid()), "w") as f:
    json.dump(calls, f)
with open(go + ".sends." + str(os.getpid()), "w") as f:
    json.dump(sends, f)
if profiler:
    profiler.dump_stats(profile + "-" + str(os.getpid()) + ".prof")
"""


@contextlib.contextmanager
def _kicks_to_bench_queue():
    """This process's django-q2 kicks go to KICK_QUEUE while inside."""
    from django_q.conf import Conf

    saved, Conf.CLUSTER_NAME = Conf.CLUSTER_NAME, KICK_QUEUE
    try:
        yield
    finally:
        Conf.CLUSTER_NAME = saved


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle, iowait


def _db_thread(calls: list, start: float, end: float) -> dict:
    """Seconds each kind of call kept a worker's database thread busy within [start, end]."""
    busy = Counter()
    for name, at, seconds in calls:
        busy[name] += max(0.0, min(at + seconds, end) - max(at, start))
    total = sum(busy.values())
    return {"busy_share": round(total / max(end - start, 1e-6), 2),
            "seconds": {k: round(v, 3) for k, v in busy.most_common()},
            "calls": dict(Counter(name for name, at, _ in calls if start <= at <= end))}


def warm_window(received: list[tuple[str, str, float]], started: float) -> tuple[float, int]:
    """(when every subscription had had its first item, how many items came
    after that moment), from the receiver's (webhook id, subscription id,
    time) receipts: the pushes of workers whose connections are all open, as
    a running worker's are. An item received twice counts at its first
    receipt."""
    first_of_item: dict[str, float] = {}
    first_of_subscription: dict[str, float] = {}
    for item, subscription, at in received:
        first_of_item[item] = min(at, first_of_item.get(item, at))
        first_of_subscription[subscription] = min(at, first_of_subscription.get(subscription, at))
    warm_from = max(first_of_subscription.values(), default=started)
    return warm_from, sum(at > warm_from for at in first_of_item.values())


def warm_rate(warm_from: float, warm_items: int, *, items: int, last: float) -> float | None:
    """Warm items/s, or None where fewer than half the items came after the
    window opened (too few a subscription for the run to warm up)."""
    if warm_items < items / 2:
        return None
    return round(warm_items / max(last - warm_from, 1e-6), 1)


def _receipts(received: list, started: float, expected: int, prefix: str) -> dict:
    """The figures of a push run from the receiver's receipts (webhook id,
    subscription id, time) and its go signal's time `started`: items
    unique and duplicated, items/s from the go signal and warm
    (`warm_window`), and the agents' items left pending."""
    from inbox.models import InboxItem

    first_at: dict[str, float] = {}
    for delivery_id, _, at in received:
        first_at[delivery_id] = min(at, first_at.get(delivery_id, at))
    last = max(first_at.values(), default=started)
    seconds = max(last - started, 1e-6)
    warm_from, warm_items = warm_window(received, started)
    return {"items": expected, "received": len(received), "unique": len(first_at),
            "duplicates": len(received) - len(first_at), "last": last,
            "seconds": round(seconds, 3), "items_per_s": round(len(first_at) / seconds, 1),
            "first_receipt_s": round(min(first_at.values(), default=started) - started, 3),
            "warm_from_s": round(warm_from - started, 3), "warm_items": warm_items,
            "warm_items_per_s": warm_rate(warm_from, warm_items, items=expected, last=last),
            "pending_left": InboxItem.objects.filter(member__handle__startswith=prefix,
                                                     state=InboxItem.State.PENDING).count()}


def _push_inboxes(dsn: str, base: str, items: int) -> tuple:
    """PUSH_SUBSCRIPTIONS new agents with `items` pending items each and an
    `inbox.item` subscription to the receiver at `base`: (their handles'
    prefix, the subscriptions, the load's figures, seconds to subscribe)."""
    from controlplane.models import Member
    from webhooks import mcp as pushes
    from webhooks.models import Subscription

    prefix = f"push{time.strftime('%H%M%S')}"
    members = [inbox.create_member(f"{prefix}{n:03d}") for n in range(PUSH_SUBSCRIPTIONS)]
    loaded = inbox.load_items(dsn, {m.pk: items for m in members})
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    started = time.monotonic()
    with _kicks_to_bench_queue():
        for n, m in enumerate(members):
            pushes.subscribe(Member.objects.get(pk=m.pk), ITEM, {}, f"{base}/hook/{n}", secret, ttl_ms=None)
    subscriptions = Subscription.objects.filter(owner__handle__startswith=prefix, mcp_name=ITEM)
    assert subscriptions.filter(status=Subscription.Status.ACTIVE).count() == PUSH_SUBSCRIPTIONS
    return prefix, subscriptions, loaded, time.monotonic() - started


def _push(env: dict, dsn: str, out_dir: Path, base: str, ca: str, *, items: int, workers: int,
          profile: bool) -> dict:
    from django.db.models import Count

    from webhooks.models import Attempt, Delivery

    prefix, subscriptions, loaded, subscribe_seconds = _push_inboxes(dsn, base, items)

    go = Path(tempfile.mkdtemp()) / "go"
    script = WORKER_SCRIPT.format(queue=KICK_QUEUE, timeout=PUSH_TIMEOUT + 60)
    worker_env = {**env, "WEBHOOK_CA_BUNDLE": ca, "BENCH_MCP_GO": str(go)}
    if profile:
        worker_env["BENCH_MCP_PROFILE"] = str(out_dir / "mcp-worker")
    procs = [subprocess.Popen([PY, "manage.py", "shell", "-c", script], cwd=ROOT, env=worker_env,
                              stdout=subprocess.DEVNULL, stderr=open(out_dir / f"mcp-worker-{i}.stderr", "w"))
             for i in range(workers)]
    expected = PUSH_SUBSCRIPTIONS * items
    try:
        deadline = time.monotonic() + 60
        while len(list(go.parent.glob("go.ready.*"))) < workers:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.05)
        _reset(base, ca)
        cpu_before, started = _cpu_ticks(), time.time()
        go.touch()
        _wait_for_receipts(base, ca, lambda n: n["unique"] >= expected, time.monotonic() + PUSH_TIMEOUT, procs)
        cpu_after = _cpu_ticks()
        time.sleep(1.0)  # room for duplicates, and for what the workers do once the inboxes are empty
        received = _stats(base, ca)
    finally:
        stopped = time.time()
        (go.parent / "go.stop").touch()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    figures = _receipts(received, started, expected, prefix)
    per = Counter(s for _, s, _ in received)
    last = figures.pop("last")
    deliveries = Delivery.objects.filter(subscription__in=subscriptions)
    threads = [_db_thread(json.loads(path.read_text()), started, last) for path in go.parent.glob("go.calls.*")]
    # Which worker sent how many items, for how many subscriptions, until when (the split of the chains).
    split = [{"items": len(rows), "subscriptions": len({s for s, _ in rows}),
              "last_send_s": round(max((at for _, at in rows), default=started) - started, 3)}
             for rows in (json.loads(path.read_text()) for path in sorted(go.parent.glob("go.sends.*")))]
    return {"subscriptions": PUSH_SUBSCRIPTIONS, "items_each": items, "workers": workers, **figures,
            "per_subscription_min_max": [min(per.values(), default=0), max(per.values(), default=0)],
            "attempts": Attempt.objects.filter(delivery__subscription__in=subscriptions).count(),
            "deliveries": dict(deliveries.values_list("state").annotate(n=Count("id")).order_by()),
            # Item subscriptions with nothing left to send, after the last item (see docs/benchmarks.md).
            "cancelled_after_last": deliveries.filter(state=Delivery.State.CANCELLED,
                                                      finished_at__gt=dt.datetime.fromtimestamp(last, dt.UTC)).count(),
            "seconds_after_last": round(stopped - last, 2),
            "machine_cpu_cores": round((cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1)
                                       * os.cpu_count(), 2),
            "db_threads": threads, "workers_split": split,
            "profiles": sorted(str(p.relative_to(ROOT)) for p in out_dir.glob("mcp-worker-*.prof")),
            "subscribe_seconds": round(subscribe_seconds, 2), "load_seconds": loaded.get("load_seconds"),
            "worker_exit_codes": [p.returncode for p in procs]}


def _push_through_cluster(env: dict, dsn: str, out_dir: Path, base: str, ca: str, *, items: int,
                          workers: int) -> dict:
    """The same pushes sent the way a deployment with Redis sends them:
    `serve`'s worker cluster with `workers` processes, one of them the timer
    (webhooks.tasks.deliver), which asks for a helper run in another
    (webhooks.tasks.assist) when a claim fills its room. The subscriptions'
    first offers are held back until the cluster's timer runs (its workers
    queue a delivery run as they start); go: they fall due, committed as a
    send commits a new wake (a nudge to the timer, no task while it runs)."""
    from django.db import transaction
    from django_q.models import Task

    from controlplane.clock import now
    from webhooks.due import kick_on_commit
    from webhooks.models import Delivery

    prefix, subscriptions, _, _ = _push_inboxes(dsn, base, items)
    offers = Delivery.objects.filter(subscription__in=subscriptions, state=Delivery.State.OPEN)
    # (due within webhooks.engine.DUE_HORIZON: further ahead reads as a wrong clock's, due now)
    assert offers.update(due_at=now() + dt.timedelta(minutes=5)) == PUSH_SUBSCRIPTIONS
    Task.objects.all().delete()
    expected = PUSH_SUBSCRIPTIONS * items
    with worker_cluster({**env, "WEBHOOK_CA_BUNDLE": ca}, workers, out_dir / "mcp-cluster.stderr") as cluster:
        _reset(base, ca)
        cpu_before, started = _cpu_ticks(), time.time()
        with transaction.atomic():
            offers.update(due_at=now())
            kick_on_commit()
        _wait_for_receipts(base, ca, lambda n: n["unique"] >= expected, time.monotonic() + PUSH_TIMEOUT, [cluster])
        cpu_after = _cpu_ticks()
        received = _stats(base, ca)
    figures = _receipts(received, started, expected, prefix)
    figures.pop("last")
    return {"workers": workers, **figures,
            "machine_cpu_cores": round((cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1)
                                       * os.cpu_count(), 2),
            # Finished runs and what each sent; the timer's run ends with the cluster.
            "runs_sent": finished_runs(), "exit_code": cluster.returncode}


def phase(env: dict, dsn: str, out_dir: Path, *, items: int, workers: int, seconds: float,
                profile: bool) -> dict:
    kicks = redis.Redis.from_url(env["REDIS_URL"], socket_timeout=5) if env.get("REDIS_URL") else None
    try:
        with https_receiver(out_dir, "mcp") as (base, ca):
            def both() -> tuple[dict, dict | None]:
                # Through the cluster only with Redis: without it every worker may be a timer.
                return (_push(env, dsn, out_dir, base, ca, items=items, workers=workers, profile=profile),
                        _push_through_cluster(env, dsn, out_dir, base, ca, items=items, workers=workers)
                        if env.get("REDIS_URL") else None)

            raw, (push, cluster) = raw_around(f"{base}/hook", seconds, both)
            result = {"raw": raw, "push": push, **({"cluster": cluster} if cluster else {})}
    finally:
        if kicks is not None:  # without Redis they went to the ORM broker, in the bench database
            queued = kicks.llen(f"django_q:{KICK_QUEUE}:q")
            kicks.delete(f"django_q:{KICK_QUEUE}:q")
            kicks.close()
    result["kicks_queued"] = queued if kicks is not None else None
    result["ratio_push_to_raw"] = round(result["push"]["items_per_s"] / result["raw"]["posts_per_s"], 2)
    warm = result["push"]["warm_items_per_s"]
    result["ratio_warm_push_to_raw"] = round(warm / result["raw"]["posts_per_s"], 2) if warm is not None else None
    if "cluster" in result and (warm := result["cluster"]["warm_items_per_s"]) is not None:
        result["ratio_warm_cluster_to_raw"] = round(warm / result["raw"]["posts_per_s"], 2)
    return result
