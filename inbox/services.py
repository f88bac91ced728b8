"""Sending and handling messages."""
from __future__ import annotations

import hashlib
import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass

from django.db import IntegrityError, connection, transaction

from controlplane.access import LOOK_UP_ROLE, get_conversation_to_write, readers_of, removed_sql, require_sender
from controlplane.clock import now
from controlplane.errors import (AuthorityRevoked, Conflict, Forbidden, GrantRequired, IdempotencyConflict,
                                 InvalidRequest, LimitExceeded, NotFound)
from controlplane.log import append_events
from controlplane.db import model_columns, model_from_row, plain_rows
from controlplane.models import Conversation, Member, Membership, Participant, Space
from controlplane.services import MAX_GROUP_MEMBERS
from inbox import authority, collectives, events, mailbox
from inbox.mentions import parse_mentions
from inbox.models import Message, Recipient
from inbox.text import encode_text
from inbox.writes import RecipientsRemoved, insert_message

# One line per accepted send; its request id leads to its wakes (docs/observability.md).
send_log = logging.getLogger("switchboard.send")

MAX_BODY_BYTES = 8 * 1024
# Whom one message may address: as many as the largest group holds. A
# channel message addresses whom it mentions, and every member of the host
# reads an open space: a body of `@a @b …` reached some 1,900 mailboxes, a
# row, an item and a wake each, in the send's one transaction.
MAX_RECIPIENTS = MAX_GROUP_MEMBERS
MAX_RESULT_BYTES = 2 * 1024
MAX_RELATED_PATHS = 64
MAX_RELATED_PATH_CHARS = 1024
# All of a message's related paths together, in UTF-8, as much as its body:
# they travel in every copy of it (inbox items, feed events) and count
# against no mailbox.
MAX_RELATED_PATHS_BYTES = MAX_BODY_BYTES


def _validate_related_paths(paths: list[str]) -> list[str]:
    if len(paths) > MAX_RELATED_PATHS:
        raise InvalidRequest(f"At most {MAX_RELATED_PATHS} related paths.")
    for path in paths:
        if not path or len(path) > MAX_RELATED_PATH_CHARS or "\x00" in path:
            raise InvalidRequest(f"A related path is 1–{MAX_RELATED_PATH_CHARS} characters without NUL.",
                                 details={"related_paths": path[:100]})
    if sum(len(path.encode("utf-8", "surrogatepass")) for path in paths) > MAX_RELATED_PATHS_BYTES:
        raise InvalidRequest(f"The related paths are at most {MAX_RELATED_PATHS_BYTES} bytes (UTF-8) together.",
                             details={"max_bytes": MAX_RELATED_PATHS_BYTES})
    return paths


def send_fingerprint(conversation: Conversation, body: str, related_paths: list[str], reply_to: str | None,
                     collective: dict | None = None) -> str:
    parts = [conversation.public_id, body, related_paths, reply_to] + ([collective] if collective else [])
    canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class SendResult:
    message: Message
    created: bool


_KEY_PROBE_SQL = (f"SELECT fingerprint FROM {connection.ops.quote_name(Message._meta.db_table)} "
                  "WHERE author_id = %s AND idempotency_key = %s")


def _replay(actor: Member, key: str, fingerprint: str) -> SendResult | None:
    """The original send under (actor, key), or None. The probe runs before
    nearly every send and almost always finds nothing, so it is one plain
    statement reading one column (compiling it through the ORM cost more)."""
    with connection.cursor() as cursor:
        cursor.execute(_KEY_PROBE_SQL, [actor.pk, key])
        stored = cursor.fetchone()
    if stored is None:
        return None
    if stored[0] != fingerprint:
        raise IdempotencyConflict()
    original = Message.objects.select_related("space", "conversation", "author", "reply_to").get(
        author=actor, idempotency_key=key)
    return SendResult(original, created=False)


