"""The core's API: members, credentials, spaces, memberships, conversations.

Views validate, call one service, and render."""
from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import bearer, services
from controlplane.api.fields import validated
from controlplane.api.pagination import paginate
from controlplane.api.permissions import IsAdmin, ReadableAnonymously
from controlplane.api.schema import CURSOR, IDEMPOTENCY_KEY, LIMIT, errors, extend_schema
from controlplane.api.serializers import (ChannelCreateIn, ConversationOut, CredentialCreateIn, CredentialCreatedOut,
                                          CredentialOut, EmptyIn, GroupCreateIn, MemberCreateIn, MemberOut, MemberRefIn,
                                          MembershipAddIn, MembershipOut, MySpaceOut, SpaceCreateIn, SpaceOut,
                                          envelope)
from controlplane.errors import NotFound
from controlplane.idempotency import idempotent
from controlplane.models import Credential, Membership
from controlplane.render import (render_conversation, render_credential, render_member, render_membership,
                                 render_my_space, render_space)
from controlplane.access import (get_readable_space, get_space_for, is_active_admin, readable_conversations,
                                 visible_memberships)


class MeView(APIView):
    @extend_schema(operation_id="get_me", responses={200: envelope("member", MemberOut), **errors()})
    def get(self, request):
        return Response({"member": render_member(request.user)})


class MySpacesView(APIView):
    @extend_schema(operation_id="list_my_spaces", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("spaces", MySpaceOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR")})
    def get(self, request):
        """The spaces the caller belongs to, and those it asked to join, oldest
        membership first (a removal takes a space off the list)."""
        memberships = (Membership.objects.filter(member=request.user)
                       .exclude(status=Membership.Status.REMOVED).select_related("space"))
        page = paginate(request, memberships, stream="my-spaces", render=render_my_space)
        return Response({"spaces": page.pop("items"), **page})


class CredentialsView(APIView):
    @extend_schema(operation_id="list_credentials",
                   responses={200: envelope("credentials", CredentialOut, many=True), **errors()})
    def get(self, request):
        credentials = Credential.objects.filter(member=request.user).order_by("id")
        return Response({"credentials": [render_credential(c) for c in credentials]})

    @extend_schema(operation_id="create_credential", request=CredentialCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: CredentialCreatedOut,
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "IDEMPOTENCY_CONFLICT",
                                       "LIMIT_EXCEEDED")})
    @idempotent(secret_fields=("token",))
    def post(self, request):
        name = validated(CredentialCreateIn, request.data)["name"]
        credential, token = bearer.issue_credential(request.user, actor=request.user, name=name)
        return Response({**render_credential(credential), "token": token}, status=201)


class CredentialView(APIView):
    @extend_schema(operation_id="delete_credential", responses={204: None, **errors("INVALID_REQUEST", "NOT_FOUND")})
    def delete(self, request, credential_id):
        validated(EmptyIn, request.data)  # a delete takes no body: one it would ignore is refused, as elsewhere
        credential = Credential.objects.filter(member=request.user, public_id=credential_id).first()
        if credential is None:
            raise NotFound()
        bearer.revoke_credential(credential, actor=request.user)
        return Response(status=204)


