from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import ApiError
from inbox import firewall
from inbox.models import (Collective, CollectiveAnswer, FirewallRule, InboxItem, Mailbox, MailboxShare, Message,
                          Recipient)


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
    list_display = ["token", "member", "kind", "state", "admission", "content_bytes", "position", "created_at"]
    list_filter = ["kind", "state", "admission"]
    search_fields = ["token", "member__handle"]
    actions = ["release"]

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Release the selected held items into their inbox", permissions=["release"])
    def release(self, request, queryset):
        actor = getattr(request.user, "member", None)
        released, refused = 0, 0
        for item in queryset.filter(admission=InboxItem.Admission.HELD).select_related("member"):
            try:
                firewall.release_item(item.member, item.token, actor=actor)
                released += 1
            except ApiError:
                refused += 1  # its grant is being or was revoked
        self.message_user(request, f"Released {released} held item(s)."
                          + (f" {refused} could not be released: their grant is no longer active." if refused else ""))

    def has_release_permission(self, request):
        return request.user.is_superuser


@admin.register(FirewallRule)
class FirewallRuleAdmin(ReadOnlyAdmin):
    """A member sets their own rules (the API or the web app), through
    `firewall.set_rules`: its checks, the firewall flag and the audit entry."""
    list_display = ["member", "ordinal", "action", "sender", "space", "conversation_kind", "content_pattern",
                    "min_bytes"]
    search_fields = ["member__handle"]


@admin.register(Mailbox)
class MailboxAdmin(ReadOnlyAdmin):
    list_display = ["member", "pending_bytes", "firewall"]


@admin.register(MailboxShare)
class MailboxShareAdmin(ReadOnlyAdmin):
    list_display = ["member", "sender", "pending_bytes"]
    search_fields = ["member__handle", "sender__handle"]


@admin.register(Collective)
class CollectiveAdmin(ReadOnlyAdmin):
    list_display = ["message", "op", "requester", "state", "reason", "deadline_at", "finished_at"]
    list_filter = ["op", "state"]


@admin.register(CollectiveAnswer)
class CollectiveAnswerAdmin(ReadOnlyAdmin):
    list_display = ["collective", "member", "answered_at"]