def _recipients(conversation: Conversation, space: Space, mentioned: list[str], author: Member) -> list[Member]:
    """Who a message goes to, never its author:
    - direct and group: the other participants who still belong to the space;
    - channel: the explicitly mentioned members who can read the space, less
      those removed from it (controlplane.access.receives_from)."""
    if conversation.kind == Conversation.Kind.CHANNEL:
        if not mentioned:
            return []
        member, columns = connection.ops.quote_name(Member._meta.db_table), model_columns(Member, "m")
        candidates = _members(f"SELECT {columns} FROM {member} m "
                              f"WHERE m.handle IN ({', '.join(['%s'] * len(mentioned))}) AND m.id <> %s "
                              f"AND NOT {removed_sql('%s', 'm.id')}",
                              [*mentioned, author.pk, space.pk])
        readers = readers_of(conversation, {m.pk for m in candidates})
        order = {h: i for i, h in enumerate(mentioned)}
        return sorted((m for m in candidates if m.pk in readers), key=lambda m: order[m.handle])
    return _participants(conversation, space, author, away=False)


def _participants(conversation: Conversation, space: Space, author: Member, *, away: bool) -> list[Member]:
    """A direct or group conversation's other participants who belong to
    the space now (its recipients), or, `away`, those who do not."""
    quote = connection.ops.quote_name
    member, columns = quote(Member._meta.db_table), model_columns(Member, "m")
    membership = quote(Membership._meta.db_table)
    return _members(f"SELECT {columns} FROM {quote(Participant._meta.db_table)} p "
                    f"JOIN {member} m ON m.id = p.member_id WHERE p.conversation_id = %s AND p.member_id <> %s "
                    f"AND {'NOT ' if away else ''}EXISTS (SELECT 1 FROM {membership} ms WHERE ms.space_id = %s "
                    f"AND ms.member_id = p.member_id AND ms.status = '{Membership.Status.ACTIVE.value}') "
                    f"ORDER BY p.ordinal", [conversation.pk, author.pk, space.pk])


def _away(conversation: Conversation, space: Space, author: Member) -> list[Member]:
    """Who else a send must be authorized for (explicit_only): the
    participants of a direct or group conversation away from its space. They
    get no copy now, but read the conversation again once they are back (or,
    in an open space, while away), so a send with them away needed no grant
    for them, and reached them all the same."""
    if conversation.kind == Conversation.Kind.CHANNEL:
        return []
    return _participants(conversation, space, author, away=True)


def _members(sql: str, params: list) -> list[Member]:
    """Members read with plain SQL: a send asks for its recipients every
    time, and compiling the ORM's joins cost several times running them."""
    return [model_from_row(Member, row) for row in plain_rows(sql, params)]


def send_to(slug: str, ref: str, *, actor: Member, idempotency_key: str | None = None, **fields) -> SendResult:
    """`send_message` to the conversation `ref` (`cnv_…` or `#name`) of the
    space `slug`, which `actor` must be able to read (the API's and the MCP
    tool's send). A retry of a send whose sender can no longer read the
    conversation (removed from a private space since) still gets its
    original back, as every retry does; anyone else gets the same 404."""
    try:
        conversation = get_conversation_to_write(slug, ref, actor)
    except NotFound:
        if idempotency_key and (replay := _replay_unread(actor, idempotency_key, slug, ref, fields)):
            return replay
        raise
    return send_message(conversation, idempotency_key=idempotency_key, actor=actor, **fields)


def _replay_unread(actor: Member, key: str, slug: str, ref: str, fields: dict) -> SendResult | None:
    """The original under (actor, key), if it went to the conversation that
    `slug` and `ref` name; IDEMPOTENCY_CONFLICT if the request differs."""
    original = Message.objects.select_related("space", "conversation", "author", "reply_to").filter(
        author=actor, idempotency_key=key).first()
    if original is None or original.space.slug != slug:
        return None
    conversation = original.conversation
    names = {conversation.public_id}
    if conversation.kind == Conversation.Kind.CHANNEL:
        names.add(f"#{conversation.name}")
    if ref not in names:
        return None
    *_, fingerprint = _request(conversation, fields["body"], fields.get("related_paths"), fields.get("reply_to"),
                               fields.get("collective"))
    return _replay(actor, key, fingerprint)