class MembersView(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(operation_id="create_member", request=MemberCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("member", MemberOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "CONFLICT",
                                       "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request):
        data = validated(MemberCreateIn, request.data)
        member = services.create_member(data["handle"], kind=data["kind"], display_name=data.get("display_name", ""),
                                        is_admin=data["is_admin"], actor=request.user)
        return Response({"member": render_member(member)}, status=201)


class SpacesView(APIView):
    @extend_schema(operation_id="create_space", request=SpaceCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("space", SpaceOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "CONFLICT",
                                       "IDEMPOTENCY_CONFLICT", "LIMIT_EXCEEDED")})
    @idempotent
    def post(self, request):
        data = validated(SpaceCreateIn, request.data)
        space = services.create_space(**data, actor=request.user)
        return Response({"space": render_space(space)}, status=201)


class SpaceView(APIView):
    permission_classes = [ReadableAnonymously]

    @extend_schema(operation_id="get_space", responses={200: envelope("space", SpaceOut),
                                                        **errors("NOT_FOUND")})
    def get(self, request, slug):
        return Response({"space": render_space(get_space_for(slug, request.user))})


def _membership_response(change: services.MembershipChange) -> Response:
    return Response({"membership": render_membership(change.membership)}, status=201 if change.created else 200)


class JoinView(APIView):
    @extend_schema(operation_id="join_space", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("membership", MembershipOut), 201: envelope("membership", MembershipOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "NOT_FOUND", "CONFLICT",
                                       "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request, slug):
        validated(EmptyIn, request.data)
        change = services.join_space(get_space_for(slug, request.user), actor=request.user)
        return _membership_response(change)


class SpaceMembersView(APIView):
    permission_classes = [ReadableAnonymously]

    @extend_schema(operation_id="list_space_members", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("members", MembershipOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND")})
    def get(self, request, slug):
        # The host's admins manage any space's members as an owner would, so they list them too.
        space = get_space_for(slug, request.user) if is_active_admin(request.user) else get_readable_space(
            slug, request.user)
        page = paginate(request, visible_memberships(space, request.user), stream=f"members:{space.pk}",
                        render=render_membership)
        return Response({"members": page.pop("items"), **page})

    @extend_schema(operation_id="add_space_member", request=MembershipAddIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("membership", MembershipOut), 201: envelope("membership", MembershipOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "NOT_FOUND",
                                       "CONFLICT", "IDEMPOTENCY_CONFLICT")})
    @idempotent
    def post(self, request, slug):
        data = validated(MembershipAddIn, request.data)
        space = get_space_for(slug, request.user)
        change = services.add_member(space, services.member_to_manage(space, data["member"], actor=request.user),
                                     role=data.get("role"), actor=request.user)
        return _membership_response(change)


class SpaceMemberView(APIView):
    @extend_schema(operation_id="remove_space_member",
                   responses={204: None, **errors("INVALID_REQUEST", "FORBIDDEN", "NOT_FOUND", "CONFLICT")})
    def delete(self, request, slug, handle):
        validated(EmptyIn, request.data)
        space = get_space_for(slug, request.user)
        services.remove_member(space, services.member_to_manage(space, handle, actor=request.user),
                               actor=request.user)
        return Response(status=204)


class ConversationsView(APIView):
    permission_classes = [ReadableAnonymously]

    @extend_schema(operation_id="list_channels", parameters=[CURSOR, LIMIT],
                   responses={200: envelope("conversations", ConversationOut, many=True, paged=True),
                              **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND")})
    def get(self, request, slug):
        space = get_readable_space(slug, request.user)
        conversations = readable_conversations(space, request.user).select_related("space")
        page = paginate(request, conversations, stream=f"conversations:{space.pk}", render=render_conversation)
        return Response({"conversations": page.pop("items"), **page})


def _conversation_response(conversation, created: bool) -> Response:
    return Response({"conversation": render_conversation(conversation)}, status=201 if created else 200)


CONVERSATION_CODES = ("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "NOT_FOUND", "CONFLICT",
                      "IDEMPOTENCY_CONFLICT")
CONVERSATION_ERRORS = errors(*CONVERSATION_CODES)


class DirectView(APIView):
    @extend_schema(operation_id="get_or_create_direct", request=MemberRefIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("conversation", ConversationOut),
                              201: envelope("conversation", ConversationOut), **CONVERSATION_ERRORS})
    @idempotent
    def post(self, request, slug):
        data = validated(MemberRefIn, request.data)
        space = get_space_for(slug, request.user)
        (other,) = services.participants_named(space, [data["member"]], actor=request.user)
        conversation, created = services.get_or_create_direct(space, other, actor=request.user)
        return _conversation_response(conversation, created)


class ChannelsView(APIView):
    @extend_schema(operation_id="create_channel", request=ChannelCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("conversation", ConversationOut),
                              **errors(*CONVERSATION_CODES, "LIMIT_EXCEEDED")})
    @idempotent
    def post(self, request, slug):
        data = validated(ChannelCreateIn, request.data)
        space = get_space_for(slug, request.user)
        return _conversation_response(services.create_channel(space, data["name"], actor=request.user), True)


class GroupsView(APIView):
    @extend_schema(operation_id="get_or_create_group", request=GroupCreateIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("conversation", ConversationOut),
                              201: envelope("conversation", ConversationOut),
                              **errors(*CONVERSATION_CODES, "LIMIT_EXCEEDED")})
    @idempotent
    def post(self, request, slug):
        data = validated(GroupCreateIn, request.data)
        space = get_space_for(slug, request.user)
        members = services.participants_named(space, data["members"], actor=request.user)
        conversation, created = services.get_or_create_group(space, members, actor=request.user)
        return _conversation_response(conversation, created)
