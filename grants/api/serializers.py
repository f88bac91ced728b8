from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fields import RFC3339Field, StrictCharField, StrictChoiceField, StrictSerializer
from controlplane.api.pagination import PageParams
from grants.models import ApprovalRequest, Grant
from inbox.models import Collective


class GrantCreateIn(StrictSerializer):
    id = StrictCharField(max_length=68, help_text="Client-chosen: grt_ and 1–64 of A-Z, a-z, 0-9, _ and -.")
    kind = StrictChoiceField(choices=Grant.Kind.choices)
    sender = StrictCharField(max_length=33, required=False, allow_null=True, help_text="pair and one_message")
    recipient = StrictCharField(max_length=33, required=False, allow_null=True, help_text="pair and one_message")
    idempotency_key = StrictCharField(max_length=128, required=False, allow_null=True,
                                      help_text="one_message: the sender's Idempotency-Key for that message")
    expires_at = RFC3339Field(required=False, allow_null=True, help_text="RFC 3339")


class DenyIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, help_text="Why; recorded with who denied and when.")


class ApprovalListParams(PageParams):
    status = serializers.ChoiceField(choices=ApprovalRequest.Status.choices, default=ApprovalRequest.Status.PENDING)


class GrantOut(serializers.Serializer):
    id = serializers.CharField()
    space = serializers.CharField()
    kind = serializers.ChoiceField(choices=Grant.Kind.choices)
    sender = serializers.CharField(allow_null=True)
    recipient = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    status = serializers.ChoiceField(choices=Grant.Status.choices)
    generation = serializers.IntegerField()
    message = serializers.CharField(allow_null=True, help_text="one_message: the message that consumed it")
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    barrier_started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)


class RetainedCollectiveOut(serializers.Serializer):
    op = serializers.ChoiceField(choices=Collective.Op.choices)
    deadline_ms = serializers.IntegerField(help_text="Counted from the approval's send")


class ApprovalRequestOut(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.ChoiceField(choices=ApprovalRequest.Status.choices)
    space = serializers.CharField()
    conversation = serializers.CharField()
    sender = serializers.CharField()
    recipients = serializers.ListField(child=serializers.CharField())
    idempotency_key = serializers.CharField()
    body = serializers.CharField()
    reply_to = serializers.CharField(allow_null=True)
    related_paths = serializers.ListField(child=serializers.CharField())
    collective = RetainedCollectiveOut(allow_null=True, help_text="A collective request (SPEC §7b), as sent")
    fingerprint = serializers.CharField()
    created_at = serializers.DateTimeField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True, help_text="Once approved and sent")
