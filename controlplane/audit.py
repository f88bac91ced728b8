"""The audit trail: every state change that no event records names its
actor here (an event carries its actor already). In the caller's
transaction, so the entry commits with the change or not at all."""
from __future__ import annotations

from controlplane.models import AuditEntry, Member


def record(action: str, target: str, *, actor: Member | None, **detail) -> None:
    """`actor` (None: the system, e.g. a management command) did `action` to
    `target` (a public id). `detail` must never hold a secret."""
    AuditEntry.objects.create(actor=actor, action=action, target=target, detail=detail)
