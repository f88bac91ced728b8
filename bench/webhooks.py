"""Webhook delivery: wakes/s, raw signed POSTs/s, send-to-receipt latency.

All against one local HTTPS receiver (bench/receiver.py, its own process,
a throwaway CA trusted through WEBHOOK_CA_BUNDLE), in the same run:

1. raw: this process signs (Ed25519, the engine's Signer) and POSTs wakes
   as fast as it can through the engine's own transport, with the engine's
   concurrency (64 in flight), for `seconds` in two halves, just before
   and just after the wakes (`raw_around`), each counting the answers
   within its half after RAW_WARMUP_SECONDS (its connections opened): the
   ceiling for one process.
2. wakes: 1,000 active subscriptions over 20 endpoints, one due wake each,
   sent by `workers` worker processes each running the delivery timer for
   the whole phase (claim with SKIP LOCKED, sign, POST, record), a warm-up
   round and then ROUNDS rounds; wakes/s is wakes over the time from a
   round's commit (whose nudge wakes the timers, as a send's does) to its
   last receipt, over the rounds after the warm-up. The warm-up round's
   figure is kept beside it: it also opens the workers' connections and
   prepares their statements, which a running timer has done long before.
   Then the same rounds through `serve`'s worker cluster (`worker_cluster`):
   one timer, and the helper runs it asks for (webhooks.tasks.assist).
3. latency: `manage.py serve` (its ASGI server and the django-q2 cluster, Redis
   broker) and one inbox subscription with debounce 0; `latency_sends`
   direct messages one at a time, 100 ms apart; latency is from just before
   the send request to the receipt of the first wake whose range covers it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.load import latency_summary
from bench.servers import PY, ROOT, free_port

SUBSCRIPTIONS = 1_000
ENDPOINTS = 20
ROUNDS = 3
WARMUP_ROUNDS = 1
RAW_WARMUP_SECONDS = 0.5
RAW_SETTLE_SECONDS = 1.0
GO_FILE_ENV = "BENCH_WEBHOOK_GO"
# A worker: the delivery timer (one run, one transport, woken by the nudges
# each round's commit sends, as in `serve`) until the stop file.
WORKER_SCRIPT = """
import asyncio, os, threading, time
from django.conf import settings
from controlplane import processes
from webhooks import pump
settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True  # the receiver is on loopback; the env flag needs DEBUG=1
stop, go = processes.share_stop_with_forks(), os.environ["BENCH_WEBHOOK_GO"]
def watch():
    while not os.path.exists(go + ".stop"):
        time.sleep(0.01)
    stop.set()
