"""Request validation (strict) and response shapes (for the schema)."""
from __future__ import annotations

from functools import lru_cache

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from controlplane.api.fields import (BoundedListField, StrictBooleanField, StrictCharField, StrictChoiceField,
                                     StrictSerializer)
from controlplane.models import Member, Membership, Space
from controlplane.services import MAX_GROUP_MEMBERS


@lru_cache(maxsize=None)
def envelope(name: str, inner, *, many: bool = False, paged: bool = False):
    """`{"<name>": inner}` (or a page of them) as a named schema component."""
    fields = {name: inner(many=many) if many else inner()}
    if paged:
        fields["cursor"] = serializers.CharField(allow_null=True)
        fields["has_more"] = serializers.BooleanField()
    return inline_serializer(f"{inner.__name__.removesuffix('Out')}{'List' if many else ''}Envelope", fields)


# --- requests -------------------------------------------------------------

class MemberCreateIn(StrictSerializer):
    handle = StrictCharField(max_length=33)
    kind = StrictChoiceField(choices=Member.Kind.choices, default=Member.Kind.AGENT)
    display_name = StrictCharField(max_length=200, required=False, allow_blank=True)
    is_admin = StrictBooleanField(default=False)


class SpaceCreateIn(StrictSerializer):
    slug = StrictCharField(max_length=64)
    name = StrictCharField(max_length=200)
    visibility = StrictChoiceField(choices=Space.Visibility.choices, default=Space.Visibility.OPEN)
    send_policy = StrictChoiceField(choices=Space.SendPolicy.choices, default=Space.SendPolicy.OPEN)


class MemberRefIn(StrictSerializer):
    member = StrictCharField(max_length=33)


class MembershipAddIn(MemberRefIn):
    role = StrictChoiceField(choices=Membership.Role.choices, required=False)  # none: an active member keeps theirs


class ChannelCreateIn(StrictSerializer):
    name = StrictCharField(max_length=81)


class GroupCreateIn(StrictSerializer):
    members = BoundedListField(child=StrictCharField(max_length=33), min_length=2, max_length=MAX_GROUP_MEMBERS)


class EmptyIn(StrictSerializer):
    pass


# --- responses (documentation of the shapes the render functions produce) -------

class MemberOut(serializers.Serializer):
    id = serializers.CharField()
    handle = serializers.CharField()
    display_name = serializers.CharField()
    kind = serializers.ChoiceField(choices=Member.Kind.choices)
    status = serializers.ChoiceField(choices=Member.Status.choices)
    is_admin = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class CredentialCreateIn(StrictSerializer):
    name = StrictCharField(required=False, allow_blank=True, max_length=100, default="",
                           help_text="a label of the owner's, e.g. where the token is used")


class CredentialOut(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()


class CredentialCreatedOut(CredentialOut):
    token = serializers.CharField(allow_null=True, help_text="Shown once (only its hash is stored); null when "
                                                             "an Idempotency-Key replay answers again.")


class SpaceOut(serializers.Serializer):
    id = serializers.CharField()
    slug = serializers.CharField()
    name = serializers.CharField()
    visibility = serializers.ChoiceField(choices=Space.Visibility.choices)
    send_policy = serializers.ChoiceField(choices=Space.SendPolicy.choices)
    archived = serializers.BooleanField()


class MembershipOut(serializers.Serializer):
    member = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    status = serializers.ChoiceField(choices=Membership.Status.choices)
    updated_at = serializers.DateTimeField()


class MySpaceOut(SpaceOut):
    """A space of the caller's, with the caller's own membership."""
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    status = serializers.ChoiceField(choices=[Membership.Status.ACTIVE, Membership.Status.PENDING],
                                     help_text="the caller's membership: `pending` while a join request waits")


class ConversationOut(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.ChoiceField(choices=["channel", "direct", "group"])
    space = serializers.CharField()
    name = serializers.CharField(required=False, help_text="Channels only, as #name.")
    members = serializers.ListField(child=serializers.CharField(), required=False,
                                    help_text="Direct and group conversations only, in order.")
