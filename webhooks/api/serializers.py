from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fields import (BoundedListField, StrictBooleanField, StrictCharField, StrictChoiceField,
                                     StrictIntegerField, StrictSerializer)


class EndpointIn(StrictSerializer):
    # Its length too is webhooks.destinations.validate_url's to check (422 INVALID_URL).
    url = StrictCharField(allow_blank=True, help_text="https:// only, at most 2048 characters")
    secret = StrictCharField(required=False, allow_null=True, max_length=200,
                             help_text="Optional Standard Webhooks secret, whsec_…; never returned")


class SubjectIn(StrictSerializer):
    type = StrictChoiceField(choices=["conversation", "task"])
    id = StrictCharField(max_length=40)


class SpaceSubscriptionIn(StrictSerializer):
    endpoint_id = StrictCharField(max_length=40)
    subjects = BoundedListField(child=SubjectIn(), required=False, max_length=20)
    exclude_self = StrictBooleanField(required=False, default=False)
    debounce_ms = StrictIntegerField(required=False, default=1000, min_value=0, max_value=60_000)


class InboxSubscriptionIn(StrictSerializer):
    endpoint_id = StrictCharField(max_length=40)
    debounce_ms = StrictIntegerField(required=False, default=1000, min_value=0, max_value=60_000)


class SubscriptionPatchIn(StrictSerializer):
    status = StrictChoiceField(required=False, choices=["paused", "active"])
    debounce_ms = StrictIntegerField(required=False, min_value=0, max_value=60_000)


class EndpointOut(serializers.Serializer):
    id = serializers.CharField()
    url = serializers.CharField()
    has_secret = serializers.BooleanField()
    verified = serializers.BooleanField(help_text="Verified for the current URL and secret")
    verified_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class SuspensionOut(serializers.Serializer):
    reason = serializers.CharField()
    last_error = serializers.CharField()
    at = serializers.DateTimeField()
    terminal = serializers.BooleanField()


class ManagedOut(serializers.Serializer):
    event = serializers.CharField(help_text="The MCP event name it delivers")
    lease_expires_at = serializers.DateTimeField(help_text="Nothing is sent after it until a refresh")


class SubscriptionOut(serializers.Serializer):
    id = serializers.CharField()
    scope = serializers.ChoiceField(choices=["space", "inbox_events", "inbox_items"],
                                    help_text="inbox_items: MCP inbox.item, one pending item per delivery")
    endpoint_id = serializers.CharField()
    owner = serializers.CharField()
    space = serializers.CharField(required=False)
    subjects = serializers.ListField(child=serializers.DictField(), required=False)
    exclude_self = serializers.BooleanField(required=False)
    debounce_ms = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["inactive", "active", "paused", "suspended"])
    version = serializers.IntegerField()
    suspended = SuspensionOut(allow_null=True)
    created_at = serializers.DateTimeField()
    mcp = ManagedOut(allow_null=True, help_text="Set when managed through MCP events/subscribe (read-only here)")


class AttemptOut(serializers.Serializer):
    number = serializers.IntegerField()
    at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    error_class = serializers.CharField(allow_null=True)


class DeliveryOut(serializers.Serializer):
    id = serializers.CharField()
    state = serializers.ChoiceField(choices=["pending", "sending", "delivered", "failed", "cancelled"])
    attempts = AttemptOut(many=True)
    replay_of = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)


class SigningKeyOut(serializers.Serializer):
    key_id = serializers.CharField()
    algorithm = serializers.ChoiceField(choices=["ed25519"])
    public_key = serializers.CharField(help_text="base64url of the raw 32-byte key")
    status = serializers.ChoiceField(choices=["active", "retired"])
