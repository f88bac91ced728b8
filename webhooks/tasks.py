"""django-q2 entry points for the delivery engine."""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import secrets
import time
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from controlplane import live
from controlplane.clock import timestamp
from webhooks import engine, mcp, pump, reaper
from webhooks.due import HELPER_KEY, SUCCESSOR_KEY, TIMER_KEY

log = logging.getLogger(__name__)

# How long the timer stays, with Redis (one timer for the whole cluster).
# Each handover to the next run leaves a moment with no timer, in which a
# new wake waits for a task to start (seen at 100–650 ms): long runs make
# that rare. A stopping cluster ends a run at once (pump.run), and a killed
# timer's key lapses within TIMER_KEY_SECONDS whatever the length; the
# bound is django-q2's task timeout (Q_CLUSTER "timeout", 60 s), which must
# outlast the run plus the 15 s a send in flight at its end may take.
RUN_SECONDS = 40
# Without Redis each worker process has a cache of its own, so the timer is
# chosen by a lock file (`_host_timer`): one per host and database. Runs are
# short all the same, as a host's processes may be more than one cluster's.
LOCAL_RUN_SECONDS = 10
# The timer renews its key every second while it runs, with the time: a
# killed timer's key is gone within TIMER_KEY_SECONDS, and new wakes queue
# tasks again; a starting worker tells a live timer by the renewals (`resume`).
TIMER_KEY_SECONDS = 3
RESUME_POLL_SECONDS = 0.25
# With Redis, the timer is the only run sending while it runs (kicks are not
# queued meanwhile), and one process's CPU bounds it. A claim that fills its
# room means more is due than it can hold: it asks for a helper, one more
# run in another worker (`assist`), one at a time (HELPER_KEY, held from the
# asking to the helper's end, or for HELPER_KEY_SECONDS if the helper never
# ends). A helper sends what is due until nothing has been for a moment
# (HELP_LINGER_SECONDS), for at most HELP_SECONDS, so the tasks queued
# behind it (firewall classification, sweeps) get that worker back between
# helpers.
HELP_SECONDS = 10
HELPER_KEY_SECONDS = 3 * HELP_SECONDS
# A helper stays this long after its last send, hearing the timer's nudges:
# a burst soon after finds it with its connections open, where a new helper
# would open them again.
HELP_LINGER_SECONDS = 2.0
# With Redis, a timer that ends queues the run that takes it over, and
# holds SUCCESSOR_KEY (that run's token) until the run starts: meanwhile
# other runs (the minute's sweep, a kick) send what is due now and leave the
# timer to it. With one worker, whose queue runs one task at a time, every
# sweep found the timer's key free and became a timer too, queueing a next
# run of its own: one chain more a minute, and the queue grew without end.
# The key lapses if its run never starts. (Without Redis each process has
# a cache of its own, where another's successor would never clear the key.)
SUCCESSOR_KEY_SECONDS = 2 * RUN_SECONDS


def _queue_successor(shared: bool) -> None:
    from django_q.tasks import async_task

    token = secrets.token_hex(8) if shared else ""
    if shared:
        cache.set(SUCCESSOR_KEY, token, timeout=SUCCESSOR_KEY_SECONDS)
    async_task("webhooks.tasks.deliver", token)


