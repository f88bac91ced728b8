"""The durable inbox API: read_inbox, acknowledge_delivery, read_event."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.fields import StrictCharField, StrictSerializer, validated
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, errors
from controlplane.clock import rfc3339
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from controlplane.errors import InvalidRequest
from controlplane.idempotency import idempotent
from inbox import delivery
from inbox.models import InboxItem

STREAM = "read_inbox"


class AcknowledgeDeliveryIn(StrictSerializer):
    deliveryToken = StrictCharField(max_length=47)


class InboxParams(serializers.Serializer):
    cursor = serializers.CharField(required=False, max_length=200)


class InboxEntryOut(serializers.Serializer):
    deliveryToken = serializers.CharField()
    item = serializers.DictField()
    guidance = serializers.CharField(required=False)
    insertedAt = serializers.DateTimeField()


InboxPageOut = inline_serializer("InboxPage", {"items": InboxEntryOut(many=True),
                                               "nextCursor": serializers.CharField(allow_null=True)})
ItemOut = inline_serializer("InboxEvent", {"item": serializers.DictField()})


def render_entry(item: InboxItem) -> dict:
    return {"deliveryToken": item.token, "item": item.payload, "insertedAt": rfc3339(item.created_at)}


class InboxView(APIView):
    @extend_schema(operation_id="read_inbox", parameters=[CURSOR],
                   responses={200: InboxPageOut, **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        params = validated(InboxParams, request.query_params)
        caller = caller_id(request.user)
        bound, after = None, (0, 0)
        if params.get("cursor"):
            bound, *after = unpack_cursor(params["cursor"], count=3, caller=caller, stream=STREAM)
        page = delivery.read_inbox(request.user, bound=bound, after=tuple(after))
        return Response({
            "items": [render_entry(item) for item in page.items],
            "nextCursor": pack_cursor(page.next, caller=caller, stream=STREAM) if page.next else None,
        })


class AcknowledgeDeliveryView(APIView):
    @extend_schema(operation_id="acknowledge_delivery", request=AcknowledgeDeliveryIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: inline_serializer("Empty", {}),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "UNKNOWN_DELIVERY",
                                       "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request):
        token = validated(AcknowledgeDeliveryIn, request.data)["deliveryToken"]
        if not delivery.TOKEN_RE.fullmatch(token):
            raise InvalidRequest("deliveryToken is dlv_ followed by 43 base64url characters.")
        delivery.acknowledge_delivery(request.user, token)
        return Response({})


class InboxEventView(APIView):
    @extend_schema(operation_id="read_event",
                   responses={200: ItemOut, **errors("INVALID_EVENT_ID", "UNKNOWN_EVENT")})
    def get(self, request, event_id):
        return Response({"item": delivery.read_event(request.user, event_id).payload})
