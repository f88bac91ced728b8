"""Webhooks in the Django admin: state and history, never a secret (the
endpoint secret and signing keys' private halves are not shown anywhere)."""
from django.contrib import admin

from controlplane.admin import ReadOnlyAdmin
from webhooks.models import Attempt, Delivery, Endpoint, SigningKey, Subscription


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "owner", "url", "has_secret", "verified_at", "created_at"]
    fields = ["public_id", "owner", "url", "has_secret", "verified_at", "created_at"]
    readonly_fields = fields
    search_fields = ["public_id", "owner__handle", "url"]

    @admin.display(boolean=True)
    def has_secret(self, obj):
        return obj.secret is not None


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "owner", "kind", "space", "status", "debounce_ms", "version", "suspended_error",
                    "created_at"]
    list_filter = ["kind", "status", "terminal"]
    search_fields = ["public_id", "owner__handle"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    fields = ["number", "started_at", "duration_ms", "status_code", "error_class", "key_id"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "subscription", "state", "attempts", "due_at", "created_at", "finished_at"]
    list_filter = ["state"]
    search_fields = ["public_id", "subscription__public_id"]
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["delivery", "number", "started_at", "duration_ms", "status_code", "error_class"]
    list_filter = ["error_class"]


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    list_display = ["key_id", "status", "public_key", "created_at", "retired_at"]
    fields = ["key_id", "status", "public_key", "created_at", "retired_at"]
    readonly_fields = fields
