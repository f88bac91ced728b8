"""Periodic work, as django-q2 schedules. The on-commit kicks are nudges;
these sweeps are the guarantee.

Each app declares its own sweeps as `schedules` on its AppConfig, a list of
(name, task path, minutes between runs); `ensure_schedules` (run by the
worker at start) creates or updates one django-q2 schedule per entry.
"""
from __future__ import annotations

from django.apps import apps
from django.db import transaction
from django_q.models import Schedule

from controlplane.db import advisory_lock



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
