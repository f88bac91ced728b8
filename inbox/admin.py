from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin
from inbox.models import Message, Recipient


class RecipientInline(admin.TabularInline):
    model = Recipient
    extra = 0
    can_delete = False
    readonly_fields = ["member", "state", "acknowledged_at", "resolved_at", "result"]
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "space", "conversation", "author", "body_bytes", "position", "created_at"]
    search_fields = ["public_id", "author__handle", "space__slug"]
    inlines = [RecipientInline]


@admin.register(Recipient)
class RecipientAdmin(ReadOnlyAdmin):
    list_display = ["message", "member", "state", "acknowledged_at", "resolved_at"]
    list_filter = ["state"]
