"""A space's tasks: list, create, claim and the other status changes, and a
link to each task's discussion. Every action goes through
coordination.services, as the API does."""
from __future__ import annotations

from django.contrib import messages as flash
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.access import get_readable_space
from controlplane.errors import NotFound
from coordination import services
from coordination.models import Task
from web.pages import member_page

ACTIONS = {"claim": services.claim_task, "release": services.release_task, "submit": services.submit_task,
           "complete": services.complete_task, "reopen": services.reopen_task}
DONE = {"claim": "claimed", "release": "released", "submit": "submitted for review", "complete": "completed",
        "reopen": "reopened"}


def _actions(task: Task, member) -> list[str]:
    """The buttons that make sense for `member` (the services decide)."""
    if task.status == Task.Status.OPEN:
        return ["claim"]
    if task.status == Task.Status.CLAIMED:
        return ["submit", "release"] if task.claimant_id == member.pk else []
    return ["complete", "reopen"] if task.status == Task.Status.IN_REVIEW else ["reopen"]


@member_page
def tasks_page(request, member, slug):
    space = get_readable_space(slug, member)
    status = request.GET.get("status") or None
    if status is not None and status not in Task.Status.values:
        raise NotFound()
    rows = services.space_tasks(space, member, status).order_by("-id")
    return render(request, "web/tasks.html", {
        "space": space, "status": status, "statuses": Task.Status.values,
        "tasks": [(task, _actions(task, member)) for task in rows[:200]]})


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
