from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin
from inbox.models import InboxItem, Mailbox, Message, Recipient


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


@admin.register(InboxItem)
class InboxItemAdmin(ReadOnlyAdmin):
    list_display = ["token", "member", "kind", "state", "content_bytes", "position", "created_at"]
    list_filter = ["kind", "state"]
    search_fields = ["token", "member__handle"]


@admin.register(Mailbox)
class MailboxAdmin(ReadOnlyAdmin):
    list_display = ["member", "pending_bytes"]
