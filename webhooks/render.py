"""JSON shapes of receivers, subscriptions, deliveries and signing keys,
as webhooks/api/serializers.py declares them."""
from __future__ import annotations

from controlplane.clock import rfc3339
from webhooks.models import Delivery, Endpoint, SigningKey, Subscription
from webhooks.services import is_verified


def render_endpoint(endpoint: Endpoint) -> dict:
    return {"id": endpoint.public_id, "url": endpoint.url, "has_secret": endpoint.secret is not None,
            "verified": is_verified(endpoint), "verified_at": rfc3339(endpoint.verified_at),
            "created_at": rfc3339(endpoint.created_at)}


def render_subscription(subscription: Subscription) -> dict:
    data = {"id": subscription.public_id, "endpoint_id": subscription.endpoint.public_id,
            "owner": f"@{subscription.owner.handle}"}
    if subscription.kind == Subscription.Kind.SPACE:
        data |= {"scope": "space", "space": subscription.space.slug, "subjects": subscription.subjects,
                 "exclude_self": subscription.exclude_self}
    else:
        data |= {"scope": "inbox_items" if subscription.kind == Subscription.Kind.ITEM else "inbox_events"}
    suspended = None
    if subscription.status == Subscription.Status.SUSPENDED:
        suspended = {"reason": subscription.suspended_reason, "last_error": subscription.suspended_error,
                     "at": rfc3339(subscription.suspended_at), "terminal": subscription.terminal}
    return data | {"debounce_ms": subscription.debounce_ms, "status": subscription.status,
                   "version": subscription.version, "suspended": suspended,
                   "created_at": rfc3339(subscription.created_at),
                   "mcp": {"event": subscription.mcp_name, "lease_expires_at": rfc3339(subscription.lease_expires_at)}
                   if subscription.managed else None}


def render_delivery(delivery: Delivery) -> dict:
    attempts = [{"number": a.number, "at": rfc3339(a.started_at), "duration_ms": a.duration_ms,
                 "status_code": a.status_code, "error_class": a.error_class}
                for a in sorted(delivery.attempt_rows.all(), key=lambda a: a.number)]
    return {"id": delivery.public_id, "state": delivery.state, "attempts": attempts,
            "replay_of": delivery.replay_of.public_id if delivery.replay_of_id else None,
            "created_at": rfc3339(delivery.created_at), "finished_at": rfc3339(delivery.finished_at),
            "next_attempt_at": rfc3339(delivery.due_at) if delivery.state == Delivery.State.PENDING else None}


def render_key(key: SigningKey) -> dict:
    return {"key_id": key.key_id, "algorithm": "ed25519", "public_key": key.public_key, "status": key.status}
