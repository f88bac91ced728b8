from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fields import StrictCharField, StrictSerializer
from coordination.models import Task
from coordination.services import DESCRIPTION_MAX, TITLE_MAX


class TaskCreateIn(StrictSerializer):
    title = StrictCharField(max_length=TITLE_MAX)
    description = StrictCharField(required=False, allow_blank=True, max_length=DESCRIPTION_MAX)
    assignee = StrictCharField(required=False, allow_null=True, max_length=33, help_text="@handle")
    reviewer = StrictCharField(required=False, allow_null=True, max_length=33, help_text="@handle")


class TaskUpdateIn(TaskCreateIn):
    title = StrictCharField(required=False, max_length=TITLE_MAX)


class TaskListParams(serializers.Serializer):
    status = serializers.ChoiceField(choices=Task.Status.choices, required=False)


class TaskOut(serializers.Serializer):
    id = serializers.CharField()
    space = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    status = serializers.ChoiceField(choices=Task.Status.choices)
    assignee = serializers.CharField(allow_null=True)
    reviewer = serializers.CharField(allow_null=True)
    claimant = serializers.CharField(allow_null=True)
    claimed_at = serializers.DateTimeField(allow_null=True)
    conversation = serializers.CharField(help_text="its discussion: a channel of the space")
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
