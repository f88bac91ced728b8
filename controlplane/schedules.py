"""Periodic work, as django-q2 schedules. The on-commit kicks are nudges;
these sweeps are the guarantee.

Each app declares its own sweeps as `schedules` on its AppConfig, a list of
(name, task path, minutes between runs); `ensure_schedules` (run by the
worker at start) creates or updates one django-q2 schedule per entry.

django-q2 looks at its schedules every 30 s, so a minute's schedule runs
30–90 s after what it is for. What may not wait that long an app declares
as `watch` on its AppConfig: the path of a function each worker command
calls about once a second (`Watcher`). It must cost one indexed read when
nothing is due, and hand anything longer to a task.
"""
from __future__ import annotations

import logging
import time

from django.apps import apps
from django.db import connections, transaction
from django.utils.module_loading import import_string
from django_q.models import Schedule

from controlplane.db import advisory_lock

WATCH_SECONDS = 1.0
# A failing watch (the database restarting) is logged this often at most.
WATCH_LOG_SECONDS = 60.0
log = logging.getLogger(__name__)



def declared_schedules() -> list[tuple[str, str, int]]:
    return [entry for config in apps.get_app_configs() for entry in getattr(config, "schedules", ())]


def ensure_schedules() -> None:
    """One schedule per entry, however many workers start at once. A
    schedule's name is not unique in django-q2, so the workers take turns
    (SQLite's BEGIN IMMEDIATE, an advisory lock on PostgreSQL), and
    duplicates an earlier race left are removed: `update_or_create` alone let
    two workers starting together each insert one, and every later start
    then failed on the pair (found by the fault matrix)."""
    with transaction.atomic():
        advisory_lock("schedules")  # workers starting together take turns
        for name, func, minutes in declared_schedules():
            found = list(Schedule.objects.filter(name=name).order_by("pk"))
            Schedule.objects.filter(pk__in=[s.pk for s in found[1:]]).delete()
            schedule = found[0] if found else Schedule(name=name)
            schedule.func, schedule.schedule_type, schedule.minutes, schedule.repeats = (
                func, Schedule.MINUTES, minutes, -1)
            schedule.save()


class Watcher:
    """The apps' `watch` functions, each called about once a second from
    the worker command's loop (`tick`, called more often than that)."""

    def __init__(self) -> None:
        self.watches = [import_string(config.watch) for config in apps.get_app_configs()
                        if getattr(config, "watch", None)]
        self.due, self.logged = 0.0, -WATCH_LOG_SECONDS

    def tick(self) -> None:
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + WATCH_SECONDS
        try:
            for watch in self.watches:
                try:
                    watch()
                except Exception:  # noqa: BLE001 - the minute's schedules are the guarantee
                    if time.monotonic() - self.logged >= WATCH_LOG_SECONDS:
                        self.logged = time.monotonic()
                        log.warning("a worker's watch (%s) failed; the schedules cover it", watch.__module__,
                                    exc_info=True)
        finally:
            # Back to the pool (PostgreSQL) until the next round, which takes
            # one it checks first: a connection kept for good would stay
            # broken after a database restart, and every round fail with it.
            connections.close_all()