def _request(conversation: Conversation, body: str, related_paths: list[str] | None, reply_to: str | None,
             collective: dict | None) -> tuple[bytes, list[str], dict | None, str]:
    """A send's checked parts: the body's bytes, its related paths, its
    collective request, and the fingerprint a retry is matched by."""
    raw = encode_text(body, field="body", max_bytes=MAX_BODY_BYTES)
    related_paths = _validate_related_paths(related_paths or [])
    if collective is not None:
        collective = collectives.validate(conversation, collective)
    return raw, related_paths, collective, send_fingerprint(conversation, body, related_paths, reply_to, collective)


SEND_TRIES = 3  # writes in a row that found a recipient removed since their lookup


def send_message(conversation: Conversation, *, body: str, reply_to: str | None = None,
                 related_paths: list[str] | None = None, idempotency_key: str | None = None,
                 request_approval: bool = False, collective: dict | None = None, actor: Member,
                 lock_also: tuple[int, ...] = ()) -> SendResult:
    """Send a message; with `collective` (`{"op", "deadline_ms"}`, group
    conversations only) a collective request (inbox.collectives).

    Atomic: the message, its recipients and its `message.created` event
    commit together or not at all. Idempotent per sender and key: the same
    request again returns the original (created=False); different content
    under the same key is IDEMPOTENCY_CONFLICT. Without authority for every
    recipient it is GRANT_REQUIRED; with `request_approval` the message is
    then retained in an approval request, named in the error's details. The
    caller has already checked that `actor` can read `conversation` (and may
    have annotated it with `caller_role`, see access.get_conversation_to_write).
    `lock_also` names members whose mailboxes the caller counts into after
    the send, in its transaction (an approval's notice to its sender, in an
    `explicit_only` space): they are locked with the recipients', in member
    order, after the grants and before the log head.

    A recipient removed from the space between the lookup of the recipients
    and the write gets nothing: the write rolls back and the send runs again
    from the start, to whom it goes now (inbox.writes.RecipientsRemoved);
    after SEND_TRIES such races in a row, CONFLICT.
    """
    for _ in range(SEND_TRIES):
        try:
            return _send(conversation, body=body, reply_to=reply_to, related_paths=related_paths,
                         idempotency_key=idempotency_key, request_approval=request_approval, collective=collective,
                         actor=actor, lock_also=lock_also)
        except RecipientsRemoved:
            continue
    raise Conflict("Members left the space as the message was sent; send it again.")


def _send(conversation: Conversation, *, body: str, reply_to: str | None, related_paths: list[str] | None,
          idempotency_key: str | None, request_approval: bool, collective: dict | None, actor: Member,
          lock_also: tuple[int, ...]) -> SendResult:
    space = conversation.space
    raw, related_paths, collective, fingerprint = _request(conversation, body, related_paths, reply_to, collective)
    # A retry answers with the original before any check runs again: what
    # authorized the first send (a one-message grant, say) may be used up.
    if idempotency_key and (replay := _replay(actor, idempotency_key, fingerprint)):
        return replay
    require_sender(space, actor, getattr(conversation, "caller_role", LOOK_UP_ROLE))
    parent = None
    if reply_to is not None:
        parent = Message.objects.filter(public_id=reply_to, conversation=conversation).first()
        if parent is None:
            raise InvalidRequest("reply_to must name a message of this conversation.", details={"reply_to": reply_to})
    mentioned = parse_mentions(body)
    recipients = _recipients(conversation, space, mentioned, actor)
    if len(recipients) > MAX_RECIPIENTS:
        raise LimitExceeded(f"A message addresses at most {MAX_RECIPIENTS} members; this one mentions "
                            f"{len(recipients)} who can read it.", details={"max_recipients": MAX_RECIPIENTS})
    # In channels the recipients are the mentioned readers; in direct and
    # group conversations everyone is a recipient, and `mentions` records who
    # was also named explicitly.
    mentions = [m.handle for m in recipients if m.handle in mentioned]
    message = Message(space=space, conversation=conversation, author=actor, body=body, body_bytes=len(raw),
                      reply_to=parent, related_paths=related_paths, mentions=mentions,
                      idempotency_key=idempotency_key or None, fingerprint=fingerprint)
    request = collectives.request_fields(collective, message.created_at) if collective else None
    # An open space's plain send is one statement on PostgreSQL: no
    # transaction around it, which would cost two more round trips.
    guard = transaction.atomic() if collective or space.send_policy != Space.SendPolicy.OPEN else nullcontext()
    try:
        with guard:
            if space.send_policy == Space.SendPolicy.OPEN:
                insert_message(message, recipients, collective=request)
            else:
                # The send policy (grants, registered with inbox.authority)
                # decides; its grants stay locked from the decision to the commit.
                policy = authority.send_policy()
                granted = policy.authorize(space, actor, [*recipients, *_away(conversation, space, actor)],
                                           idempotency_key=idempotency_key)
                if lock_also:
                    mailbox.lock([*lock_also, *(r.pk for r in recipients)], create=True)
                insert_message(message, recipients, granted, collective=request)
                policy.consume(granted, message)
            if collective:
                collectives.start(message, recipients, collective)
    except IntegrityError:
        # A concurrent send with the same key committed first.
        if idempotency_key and (replay := _replay(actor, idempotency_key, fingerprint)):
            return replay
        raise
    except GrantRequired as refusal:
        # A concurrent send with the same key may have used the grant.
        if idempotency_key and (replay := _replay(actor, idempotency_key, fingerprint)):
            return replay
        if request_approval:
            refusal.details["approval_request"] = authority.send_policy().request_approval(
                message, refusal.uncovered, collective)
        raise
    send_log.info("sent %s in %s at event %d", message.public_id, space.slug, message.position,
                  extra={"message_id": message.public_id, "space": space.slug,
                         "conversation_id": conversation.public_id, "event_position": message.position,
                         "recipients": len(recipients)})
    return SendResult(message, created=True)


