"""What an operator watches: the readiness probe's checks (GET /readyz) and
the backlog figures `manage.py health` prints (docs/observability.md).

/healthz only says the process answers. /readyz also asks the database
(a trivial query) and, when REDIS_URL is set, Redis (a PING), each bounded
by CHECK_SECONDS, so a hung dependency fails the probe instead of holding
it. A check names its state and at most an error class: never an address,
a message or a credential.

Each app names its own backlog figures as `gauges` on its AppConfig: a
dotted path to a function returning {name: number or None (unknown)},
marked with the names it returns (`figures`), so that one which fails
(the database is away) gives None for each, and the others still count.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as CheckTimedOut

import redis
from django.apps import apps
from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string
from django_q.brokers import get_broker
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("switchboard.health")
CHECK_SECONDS = 2.0
# Checks run here, so the probe can stop waiting for one; a hung check
# keeps its thread until it returns, and at most this many hang at once
# (later probes wait for a thread, and answer `timeout`).
_checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="switchboard-readyz")


def _database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        connection.close()  # this thread's connection goes back (to the pool, on PostgreSQL)


def _redis() -> None:
    # One try: a probe that retries only holds its thread longer.
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=CHECK_SECONDS,
                                  socket_connect_timeout=CHECK_SECONDS, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    finally:
        client.close()


def _timed(check) -> int:
    started = time.monotonic()
    check()
    return round((time.monotonic() - started) * 1000)


# A process answers probes from its last checks for this long: /readyz is
# counted by no rate limit (load balancers call it), and each check took a
# database connection and a new Redis connection, so a flood of anonymous
# probes slowed everyone's requests fourfold more than one of /healthz.
ANSWER_FOR_SECONDS = 1.0
_last: tuple[float, tuple[bool, dict]] | None = None
_last_lock = threading.Lock()


def readiness() -> tuple[bool, dict]:
    """`check_readiness`, at most once per ANSWER_FOR_SECONDS in a process:
    probes meanwhile get its answer (those arriving while it runs wait for
    it)."""
    global _last
    with _last_lock:
        if _last is not None and time.monotonic() - _last[0] < ANSWER_FOR_SECONDS:
            return _last[1]
        answer = check_readiness()
        _last = (time.monotonic(), answer)
        return answer


def check_readiness() -> tuple[bool, dict]:
    """(ready, {"status", "checks": {name: {"state", "ms"?, "error"?}}}):
    every configured dependency answered within CHECK_SECONDS."""
    checks = {"database": _database, "redis": _redis if settings.REDIS_URL else None}
    deadline = time.monotonic() + CHECK_SECONDS
    running = {name: _checks.submit(_timed, check) for name, check in checks.items() if check is not None}
    report = {name: {"state": "not configured"} for name, check in checks.items() if check is None}
    for name, future in running.items():
        try:
            report[name] = {"state": "ok", "ms": future.result(timeout=max(0.0, deadline - time.monotonic()))}
        except CheckTimedOut:
            future.cancel()  # if it is still waiting for a thread
            report[name] = {"state": "timeout"}
        except Exception as error:
            report[name] = {"state": "failed", "error": type(error).__name__}
    ready = all(check["state"] in ("ok", "not configured") for check in report.values())
    return ready, {"status": "ready" if ready else "unavailable", "checks": dict(sorted(report.items()))}


def figures(*names: str):
    """Mark a gauges function with the figures it returns."""
    def mark(provider):
        provider.figures = names
        return provider
    return mark


@figures("tasks_queued")
def task_queue() -> dict[str, int | None]:
    """django-q2 tasks waiting for a worker (either broker), None if the
    broker cannot say."""
    try:
        return {"tasks_queued": get_broker().queue_size()}
    except Exception:
        return {"tasks_queued": None}


def gauges() -> dict[str, int | float | None]:
    """Every app's backlog figures (`gauges` on its AppConfig), by name."""
    found = {}
    for config in apps.get_app_configs():
        if path := getattr(config, "gauges", None):
            provider = import_string(path)
            try:
                found.update(provider())
            except Exception as error:  # unknown, not a traceback: the figures matter most when this happens
                log.warning("the %s figures are unknown: %s", config.label, type(error).__name__)
                found.update(dict.fromkeys(provider.figures))
    return found
