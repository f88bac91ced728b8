"""django-q2 entry points: thin wrappers over services."""
from __future__ import annotations

from controlplane import live
from inbox import collectives, firewall


def classify_pending(member_id: int) -> int:
    """Queued once per member at a time (inbox.writes: every send to a
    firewalled member asks for it)."""
    live.started("inbox.tasks.classify_pending", member_id)
    return firewall.classify_pending(member_id)


def classify_all() -> int:
    """The sweep: settles whatever a lost kick left unclassified, and turns
    off a firewall flag nothing keeps on any more."""
    settled = sum(firewall.classify_pending(member_id) for member_id in firewall.members_with_unclassified_items())
    for member_id in firewall.members_flagged_without_reason():
        firewall.refresh_firewall_flag(member_id)
    return settled


def finish_collectives() -> int:
    """The minute schedule: collective requests whose deadline has passed."""
    return collectives.finish_due()


def settle_collectives(message_ids: list[int]) -> None:
    """Operations over as they start (inbox.collectives.start)."""
    collectives.settle(message_ids)


def settle_owed_by(member_id: int) -> None:
    """A member was suspended (inbox.apps)."""
    collectives.settle_owed_by(member_id)
