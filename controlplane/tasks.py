"""django-q2 entry points: thin wrappers over services."""
from __future__ import annotations

import datetime as dt

from django.conf import settings

from controlplane.clock import now
from controlplane.idempotency import purge_idempotency_records as _purge
from controlplane.log import prune_events


def prune_event_log() -> int:
    """Events older than EVENT_RETENTION_DAYS go; with 0, none does (0 reads
    as "off", as it does for the other limits, not as "keep nothing")."""
    if settings.EVENT_RETENTION_DAYS <= 0:
        return 0
    return prune_events(older_than=now() - dt.timedelta(days=settings.EVENT_RETENTION_DAYS))


def purge_idempotency_records() -> int:
    return _purge()


def clear_expired_sessions() -> None:
    """Expired sessions are refused but stay stored until this removes them."""
    from controlplane.sessions import SessionStore

    SessionStore.clear_expired()
