"""Periodic work, as django-q2 schedules. The on-commit kicks are nudges;
these sweeps are the guarantee.

Each app declares its own sweeps as `schedules` on its AppConfig, a list of
(name, task path, minutes between runs); `ensure_schedules` (run by the
worker at start) creates or updates one django-q2 schedule per entry.
"""
from __future__ import annotations

from django.apps import apps
from django_q.models import Schedule


def declared_schedules() -> list[tuple[str, str, int]]:
    return [entry for config in apps.get_app_configs() for entry in getattr(config, "schedules", ())]


def ensure_schedules() -> None:
    for name, func, minutes in declared_schedules():
        Schedule.objects.update_or_create(name=name, defaults={
            "func": func, "schedule_type": Schedule.MINUTES, "minutes": minutes, "repeats": -1,
        })
