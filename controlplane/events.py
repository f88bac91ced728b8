"""Typed constructors for the core's events: one function per kind."""
from __future__ import annotations

from controlplane.log import NewEvent
from controlplane.models import Conversation, Member, Membership, Space


def space_created(space: Space, *, actor: Member) -> NewEvent:
    return NewEvent("space.created", {"space": {"slug": space.slug, "name": space.name,
                                                "visibility": space.visibility, "send_policy": space.send_policy}},
                    space_id=space.pk, actor_id=actor.pk)


def member_joined(membership: Membership, *, actor: Member) -> NewEvent:
    return NewEvent("member.joined", {"member": f"@{membership.member.handle}", "role": membership.role},
                    space_id=membership.space_id, actor_id=actor.pk, member_id=membership.member_id)


def member_removed(membership: Membership, *, actor: Member) -> NewEvent:
    return NewEvent("member.removed", {"member": f"@{membership.member.handle}"},
                    space_id=membership.space_id, actor_id=actor.pk, member_id=membership.member_id)


def conversation_created(conversation: Conversation, members: list[Member], *, actor: Member) -> NewEvent:
    data = {"conversation": {"id": conversation.public_id, "kind": conversation.kind}}
    if conversation.kind == Conversation.Kind.CHANNEL:
        data["conversation"]["name"] = conversation.name
    else:
        data["conversation"]["members"] = [f"@{m.handle}" for m in members]
    return NewEvent("conversation.created", data, space_id=conversation.space_id,
                    conversation_id=conversation.pk, actor_id=actor.pk,
                    restricted=conversation.kind != Conversation.Kind.CHANNEL)
