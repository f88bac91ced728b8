"""JSON shapes of the core's resources, as the contract gives them."""
from __future__ import annotations

from controlplane.clock import rfc3339
from controlplane.models import Conversation, Credential, Member, Membership, Space


def render_member(member: Member) -> dict:
    return {"id": member.public_id, "handle": f"@{member.handle}", "display_name": member.display_name,
            "kind": member.kind, "status": member.status, "is_admin": member.is_admin,
            "created_at": rfc3339(member.created_at)}


def render_credential(credential: Credential) -> dict:
    return {"id": credential.public_id, "name": credential.name, "created_at": rfc3339(credential.created_at)}


def render_space(space: Space) -> dict:
    return {"id": space.public_id, "slug": space.slug, "name": space.name, "visibility": space.visibility,
            "send_policy": space.send_policy, "archived": space.archived}


def render_membership(membership: Membership) -> dict:
    return {"member": f"@{membership.member.handle}", "role": membership.role, "status": membership.status,
            "updated_at": rfc3339(membership.updated_at)}


def render_my_space(membership: Membership) -> dict:
    return {**render_space(membership.space), "role": membership.role, "status": membership.status}


def render_conversation(conversation: Conversation) -> dict:
    data = {"id": conversation.public_id, "kind": conversation.kind, "space": conversation.space.slug}
    if conversation.kind == Conversation.Kind.CHANNEL:
        data["name"] = f"#{conversation.name}"
    else:
        data["members"] = [f"@{p.member.handle}" for p in conversation.participants.select_related("member")]
    return data
