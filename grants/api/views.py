"""Grants and approval requests (SPEC §5)."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import get_space_for
from controlplane.api.fields import validated
from controlplane.api.pagination import paginate
from controlplane.api.permissions import IsAdmin
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, LIMIT, errors, extend_schema, extend_schema_view
from controlplane.api.serializers import EmptyIn, envelope
from controlplane.idempotency import idempotent
from controlplane.services import require_owner
from grants import approvals, services
from grants.api.serializers import (ApprovalListParams, ApprovalRequestOut, DenyIn, GrantCreateIn, GrantOut)
from grants.models import ApprovalRequest, Grant
from grants.render import render_approval_request, render_approval_requests, render_grant


DECISION_ERRORS = ("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "NOT_FOUND", "CONFLICT",
                   "IDEMPOTENCY_CONFLICT")


def _grant(request, grant: Grant, status: int = 200) -> Response:
    return Response({"grant": render_grant(grant, request.user)}, status=status)


def _approval(request: ApprovalRequest) -> Response:
    return Response({"approval_request": render_approval_request(request)})


class SpaceGrantsView(APIView):
    @extend_schema(operation_id="list_grants", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("grants", GrantOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "FORBIDDEN", "NOT_FOUND")})
    def get(self, request, slug):
        space = get_space_for(slug, request.user)
        require_owner(space, request.user)
        grants = Grant.objects.filter(space=space).select_related("space", "sender", "recipient", "message",
                                                                  "created_by")
        page = paginate(request, grants, stream=f"grants:{space.pk}",
                        render=lambda grant: render_grant(grant, request.user))
        return Response({"grants": page.pop("items"), **page})

    @extend_schema(operation_id="create_grant", request=GrantCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("grant", GrantOut), 200: envelope("grant", GrantOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "NOT_FOUND",
                                       "GRANT_CONFLICT", "IDEMPOTENCY_CONFLICT", "CONFLICT")})
    @idempotent
    def post(self, request, slug):
        data = validated(GrantCreateIn, request.data)
        space = get_space_for(slug, request.user)
        grant, created = services.create_grant(
            space, grant_id=data["id"], kind=data["kind"], sender=data.get("sender"),
            recipient=data.get("recipient"), idempotency_key=data.get("idempotency_key"),
            expires_at=data.get("expires_at"), actor=request.user)
        return _grant(request, services.visible_grant(grant.public_id, request.user, space=space),
                      201 if created else 200)


def _find_grant(request, grant_id: str, slug: str | None) -> Grant:
    space = get_space_for(slug, request.user) if slug is not None else None
    return services.visible_grant(grant_id, request.user, space=space)


class GrantView(APIView):
    """`/v0/grants/{id}` and `/v0/spaces/{slug}/grants/{id}`: ids are unique
    within a space, so the global route answers CONFLICT when the caller
    sees the id in several spaces."""

    @extend_schema(operation_id="get_grant", responses={200: envelope("grant", GrantOut),
                                                        **errors("NOT_FOUND", "CONFLICT")})
    def get(self, request, grant_id, slug=None):
        return _grant(request, _find_grant(request, grant_id, slug))


class RevokeGrantView(APIView):
    @extend_schema(operation_id="revoke_grant", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("grant", GrantOut), **errors(*DECISION_ERRORS)})
    @idempotent(atomic=False)  # the barrier settles its items in batches, each its own transaction
    def post(self, request, grant_id, slug=None):
        validated(EmptyIn, request.data)
        return _grant(request, services.revoke_grant(_find_grant(request, grant_id, slug), actor=request.user))


@extend_schema_view(get=extend_schema(operation_id="get_space_grant"))
class SpaceGrantView(GrantView):
    pass


@extend_schema_view(post=extend_schema(operation_id="revoke_space_grant"))
class RevokeSpaceGrantView(RevokeGrantView):
    pass


class ApprovalRequestsView(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(operation_id="list_approval_requests",
                   parameters=[OpenApiParameter("status", str, enum=ApprovalRequest.Status.values,
                                                description="Default pending."), CURSOR, LIMIT],
                   responses={200: envelope("approval_requests", ApprovalRequestOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "FORBIDDEN")})
    def get(self, request):
        params = validated(ApprovalListParams, request.query_params)
        status = params["status"]
        queue = ApprovalRequest.objects.filter(status=status).select_related(
            "space", "conversation", "sender", "decided_by", "message")
        page = paginate(request, queue, stream=f"approvals:{status}", render_rows=render_approval_requests,
                        params=params)
        return Response({"approval_requests": page.pop("items"), **page})


class ApprovalRequestView(APIView):
    @extend_schema(operation_id="get_approval_request",
                   responses={200: envelope("approval_request", ApprovalRequestOut), **errors("NOT_FOUND")})
    def get(self, request, request_id):
        return _approval(approvals.visible_approval_request(request_id, request.user))


class ApproveView(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(operation_id="approve_request", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("approval_request", ApprovalRequestOut), **errors(*DECISION_ERRORS)})
    @idempotent
    def post(self, request, request_id):
        validated(EmptyIn, request.data)
        pending = approvals.visible_approval_request(request_id, request.user)
        return _approval(approvals.approve(pending, actor=request.user))


class DenyView(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(operation_id="deny_request", request=DenyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("approval_request", ApprovalRequestOut), **errors(*DECISION_ERRORS)})
    @idempotent
    def post(self, request, request_id):
        data = validated(DenyIn, request.data)
        pending = approvals.visible_approval_request(request_id, request.user)
        return _approval(approvals.deny(pending, data["reason"], actor=request.user))
