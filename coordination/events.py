"""The events tasks append to their space's feed."""
from __future__ import annotations

from controlplane.log import NewEvent
from controlplane.models import Member
from coordination.models import Task
from coordination.render import render_task


def task_event(kind: str, task: Task, *, actor: Member | None, extra: dict | None = None, **fields) -> NewEvent:
    """A task's event: in the space feed, on its discussion channel (so a
    subscription narrowed to the task, or to that conversation, sees it)."""
    return NewEvent(kind, {"task": render_task(task), **(extra or {})}, space_id=task.space_id,
                    conversation_id=task.conversation_id, actor_id=actor.pk if actor else None, **fields)