threading.Thread(target=watch, daemon=True).start()
asyncio.run(pump.run(seconds=600, wait=True))
"""


def _stats(base: str, ca: str) -> list:
    return httpx.get(f"{base}/stats", verify=ca, timeout=30).json()["received"]


def _reset(base: str, ca: str) -> None:
    httpx.post(f"{base}/reset", verify=ca, timeout=30)


def _wait_for_receipts(base: str, ca: str, enough, deadline: float, procs=()) -> None:
    """Until the receiver's counts (`{"received": n, "unique": m}`) are
    `enough`, `deadline` (monotonic) passes, or one of the sending `procs`
    has exited (a crashed worker sends nothing more): short looks on one kept-alive
    connection, each a few bytes, so the looking costs the cores under
    measurement next to nothing (fetching every receipt each time over a new
    TLS connection took a visible share of them)."""
    with httpx.Client(base_url=base, verify=ca, timeout=30) as http:
        while (not enough(http.get("/count").json()) and time.monotonic() < deadline
               and all(proc.poll() is None for proc in procs)):
            time.sleep(0.02)


async def _raw_posts(url: str, seconds: float) -> tuple[int, int, list[float]]:
    """(requests, errors, latencies) of raw signed POSTs, 64 in flight: those
    answered within `seconds` after RAW_WARMUP_SECONDS (the connections open)."""
    from webhooks import crypto
    from webhooks.transport import Transport

    signer = crypto.Signer(await asyncio.to_thread(crypto.active_signing_key))
    body = b'{"type":"spaces.events.available","id":"whd_bench","event_range":{"after":"a","through":"b"}}'
    sent, errors, latencies = 0, 0, []
    measured_from = time.monotonic() + RAW_WARMUP_SECONDS
    deadline = measured_from + seconds
    async with Transport(limit=64) as transport:
        async def client():
            nonlocal sent, errors
            while (started := time.monotonic()) < deadline:
                headers = signer.headers("whd_bench", body, secret=None, timestamp=int(time.time()))
                outcome = await transport.post(url, body, headers)
                if measured_from <= (answered := time.monotonic()) <= deadline:
                    latencies.append(answered - started)
                    sent += 1
                    errors += not outcome.ok

        await asyncio.gather(*(client() for _ in range(64)))
    return sent, errors, latencies


def raw_around(url: str, seconds: float, measure):
    """(the raw signed POSTs baseline, `measure()`): half of the baseline's
    `seconds` just before the measurement and half just after it (once what
    it left running has had RAW_SETTLE_SECONDS to stop), so that most of a
    shift in what the shared machine gives (which moves one run's figures by
    a fifth) reaches both sides of the ratio."""
    half = seconds / 2
    before = asyncio.run(_raw_posts(url, half))
    measured = measure()
    time.sleep(RAW_SETTLE_SECONDS)
    after = asyncio.run(_raw_posts(url, half))
    rates = [round(sent / half, 1) for sent, _, _ in (before, after)]
    raw = {"posts_per_s": round(sum(rates) / 2, 1), "before_after_posts_per_s": rates,
           "errors": before[1] + after[1], "warmup_s": RAW_WARMUP_SECONDS,
           **latency_summary(before[2] + after[2])}
    return raw, measured


def _prepare_subscriptions(url_base: str) -> tuple:
    from controlplane import services
    from webhooks.models import Endpoint, Subscription

    # One member per endpoint: the engine gives one member at most half a
    # worker's room (webhooks.engine.PER_OWNER), and these stand for many.
    stamp = int(time.time())
    owners = [services.create_member(f"hooks{stamp}m{n:02d}", actor=None) for n in range(ENDPOINTS)]
    endpoints = Endpoint.objects.bulk_create(Endpoint(owner=owners[n], url=f"{url_base}/hook/{n}")
                                             for n in range(ENDPOINTS))
    subscriptions = Subscription.objects.bulk_create(
        Subscription(owner=owners[n % ENDPOINTS], endpoint=endpoints[n % ENDPOINTS], kind="inbox", status="active",
                     activation_position=0, debounce_ms=0) for n in range(SUBSCRIPTIONS))
    return owners, subscriptions


def _due_wakes(subscriptions, round_: int) -> float:
    """Commit one due wake per subscription and nudge the timers; the time
    just before the commit."""
    from django.db import transaction

    from controlplane.clock import now
    from webhooks.due import nudge_timer_on_commit
    from webhooks.models import Delivery

    with transaction.atomic():
        Delivery.objects.bulk_create(Delivery(subscription=s, after_position=round_, through_position=round_ + 1,
                                              state="pending", due_at=now()) for s in subscriptions)
        nudge_timer_on_commit()
        return time.time()


def _round(stats_base: str, ca: str, subscriptions, round_: int, procs) -> dict:
    """One round: a due wake for every subscription, committed, and its
    receipts (from the commit to the last)."""
    _reset(stats_base, ca)
    started = _due_wakes(subscriptions, round_)
    _wait_for_receipts(stats_base, ca, lambda n: n["received"] >= SUBSCRIPTIONS, time.monotonic() + 120, procs)
    received = _stats(stats_base, ca)
    last = max((at for _, _, at in received), default=started)
    return {"wakes": len(received), "unique": len({i for i, _, _ in received}), "seconds": round(last - started, 3),
            "wakes_per_s": round(len(received) / max(last - started, 1e-6), 1), "warmup": round_ < WARMUP_ROUNDS}


def _wakes(env: dict, url_base: str, stats_base: str, ca: str, workers: int, out_dir: Path) -> dict:
    owners, subscriptions = _prepare_subscriptions(url_base)
    go = Path(tempfile.mkdtemp()) / "go"
    # Production settings (DEBUG off: no query log), as bench/push.py's workers.
    worker_env = {**env, GO_FILE_ENV: str(go), "DEBUG": "0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "0"}
    procs = [subprocess.Popen([PY, "manage.py", "shell", "-c", WORKER_SCRIPT], cwd=ROOT,
                              env=worker_env, stdout=subprocess.DEVNULL,
                              stderr=open(out_dir / f"webhook-worker-{i}.stderr", "w")) for i in range(workers)]
    rounds = []
    try:
        time.sleep(3)  # let the workers boot
        for r in range(WARMUP_ROUNDS + ROUNDS):
            rounds.append(_round(stats_base, ca, subscriptions, r, procs))
    finally:
        (go.parent / "go.stop").touch()
        for proc in procs:
            proc.wait(60) if proc.poll() is None else None
    from webhooks.models import Attempt, Delivery
    measured = [r for r in rounds if not r["warmup"]]
    return {"workers": workers, "subscriptions": SUBSCRIPTIONS, "endpoints": ENDPOINTS, "rounds": rounds,
            "wakes_per_s": round(sum(r["wakes"] for r in measured) / sum(r["seconds"] for r in measured), 1),
            "attempts": Attempt.objects.filter(delivery__subscription__owner__in=owners).count(),
            "delivered": Delivery.objects.filter(subscription__owner__in=owners, state="delivered").count()}


# `serve`'s worker cluster (`manage.py worker`), with loopback receivers
# allowed as the worker scripts above allow them.
CLUSTER_SCRIPT = """
from django.conf import settings
from django.core.management import call_command
settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True  # the receiver is on loopback; the env flag needs DEBUG=1
call_command("worker")
"""
# Once the cluster's timer runs: the other workers' start-up runs (nothing due) have ended.
CLUSTER_SETTLE_SECONDS = 1.0


@contextlib.contextmanager
def worker_cluster(env: dict, workers: int, log: Path):
    """`serve`'s worker cluster with `workers` processes, as a deployment
    with Redis runs it, until the block ends: yielded once one of its workers
    is the delivery timer (each queues a delivery run as it starts)."""
    from django.core.cache import cache

    from webhooks.due import TIMER_KEY

    cluster = subprocess.Popen([PY, "manage.py", "shell", "-c", CLUSTER_SCRIPT], cwd=ROOT,
                               env={**env, "DEBUG": "0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "0",
                                    "Q_WORKERS": str(workers)},
                               stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not cache.get(TIMER_KEY):
            assert time.monotonic() < deadline and cluster.poll() is None, "the cluster's timer did not start"
            time.sleep(0.05)
        time.sleep(CLUSTER_SETTLE_SECONDS)
        yield cluster
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait(10)


def finished_runs() -> dict[str, list]:
    """What each finished delivery run (`deliver`) and helper run (`assist`)
    of the cluster sent, from django-q2's task results."""
    from django_q.models import Task

    return {name: list(Task.objects.filter(func=f"webhooks.tasks.{name}").values_list("result", flat=True))
            for name in ("deliver", "assist")}


