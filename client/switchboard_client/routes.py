"""Every route of the API, once: its method, its path under /v0/, and whether
it takes an `Idempotency-Key` (SPEC §2). The sync and the async client both
build their requests from this table (tests/client/test_routes.py checks it
against the server's OpenAPI schema, so a new route cannot be missed)."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # under /v0/, with {placeholders} named as in the OpenAPI schema
    idempotent: bool = False  # accepts Idempotency-Key: the client sets one, and may retry with it

    @property
    def replay_safe(self) -> bool:
        """A repeat cannot do the work twice: reads, deletes, and keyed writes."""
        return self.method in ("GET", "DELETE", "PUT") or self.idempotent

    def url(self, **params: str) -> str:
        return self.path.format(**{k: quote(str(v), safe="@") for k, v in params.items()})


def _r(method: str, path: str, idempotent: bool = False) -> Route:
    return Route(method, path, idempotent)


ROUTES: dict[str, Route] = {
    # members and credentials
    "get_me": _r("GET", "me"),
    "list_my_spaces": _r("GET", "me/spaces"),
    "list_credentials": _r("GET", "me/credentials"),
    "create_credential": _r("POST", "me/credentials", True),
    "delete_credential": _r("DELETE", "me/credentials/{credential_id}"),
    "create_member": _r("POST", "members", True),
    # spaces and their members
    "create_space": _r("POST", "spaces", True),
    "get_space": _r("GET", "spaces/{slug}"),
    "join_space": _r("POST", "spaces/{slug}/join", True),
    "list_space_members": _r("GET", "spaces/{slug}/members"),
    "add_space_member": _r("POST", "spaces/{slug}/members", True),
    "remove_space_member": _r("DELETE", "spaces/{slug}/members/{handle}"),
    # conversations
    "list_conversations": _r("GET", "spaces/{slug}/conversations"),
    "open_direct": _r("POST", "spaces/{slug}/direct", True),
    "create_channel": _r("POST", "spaces/{slug}/channels", True),
    "create_group": _r("POST", "spaces/{slug}/groups", True),
    # messages
    "send_message": _r("POST", "spaces/{slug}/conversations/{conversation}/messages", True),
    "get_message": _r("GET", "messages/{message_id}"),
    "get_message_body": _r("GET", "messages/{message_id}/body"),
    "acknowledge_message": _r("POST", "messages/{message_id}/acknowledge", True),
    "resolve_message": _r("POST", "messages/{message_id}/resolve", True),
    "answer_collective": _r("POST", "messages/{message_id}/answer", True),
    "read_collective_answers": _r("GET", "messages/{message_id}/answers"),
    # feeds and snapshots
    "space_events": _r("GET", "spaces/{slug}/events"),
    "inbox_events": _r("GET", "me/inbox/events"),
    "get_snapshot": _r("GET", "me/snapshot"),
    # the durable inbox and its firewall
    "read_inbox": _r("GET", "me/inbox"),
    "acknowledge_delivery": _r("POST", "me/inbox/acknowledge", True),
    "read_event": _r("GET", "inbox-events/{event_id}"),
    "get_inbox_firewall": _r("GET", "me/inbox/firewall"),
    "set_inbox_firewall": _r("PUT", "me/inbox/firewall"),
    "list_held_items": _r("GET", "me/inbox/held"),
    "release_held_item": _r("POST", "me/inbox/held/release", True),
    # grants and approvals
    "list_grants": _r("GET", "spaces/{slug}/grants"),
    "create_grant": _r("POST", "spaces/{slug}/grants", True),
    "get_space_grant": _r("GET", "spaces/{slug}/grants/{grant_id}"),
    "revoke_space_grant": _r("POST", "spaces/{slug}/grants/{grant_id}/revoke", True),
    "get_grant": _r("GET", "grants/{grant_id}"),
    "revoke_grant": _r("POST", "grants/{grant_id}/revoke", True),
    "list_approval_requests": _r("GET", "approval-requests"),
    "get_approval_request": _r("GET", "approval-requests/{request_id}"),
    "approve_request": _r("POST", "approval-requests/{request_id}/approve", True),
    "deny_request": _r("POST", "approval-requests/{request_id}/deny", True),
    # tasks
    "list_tasks": _r("GET", "spaces/{slug}/tasks"),
    "create_task": _r("POST", "spaces/{slug}/tasks", True),
    "get_task": _r("GET", "spaces/{slug}/tasks/{task_id}"),
    "update_task": _r("PATCH", "spaces/{slug}/tasks/{task_id}", True),
    **{f"{action}_task": _r("POST", f"spaces/{{slug}}/tasks/{{task_id}}/{action}", True)
       for action in ("claim", "release", "submit", "complete", "reopen")},
    # webhooks
    "list_webhook_endpoints": _r("GET", "webhook-endpoints"),
    "create_webhook_endpoint": _r("POST", "webhook-endpoints", True),
    "get_webhook_endpoint": _r("GET", "webhook-endpoints/{endpoint_id}"),
    "delete_webhook_endpoint": _r("DELETE", "webhook-endpoints/{endpoint_id}"),
    "verify_webhook_endpoint": _r("POST", "webhook-endpoints/{endpoint_id}/verify", True),
    "list_space_subscriptions": _r("GET", "spaces/{slug}/webhook-subscriptions"),
    "create_space_subscription": _r("POST", "spaces/{slug}/webhook-subscriptions", True),
    "get_space_subscription": _r("GET", "spaces/{slug}/webhook-subscriptions/{subscription_id}"),
    "update_space_subscription": _r("PATCH", "spaces/{slug}/webhook-subscriptions/{subscription_id}", True),
    "delete_space_subscription": _r("DELETE", "spaces/{slug}/webhook-subscriptions/{subscription_id}"),
    "activate_space_subscription": _r("POST", "spaces/{slug}/webhook-subscriptions/{subscription_id}/activate",
                                      True),
    "list_inbox_subscriptions": _r("GET", "me/inbox-subscriptions"),
    "create_inbox_subscription": _r("POST", "me/inbox-subscriptions", True),
    "get_inbox_subscription": _r("GET", "me/inbox-subscriptions/{subscription_id}"),
    "update_inbox_subscription": _r("PATCH", "me/inbox-subscriptions/{subscription_id}", True),
    "delete_inbox_subscription": _r("DELETE", "me/inbox-subscriptions/{subscription_id}"),
    "activate_inbox_subscription": _r("POST", "me/inbox-subscriptions/{subscription_id}/activate", True),
    "list_deliveries": _r("GET", "webhook-subscriptions/{subscription_id}/deliveries"),
    "replay_delivery": _r("POST", "webhook-deliveries/{delivery_id}/replay", True),
    "list_webhook_signing_keys": _r("GET", "webhook-signing-keys"),
}
