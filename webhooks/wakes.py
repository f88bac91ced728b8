"""A wake's body as its receiver gets it (SPEC §8): which subscription,
and the range of the owner's feed to read, as cursors valid there."""
from __future__ import annotations

import json

from django.conf import settings

from controlplane.clock import rfc3339
from controlplane.cursors import caller_id, pack_cursor
from webhooks.models import Delivery, Subscription


def feed_cursor(subscription: Subscription, position: int) -> str:
    """A cursor for the owner's feed this subscription follows (the space
    feed, or the inbox feed), at `position`."""
    stream = f"space:{subscription.space.public_id}" if subscription.kind == Subscription.Kind.SPACE else "inbox"
    return pack_cursor((position,), caller=caller_id(subscription.owner), stream=stream)


def wake_body(delivery: Delivery) -> str:
    """The wake as the receiver gets it: cursors valid for the owner's feed."""
    subscription = delivery.subscription
    kind = ("spaces.events.available" if subscription.kind == Subscription.Kind.SPACE
            else "spaces.inbox_events.available")

    def cursor(position: int) -> str:
        return feed_cursor(subscription, position)

    body = {"type": kind, "id": delivery.public_id, "issuer": _issuer(),
            "subscription": {"id": subscription.public_id, "version": subscription.version}}
    if subscription.kind == Subscription.Kind.SPACE:
        body["space"] = subscription.space.slug
    body["event_range"] = {"after": cursor(delivery.after_position), "through": cursor(delivery.through_position)}
    body["created_at"] = rfc3339(delivery.created_at)
    return json.dumps(body, separators=(",", ":"))


def _issuer() -> str:
    return settings.SWITCHBOARD_PUBLIC_URL
