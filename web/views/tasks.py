"""A space's tasks: list, create, claim and the other status changes, and a
link to each task's discussion. Every action goes through
coordination.services, as the API does."""
from __future__ import annotations

from django.contrib import messages as flash
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.access import active_membership, get_readable_space, may_administer
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from controlplane.errors import NotFound
from coordination import services
from coordination.models import Task
from web.pages import may_write, member_page

ACTIONS = {"claim": services.claim_task, "release": services.release_task, "submit": services.submit_task,
           "complete": services.complete_task, "reopen": services.reopen_task}
PAGE_TASKS = 200
DONE = {"claim": "claimed", "release": "released", "submit": "submitted for review", "complete": "completed",
        "reopen": "reopened"}


# What each status offers on the page: the moves that make sense there
# (completing an open task is allowed, and rarely meant).
OFFERED = {Task.Status.OPEN: ("claim",), Task.Status.CLAIMED: ("submit", "release"),
           Task.Status.IN_REVIEW: ("complete", "reopen"), Task.Status.DONE: ("reopen",)}


def _actions(task: Task, member, *, can_write: bool, admin: bool) -> list[str]:
    """The buttons for `member`: those of the task's status the service
    would accept from them (observers and readers who are not members get
    none)."""
    if not can_write:
        return []
    return [move for move in OFFERED[task.status] if services.may_move(task, move, member, admin=admin)]


@member_page
def tasks_page(request, member, slug):
    """The newest PAGE_TASKS tasks (in a status), then older ones page by
    page (a sealed cursor, as the API's)."""
    space = get_readable_space(slug, member)
    status = request.GET.get("status") or None
    if status is not None and status not in Task.Status.values:
        raise NotFound()
    stream = f"web-tasks:{space.pk}:{status or 'all'}"
    rows = services.space_tasks(space, member, status).order_by("-id")
    if older := request.GET.get("older"):
        (before,) = unpack_cursor(older, count=1, caller=caller_id(member), stream=stream)
        rows = rows.filter(pk__lt=before)
    rows = list(rows[:PAGE_TASKS + 1])
    more = len(rows) > PAGE_TASKS
    rows = rows[:PAGE_TASKS]
    can_write, admin = may_write(space, active_membership(space, member)), may_administer(space, member)
    return render(request, "web/tasks.html", {
        "space": space, "status": status, "statuses": Task.Status.values, "paged": bool(older),
        "can_write": can_write, "tasks": [(task, _actions(task, member, can_write=can_write, admin=admin))
                                          for task in rows],
        "older": pack_cursor((rows[-1].pk,), caller=caller_id(member), stream=stream) if more else None})


@member_page
@require_POST
def create_task(request, member, slug):
    space = get_readable_space(slug, member)
    task = services.create_task(space, title=request.POST.get("title", ""),
                                description=request.POST.get("description", ""), actor=member)
    flash.success(request, f"Task “{task.title}” created.")
    return redirect("web-tasks", slug)


@member_page
@require_POST
def task_action(request, member, slug, task_id, action):
    if action not in ACTIONS:
        raise NotFound()
    space = get_readable_space(slug, member)
    task = ACTIONS[action](space, task_id, actor=member)
    flash.success(request, f"Task “{task.title}” {DONE[action]}.")
    return redirect("web-tasks", slug)
