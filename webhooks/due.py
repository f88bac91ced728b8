"""The delivery claim's statements in plain SQL (webhooks.engine.claim_due):
they run for every batch a worker claims, where compiling the ORM's
equivalents cost more than running them."""
from __future__ import annotations

from django.core.cache import cache
from django.db import connection, transaction

from controlplane import live
from controlplane.db import rows_sql
from webhooks.models import Delivery, Subscription

# The running delivery timer listens here (webhooks.pump): a new due
# delivery reaches it at once instead of at its next poll.
DUE_GROUP = "switchboard.webhooks.due"
# Held in the cache by the worker that is the timer (webhooks.tasks.deliver).
TIMER_KEY = "webhooks:timer"


def kick_on_commit() -> None:
    """Once the current transaction commits, have the new due deliveries
    sent: nudge the running timer, and queue a delivery task unless a timer
    is running where this process can tell (a shared channel layer and
    cache: Redis). Both are nudges: the rows are the truth, and the timer's
    poll and the minute sweep find what a lost one left. A timer that ends
    just then looks again after it gave up the key, and queues the next
    run for anything due (webhooks.tasks.deliver)."""
    nudge_timer_on_commit()
    transaction.on_commit(_kick_unless_timed, robust=True)


def nudge_timer_on_commit() -> None:
    live.group_send_on_commit(DUE_GROUP, {"type": "webhooks.due"})


def _kick_unless_timed() -> None:
    if live.shared_layer() and cache.get(TIMER_KEY):
        return  # a queued task would race the timer for the same rows, from a cold start
    live.kick("webhooks.tasks.deliver")


def due_sql(ready: str) -> str:
    """Due deliveries (`ready`) whose subscription may send (see `sendable`),
    that are their subscription's oldest unfinished one, whose endpoint has
    fewer than PER_ENDPOINT in flight: oldest due first, skipping rows other
    workers hold. Plain SQL: this runs for every batch a worker claims, and
    compiling it through the ORM cost more than running it."""
    quote = connection.ops.quote_name
    deliveries, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    lock = " FOR NO KEY UPDATE OF d SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    return (f"SELECT d.id FROM {deliveries} d JOIN {subscriptions} s ON s.id = d.subscription_id "
            f"WHERE {ready} AND s.status = 'active' AND (s.lease_expires_at IS NULL OR s.lease_expires_at > %(at)s) "
            f"AND NOT EXISTS (SELECT 1 FROM {deliveries} o WHERE o.subscription_id = d.subscription_id "
            f"AND o.id < d.id AND o.state IN ('pending', 'sending')) "
            f"AND s.endpoint_id NOT IN (SELECT bs.endpoint_id FROM {deliveries} b "
            f"JOIN {subscriptions} bs ON bs.id = b.subscription_id "
            f"WHERE b.state = 'sending' AND b.claimed_until >= %(at)s AND b.claimed_until <= %(horizon)s "
            f"GROUP BY bs.endpoint_id HAVING COUNT(*) >= %(per_endpoint)s) "
            f"ORDER BY d.due_at, d.id LIMIT %(limit)s{lock}")


# Index-backed reads (due wakes; claims whose lease ran out; claims and due
# times set further ahead than any rule sets them, by a worker whose clock
# was ahead) rather than one OR, which would scan the whole delivery
# history. A lease past `horizon` (now + two leases) or a due time past
# `due_horizon` (now + the longest retry delay or debounce window) was set
# by a wrong clock: it would hold its wake, and every later one of its
# subscription, until that clock's time came (found by the fault matrix).
READY = ("d.state IN ('open', 'pending') AND d.due_at <= %(at)s",
          "d.state = 'sending' AND d.claimed_until < %(at)s",
          "d.state = 'sending' AND d.claimed_until > %(horizon)s",
          "d.state IN ('open', 'pending') AND d.due_at > %(due_horizon)s")


def freeze(deliveries: list[Delivery], at) -> None:
    """Store the bodies (and bound items) of first claims: one statement."""
    table = connection.ops.quote_name(Delivery._meta.db_table)
    values, params = rows_sql([(d.pk, d.body, d.item_id) for d in deliveries],
                              {"id": "BIGINT", "body": "TEXT", "item_id": "BIGINT"})
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET body = v.body, item_id = v.item_id, "
                       f"first_attempt_at = %s FROM ({values}) v WHERE {table}.id = v.id",
                       [connection.ops.adapt_datetimefield_value(at), *params])