def deliver(successor: str = "") -> int:
    """Send what is due. One worker at a time (per cache) is also the timer:
    it stays for the run, sending each wake as its debounce window or retry
    time comes, nudged by every new one (webhooks.due); the others send what
    is due now and return. Kicked after a new wake commits while no timer
    runs, and swept once a minute; `successor`: queued by the timer before
    it, which this run takes over from."""
    mcp.offer_waiting()
    shared = live.shared_layer()
    awaited = cache.get(SUCCESSOR_KEY) if shared else None
    if successor and awaited == successor:
        cache.delete(SUCCESSOR_KEY)
        awaited = None
    host_lock = None if shared or awaited is not None else _host_timer()
    timer = (awaited is None and (shared or host_lock is not None)
             and cache.add(TIMER_KEY, timestamp(), timeout=TIMER_KEY_SECONDS))
    renew = (lambda: cache.set(TIMER_KEY, timestamp(), timeout=TIMER_KEY_SECONDS)) if timer else None
    handed_over = False

    def let_go() -> None:
        nonlocal timer, host_lock
        if timer:
            cache.delete(TIMER_KEY)
            timer = False
        if host_lock is not None:
            host_lock.close()  # and with it the lock
            host_lock = None

    def hand_over() -> None:
        """The run's time is up, its slowest sends still out: the next run
        takes over the timer now."""
        nonlocal handed_over
        let_go()
        handed_over = True
        _queue_successor(shared)

    was_timer = timer
    try:
        sent = asyncio.run(pump.run(seconds=RUN_SECONDS if shared else LOCAL_RUN_SECONDS, wait=timer, renew=renew,
                                    hand_over=hand_over if timer else None,
                                    ask_for_help=ask_for_help if timer and shared else None))
    finally:
        let_go()
    # The connection the run began with (mcp.offer_waiting) is 40 s old: a
    # database restart meanwhile broke it, and the look below failed the task
    # with it, so no run took the timer over until the minute's sweep. Back
    # to the pool; the next query takes one the pool checks first.
    connection.close()
    # After the key is gone: a wake committed while it was held queued no
    # task (webhooks.due.kick_on_commit), and is found here. The cluster's
    # one timer also hands over after a run that sent anything: more is
    # likely to come.
    if was_timer and not handed_over and ((shared and sent) or engine.next_due_in(60) is not None):
        _queue_successor(shared)
    return sent


def resume() -> int:
    """A worker's first run (webhooks.apps): `deliver`, as the timer if the
    one before died. A killed timer's key outlives it by up to
    TIMER_KEY_SECONDS, so a run that started then was no timer, and the
    wakes the dead one had claimed waited for the minute's sweep (some 30 s
    after a restart) once their leases ran out. So a starting worker that
    finds the key waits for it to lapse, or to be renewed: a live timer
    renews it (with the time) about once a second."""
    if live.shared_layer():
        held = cache.get(TIMER_KEY)
        until = time.monotonic() + TIMER_KEY_SECONDS + RESUME_POLL_SECONDS
        while held is not None and time.monotonic() < until:
            time.sleep(RESUME_POLL_SECONDS)
            if cache.get(TIMER_KEY) != held:
                break
    return deliver()


def _host_timer():
    """Without Redis: the open lock file that makes this run the timer of
    its host and database, or None when another process's run is. Each
    worker process was the timer before, so both of `make run`'s workers
    sat in 10 s runs while firewall classification waited behind them.
    (The lock goes with the file's closing, or the process's death.)"""
    database = connection.settings_dict
    name = hashlib.sha256(f"{database['ENGINE']}|{database.get('HOST')}|{database['NAME']}".encode()).hexdigest()
    lock = open(Path(settings.VAR_DIR) / f"delivery-timer.{name[:16]}.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock


def reap_deleted() -> int:
    """Hourly: remove what was deleted more than a day ago, endpoints and
    MCP subscriptions, with their rows (webhooks.reaper)."""
    return reaper.reap_deleted_endpoints() + mcp.reap_deleted()


def ask_for_help() -> None:
    """Queue a helper run (`assist`) unless one is queued or running. Called
    by the timer (webhooks.pump) after a claim that filled its room; a
    failure is only logged: the timer goes on alone."""
    from django_q.tasks import async_task

    token = secrets.token_hex(8)
    try:
        if cache.add(HELPER_KEY, token, timeout=HELPER_KEY_SECONDS):
            try:
                async_task("webhooks.tasks.assist", token)
            except Exception:
                cache.delete(HELPER_KEY)  # none is queued: the next full claim asks again
                raise
    except Exception:  # noqa: BLE001 - the broker or cache is down: the timer sends on
        log.warning("the delivery timer could not ask for a helper", exc_info=True)


def assist(token: str = "") -> int:
    """A helper run beside the timer (`ask_for_help`): send what is due and
    what it hands off, until nothing has been for HELP_LINGER_SECONDS, for
    at most HELP_SECONDS; then the timer may ask for the next one. The key
    is held again from the start (however long the task waited in the
    queue), and given up only if it is still this helper's."""
    cache.set(HELPER_KEY, token, timeout=HELPER_KEY_SECONDS)
    try:
        return asyncio.run(pump.run(seconds=HELP_SECONDS, wait=False, linger=HELP_LINGER_SECONDS))
    finally:
        if cache.get(HELPER_KEY) == token:
            cache.delete(HELPER_KEY)
