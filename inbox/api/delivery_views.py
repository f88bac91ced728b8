"""The durable inbox API: read_inbox, acknowledge_delivery, read_event."""
from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.fields import (BoundedListField, CursorField, QueryIntegerField, StrictCharField,
                                     StrictChoiceField, StrictIntegerField, StrictSerializer, validated)
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, INBOX_LIMIT, errors, extend_schema
from controlplane.errors import InvalidRequest
from controlplane.idempotency import idempotent
from controlplane.services import SLUG_RE, parse_handle
from inbox import delivery, firewall, reads
from inbox.models import FirewallRule
from inbox.render import render_entry, render_rules

class AcknowledgeDeliveryIn(StrictSerializer):
    deliveryToken = StrictCharField(max_length=47)


class InboxParams(serializers.Serializer):
    cursor = CursorField(required=False)
    limit = QueryIntegerField(required=False, min_value=1, max_value=delivery.PAGE_ITEMS, default=delivery.PAGE_ITEMS)


class InboxEntryOut(serializers.Serializer):
    deliveryToken = serializers.CharField()
    item = serializers.DictField()
    guidance = serializers.CharField(required=False)
    insertedAt = serializers.DateTimeField()


InboxPageOut = inline_serializer("InboxPage", {"items": InboxEntryOut(many=True),
                                               "nextCursor": serializers.CharField(allow_null=True)})
ItemOut = inline_serializer("InboxEvent", {
    "item": serializers.DictField(),
    "state": serializers.ChoiceField(choices=["rejected"], required=False,
                                     help_text="Only on a tombstone: the item was withdrawn before hand-off"),
    "reason": serializers.CharField(required=False, help_text="Only on a tombstone: why"),
    "guidance": serializers.CharField(required=False, help_text="The firewall's guidance, beside the item"),
})


class RuleIn(StrictSerializer):
    action = StrictChoiceField(choices=FirewallRule.Action.choices)
    sender = StrictCharField(required=False, allow_null=True, max_length=33)
    space = StrictCharField(required=False, allow_null=True, max_length=64)
    conversation_kind = StrictChoiceField(required=False, allow_null=True, choices=["channel", "direct", "group"])
    content_pattern = StrictCharField(required=False, allow_null=True, max_length=firewall.MAX_PATTERN)
    min_bytes = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    guidance = StrictCharField(required=False, allow_null=True, max_length=2000)


class RulesIn(StrictSerializer):
    rules = BoundedListField(child=RuleIn(), max_length=firewall.MAX_RULES)


RulesOut = inline_serializer("FirewallRules", {"rules": RuleIn(many=True)})


class FirewallView(APIView):
    @extend_schema(operation_id="get_inbox_firewall", responses={200: RulesOut, **errors()})
    def get(self, request):
        return Response(render_rules(FirewallRule.objects.filter(member=request.user).order_by("ordinal")))

    @extend_schema(operation_id="set_inbox_firewall", request=RulesIn,
                   responses={200: RulesOut, **errors("INVALID_REQUEST")})
    def put(self, request):
        return Response(render_rules(firewall.set_rules(request.user, parse_rules(request.data),
                                                        actor=request.user)))


def parse_rules(data) -> list[dict]:
    """`{"rules": [...]}` as `firewall.set_rules` takes them (the API's and the web app's)."""
    rules = validated(RulesIn, data)["rules"]
    for rule in rules:
        if rule.get("sender"):
            rule["sender"] = parse_handle(rule["sender"])
        if rule.get("space") is not None and not SLUG_RE.fullmatch(rule["space"]):
            # (a rule of "LAB" or " lab" was kept, and matched nothing)
            raise InvalidRequest("A rule's space is a space's slug.", details={"space": rule["space"]})
    return [dict(r) for r in rules]


class HeldView(APIView):
    @extend_schema(operation_id="list_held_items", parameters=[CURSOR, INBOX_LIMIT],
                   responses={200: InboxPageOut, **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        params = validated(InboxParams, request.query_params)
        return Response(reads.held_page(request.user, params.get("cursor"), params["limit"]))


class ReleaseView(APIView):
    @extend_schema(operation_id="release_held_item", request=AcknowledgeDeliveryIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: inline_serializer("Released", {"item": InboxEntryOut()}),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "UNKNOWN_DELIVERY",
                                       "AUTHORITY_REVOKED", "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request):
        token = validated(AcknowledgeDeliveryIn, request.data)["deliveryToken"]
        item = firewall.release_item(request.user, token, actor=request.user)
        return Response({"item": render_entry(item)})


class InboxView(APIView):
    @extend_schema(operation_id="read_inbox", parameters=[CURSOR, INBOX_LIMIT],
                   responses={200: InboxPageOut, **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        params = validated(InboxParams, request.query_params)
        return Response(reads.inbox_page(request.user, params.get("cursor"), params["limit"]))


class AcknowledgeDeliveryView(APIView):
    @extend_schema(operation_id="acknowledge_delivery", request=AcknowledgeDeliveryIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: inline_serializer("Empty", {}),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "UNKNOWN_DELIVERY",
                                       "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request):
        token = validated(AcknowledgeDeliveryIn, request.data)["deliveryToken"]
        return Response(reads.acknowledge(request.user, token))


class InboxEventView(APIView):
    @extend_schema(operation_id="read_event",
                   responses={200: ItemOut, **errors("INVALID_EVENT_ID", "UNKNOWN_EVENT", "AUTHORITY_REVOKED")})
    def get(self, request, event_id):
        return Response(reads.read_event(request.user, event_id))
