"""Periodic work, as django-q2 schedules. The on-commit kicks are nudges;
these sweeps are the guarantee."""
from __future__ import annotations

from django_q.models import Schedule

SCHEDULES = [
    # (name, task path, minutes between runs)
    ("prune-event-log", "controlplane.tasks.prune_event_log", 60),
    ("purge-idempotency-records", "controlplane.tasks.purge_idempotency_records", 60),
    ("classify-inbox-items", "inbox.tasks.classify_all", 1),
    ("expire-grants", "grants.tasks.expire_and_recover", 1),
    ("deliver-webhooks", "webhooks.tasks.deliver", 1),
]


def ensure_schedules() -> None:
    for name, func, minutes in SCHEDULES:
        Schedule.objects.update_or_create(name=name, defaults={
            "func": func, "schedule_type": Schedule.MINUTES, "minutes": minutes, "repeats": -1,
        })
