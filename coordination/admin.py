from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin
from coordination.models import CheckinReceipt, SweepMark, Task


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    """Read-only: a change here would bypass the task's events and rules."""

    list_display = ["public_id", "space", "title", "status", "claimant", "updated_at", "sweep_at"]
    list_filter = ["status"]
    search_fields = ["public_id", "title"]


@admin.register(CheckinReceipt)
class CheckinReceiptAdmin(ReadOnlyAdmin):
    list_display = ["task", "claimant", "task_updated_at", "created_at"]


@admin.register(SweepMark)
class SweepMarkAdmin(ReadOnlyAdmin):
    list_display = ["name", "last_at"]
