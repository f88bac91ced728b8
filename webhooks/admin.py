"""Webhooks in the Django admin: state and history, never a secret (the
endpoint secret and signing keys' private halves are not shown anywhere)."""
from django.contrib import admin, messages

from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import ApiError
from webhooks import services
from webhooks.models import Attempt, Delivery, Endpoint, SigningKey, Subscription


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "owner", "url", "has_secret", "verified_at", "created_at", "deleted_at"]
    fields = ["public_id", "owner", "url", "has_secret", "verified_at", "created_at", "deleted_at"]
    readonly_fields = fields
    search_fields = ["public_id", "owner__handle", "url"]

    @admin.display(boolean=True)
    def has_secret(self, obj):
        return obj.secret is not None


def _report(modeladmin, request, done: int, what: str, failures: list[str]) -> None:
    modeladmin.message_user(request, f"{what} {done}.", messages.SUCCESS)
    for failure in failures:
        modeladmin.message_user(request, failure, messages.ERROR)


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "owner", "kind", "space", "status", "debounce_ms", "version", "suspended_error",
                    "created_at"]
    list_filter = ["kind", "status", "terminal"]
    search_fields = ["public_id", "owner__handle"]
    actions = ["resume_selected"]

    @admin.action(description="Resume the selected paused or suspended subscriptions (with a catch-up wake)")
    def resume_selected(self, request, queryset):
        done, failures = 0, []
        for subscription in queryset:
            try:
                services.update_subscription(subscription, status=Subscription.Status.ACTIVE, debounce_ms=None)
                done += 1
            except ApiError as exc:
                failures.append(f"{subscription.public_id}: {exc.message}")
        _report(self, request, done, "Resumed", failures)


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
    actions = ["replay_selected"]

    @admin.action(description="Replay the selected deliveries (the same range again, as new wakes)")
    def replay_selected(self, request, queryset):
        done, failures = 0, []
        for delivery in queryset.select_related("subscription__owner"):
            try:
                services.replay(delivery.public_id, delivery.subscription.owner)
                done += 1
            except ApiError as exc:
                failures.append(f"{delivery.public_id}: {exc.message}")
        _report(self, request, done, "Replayed", failures)


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["delivery", "number", "started_at", "duration_ms", "status_code", "error_class"]
    list_filter = ["error_class"]


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    list_display = ["key_id", "status", "public_key", "created_at", "retired_at"]
    fields = ["key_id", "status", "public_key", "created_at", "retired_at"]
    readonly_fields = fields
