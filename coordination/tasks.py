"""django-q2 tasks of the coordination app."""
from __future__ import annotations

from coordination import claims


def sweep_claims() -> dict | None:
    """The minute schedule: check-ins and expiry of silent claims."""
    return claims.sweep()
