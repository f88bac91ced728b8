"""Tasks (SPEC §10)."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import get_readable_space, get_space_for
from controlplane.api.fields import validated
from controlplane.api.pagination import paginate
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, LIMIT, errors, extend_schema
from controlplane.api.serializers import EmptyIn, envelope
from controlplane.idempotency import idempotent
from coordination import services
from coordination.api.serializers import TaskCreateIn, TaskListParams, TaskOut, TaskUpdateIn
from coordination.models import Task
from coordination.render import render_task

STATUS = OpenApiParameter("status", str, enum=list(Task.Status.values), description="only tasks in this status")
WRITE_ERRORS = ("INVALID_REQUEST", "INVALID_BODY", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "NOT_FOUND", "CONFLICT",
                "IDEMPOTENCY_CONFLICT")


def _task(task: Task, status: int = 200) -> Response:
    return Response({"task": render_task(task)}, status=status)


class TasksView(APIView):
    @extend_schema(operation_id="list_tasks", parameters=[STATUS, CURSOR, LIMIT],
                   responses={200: envelope("tasks", TaskOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND")})
    def get(self, request, slug):
        space = get_readable_space(slug, request.user)
        params = validated(TaskListParams, request.query_params)
        status = params.get("status")
        tasks = services.space_tasks(space, request.user, status)
        page = paginate(request, tasks, stream=f"tasks:{space.pk}:{status or 'all'}", render=render_task,
                        params=params)
        return Response({"tasks": page.pop("items"), **page})

    @extend_schema(operation_id="create_task", request=TaskCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("task", TaskOut), **errors(*WRITE_ERRORS, "LIMIT_EXCEEDED")})
    @idempotent
    def post(self, request, slug):
        data = validated(TaskCreateIn, request.data)
        space = get_space_for(slug, request.user)
        return _task(services.create_task(space, actor=request.user, **data), 201)


class TaskView(APIView):
    @extend_schema(operation_id="get_task", responses={200: envelope("task", TaskOut), **errors("NOT_FOUND")})
    def get(self, request, slug, task_id):
        space = get_space_for(slug, request.user)
        return _task(services.visible_task(space, task_id, request.user))

    @extend_schema(operation_id="update_task", request=TaskUpdateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("task", TaskOut), **errors(*WRITE_ERRORS)})
    @idempotent
    def patch(self, request, slug, task_id):
        data = validated(TaskUpdateIn, request.data)
        space = get_space_for(slug, request.user)
        return _task(services.update_task(space, task_id, data, actor=request.user))


class TaskActionView(APIView):
    """POST …/tasks/{id}/claim|release|submit|complete|reopen."""

    action = None
    operation_id = "{action}_task"
    ACTIONS = {"claim": services.claim_task, "release": services.release_task, "submit": services.submit_task,
               "complete": services.complete_task, "reopen": services.reopen_task}

    @extend_schema(request=EmptyIn, parameters=[IDEMPOTENCY_KEY],  # (LIMIT_EXCEEDED: reopening done work)
                   responses={200: envelope("task", TaskOut), **errors(*WRITE_ERRORS, "LIMIT_EXCEEDED")})
    @idempotent
    def post(self, request, slug, task_id):
        validated(EmptyIn, request.data)
        space = get_space_for(slug, request.user)
        return _task(self.ACTIONS[self.action](space, task_id, actor=request.user))
