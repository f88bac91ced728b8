from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fields import StrictCharField, StrictSerializer
from controlplane.api.pagination import PageParams
from coordination.models import Task
from coordination.services import DESCRIPTION_MAX, TITLE_MAX


# The limits are UTF-8 bytes, which the service counts (coordination.services._text):
# a schema's maxLength counts characters.
TITLE = f"At most {TITLE_MAX} bytes of UTF-8, surrounding white space removed."
DESCRIPTION = f"At most {DESCRIPTION_MAX} bytes of UTF-8."


class TaskCreateIn(StrictSerializer):
    title = StrictCharField(help_text=TITLE)
    description = StrictCharField(required=False, allow_blank=True, help_text=DESCRIPTION)
    assignee = StrictCharField(required=False, allow_null=True, max_length=33, help_text="@handle")
    reviewer = StrictCharField(required=False, allow_null=True, max_length=33, help_text="@handle")


class TaskUpdateIn(TaskCreateIn):
    title = StrictCharField(required=False, help_text=TITLE)


class TaskListParams(PageParams):
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