def require_active_authority(message: Message) -> None:
    """Body access and handling need the authority the message was sent
    under to be active still: under explicit_only, every grant it recorded
    (SPEC §5). Revoked authority is never restored."""
    if Recipient.objects.filter(message=message).filter(authority.inactive()).exists():
        raise AuthorityRevoked()


def _own_recipient_row(message: Message, actor: Member) -> Recipient:
    row = Recipient.objects.select_for_update(no_key=True).filter(message=message, member=actor).first()
    if row is None:
        raise Forbidden("Only a recipient of this message may do this.")
    # Under the row lock: a barrier that has not yet settled this row sees
    # the change, and one that has is seen here.
    require_active_authority(message)
    return row


def acknowledge_message(message: Message, *, actor: Member) -> Recipient:
    """Mark the message acknowledged by `actor` (a recipient). Idempotent;
    does not resolve. Emits `message.acknowledged` the first time only."""
    with transaction.atomic():
        row = _own_recipient_row(message, actor)
        if row.acknowledged_at is None:
            row.acknowledged_at = now()
            if row.state == Recipient.State.PENDING:
                row.state = Recipient.State.ACKNOWLEDGED
            row.save(update_fields=["acknowledged_at", "state"])
            append_events([events.message_acknowledged(message, actor=actor)])
        return row


def resolve_message(message: Message, result: str, *, actor: Member) -> Recipient:
    """Resolve the message for `actor` with an explicit result. Resolving
    again with the same result is a no-op; a different one is CONFLICT."""
    encode_text(result, field="result", max_bytes=MAX_RESULT_BYTES, too_large=InvalidRequest)
    with transaction.atomic():
        row = _own_recipient_row(message, actor)
        if row.state == Recipient.State.RESOLVED:
            if row.result != result:
                raise Conflict("The message is already resolved with another result.")
            return row
        row.state, row.result, row.resolved_at = Recipient.State.RESOLVED, result, now()
        row.save(update_fields=["state", "result", "resolved_at"])
        append_events([events.message_resolved(message, result, actor=actor)])
        return row


def body_page(body: str, offset: int, max_bytes: int) -> tuple[str, int | None]:
    """The slice of `body`'s UTF-8 bytes from `offset`, at most `max_bytes`
    long and never splitting a scalar, and the next offset (None at the end)."""
    raw = body.encode("utf-8")
    end = min(offset + max_bytes, len(raw))
    # Back off continuation bytes (10xxxxxx) so the page ends on a scalar.
    while end < len(raw) and (raw[end] & 0xC0) == 0x80:
        end -= 1
    return raw[offset:end].decode("utf-8"), (end if end < len(raw) else None)
