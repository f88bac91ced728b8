"""django-q2 entry points: thin wrappers over services."""
from __future__ import annotations

from grants import barrier


def expire_and_recover() -> int:
    """Once a minute: finish interrupted barriers, then put grants whose
    `expires_at` has passed through the barrier. Returns how many grants
    reached a terminal status."""
    return barrier.recover() + barrier.expire_due()
