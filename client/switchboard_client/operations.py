"""The API's operations, written once for both clients.

Each method builds a `Call` from the route table and hands it to
`self._run`: `Client` runs it and returns the result, `AsyncClient` returns
an awaitable of the same result. Writes that accept an Idempotency-Key get
one chosen here (or the caller's `idempotency_key=`), so every retry of the
call repeats the same key and the server does the work at most once.
"""
from __future__ import annotations

from typing import Any

from switchboard_client import errors
from switchboard_client import models as m
from switchboard_client.routes import ROUTES
from switchboard_client.transport import Call, new_idempotency_key

LONG_POLL_SLACK = 30.0  # seconds of read timeout beyond the server's wait
_ABSENT = object()


def _one(kind, name):
    return lambda data: kind.from_api(data[name])


def _page(kind, name, cursor_field="cursor"):
    return lambda data: m.page_of(kind, name, data, cursor_field=cursor_field)


def _nothing(data):
    return None


TASK_ACTIONS = ("claim", "release", "submit", "complete", "reopen")


def _body(**fields) -> dict:
    """A JSON body without the fields left out (None)."""
    return {k: v for k, v in fields.items() if v is not None}


def handle(member: str) -> str:
    return member if member.startswith("@") else f"@{member}"


class Operations:
    """Every REST route of SPEC §3–§10 as a method. See docs/client.md."""

    def _run(self, call: Call) -> Any:  # pragma: no cover - the clients define it
        raise NotImplementedError

    def _call(self, name: str, parse, *, params: dict | None = None, json: Any = _ABSENT,
              idempotency_key: str | None = None, timeout: float | None = None, **path) -> Any:
        route = ROUTES[name]
        if route.idempotent and idempotency_key is None:
            idempotency_key = new_idempotency_key()
        if json is _ABSENT and route.method in ("POST", "PATCH", "PUT"):
            json = {}
        return self._run(Call(route, route.url(**path), parse, params=params, json=None if json is _ABSENT else json,
                              idempotency_key=idempotency_key if route.idempotent else None, timeout=timeout,
                              has_body=json is not _ABSENT))

    # --- members and credentials (SPEC §3)
    def me(self) -> m.Member:
        return self._call("get_me", _one(m.Member, "member"))

    def my_spaces(self, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.MySpace]:
        """The caller's spaces (and pending join requests), each with `role` and `status`."""
        return self._call("list_my_spaces", _page(m.MySpace, "spaces"), params={"cursor": cursor, "limit": limit})

    def credentials(self) -> m.Page[m.Credential]:
        return self._call("list_credentials", _page(m.Credential, "credentials"))

    def create_credential(self, name: str | None = None, *, idempotency_key: str | None = None) -> m.Credential:
        """A new token for the caller (`.token`, shown this once). Should its
        answer be lost, the retry's answer has no token (the server keeps
        none): `TOKEN_LOST`, naming the credential to delete."""
        return self._call("create_credential", _fresh_credential, json=_body(name=name),
                          idempotency_key=idempotency_key)

    def delete_credential(self, credential_id: str) -> None:
        return self._call("delete_credential", _nothing, credential_id=credential_id)

    def create_member(self, handle: str, *, kind: str | None = None, display_name: str | None = None,
                      is_admin: bool | None = None, idempotency_key: str | None = None) -> m.Member:
        """Admins only."""
        return self._call("create_member", _one(m.Member, "member"), idempotency_key=idempotency_key,
                          json=_body(handle=handle.lstrip("@"), kind=kind, display_name=display_name,
                                     is_admin=is_admin))

    # --- spaces and members
    def create_space(self, slug: str, name: str, *, visibility: str | None = None, send_policy: str | None = None,
                     idempotency_key: str | None = None) -> m.Space:
        return self._call("create_space", _one(m.Space, "space"), idempotency_key=idempotency_key,
                          json=_body(slug=slug, name=name, visibility=visibility, send_policy=send_policy))

    def space(self, slug: str) -> m.Space:
        return self._call("get_space", _one(m.Space, "space"), slug=slug)

    def join_space(self, slug: str, *, idempotency_key: str | None = None) -> m.Membership:
        return self._call("join_space", _one(m.Membership, "membership"), slug=slug, idempotency_key=idempotency_key)

    def space_members(self, slug: str, *, cursor: str | None = None,
                      limit: int | None = None) -> m.Page[m.Membership]:
        return self._call("list_space_members", _page(m.Membership, "members"), slug=slug,
                          params={"cursor": cursor, "limit": limit})

    def add_space_member(self, slug: str, member: str, *, role: str | None = None,
                         idempotency_key: str | None = None) -> m.Membership:
        """Owners; admits a pending join request too."""
        return self._call("add_space_member", _one(m.Membership, "membership"), slug=slug,
                          json=_body(member=handle(member), role=role), idempotency_key=idempotency_key)

    def remove_space_member(self, slug: str, member: str) -> None:
        return self._call("remove_space_member", _nothing, slug=slug, handle=member.lstrip("@"))

    # --- conversations
    def conversations(self, slug: str, *, cursor: str | None = None,
                      limit: int | None = None) -> m.Page[m.Conversation]:
        return self._call("list_conversations", _page(m.Conversation, "conversations"), slug=slug,
                          params={"cursor": cursor, "limit": limit})

    def open_direct(self, slug: str, member: str, *, idempotency_key: str | None = None) -> m.Conversation:
        """The direct conversation with `member` (the same pair always gets the same one)."""
        return self._call("open_direct", _one(m.Conversation, "conversation"), slug=slug,
                          json={"member": handle(member)}, idempotency_key=idempotency_key)

    def create_channel(self, slug: str, name: str, *, idempotency_key: str | None = None) -> m.Conversation:
        return self._call("create_channel", _one(m.Conversation, "conversation"), slug=slug,
                          json={"name": name.lstrip("#")}, idempotency_key=idempotency_key)

    def create_group(self, slug: str, members: list[str], *,
                     idempotency_key: str | None = None) -> m.Conversation:
        return self._call("create_group", _one(m.Conversation, "conversation"), slug=slug,
                          json={"members": [handle(x) for x in members]}, idempotency_key=idempotency_key)

    # --- messages (SPEC §4, §7b)
    def send(self, space: str, conversation: str, body: str, *, reply_to: str | None = None,
             related_paths: list[str] | None = None, request_approval: bool | None = None,
             collective: dict | None = None, idempotency_key: str | None = None) -> m.Message:
        """Send `body` to a conversation (its id, or `#name` for a channel).

        Always carries an Idempotency-Key (yours, or a fresh one reused by
        every retry of this call), so a retried send never duplicates."""
        return self._call("send_message", _one(m.Message, "message"), slug=space, conversation=conversation,
                          idempotency_key=idempotency_key,
                          json=_body(body=body, reply_to=reply_to, related_paths=related_paths,
                                     request_approval=request_approval, collective=collective))

    def message(self, message_id: str) -> m.MessageStatus:
        return self._call("get_message", _one(m.MessageStatus, "message"), message_id=message_id)

    def message_body(self, message_id: str, *, cursor: str | None = None,
                     max_bytes: int | None = None) -> m.BodyPage:
        return self._call("get_message_body", m.BodyPage.from_api, message_id=message_id,
                          params={"cursor": cursor, "max_bytes": max_bytes})

    def acknowledge_message(self, message_id: str, *, idempotency_key: str | None = None) -> m.MessageStatus:
        return self._call("acknowledge_message", _one(m.MessageStatus, "message"), message_id=message_id,
                          idempotency_key=idempotency_key)

    def resolve_message(self, message_id: str, result: str, *,
                        idempotency_key: str | None = None) -> m.MessageStatus:
        return self._call("resolve_message", _one(m.MessageStatus, "message"), message_id=message_id,
                          json={"result": result}, idempotency_key=idempotency_key)

    def answer(self, message_id: str, body: str, *, idempotency_key: str | None = None) -> m.Answer:
        """Answer a collective request."""
        return self._call("answer_collective", _one(m.Answer, "answer"), message_id=message_id,
                          json={"body": body}, idempotency_key=idempotency_key)

    def read_answers(self, message_id: str) -> m.CollectiveAnswers:
        """The answers of a completed collective request you are owed the
        outcome of (also when its result came without them)."""
        return self._call("read_collective_answers", m.CollectiveAnswers.from_api, message_id=message_id)

    # --- feeds (SPEC §6)
    def space_events(self, slug: str, *, cursor: str | None = None, limit: int | None = None,
                     wait_ms: int | None = None) -> m.Page[m.Event]:
        return self._call("space_events", _page(m.Event, "events"), slug=slug, timeout=_poll_timeout(wait_ms),
                          params={"cursor": cursor, "limit": limit, "wait_ms": wait_ms})

    def inbox_events(self, *, cursor: str | None = None, limit: int | None = None,
                     wait_ms: int | None = None) -> m.Page[m.Event]:
        return self._call("inbox_events", _page(m.Event, "events"), timeout=_poll_timeout(wait_ms),
                          params={"cursor": cursor, "limit": limit, "wait_ms": wait_ms})

    def snapshot(self, *, page: str | None = None) -> m.Snapshot:
        """Unresolved messages and a feed cursor at the high watermark, in one transaction."""
        return self._call("get_snapshot", m.Snapshot.from_api, params={"page": page})

    # --- the durable inbox (SPEC §7)
    def read_inbox(self, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.InboxEntry]:
        """One page of pending items; reading acknowledges nothing."""
        return self._call("read_inbox", _page(m.InboxEntry, "items", "nextCursor"),
                          params={"cursor": cursor, "limit": limit})

    def acknowledge(self, delivery_token: str, *, idempotency_key: str | None = None) -> None:
        """Acknowledge one inbox item (idempotent)."""
        return self._call("acknowledge_delivery", _nothing, json={"deliveryToken": delivery_token},
                          idempotency_key=idempotency_key)

    def read_event(self, event_id: str) -> m.InboxEvent:
        """The retained item of `evt_…` (a delivery token with `evt_` for `dlv_`)."""
        return self._call("read_event", m.InboxEvent.from_api, event_id=event_id)

    def firewall(self) -> tuple[dict, ...]:
        return self._call("get_inbox_firewall", lambda data: tuple(data["rules"]))

    def set_firewall(self, rules: list[dict]) -> tuple[dict, ...]:
        """Replace the inbox firewall's ordered rules."""
        return self._call("set_inbox_firewall", lambda data: tuple(data["rules"]), json={"rules": rules})

    def held_items(self, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.InboxEntry]:
        """Items the firewall holds (owner's audit), a page at a time."""
        return self._call("list_held_items", _page(m.InboxEntry, "items", "nextCursor"),
                          params={"cursor": cursor, "limit": limit})

    def release_held(self, delivery_token: str, *, idempotency_key: str | None = None) -> m.InboxEntry:
        return self._call("release_held_item", _one(m.InboxEntry, "item"), json={"deliveryToken": delivery_token},
                          idempotency_key=idempotency_key)

    # --- grants and approvals (SPEC §5)
    def grants(self, slug: str, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.Grant]:
        return self._call("list_grants", _page(m.Grant, "grants"), slug=slug,
                          params={"cursor": cursor, "limit": limit})

    def create_grant(self, slug: str, grant_id: str, kind: str, *, sender: str | None = None,
                     recipient: str | None = None, message_key: str | None = None, expires_at: str | None = None,
                     idempotency_key: str | None = None) -> m.Grant:
        """`message_key` is the one-message grant's sender-scoped Idempotency-Key."""
        return self._call("create_grant", _one(m.Grant, "grant"), slug=slug, idempotency_key=idempotency_key,
                          json=_body(id=grant_id, kind=kind, sender=sender and handle(sender),
                                     recipient=recipient and handle(recipient), idempotency_key=message_key,
                                     expires_at=expires_at))

    def grant(self, grant_id: str, *, space: str | None = None) -> m.Grant:
        if space is not None:
            return self._call("get_space_grant", _one(m.Grant, "grant"), slug=space, grant_id=grant_id)
        return self._call("get_grant", _one(m.Grant, "grant"), grant_id=grant_id)

    def revoke_grant(self, grant_id: str, *, space: str | None = None) -> m.Grant:
        """Start the revocation barrier (`status` becomes `revoking`, then `revoked`)."""
        if space is not None:
            return self._call("revoke_space_grant", _one(m.Grant, "grant"), slug=space, grant_id=grant_id)
        return self._call("revoke_grant", _one(m.Grant, "grant"), grant_id=grant_id)

    def approval_requests(self, *, status: str | None = None, cursor: str | None = None,
                          limit: int | None = None) -> m.Page[m.ApprovalRequest]:
        return self._call("list_approval_requests", _page(m.ApprovalRequest, "approval_requests"),
                          params={"status": status, "cursor": cursor, "limit": limit})

    def approval_request(self, request_id: str) -> m.ApprovalRequest:
        return self._call("get_approval_request", _one(m.ApprovalRequest, "approval_request"), request_id=request_id)

    def approve(self, request_id: str) -> m.ApprovalRequest:
        """Admins: grant and send the retained message exactly as it was asked for."""
        return self._call("approve_request", _one(m.ApprovalRequest, "approval_request"), request_id=request_id)

    def deny(self, request_id: str, reason: str) -> m.ApprovalRequest:
        return self._call("deny_request", _one(m.ApprovalRequest, "approval_request"), request_id=request_id,
                          json={"reason": reason})

    # --- tasks (SPEC §10)
    def tasks(self, slug: str, *, status: str | None = None, cursor: str | None = None,
              limit: int | None = None) -> m.Page[m.Task]:
        return self._call("list_tasks", _page(m.Task, "tasks"), slug=slug,
                          params={"status": status, "cursor": cursor, "limit": limit})

    def create_task(self, slug: str, title: str, *, description: str | None = None, assignee: str | None = None,
                    reviewer: str | None = None, idempotency_key: str | None = None) -> m.Task:
        return self._call("create_task", _one(m.Task, "task"), slug=slug, idempotency_key=idempotency_key,
                          json=_body(title=title, description=description, assignee=assignee and handle(assignee),
                                     reviewer=reviewer and handle(reviewer)))

    def task(self, slug: str, task_id: str) -> m.Task:
        return self._call("get_task", _one(m.Task, "task"), slug=slug, task_id=task_id)

    def update_task(self, slug: str, task_id: str, *, idempotency_key: str | None = None, **fields) -> m.Task:
        """Change `title`, `description`, `assignee` or `reviewer`: the fields
        given, `assignee=None` or `reviewer=None` to clear one."""
        return self._call("update_task", _one(m.Task, "task"), slug=slug, task_id=task_id, json=fields,
                          idempotency_key=idempotency_key)

    def task_action(self, slug: str, task_id: str, action: str, *, idempotency_key: str | None = None) -> m.Task:
        """`claim`, `release`, `submit`, `complete` or `reopen`."""
        if action not in TASK_ACTIONS:
            raise ValueError(f"a task's action is one of {', '.join(TASK_ACTIONS)}, not {action!r}")
        return self._call(f"{action}_task", _one(m.Task, "task"), slug=slug, task_id=task_id,
                          idempotency_key=idempotency_key)

    # --- webhooks (SPEC §8)
    def endpoints(self, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.Endpoint]:
        return self._call("list_webhook_endpoints", _page(m.Endpoint, "endpoints"),
                          params={"cursor": cursor, "limit": limit})

    def create_endpoint(self, url: str, *, secret: str | None = None,
                        idempotency_key: str | None = None) -> m.Endpoint:
        return self._call("create_webhook_endpoint", _one(m.Endpoint, "endpoint"),
                          json=_body(url=url, secret=secret), idempotency_key=idempotency_key)

    def endpoint(self, endpoint_id: str) -> m.Endpoint:
        return self._call("get_webhook_endpoint", _one(m.Endpoint, "endpoint"), endpoint_id=endpoint_id)

    def delete_endpoint(self, endpoint_id: str) -> None:
        return self._call("delete_webhook_endpoint", _nothing, endpoint_id=endpoint_id)

    def verify_endpoint(self, endpoint_id: str) -> str:
        """Have the server send the signed challenge; the `verified_at` time."""
        return self._call("verify_webhook_endpoint", lambda data: data["verified_at"], endpoint_id=endpoint_id,
                          timeout=60.0)

    def space_subscriptions(self, slug: str, *, cursor: str | None = None,
                            limit: int | None = None) -> m.Page[m.Subscription]:
        return self._call("list_space_subscriptions", _page(m.Subscription, "subscriptions"), slug=slug,
                          params={"cursor": cursor, "limit": limit})

    def create_space_subscription(self, slug: str, endpoint_id: str, *, subjects: list[dict] | None = None,
                                  exclude_self: bool | None = None, debounce_ms: int | None = None,
                                  idempotency_key: str | None = None) -> m.Subscription:
        return self._call("create_space_subscription", _one(m.Subscription, "subscription"), slug=slug,
                          idempotency_key=idempotency_key,
                          json=_body(endpoint_id=endpoint_id, subjects=subjects, exclude_self=exclude_self,
                                     debounce_ms=debounce_ms))

    def inbox_subscriptions(self, *, cursor: str | None = None, limit: int | None = None) -> m.Page[m.Subscription]:
        return self._call("list_inbox_subscriptions", _page(m.Subscription, "subscriptions"),
                          params={"cursor": cursor, "limit": limit})

    def create_inbox_subscription(self, endpoint_id: str, *, debounce_ms: int | None = None,
                                  idempotency_key: str | None = None) -> m.Subscription:
        return self._call("create_inbox_subscription", _one(m.Subscription, "subscription"),
                          json=_body(endpoint_id=endpoint_id, debounce_ms=debounce_ms),
                          idempotency_key=idempotency_key)

    def subscription(self, subscription_id: str, *, space: str | None = None) -> m.Subscription:
        """An inbox subscription, or a space subscription when `space` is given."""
        return self._call(*_scoped("get", space), _one(m.Subscription, "subscription"),
                          subscription_id=subscription_id, **_slug(space))

    def update_subscription(self, subscription_id: str, *, space: str | None = None, status: str | None = None,
                            debounce_ms: int | None = None, idempotency_key: str | None = None) -> m.Subscription:
        """Pause (`status="paused"`), resume (`"active"`) or change `debounce_ms`."""
        return self._call(*_scoped("update", space), _one(m.Subscription, "subscription"),
                          subscription_id=subscription_id, json=_body(status=status, debounce_ms=debounce_ms),
                          idempotency_key=idempotency_key, **_slug(space))

    def delete_subscription(self, subscription_id: str, *, space: str | None = None) -> None:
        return self._call(*_scoped("delete", space), _nothing, subscription_id=subscription_id, **_slug(space))

    def activate_subscription(self, subscription_id: str, *, space: str | None = None) -> m.Activation:
        """Only events committed after this qualify; keep `.activation_cursor` as your first checkpoint."""
        return self._call(*_scoped("activate", space), m.Activation.from_api, subscription_id=subscription_id,
                          **_slug(space))

    def deliveries(self, subscription_id: str, *, cursor: str | None = None,
                   limit: int | None = None) -> m.Page[m.Delivery]:
        return self._call("list_deliveries", _page(m.Delivery, "deliveries"), subscription_id=subscription_id,
                          params={"cursor": cursor, "limit": limit})

    def replay_delivery(self, delivery_id: str, *, idempotency_key: str | None = None) -> m.Delivery:
        """Send the same range again, as a new wake with a new id (once per
        `idempotency_key`, however often the call is retried)."""
        return self._call("replay_delivery", _one(m.Delivery, "delivery"), delivery_id=delivery_id,
                          idempotency_key=idempotency_key)

    def signing_keys(self) -> tuple[m.SigningKey, ...]:
        """The published wake-signing keys (anonymous)."""
        return self._call("list_webhook_signing_keys", lambda data: tuple(m.SigningKey.from_api(k)
                                                                          for k in data["keys"]))


def _poll_timeout(wait_ms: int | None) -> float | None:
    return None if not wait_ms else wait_ms / 1000 + LONG_POLL_SLACK


def _scoped(verb: str, space: str | None) -> tuple[str]:
    return (f"{verb}_{'space' if space is not None else 'inbox'}_subscription",)


def _slug(space: str | None) -> dict:
    return {} if space is None else {"slug": space}


def _fresh_credential(data: Any) -> m.Credential:
    credential = m.Credential.from_api(data)
    if credential.token is None:
        raise errors.ConflictError(
            f"The credential {credential.id} was made, but the answer with its token was lost, and the server shows "
            "a token once: delete that credential and make another.", status=200, code="TOKEN_LOST",
            details={"credential": credential.id})
    return credential
