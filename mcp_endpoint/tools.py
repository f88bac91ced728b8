"""The MCP tools: each one calls the service its REST route calls and
answers with the same shape.

| tool | REST route |
| --- | --- |
| `read_inbox {cursor?}` | `GET /v0/me/inbox` |
| `acknowledge_delivery {deliveryToken}` | `POST /v0/me/inbox/acknowledge` |
| `read_event {eventId}` | `GET /v0/inbox-events/{eventId}` |
| `send_message {space, conversation, body, …}` | `POST /v0/spaces/{slug}/conversations/{conv}/messages` |
| `answer {messageId, body}` | `POST /v0/messages/{id}/answer` |
| `read_answers {messageId}` | `GET /v0/messages/{id}/answers` |
| `get_coordination_context {page?}` | `GET /v0/me/snapshot` |
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controlplane.api.parsers import check_text
from controlplane.errors import InvalidIdempotencyKey, InvalidRequest
from controlplane.idempotency import is_valid_key
from controlplane.models import Member
from inbox import collectives, reads, services
from inbox.models import Collective
from inbox.render import render_sent
from mcp_endpoint.schemas import Checked

TOKEN = {"type": "string", "pattern": r"^dlv_[A-Za-z0-9_-]{43}$",
         "description": "A delivery token from read_inbox (dlv_ + 43 base64url characters)."}
# An event id, a cursor and an idempotency key are the services' to judge, with
# the API's codes (INVALID_EVENT_ID, INVALID_CURSOR, INVALID_IDEMPOTENCY_KEY):
# a schema of their shape would answer INVALID_REQUEST first.
EVENT_ID = {"type": "string", "description": "The delivery token with evt_ in place of dlv_ (evt_ + 43 "
                                             "base64url characters)."}
CURSOR = {"type": ["string", "null"], "description": "Where the previous page ended (none or null: the first page)."}
OBJECT = {"type": "object"}


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


@dataclass(frozen=True)
class Tool(Checked):
    name: str
    description: str
    input_schema: dict
    output_schema: dict
    run: Callable[[Member, dict], dict]
    read_only: bool = True
    idempotent: bool = True  # calling it again with the same arguments changes nothing more


def _send(member: Member, arguments: dict) -> dict:
    key = arguments.get("idempotency_key")
    if key is not None and not is_valid_key(key):
        raise InvalidIdempotencyKey()
    result = services.send_to(arguments["space"], arguments["conversation"], body=arguments["body"],
                              reply_to=arguments.get("reply_to"), related_paths=arguments.get("related_paths"),
                              idempotency_key=key, request_approval=arguments.get("request_approval", False),
                              collective=arguments.get("collective"), actor=member)
    return {"message": render_sent(result.message, result.created), "created": result.created}


def _answer(member: Member, arguments: dict) -> dict:
    answered, created = reads.answer(member, arguments["messageId"], arguments["body"])
    return {**answered, "created": created}


def _read_answers(member: Member, arguments: dict) -> dict:
    return reads.answers(member, arguments["messageId"])


def _read_inbox(member: Member, arguments: dict) -> dict:
    return reads.inbox_page(member, arguments.get("cursor"))


def _acknowledge(member: Member, arguments: dict) -> dict:
    return reads.acknowledge(member, arguments["deliveryToken"])


def _read_event(member: Member, arguments: dict) -> dict:
    return reads.read_event(member, arguments["eventId"])


def _context(member: Member, arguments: dict) -> dict:
    return reads.snapshot(member, arguments.get("page"))


ENTRY = _object({"deliveryToken": TOKEN, "item": OBJECT, "guidance": {"type": "string"},
                 "insertedAt": {"type": "string"}}, ("deliveryToken", "item", "insertedAt"))
TOOLS = {tool.name: tool for tool in [
    Tool("read_inbox",
         "One page of your pending inbox items (at most 50 items and 2 MiB), oldest first. Reading "
         "acknowledges nothing; pass nextCursor to continue.",
         _object({"cursor": CURSOR}),
         _object({"items": {"type": "array", "items": ENTRY}, "nextCursor": {"type": ["string", "null"]}},
                 ("items", "nextCursor")),
         _read_inbox),
    Tool("acknowledge_delivery",
         "Acknowledge one inbox item by its delivery token: it leaves your pending inbox. Idempotent; "
         "carries no content and authorizes nothing.",
         _object({"deliveryToken": TOKEN}, ("deliveryToken",)), _object({}), _acknowledge, read_only=False),
    Tool("read_event",
         "One inbox item by event id, from its retained row: also after acknowledgement, revocation (a "
         "tombstone without the content) and restart. No side effects.",
         _object({"eventId": EVENT_ID}, ("eventId",)),
         {"type": "object", "properties": {"item": OBJECT, "guidance": {"type": "string"},
                                           "state": {"const": "rejected"}, "reason": {"type": "string"}},
          "required": ["item"]},
         _read_event),
    Tool("send_message",
         "Send a message to a conversation of a space (a cnv_ id, or #name for a channel), with the API's "
         "rules: grants, limits, mentions and idempotency (the key is scoped to you; a retry with the same "
         "key and content returns the original message with created=false).",
         _object({"space": {"type": "string", "maxLength": 64, "description": "The space's slug."},
                  "conversation": {"type": "string", "maxLength": 81,  # "#" and a channel's 80
                                   "description": "A conversation id (cnv_…) or #name for a channel."},
                  "body": {"type": "string", "description": "UTF-8 text, at most 8 KiB encoded."},
                  "reply_to": {"type": ["string", "null"], "maxLength": 40},
                  "related_paths": {"type": "array", "items": {"type": "string"}},
                  "idempotency_key": {"type": "string", "description": "8–128 visible ASCII characters."},
                  "request_approval": {"type": "boolean", "description": "Without authority, retain the "
                                       "message for an admin to approve (needs idempotency_key)."},
                  "collective": _object({"op": {"enum": Collective.Op.values},
                                         "deadline_ms": {"type": "integer", "minimum": collectives.MIN_DEADLINE_MS,
                                                         "maximum": collectives.MAX_DEADLINE_MS}},
                                        ("op", "deadline_ms"))
                  | {"description": "Group conversations: ask every other member for an answer; one "
                                    "collective.result comes back (to everyone with all_gather)."}},
                 ("space", "conversation", "body")),
         _object({"message": OBJECT, "created": {"type": "boolean"}}, ("message", "created")),
         _send, read_only=False, idempotent=False),  # only with an idempotency_key
    Tool("answer",
         "Answer a collective request (an inbox item of kind collective.request) by its message id. Your "
         "answer goes into the result only; the same answer again returns it, a different one is refused.",
         _object({"messageId": {"type": "string", "maxLength": 40},
                  "body": {"type": "string", "description": "UTF-8 text, at most 8 KiB encoded."}},
                 ("messageId", "body")),
         _object({"answer": OBJECT, "created": {"type": "boolean"}}, ("answer", "created")),
         _answer, read_only=False),
    Tool("read_answers",
         "The answers of a completed collective request you asked (or, with all_gather, were asked), by its "
         "message id: what a collective.result carries, also when it came without them (answers_omitted).",
         _object({"messageId": {"type": "string", "maxLength": 40}}, ("messageId",)),
         _object({"ended": {"enum": ["all_answered", "deadline"]}, "answers": {"type": "array", "items": OBJECT}},
                 ("ended", "answers")),
         _read_answers),
    Tool("get_coordination_context",
         "A snapshot of your unresolved and unacknowledged messages as of one moment, with a feed cursor "
         "at its high watermark; pass next_page for the rest of the same snapshot.",
         _object({"page": CURSOR}),
         _object({"snapshot_id": {"type": "string"}, "high_watermark": {"type": "integer"},
                  "unresolved": {"type": "array", "items": OBJECT}, "next_page": {"type": ["string", "null"]},
                  "cursor": {"type": "string"}}, ("snapshot_id", "high_watermark", "unresolved", "cursor")),
         _context),
]}


def check_arguments(tool: Tool, arguments: dict | None) -> dict:
    """The arguments, checked as the API checks a body and against the
    tool's input schema (400, so InvalidParams, when they do not fit)."""
    arguments = {} if arguments is None else arguments
    check_text(arguments)  # as the API's parser: no NUL, no lone surrogate, no deep nesting
    if (problem := tool.problem(arguments)) is not None:
        raise InvalidRequest(f"{tool.name}: {problem}")
    return arguments
