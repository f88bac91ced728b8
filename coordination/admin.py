from django.contrib import admin

from coordination.models import Task


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("public_id", "space", "title", "status", "claimant", "updated_at")
    list_filter = ("status",)
    search_fields = ("public_id", "title")
    raw_id_fields = ("space", "conversation", "assignee", "reviewer", "claimant", "created_by")
