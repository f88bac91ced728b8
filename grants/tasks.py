"""django-q2 entry points: thin wrappers over services."""
from __future__ import annotations

from grants import barrier


def expire_and_recover() -> int:
    """Once a minute: finish interrupted barriers, then put grants whose
    `expires_at` has passed through the barrier. Returns how many grants
    reached a terminal status."""
    return barrier.recover() + barrier.expire_due()


def finish_barrier(grant_pk: int) -> str:
    """A revocation's barrier that its request left `revoking`
    (grants.barrier.INLINE_SECONDS). Returns the grant's status."""
    return barrier.finish_barrier(grant_pk).status
