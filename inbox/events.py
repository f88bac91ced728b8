"""Typed constructors for message events."""
from __future__ import annotations

from controlplane.log import NewEvent
from controlplane.models import Conversation, Member
from inbox.models import Message
from inbox.render import render_message


def _restricted(message: Message) -> bool:
    return message.conversation.kind != Conversation.Kind.CHANNEL


def message_created(message: Message, recipients: list[Member], *, screened: set[int] = frozenset()) -> NewEvent:
    """Addressed to the recipients whose item is admitted at once; those in
    `screened` (their firewall classifies it first) get `message.admitted`
    if and when it is admitted (SPEC §7: every read path sees only admitted
    items)."""
    return NewEvent("message.created", {"message": render_message(message)}, space_id=message.space_id,
                    conversation_id=message.conversation_id, actor_id=message.author_id,
                    restricted=_restricted(message),
                    addressees=tuple(r.pk for r in recipients if r.pk not in screened))


def message_admitted(message: Message, member: Member) -> NewEvent:
    """`member`'s firewall admitted `message` (by a rule, or a release of a
    held item): addressed to them alone and in no space feed, so their inbox
    feed and inbox wakes hear of it now, after the cursor they may have moved
    past its `message.created`. It names its space, so that a member who
    can no longer read the space no longer reads it either (restricted, with
    no conversation: in no space feed)."""
    return NewEvent("message.admitted", {"message": render_message(message)}, space_id=message.space_id,
                    restricted=True, addressees=(member.pk,))


def message_acknowledged(message: Message, *, actor: Member) -> NewEvent:
    return NewEvent("message.acknowledged", {"message": message.public_id, "member": f"@{actor.handle}"},
                    space_id=message.space_id, conversation_id=message.conversation_id, actor_id=actor.pk,
                    restricted=_restricted(message))


def message_resolved(message: Message, result: str, *, actor: Member) -> NewEvent:
    return NewEvent("message.resolved", {"message": message.public_id, "member": f"@{actor.handle}",
                                         "result": result},
                    space_id=message.space_id, conversation_id=message.conversation_id, actor_id=actor.pk,
                    restricted=_restricted(message))


def message_rejected(message: Message, member: Member, reason: str) -> NewEvent:
    """A revocation barrier withdrew `message` from one recipient before
    hand-off; addressed to that recipient, visible to the participants."""
    return NewEvent("message.rejected", {"message": message.public_id, "member": f"@{member.handle}",
                                         "reason": reason},
                    space_id=message.space_id, conversation_id=message.conversation_id,
                    restricted=_restricted(message), addressees=(member.pk,))