def _wakes_through_cluster(env: dict, url_base: str, stats_base: str, ca: str, workers: int, out_dir: Path) -> dict:
    """The same rounds sent the way a deployment with Redis sends them:
    `serve`'s worker cluster, one worker the timer (nudged by each round's
    commit, as by a send's), which asks for a helper run in another when a
    claim fills its room."""
    from django_q.models import Task

    _, subscriptions = _prepare_subscriptions(url_base)
    Task.objects.all().delete()
    rounds = []
    with worker_cluster({**env, "WEBHOOK_CA_BUNDLE": ca}, workers, out_dir / "webhook-cluster.stderr") as cluster:
        for r in range(WARMUP_ROUNDS + ROUNDS):
            rounds.append(_round(stats_base, ca, subscriptions, r, [cluster]))
    measured = [r for r in rounds if not r["warmup"]]
    return {"workers": workers, "rounds": rounds, "runs_sent": finished_runs(),
            "wakes_per_s": round(sum(r["wakes"] for r in measured) / sum(r["seconds"] for r in measured), 1)}


def _latency(env: dict, url: str, stats_base: str, ca: str, sends: int, out_dir: Path) -> dict:
    from controlplane.cursors import caller_id, unpack_cursor
    from controlplane.models import Member

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stamp = int(time.time())
    tokens = {}
    for handle in (f"lat{stamp}a", f"lat{stamp}b"):
        subprocess.run([PY, "manage.py", "createmember", handle], cwd=ROOT, env=env, check=True, capture_output=True)
        tokens[handle] = subprocess.run([PY, "manage.py", "issuecredential", handle], cwd=ROOT, env=env, check=True,
                                        capture_output=True, text=True).stdout.strip()
    alice, bob = ({"Authorization": f"Bearer {tokens[h]}"} for h in tokens)
    serve = subprocess.Popen([PY, "manage.py", "serve", "--bind", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=open(out_dir / "webhook-serve.stderr", "w"),
                             start_new_session=True)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
            slug = f"lat{stamp}"
            http.post("/v0/spaces", json={"slug": slug, "name": "Latency"}, headers=alice)
            http.post(f"/v0/spaces/{slug}/join", headers=bob)
            direct = http.post(f"/v0/spaces/{slug}/direct", json={"member": f"@lat{stamp}a"},
                               headers=bob).json()["conversation"]["id"]
            endpoint = http.post("/v0/webhook-endpoints", json={"url": url}, headers=alice).json()["endpoint"]["id"]
            assert http.post(f"/v0/webhook-endpoints/{endpoint}/verify", headers=alice).status_code == 200
            sub = http.post("/v0/me/inbox-subscriptions", json={"endpoint_id": endpoint, "debounce_ms": 0},
                            headers=alice).json()["subscription"]["id"]
            http.post(f"/v0/me/inbox-subscriptions/{sub}/activate", headers=alice)
            _reset(stats_base, ca)
            sent, responses = [], []
            for n in range(sends):
                started = time.time()
                message = http.post(f"/v0/spaces/{slug}/conversations/{direct}/messages",
                                    json={"body": f"latency {n}"}, headers=bob).json()["message"]
                responses.append(time.time() - started)
                sent.append((message["position"], started))
                time.sleep(0.1)
            time.sleep(3)
            received = _stats(stats_base, ca)
    finally:
        os.killpg(serve.pid, 2)
        serve.wait(30)
    owner = Member.objects.get(handle=f"lat{stamp}a")
    receipts = sorted((unpack_cursor(through, count=1, caller=caller_id(owner), stream="inbox")[0], at)
                      for _, through, at in received if through)
    latencies, by_send = [], []  # by_send: (send number, receipt ms, its response ms)
    for n, (position, started) in enumerate(sent):
        covering = [at for through, at in receipts if through >= position]
        if covering:
            latencies.append(min(covering) - started)
            by_send.append((n, round(1000 * latencies[-1], 1), round(1000 * responses[n], 1)))
    result = {"sends": sends, "wakes": len(received), "covered": len(latencies), **latency_summary(latencies),
              "send_response": latency_summary(responses),
              "slowest": sorted(by_send, key=lambda row: -row[1])[:5]}
    result["ratio_to_send"] = {q: round(result[f"{q}_ms"] / result["send_response"][f"{q}_ms"], 2)
                               for q in ("p50", "p99") if result[f"{q}_ms"] and result["send_response"][f"{q}_ms"]}
    return result


@contextlib.contextmanager
def https_receiver(out_dir: Path, name: str):
    """bench/receiver.py in a process of its own, with a throwaway CA, until
    the block ends: (its base URL, the CA bundle), this process's settings
    trusting it meanwhile (its log: `<name>-receiver.stderr`)."""
    from django.conf import settings

    from webhooks.example_receiver import make_ca_and_certificate

    ca, cert, key = (str(p) for p in make_ca_and_certificate(Path(tempfile.mkdtemp())))
    port = free_port()
    base = f"https://localhost:{port}"
    proc = subprocess.Popen([PY, "-m", "bench.receiver", cert, key, str(port)], cwd=ROOT,
                            stderr=open(out_dir / f"{name}-receiver.stderr", "w"))
    saved = settings.WEBHOOK_CA_BUNDLE, settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS
    settings.WEBHOOK_CA_BUNDLE, settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = ca, True
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _stats(base, ca)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the receiver did not start"
                time.sleep(0.1)
        yield base, ca
    finally:
        settings.WEBHOOK_CA_BUNDLE, settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = saved
        proc.terminate()
        proc.wait(10)



def run(env: dict, out_dir: Path, *, seconds: float, workers: int, latency_sends: int) -> dict:
    with https_receiver(out_dir, "webhook") as (base, ca):
        # Loopback receivers are a development setting, which production settings
        # refuse: the latency phase's `serve` runs with DEBUG on (its query log is
        # bounded); the wakes' workers admit loopback in their script instead.
        env = {**env, "WEBHOOK_CA_BUNDLE": ca, "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1", "DEBUG": "1"}
        os.environ.update({"WEBHOOK_CA_BUNDLE": ca, "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1"})

        def wakes():
            _reset(base, ca)
            # Through the cluster only with Redis: without it every worker may be a timer.
            return (_wakes(env, base, base, ca, workers, out_dir),
                    _wakes_through_cluster(env, base, base, ca, workers, out_dir) if env.get("REDIS_URL") else None)

        raw, (result_wakes, cluster) = raw_around(f"{base}/hook", seconds, wakes)
        result = {"raw": raw, "wakes": result_wakes}
        if cluster:
            result.update(cluster=cluster, ratio_cluster_to_raw=round(cluster["wakes_per_s"] / raw["posts_per_s"], 2))
        result["latency"] = _latency(env, f"{base}/hook", base, ca, latency_sends, out_dir)
        result["ratio_wakes_to_raw"] = round(result["wakes"]["wakes_per_s"] / result["raw"]["posts_per_s"], 2)
    sys.stderr.flush()
    return result
