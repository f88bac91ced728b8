"""Tasks as the API shows them (SPEC §10)."""
from __future__ import annotations

from controlplane.clock import rfc3339
from coordination.models import Task


def _handle(member) -> str | None:
    return f"@{member.handle}" if member is not None else None


def render_task(task: Task) -> dict:
    return {"id": task.public_id, "space": task.space.slug, "title": task.title, "description": task.description,
            "status": task.status, "assignee": _handle(task.assignee), "reviewer": _handle(task.reviewer),
            "claimant": _handle(task.claimant), "claimed_at": rfc3339(task.claimed_at),
            "conversation": task.conversation.public_id, "created_by": _handle(task.created_by),
            "created_at": rfc3339(task.created_at), "updated_at": rfc3339(task.updated_at)}
