"""The authorization decision for a send: the one function grants extend."""
from __future__ import annotations

from controlplane.errors import GrantRequired
from controlplane.models import Member, Space


def authorize_send(space: Space, author: Member, recipients: list[Member], *,
                   idempotency_key: str | None) -> dict[int, None]:
    """Decide whether `author` may send to every one of `recipients`.

    Returns the authority each recipient's copy is sent under (keyed by
    member pk), or raises GrantRequired naming the recipients not covered.
    Under the `open` policy membership is the authority. Under
    `explicit_only`, discovery creates no authority: every recipient needs a
    grant, and a send with no recipients needs none.
    """
    if space.send_policy == Space.SendPolicy.OPEN:
        return {r.pk: None for r in recipients}
    uncovered = [f"@{r.handle}" for r in recipients]
    if uncovered:
        raise GrantRequired(details={"recipients": uncovered})
    return {}
