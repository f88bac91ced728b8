from django.contrib import admin

from controlplane import services
from controlplane.access import admin_member
from controlplane.models import (AuditEntry, Conversation, Credential, Event, EventAddressee, IdempotencyRecord,
                                 LogHead, Member, Membership, Participant, Space)


class ReadOnlyAdmin(admin.ModelAdmin):
    """History must not change: these records are shown, never edited."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
    list_display = ["handle", "public_id", "kind", "status", "is_admin", "created_at"]
    list_filter = ["kind", "status", "is_admin"]
    search_fields = ["handle", "public_id", "display_name"]
    readonly_fields = ["public_id", "created_at"]

    def save_model(self, request, obj, form, change):
        """Suspension and admin powers change through `update_member`, so
        sessions, sockets and the user's flags follow."""
        if not change:
            return super().save_model(request, obj, form, change)
        wanted = {name: form.cleaned_data[name] for name in ("status", "is_admin") if name in form.changed_data}
        others = [name for name in form.changed_data if name not in wanted]
        if others:
            obj.save(update_fields=others)
        if wanted:
            services.update_member(obj, **wanted, actor=admin_member(request.user))


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    # Only a hash is stored, and even that is not shown.
    list_display = ["public_id", "member", "created_at"]
    fields = ["public_id", "member", "created_at"]
    readonly_fields = ["public_id", "member", "created_at"]
    search_fields = ["public_id", "member__handle"]

    def has_add_permission(self, request):
        return False  # tokens are issued through the API or `issuecredential`, shown once


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["member"]


@admin.register(Space)
class SpaceAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "visibility", "send_policy", "archived", "created_at"]
    list_filter = ["visibility", "send_policy", "archived"]
    search_fields = ["slug", "name"]
    readonly_fields = ["public_id", "created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["space", "member", "role", "status", "updated_at"]
    list_filter = ["role", "status"]
    search_fields = ["space__slug", "member__handle"]
    raw_id_fields = ["space", "member"]


class ParticipantInline(admin.TabularInline):
    model = Participant
    extra = 0
    can_delete = False
    readonly_fields = ["member", "ordinal"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "space", "kind", "name", "created_at"]
    list_filter = ["kind"]
    search_fields = ["public_id", "name", "space__slug"]
    inlines = [ParticipantInline]


@admin.register(Participant)
class ParticipantAdmin(ReadOnlyAdmin):
    list_display = ["conversation", "member", "ordinal"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["position", "kind", "space", "conversation", "actor", "restricted", "created_at"]
    list_filter = ["kind", "restricted"]
    search_fields = ["kind", "space__slug"]


@admin.register(EventAddressee)
class EventAddresseeAdmin(ReadOnlyAdmin):
    list_display = ["event", "member", "space"]


@admin.register(LogHead)
class LogHeadAdmin(ReadOnlyAdmin):
    list_display = ["position", "floor"]


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ["owner", "scope", "status_code", "created_at"]
    exclude = ["body"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor", "action", "target"]
    list_filter = ["action"]
    search_fields = ["target", "actor__handle"]
