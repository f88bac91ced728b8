"""Which run is the delivery timer: the key a run holds (with Redis) or
the lock file of its host (without), handed over at a run's end, and taken
over by a starting worker once a dead timer's key lapses."""
import asyncio
import threading
import time

import pytest
from django.core.cache import cache

from webhooks import due

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]


def test_a_timer_that_handed_over_leaves_the_next_ones_key_alone(monkeypatch):
    from django_q import tasks as q_tasks

    from webhooks import tasks

    queued = []
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: True)
    monkeypatch.setattr(q_tasks, "async_task", lambda name, *args: queued.append(name))
    monkeypatch.setattr(tasks.mcp, "offer_waiting", lambda: None)

    async def run(seconds, wait, renew, hand_over, ask_for_help):
        hand_over()  # its time is up, sends still in flight
        assert cache.add(due.TIMER_KEY, 1, timeout=3)  # the next run is the timer now
        return 5

    monkeypatch.setattr(tasks.pump, "run", run)
    cache.delete(due.TIMER_KEY)
    # when
    tasks.deliver()
    # then: the next run was queued once, and its key is still there
    assert queued == ["webhooks.tasks.deliver"] and cache.get(due.TIMER_KEY) == 1
    cache.delete(due.TIMER_KEY)


@pytest.mark.parametrize("renewed", [False, True], ids=["dead timer", "live timer"])
def test_a_starting_worker_is_the_timer_once_a_dead_timers_key_lapses_and_waits_no_more_for_a_live_one(
        monkeypatch, renewed):
    """A killed timer's key outlives it by a few seconds; a worker started
    then (a restart) waits for it to lapse and takes over, where it used to
    run as no timer and leave what the dead one had claimed to the minute's
    sweep. A live timer's renewal ends the wait at once."""
    from webhooks import tasks

    monkeypatch.setattr("controlplane.live.shared_layer", lambda: True)
    seen = []
    monkeypatch.setattr(tasks, "deliver", lambda: seen.append(cache.get(due.TIMER_KEY)) or 0)
    cache.set(due.TIMER_KEY, time.time() - 2, timeout=1)  # its last renewal, 2 s ago
    renewal = threading.Timer(0.3, lambda: renewed and cache.set(due.TIMER_KEY, time.time(), timeout=3))
    renewal.start()
    try:
        # when
        started = time.monotonic()
        tasks.resume()
        # then: a dead timer's key was gone when the run started (so it is
        # the timer); a live one's was there, renewed, long before it lapses
        if renewed:
            assert seen[0] is not None and time.monotonic() - started < tasks.TIMER_KEY_SECONDS
        else:
            assert seen == [None]
    finally:
        renewal.join()
        cache.delete(due.TIMER_KEY)


def test_without_redis_one_run_at_a_time_is_the_timer_of_its_host_and_database(monkeypatch):
    """Each worker process's cache is its own: a lock file chooses the
    timer, and the other runs send what is due and give their worker back."""
    from webhooks import engine, tasks

    monkeypatch.setattr("controlplane.live.shared_layer", lambda: False)
    monkeypatch.setattr(tasks.cache, "add", lambda *args, **kwargs: True)  # as in a process of its own
    monkeypatch.setattr(tasks.mcp, "offer_waiting", lambda: None)
    monkeypatch.setattr(engine, "next_due_in", lambda horizon: None)
    waits, inside, release = [], threading.Event(), threading.Event()

    async def run(seconds, wait, renew, hand_over, ask_for_help):
        waits.append(wait)
        if len(waits) == 1:  # the first run stays
            inside.set()
            await asyncio.to_thread(release.wait, 10)
        return 0

    monkeypatch.setattr(tasks.pump, "run", run)
    # when: a run while the first one stays, and one after it ended
    first = threading.Thread(target=tasks.deliver)
    first.start()
    assert inside.wait(10)
    tasks.deliver()
    release.set()
    first.join(10)
    tasks.deliver()
    # then
    assert waits == [True, False, True]


def test_a_timer_whose_connection_broke_during_its_run_still_looks_for_what_is_next(monkeypatch):
    """A run lasts 40 s: a database restart meanwhile broke the connection
    the task began with, and the look for the next run's work, after the
    run, failed the task with it (no run took the timer over until the
    minute's sweep)."""
    from django.db import connections
    from django_q import tasks as q_tasks

    from webhooks import tasks

    task_connection = connections["default"]  # the task's thread's (the run's coroutine has a context of its own)
    monkeypatch.setattr("controlplane.live.shared_layer", lambda: True)
    monkeypatch.setattr(q_tasks, "async_task", lambda name, *args: None)
    monkeypatch.setattr(tasks.mcp, "offer_waiting", task_connection.ensure_connection)  # the task's first query

    async def run(seconds, wait, renew, hand_over, ask_for_help):
        task_connection.connection.close()  # the restart, as the task's connection meets it
        return 0

    monkeypatch.setattr(tasks.pump, "run", run)
    cache.delete(due.TIMER_KEY)
    # when / then: the look after the run (nothing is due) answers
    assert tasks.deliver() == 0
