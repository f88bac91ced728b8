"""Typed results: frozen dataclasses, one per resource of the API.

Each keeps the answer it was made from in `raw`, so a field the server adds
later is readable before this package knows it (`space.raw["new_field"]`);
fields this package knows but an older server leaves out are None.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Resource:
    raw: dict = field(default_factory=dict, repr=False, compare=False, hash=False, kw_only=True)
    nested: ClassVar[dict[str, type[Resource]]] = {}

    @classmethod
    def from_api(cls, data: dict | None):
        if data is None:
            return None
        values = {}
        for f in dataclasses.fields(cls):
            if f.name == "raw" or f.name not in data:
                continue
            value = data[f.name]
            kind = cls.nested.get(f.name)
            if kind is not None:
                value = tuple(kind.from_api(v) for v in value) if isinstance(value, list) else kind.from_api(value)
            elif isinstance(value, list):
                value = tuple(value)
            values[f.name] = value
        return cls(**values, raw=data)


def _optional(cls):
    """Every field defaults to None: an older server may leave one out."""
    for name in list(cls.__annotations__):
        if not hasattr(cls, name):
            setattr(cls, name, None)
    return dataclass(frozen=True)(cls)


@_optional
class Member(Resource):
    id: str
    handle: str
    display_name: str
    kind: str
    status: str
    is_admin: bool
    created_at: str


@_optional
class Credential(Resource):
    id: str
    created_at: str
    token: str = field(default=None, repr=False)  # only in the answer that created it; never in a repr


@_optional
class Space(Resource):
    id: str
    slug: str
    name: str
    visibility: str
    send_policy: str
    archived: bool


@_optional
class MySpace(Space):
    """A space of the caller's (`GET /v0/me/spaces`) with the caller's role and membership status."""
    role: str
    status: str


@_optional
class Membership(Resource):
    member: str
    role: str
    status: str
    updated_at: str


@_optional
class Conversation(Resource):
    id: str
    kind: str
    space: str
    name: str
    members: tuple


@_optional
class Message(Resource):
    id: str
    conversation: str
    space: str
    author: str
    body: str
    body_withheld: str
    reply_to: str
    related_paths: tuple
    mentions: tuple
    created_at: str
    position: int


@_optional
class Recipient(Resource):
    member: str
    state: str
    acknowledged_at: str
    resolved_at: str
    result: str
    rejected_at: str
    reason: str


@_optional
class MessageStatus(Resource):
    """`GET /v0/messages/{id}`: metadata and each recipient's handling state."""
    id: str
    conversation: str
    space: str
    author: str
    reply_to: str
    related_paths: tuple
    mentions: tuple
    created_at: str
    position: int
    body_bytes: int
    recipients: tuple
    nested = {"recipients": Recipient}


@_optional
class BodyPage(Resource):
    body: str
    total_bytes: int
    cursor: str
    has_more: bool


@_optional
class Answer(Resource):
    message: str
    member: str
    body: str
    answered_at: str


@_optional
class ResultAnswer(Resource):
    member: str
    answer: str
    answered_at: str
    missing: bool
    reason: str  # of a missing answer that was given: "grant_required"


@_optional
class CollectiveAnswers(Resource):
    """A completed collective request's answers, in membership order."""
    ended: str
    answers: tuple
    nested = {"answers": ResultAnswer}


@_optional
class Event(Resource):
    id: str
    position: int
    kind: str
    space: str
    conversation: str
    actor: str
    created_at: str
    data: dict


@_optional
class InboxEntry(Resource):
    """An inbox item with its delivery token (`item` is the classified payload)."""
    deliveryToken: str  # noqa: N815 - the API's name
    item: dict
    guidance: str
    insertedAt: str  # noqa: N815

    @property
    def token(self) -> str:
        return self.deliveryToken

    @property
    def kind(self) -> str | None:
        return (self.item or {}).get("kind")


@_optional
class InboxEvent(Resource):
    """`GET /v0/inbox-events/{id}`: the retained item, also after acknowledgement."""
    item: dict
    state: str
    reason: str
    guidance: str


@_optional
class SnapshotItem(Resource):
    message: Message
    state: str
    acknowledged_at: str
    nested = {"message": Message}


@_optional
class Snapshot(Resource):
    snapshot_id: str
    high_watermark: int
    unresolved: tuple
    next_page: str
    cursor: str
    nested = {"unresolved": SnapshotItem}


@_optional
class Grant(Resource):
    id: str
    space: str
    kind: str
    sender: str
    recipient: str
    idempotency_key: str
    expires_at: str
    status: str
    generation: int
    message: str
    created_by: str
    created_at: str
    barrier_started_at: str
    ended_at: str


@_optional
class ApprovalRequest(Resource):
    id: str
    status: str
    space: str
    conversation: str
    sender: str
    recipients: tuple
    idempotency_key: str
    body: str
    reply_to: str
    related_paths: tuple
    collective: dict
    fingerprint: str
    created_at: str
    decided_by: str
    decided_at: str
    reason: str
    message: str


@_optional
class Endpoint(Resource):
    id: str
    url: str
    has_secret: bool
    verified: bool
    verified_at: str
    created_at: str


@_optional
class Subscription(Resource):
    id: str
    scope: str
    endpoint_id: str
    owner: str
    space: str
    subjects: tuple
    exclude_self: bool
    debounce_ms: int
    status: str
    version: int
    suspended: dict
    created_at: str
    mcp: dict


@_optional
class Activation(Resource):
    activation_cursor: str
    subscription: Subscription
    nested = {"subscription": Subscription}


@_optional
class Attempt(Resource):
    number: int
    at: str
    duration_ms: int
    status_code: int
    error_class: str


@_optional
class Delivery(Resource):
    id: str
    state: str
    attempts: tuple
    replay_of: str
    created_at: str
    finished_at: str
    next_attempt_at: str
    nested = {"attempts": Attempt}


@_optional
class SigningKey(Resource):
    key_id: str
    algorithm: str
    public_key: str
    status: str


@_optional
class Task(Resource):
    id: str
    space: str
    title: str
    description: str
    status: str
    assignee: str
    reviewer: str
    claimant: str
    claimed_at: str
    conversation: str
    created_by: str
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: `items`, the `cursor` to pass for the next page
    (None when the list does not page) and whether `has_more` follows."""
    items: tuple[T, ...]
    cursor: str | None
    has_more: bool
    raw: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def page_of(kind: type[Resource], name: str, data: dict, *, cursor_field: str = "cursor") -> Page:
    cursor = data.get(cursor_field)
    has_more = data.get("has_more", cursor is not None if cursor_field == "nextCursor" else False)
    return Page(tuple(kind.from_api(x) for x in data.get(name) or ()), cursor, bool(has_more), raw=data)


def as_dict(resource: Any) -> Any:
    """A result as plain JSON data (what the API answered)."""
    if isinstance(resource, Page):
        return resource.raw
    if isinstance(resource, Resource):
        return resource.raw
    return resource
