"""Webhook endpoints, subscriptions, history, replay and signing keys (SPEC §8)."""
from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import get_space_for
from controlplane.api.fields import validated
from controlplane.api.pagination import paginate
from controlplane.api.permissions import ReadableAnonymously
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, LIMIT, errors, extend_schema, extend_schema_view
from controlplane.api.serializers import EmptyIn, envelope
from controlplane.clock import rfc3339
from controlplane.idempotency import idempotent
from webhooks import services, verification
from webhooks.api.serializers import (DeliveryOut, EndpointIn, EndpointOut, InboxSubscriptionIn, SigningKeyOut,
                                      SpaceSubscriptionIn, SubscriptionOut, SubscriptionPatchIn)
from webhooks.models import Endpoint, Subscription
from webhooks.render import render_delivery, render_endpoint, render_key, render_subscription

KEYED = ("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "IDEMPOTENCY_CONFLICT")
CREATE_ERRORS = (*KEYED, "LIMIT_EXCEEDED", "NOT_FOUND")


def _endpoint(endpoint, status=200):
    return Response({"endpoint": render_endpoint(endpoint)}, status=status)


def _subscription(subscription, status=200):
    return Response({"subscription": render_subscription(subscription)}, status=status)


class EndpointsView(APIView):
    @extend_schema(operation_id="list_webhook_endpoints", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("endpoints", EndpointOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        page = paginate(request, Endpoint.objects.owned_by(request.user), stream="webhook-endpoints",
                        render=render_endpoint)
        return Response({"endpoints": page.pop("items"), **page})

    @extend_schema(operation_id="create_webhook_endpoint", request=EndpointIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("endpoint", EndpointOut), **errors(*CREATE_ERRORS, "INVALID_URL")})
    @idempotent
    def post(self, request):
        data = validated(EndpointIn, request.data)
        return _endpoint(services.create_endpoint(request.user, data["url"], data.get("secret"), actor=request.user), 201)


class EndpointView(APIView):
    @extend_schema(operation_id="get_webhook_endpoint", responses={200: envelope("endpoint", EndpointOut),
                                                                   **errors("NOT_FOUND")})
    def get(self, request, endpoint_id):
        return _endpoint(services.owned_endpoint(endpoint_id, request.user))

    @extend_schema(operation_id="delete_webhook_endpoint",
                   responses={204: None, **errors("INVALID_REQUEST", "NOT_FOUND", "CONFLICT")})
    def delete(self, request, endpoint_id):
        validated(EmptyIn, request.data)
        services.delete_endpoint(services.owned_endpoint(endpoint_id, request.user))
        return Response(status=204)


class VerifyEndpointView(APIView):
    @extend_schema(operation_id="verify_webhook_endpoint", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: inline_serializer("Verified", {"verified_at": serializers.DateTimeField()}),
                              **errors(*KEYED, "NOT_FOUND", "VERIFICATION_FAILED", "CONFLICT")})
    @idempotent(atomic=False)  # the challenge waits on the receiver: no transaction stays open meanwhile
    def post(self, request, endpoint_id):
        validated(EmptyIn, request.data)
        endpoint = services.owned_endpoint(endpoint_id, request.user)
        return Response({"verified_at": rfc3339(verification.verify_endpoint(endpoint))})


class SpaceSubscriptionsView(APIView):
    @extend_schema(operation_id="list_space_subscriptions", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("subscriptions", SubscriptionOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND")})
    def get(self, request, slug):
        space = get_space_for(slug, request.user)
        mine = (Subscription.objects.filter(owner=request.user, space=space)
                .exclude(status=Subscription.Status.DELETED).select_related("endpoint", "space", "owner"))
        page = paginate(request, mine, stream=f"subscriptions:{space.pk}", render=render_subscription)
        return Response({"subscriptions": page.pop("items"), **page})

    @extend_schema(operation_id="create_space_subscription", request=SpaceSubscriptionIn,
                   parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("subscription", SubscriptionOut),
                              **errors(*CREATE_ERRORS, "FORBIDDEN", "CONFLICT")})
    @idempotent
    def post(self, request, slug):
        data = validated(SpaceSubscriptionIn, request.data)
        space = get_space_for(slug, request.user)
        subscription = services.create_subscription(
            request.user, data["endpoint_id"], space=space, subjects=data.get("subjects"),
            exclude_self=data["exclude_self"], debounce_ms=data["debounce_ms"])
        return _subscription(subscription, 201)


INBOX_KINDS = (Subscription.Kind.INBOX, Subscription.Kind.ITEM)


class InboxSubscriptionsView(APIView):
    @extend_schema(operation_id="list_inbox_subscriptions", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("subscriptions", SubscriptionOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        mine = (Subscription.objects.filter(owner=request.user, kind__in=INBOX_KINDS)
                .exclude(status=Subscription.Status.DELETED).select_related("endpoint", "space", "owner"))
        page = paginate(request, mine, stream="inbox-subscriptions", render=render_subscription)
        return Response({"subscriptions": page.pop("items"), **page})

    @extend_schema(operation_id="create_inbox_subscription", request=InboxSubscriptionIn,
                   parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("subscription", SubscriptionOut), **errors(*CREATE_ERRORS, "CONFLICT")})
    @idempotent
    def post(self, request):
        data = validated(InboxSubscriptionIn, request.data)
        subscription = services.create_subscription(request.user, data["endpoint_id"],
                                                    debounce_ms=data["debounce_ms"])
        return _subscription(subscription, 201)


class _OneSubscription(APIView):
    """GET, PATCH, DELETE and activate on `<collection>/{id}`."""

    def subscription(self, request, subscription_id, slug=None) -> Subscription:
        if slug is None:
            return services.owned_subscription(subscription_id, request.user, kinds=INBOX_KINDS)
        return services.owned_subscription(subscription_id, request.user, space_slug=slug)


class _SubscriptionView(_OneSubscription):
    def get(self, request, subscription_id, slug=None):
        return _subscription(self.subscription(request, subscription_id, slug))

    @idempotent
    def patch(self, request, subscription_id, slug=None):
        data = validated(SubscriptionPatchIn, request.data)
        subscription = self.subscription(request, subscription_id, slug)
        return _subscription(services.update_subscription(subscription, status=data.get("status"),
                                                          debounce_ms=data.get("debounce_ms")))

    def delete(self, request, subscription_id, slug=None):
        validated(EmptyIn, request.data)
        services.delete_subscription(self.subscription(request, subscription_id, slug))
        return Response(status=204)


class _ActivateView(_OneSubscription):
    @idempotent
    def post(self, request, subscription_id, slug=None):
        validated(EmptyIn, request.data)
        subscription = self.subscription(request, subscription_id, slug)
        services.activate(subscription)
        return Response({"activation_cursor": services.activation_cursor(subscription),
                         "subscription": render_subscription(subscription)})


def _one_subscription_schema(scope: str):
    return extend_schema_view(
        get=extend_schema(operation_id=f"get_{scope}_subscription",
                          responses={200: envelope("subscription", SubscriptionOut), **errors("NOT_FOUND")}),
        patch=extend_schema(operation_id=f"update_{scope}_subscription", request=SubscriptionPatchIn,
                            parameters=[IDEMPOTENCY_KEY],
                            responses={200: envelope("subscription", SubscriptionOut),
                                       **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "IDEMPOTENCY_CONFLICT",
                                                "NOT_FOUND", "CONFLICT",
                                                *(["FORBIDDEN"] if scope == "space" else []))}),
        delete=extend_schema(operation_id=f"delete_{scope}_subscription",
                             responses={204: None, **errors("INVALID_REQUEST", "NOT_FOUND", "CONFLICT")}),
    )


ACTIVATED = inline_serializer("Activated", {"activation_cursor": serializers.CharField(),
                                           "subscription": SubscriptionOut()})


def _activate_schema(scope: str):
    return extend_schema_view(post=extend_schema(
        operation_id=f"activate_{scope}_subscription", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
        responses={200: ACTIVATED, **errors(*KEYED, "NOT_FOUND", "CONFLICT",
                                            *(["FORBIDDEN"] if scope == "space" else []))}))


@_one_subscription_schema("space")
class SpaceSubscriptionView(_SubscriptionView):
    pass


@_one_subscription_schema("inbox")
class InboxSubscriptionView(_SubscriptionView):
    pass


@_activate_schema("space")
class SpaceActivateView(_ActivateView):
    pass


@_activate_schema("inbox")
class InboxActivateView(_ActivateView):
    pass


class DeliveriesView(APIView):
    @extend_schema(operation_id="list_deliveries", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("deliveries", DeliveryOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND")})
    def get(self, request, subscription_id):
        subscription = services.owned_subscription(subscription_id, request.user)
        history = services.deliveries_of(subscription).select_related("replay_of").prefetch_related("attempt_rows")
        page = paginate(request, history, stream=f"deliveries:{subscription.pk}", render=render_delivery)
        return Response({"deliveries": page.pop("items"), **page})


class ReplayView(APIView):
    @extend_schema(operation_id="replay_delivery", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={202: envelope("delivery", DeliveryOut),
                              **errors(*KEYED, "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED")})
    @idempotent  # each replay is a new wake: a retried request must not send it twice
    def post(self, request, delivery_id):
        validated(EmptyIn, request.data)
        return Response({"delivery": render_delivery(services.replay(delivery_id, request.user))},
                        status=202)


class SigningKeysView(APIView):
    permission_classes = [ReadableAnonymously]

    @extend_schema(operation_id="list_webhook_signing_keys",
                   responses={200: envelope("keys", SigningKeyOut, many=True), **errors()})
    def get(self, request):
        return Response({"keys": [render_key(k) for k in services.published_keys()]})
