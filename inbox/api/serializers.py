from __future__ import annotations

from rest_framework import serializers

from controlplane.api.fields import (BoundedListField, CursorField, QueryIntegerField, StrictBooleanField,
                                     StrictCharField, StrictChoiceField, StrictIntegerField, StrictSerializer)
from controlplane.api.pagination import DEFAULT_LIMIT, MAX_LIMIT
from inbox.collectives import MAX_DEADLINE_MS, MIN_DEADLINE_MS
from inbox.models import Collective
from inbox.services import MAX_BODY_BYTES, MAX_RELATED_PATHS


class CollectiveIn(StrictSerializer):
    op = StrictChoiceField(choices=Collective.Op.choices)
    deadline_ms = StrictIntegerField(help_text=f"{MIN_DEADLINE_MS}–{MAX_DEADLINE_MS}")


class AnswerIn(StrictSerializer):
    body = StrictCharField(allow_blank=True, help_text="UTF-8 text, at most 8 KiB encoded.")


class AnswerOut(serializers.Serializer):
    message = serializers.CharField()
    member = serializers.CharField()
    body = serializers.CharField()
    answered_at = serializers.DateTimeField()


class ResultAnswerOut(serializers.Serializer):
    member = serializers.CharField()
    answer = serializers.CharField(required=False)
    answered_at = serializers.DateTimeField(required=False)
    missing = serializers.BooleanField(required=False)
    # A missing answer that was given, but that no grant lets reach this reader (docs/collectives.md).
    reason = serializers.ChoiceField(choices=["grant_required"], required=False)


class AnswersOut(serializers.Serializer):
    ended = serializers.ChoiceField(choices=["all_answered", "deadline"])
    answers = ResultAnswerOut(many=True)


class SendMessageIn(StrictSerializer):
    body = StrictCharField(allow_blank=True, help_text="UTF-8 text, at most 8 KiB encoded; stored exactly.")
    reply_to = StrictCharField(required=False, allow_null=True, max_length=40)
    related_paths = BoundedListField(child=StrictCharField(), required=False, max_length=MAX_RELATED_PATHS)
    request_approval = StrictBooleanField(required=False, default=False,
                                          help_text="Without authority, retain the message for an admin to approve "
                                                    "(needs an Idempotency-Key).")
    collective = CollectiveIn(required=False, help_text="Group conversations: ask every other member for an answer "
                                                        "(SPEC §7b).")


class ResolveIn(StrictSerializer):
    result = StrictCharField(allow_blank=True, help_text="Required, at most 2 KiB encoded.")


class FeedParams(serializers.Serializer):
    cursor = CursorField(required=False)
    limit = QueryIntegerField(required=False, min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)
    wait_ms = QueryIntegerField(required=False, min_value=0, max_value=30_000, default=0)


class BodyParams(serializers.Serializer):
    cursor = CursorField(required=False)
    max_bytes = QueryIntegerField(required=False, min_value=4, max_value=MAX_BODY_BYTES, default=MAX_BODY_BYTES)


class SnapshotParams(serializers.Serializer):
    page = CursorField(required=False)

    def to_internal_value(self, data):
        # The feeds page with `cursor`; a snapshot given one took no page
        # and started again at its first, silently.
        if "cursor" in data:
            raise serializers.ValidationError({"cursor": ["A snapshot pages with `page` (its `next_page`)."]})
        return super().to_internal_value(data)


# --- response shapes -------------------------------------------------------------

class MessageMetaOut(serializers.Serializer):
    id = serializers.CharField()
    conversation = serializers.CharField()
    space = serializers.CharField()
    author = serializers.CharField()
    reply_to = serializers.CharField(allow_null=True)
    related_paths = serializers.ListField(child=serializers.CharField())
    mentions = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    position = serializers.IntegerField()


class MessageOut(MessageMetaOut):
    body = serializers.CharField(allow_null=True, help_text="null when withheld")
    body_withheld = serializers.ChoiceField(choices=["AUTHORITY_REVOKED"], required=False,
                                            help_text="Present when the authority the message was sent under "
                                                      "is no longer active")


class RecipientOut(serializers.Serializer):
    member = serializers.CharField()
    state = serializers.ChoiceField(choices=["pending", "acknowledged", "resolved", "rejected"])
    acknowledged_at = serializers.DateTimeField(allow_null=True)
    resolved_at = serializers.DateTimeField(allow_null=True)
    result = serializers.CharField(allow_null=True)
    rejected_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="Why a revocation barrier rejected it")


class MessageStatusOut(MessageMetaOut):
    body_bytes = serializers.IntegerField()
    recipients = RecipientOut(many=True)


class BodyPageOut(serializers.Serializer):
    body = serializers.CharField()
    total_bytes = serializers.IntegerField()
    cursor = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class EventOut(serializers.Serializer):
    id = serializers.CharField()
    position = serializers.IntegerField()
    kind = serializers.CharField()
    space = serializers.CharField(allow_null=True)
    conversation = serializers.CharField(allow_null=True)
    actor = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    data = serializers.DictField()


class FeedPageOut(serializers.Serializer):
    events = EventOut(many=True)
    cursor = serializers.CharField()
    has_more = serializers.BooleanField()


class SnapshotItemOut(serializers.Serializer):
    message = MessageOut()
    state = serializers.ChoiceField(choices=["pending", "acknowledged"])
    acknowledged_at = serializers.DateTimeField(allow_null=True)


class SnapshotOut(serializers.Serializer):
    snapshot_id = serializers.CharField()
    high_watermark = serializers.IntegerField()
    unresolved = SnapshotItemOut(many=True)
    next_page = serializers.CharField(allow_null=True)
    cursor = serializers.CharField(help_text="Inbox feed cursor at the high watermark.")
