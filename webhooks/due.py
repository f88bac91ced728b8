"""The delivery engine's hot statements in plain SQL (webhooks.engine's
claim and record): they run for every batch a worker claims or records,
where compiling the ORM's equivalents cost more than running them."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from django.core.cache import cache
from django.db import connection, transaction

from controlplane import live
from controlplane.db import datetime_from_db, ids_in, model_columns, models_from_row, rows_sql
from controlplane.models import Member, Space
from inbox.models import InboxItem
from webhooks.models import Attempt, Delivery, Endpoint, Subscription, new_delivery_id

# The running delivery timer listens here (webhooks.pump): a new due
# delivery reaches it at once instead of at its next poll.
DUE_TOPIC = "switchboard.webhooks.due"
# Held in the cache by the worker that is the timer (webhooks.tasks.deliver).
TIMER_KEY = "webhooks:timer"
# Held from the timer's asking for a helper run to that run's end (webhooks.tasks.ask_for_help).
HELPER_KEY = "webhooks:helper"
# Held from a timer's queueing of the run that takes it over to that run's start (webhooks.tasks).
SUCCESSOR_KEY = "webhooks:timer-next"


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
    live.publish_on_commit(DUE_TOPIC, {"type": "webhooks.due"})


def _kick_unless_timed() -> None:
    if live.shared_layer() and cache.get_many([TIMER_KEY, SUCCESSOR_KEY]):
        return  # a queued task would race the timer (or its next run) for the same rows, from a cold start
    live.kick("webhooks.tasks.deliver")


def sendable(at: str = "%(at)s", subscription: str = "s") -> str:
    """Whether the subscription `subscription` (its alias) may send at `at`
    (a placeholder): active, within its lease (MCP-managed ones have one;
    past it nothing is sent, nothing lost), and its owner not suspended.
    Every read of the rule states it through here: the claim, the timer's
    next wake, a push's hand-off, the sweep's offer
    (webhooks.mcp.offer_waiting) and the health figures. A suspended
    owner's wakes wait, their ranges as they were, and go once the owner is
    reinstated: they were cancelled at their claim, and the next wake's
    range began after theirs, breaking the chain (SPEC §8)."""
    members = connection.ops.quote_name(Member._meta.db_table)
    return (f"{subscription}.status = 'active' "
            f"AND ({subscription}.lease_expires_at IS NULL OR {subscription}.lease_expires_at > {at}) "
            f"AND EXISTS (SELECT 1 FROM {members} so WHERE so.id = {subscription}.owner_id "
            f"AND so.status = '{Member.Status.ACTIVE.value}')")


SENDABLE = sendable()


def _its_subscription_may_send(subscriptions: str) -> str:
    """Whether the delivery `d`'s subscription may send, as a correlated
    subquery: one index probe a candidate, in the order of the index walked."""
    return f"(SELECT {SENDABLE} FROM {subscriptions} s WHERE s.id = d.subscription_id)"


def _first_unfinished(deliveries: str) -> str:
    """Whether the delivery `d` is its subscription's oldest unfinished one."""
    return (f"(SELECT 1 FROM {deliveries} o WHERE o.subscription_id = d.subscription_id "
            f"AND o.id < d.id AND o.state IN ('pending', 'sending') LIMIT 1) IS NULL")


def due_sql(ready: str, lock: bool = True, *, not_owners: Iterable[int] = (), not_endpoints: Iterable[int] = (),
            not_ids: Iterable[int] = ()) -> str:
    """Due deliveries (`ready`) whose subscription may send (`sendable`),
    that are their subscription's oldest unfinished one, whose endpoint has
    fewer than PER_ENDPOINT in flight and whose owner fewer than PER_OWNER
    (webhooks.engine), leaving out those of `not_owners`, `not_endpoints` and `not_ids`:
    oldest due first, skipping rows other
    workers hold and locking the rows it returns (without `lock`: a look
    that takes nothing). Plain SQL: this runs for every batch a worker
    claims, and compiling it through the ORM cost more than running it.

    The subscription and the older-wake checks are correlated subqueries,
    which the planner cannot turn into joins: each is one index probe per
    candidate, in the order of `delivery_due_in_order`, until `limit` are
    found. As joins, a table whose statistics were not gathered yet (a burst
    of new wakes on a young database) got plans that compared every
    candidate with every subscription or every unfinished wake: 100 ms a
    claim instead of 1."""
    quote = connection.ops.quote_name
    deliveries, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    skip_locked = lock and connection.features.has_select_for_update_skip_locked
    lock_clause = " FOR NO KEY UPDATE OF d SKIP LOCKED" if skip_locked else ""
    def busy(column: str, cap: str) -> str:
        return (f"SELECT bs.{column} FROM {_in_flight(deliveries, subscriptions)} "
                f"GROUP BY bs.{column} HAVING COUNT(*) >= %({cap})s")

    left_out = "".join(f" AND {column} NOT IN ({', '.join(map(str, map(int, values)))})"
                       for column, values in (("s.owner_id", list(not_owners)), ("s.endpoint_id", list(not_endpoints)),
                                              ("d.id", list(not_ids))) if values)
    return (f"SELECT d.id FROM {deliveries} d WHERE {ready} "
            f"AND (SELECT {SENDABLE} AND s.endpoint_id NOT IN ({busy('endpoint_id', 'per_endpoint')}) "
            f"AND s.owner_id NOT IN ({busy('owner_id', 'per_owner')}){left_out} "
            f"FROM {subscriptions} s WHERE s.id = d.subscription_id) "
            f"AND {_first_unfinished(deliveries)} "
            f"ORDER BY d.due_at, d.id LIMIT %(limit)s{lock_clause}")


def _in_flight(deliveries: str, subscriptions: str) -> str:
    """The deliveries in flight (`b`, with their subscriptions `bs`): sending under a lease of today's clocks."""
    return (f"{deliveries} b JOIN {subscriptions} bs ON bs.id = b.subscription_id WHERE b.state = 'sending' "
            f"AND b.claimed_until >= %(at)s AND b.claimed_until <= %(horizon)s")


def _in_flight_to(cursor, endpoints: set[int], params: dict) -> dict[int, int]:
    """How many deliveries are in flight to each of these endpoints (those with none are left out)."""
    return _in_flight_by(cursor, "endpoint_id", endpoints, params)


def in_flight_of(owners: set[int], params: dict) -> dict[int, int]:
    """How many deliveries of each of these members are in flight (those with none are left out)."""
    with connection.cursor() as cursor:
        return _in_flight_by(cursor, "owner_id", owners, params)


def _in_flight_by(cursor, column: str, ids: set[int], params: dict) -> dict[int, int]:
    quote = connection.ops.quote_name
    in_flight = _in_flight(quote(Delivery._meta.db_table), quote(Subscription._meta.db_table))
    cursor.execute(f"SELECT bs.{column}, COUNT(*) FROM {in_flight} "
                   f"AND bs.{column} IN ({', '.join(map(str, map(int, sorted(ids))))}) "
                   f"GROUP BY bs.{column}", params)
    return dict(cursor.fetchall())


def claimable(limit: int, reads, params: Callable[[int], dict], per_owner: int, per_endpoint: int) -> list[Delivery]:
    """Up to `limit` due deliveries (`reads` of READY in turn, `params(asked)`
    their parameters), locked, with their relations (`claimed`), at most
    `per_owner` of each member's, and at most `per_endpoint` in flight to
    each endpoint, those already in flight counted: a read that reaches a
    member's or an endpoint's last place reads again without them (and
    without what it took), so the rest of the room goes to the wakes of
    others due after theirs."""
    due: list[Delivery] = []
    caps = {"owner": per_owner, "endpoint": per_endpoint}
    taken: dict[tuple[str, int], int] = {}  # ("owner" | "endpoint", id) → places taken
    with connection.cursor() as cursor:
        for ready in reads:
            while len(due) < limit:
                asked = limit - len(due)
                full = {key for key, count in taken.items() if count >= caps[key[0]]}
                cursor.execute(due_sql(ready, not_owners=[pk for kind, pk in full if kind == "owner"],
                                       not_endpoints=[pk for kind, pk in full if kind == "endpoint"],
                                       not_ids=[d.pk for d in due] if full else ()), params(asked))
                ids = [row[0] for row in cursor.fetchall()]
                candidates = claimed(ids)
                seen = {pk for kind, pk in taken if kind == "endpoint"}
                if new := {d.subscription.endpoint_id for d in candidates} - seen:
                    # an endpoint's places start from what is in flight to it
                    counts = _in_flight_to(cursor, new, params(asked))
                    taken |= {("endpoint", pk): counts.get(pk, 0) for pk in new}
                skipped = 0
                for delivery in candidates:
                    keys = (("owner", delivery.subscription.owner_id), ("endpoint", delivery.subscription.endpoint_id))
                    if all(taken.get(key, 0) < caps[key[0]] for key in keys):
                        for key in keys:
                            taken[key] = taken.get(key, 0) + 1
                        due.append(delivery)
                    else:
                        skipped += 1
                if len(ids) < asked or not skipped:  # nothing more is due, or the room is full
                    break
    return due


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


# A claim's rows: each delivery with its subscription, the subscription's
# owner, space (if any) and endpoint, and the delivery's item (if bound).
CLAIMED = ((Delivery, "d"), (Subscription, "s"), (Member, "o"), (Space, "sp"), (Endpoint, "e"), (InboxItem, "i"))


def claimed(ids: list[int]) -> list[Delivery]:
    """The deliveries `ids`, in that order, with their CLAIMED relations
    loaded: one plain-SQL statement (the ORM's select_related of the same
    took longer to compile and build than to run)."""
    if not ids:
        return []
    table = {alias: connection.ops.quote_name(model._meta.db_table) for model, alias in CLAIMED}
    columns = ", ".join(model_columns(model, alias) for model, alias in CLAIMED)
    which, params = ids_in("d.id", ids)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {table['d']} d JOIN {table['s']} s ON s.id = d.subscription_id "
                       f"JOIN {table['o']} o ON o.id = s.owner_id LEFT JOIN {table['sp']} sp ON sp.id = s.space_id "
                       f"JOIN {table['e']} e ON e.id = s.endpoint_id LEFT JOIN {table['i']} i ON i.id = d.item_id "
                       f"WHERE {which}", params)
        rows = cursor.fetchall()
    found = {}
    for row in rows:
        delivery, subscription, owner, space, endpoint, item = models_from_row([m for m, _ in CLAIMED], row)
        for relation, instance, value in ((Subscription.owner, subscription, owner),
                                          (Subscription.space, subscription, space),
                                          (Subscription.endpoint, subscription, endpoint),
                                          (Delivery.subscription, delivery, subscription),
                                          (Delivery.item, delivery, item)):
            relation.field.set_cached_value(instance, value)
        found[delivery.pk] = delivery
    return [found[pk] for pk in ids if pk in found]


def anything_due(params: dict) -> bool:
    """Whether a claim would find a wake due now (READY's first read, locking
    nothing), with `webhooks.engine.ready_params`."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS ({due_sql(READY[0], lock=False)})", params)
        return bool(cursor.fetchone()[0])


def soonest_due_at(params: dict):
    """When the soonest open or pending wake whose subscription may send
    falls due (None: there is none), with `webhooks.engine.ready_params`.
    Like the claim (`due_sql`), it walks `delivery_due_in_order` in its order
    and checks each candidate's subscription with a correlated subquery. As
    a join (the ORM's), a table whose statistics were not gathered yet got a
    plan that probed every subscription's deliveries: 80–110 ms on a
    benchmark's young database, after every wake, and a nudge the timer
    heard meanwhile waited for it (docs/benchmarks.md, round twenty)."""
    return _soonest("due_at", "IN ('open', 'pending')", "d.due_at, d.id", params)


def soonest_claim_end(params: dict):
    """When the soonest claim of a wake whose subscription may send runs out
    (None: there is none), walking `delivery_claimed` in its order. A claim
    left by a worker that died is taken back only while its subscription may
    send: counting the others kept the timer polling at once, for good,
    once a paused or lapsed subscription had one."""
    return _soonest("claimed_until", "= 'sending'", "d.claimed_until", params)


def _soonest(column: str, state: str, order: str, params: dict):
    """The first `column` of the deliveries whose state is `state` (a
    condition) and whose subscription may send, in `order` (an index's)."""
    quote = connection.ops.quote_name
    deliveries, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT d.{column} FROM {deliveries} d WHERE d.state {state} "
                       f"AND {_its_subscription_may_send(subscriptions)} ORDER BY {order} LIMIT 1", params)
        row = cursor.fetchone()
    return datetime_from_db(row[0]) if row else None


def due_now(params: dict) -> tuple[int, object]:
    """How many wakes a worker could send now (due, their subscription may
    send, no older wake of it unfinished) and when the oldest of them fell
    due (None: none is), with `webhooks.engine.ready_params`: what the claim
    takes, without its endpoint bound (manage.py health)."""
    quote = connection.ops.quote_name
    deliveries, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*), min(d.due_at) FROM {deliveries} d WHERE {READY[0]} "
                       f"AND {_its_subscription_may_send(subscriptions)} AND {_first_unfinished(deliveries)}", params)
        count, oldest = cursor.fetchone()
    return count, datetime_from_db(oldest) if oldest is not None else None


def set_by_wrong_clock(params: dict) -> bool:
    """Whether a claim or a due time was set further ahead than any rule
    sets them (READY's last two reads, with `webhooks.engine.ready_params`):
    such a delivery is due now."""
    table = connection.ops.quote_name(Delivery._meta.db_table)
    checks = " OR ".join(f"EXISTS (SELECT 1 FROM {table} d WHERE {ready})" for ready in READY[2:])
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {checks}", params)
        return bool(cursor.fetchone()[0])


def mark_sending(deliveries: list[Delivery], first: set[int], at, until) -> None:
    """Move claimed deliveries to `sending` (one attempt more, leased until
    `until`), storing the bodies and bound items of first claims (`first`,
    by id): one statement, one new row version each."""
    table = connection.ops.quote_name(Delivery._meta.db_table)
    values, params = rows_sql([(d.pk, d.body, d.item_id) if d.pk in first else (d.pk, None, None) for d in deliveries],
                              {"id": "BIGINT", "body": "TEXT", "item_id": "BIGINT"})
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET state = 'sending', attempts = {table}.attempts + 1, claimed_until = %s, "
                       f"body = COALESCE(v.body, {table}.body), item_id = COALESCE(v.item_id, {table}.item_id), "
                       f"first_attempt_at = COALESCE({table}.first_attempt_at, %s) "
                       f"FROM ({values}) v WHERE {table}.id = v.id", [adapt(until), adapt(at), *params])


LEASE_EXPIRED = "lease_expired"  # an attempt whose worker never recorded it
ATTEMPT_COLUMNS = {"delivery_id": "BIGINT", "number": "INTEGER", "started_at": "TIMESTAMPTZ",
                   "duration_ms": "INTEGER", "status_code": "SMALLINT", "error_class": "VARCHAR(64)",
                   "key_id": "VARCHAR(40)"}


def insert_attempts(rows: list[tuple]) -> None:
    """A batch's attempt rows, each as ATTEMPT_COLUMNS' values: one
    statement (the ORM's bulk_create prepared each row for longer than the
    insert ran). An attempt whose lease ran out is recorded as
    `lease_expired` by the claim that takes its delivery again
    (webhooks.engine.claim_due); if its worker records it after all, its
    outcome takes that row's place. (`WHERE true`: SQLite reads an ON
    CONFLICT straight after a SELECT as the SELECT's join.)"""
    adapt = connection.ops.adapt_datetimefield_value
    values, params = rows_sql([(*row[:2], adapt(row[2]), *row[3:]) for row in rows], ATTEMPT_COLUMNS)
    table = connection.ops.quote_name(Attempt._meta.db_table)
    replaced = ", ".join(f"{column} = excluded.{column}" for column in list(ATTEMPT_COLUMNS)[2:])
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({', '.join(ATTEMPT_COLUMNS)}) SELECT * FROM ({values}) AS r WHERE true "
                       f"ON CONFLICT (delivery_id, number) DO UPDATE SET {replaced} "
                       f"WHERE {table}.error_class = %s AND COALESCE(excluded.error_class, '') <> %s",
                       [*params, LEASE_EXPIRED, LEASE_EXPIRED])


def mark_delivered(answered: list[tuple[int, int]], at) -> list[tuple[int, int | None, int]]:
    """Finish as `delivered` the deliveries answered with a 2xx, given as
    (id, attempt number): only those still `sending` under that attempt (a
    lease that ran out and was claimed again belongs to the newer attempt;
    a cancelled one stays cancelled). One statement; returns the finished
    ones' (subscription id, item id, owner id)."""
    quote = connection.ops.quote_name
    table, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    values, params = rows_sql(answered, {"id": "BIGINT", "number": "INTEGER"})
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET state = 'delivered', finished_at = %s, claimed_until = NULL "
                       f"FROM ({values}) v WHERE {table}.id = v.id AND {table}.state = 'sending' "
                       f"AND {table}.attempts = v.number RETURNING {table}.subscription_id, {table}.item_id, "
                       # (SQLite's RETURNING reads only the updated table: a subquery, not a join.)
                       f"(SELECT s.owner_id FROM {subscriptions} s WHERE s.id = {table}.subscription_id)",
                       [connection.ops.adapt_datetimefield_value(at), *params])
        return cursor.fetchall()


def cancelled_receipts(answered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of the deliveries answered with a 2xx, given as (id, attempt number),
    the pushed items of those cancelled while that attempt was in flight (an
    unsubscribe), as (item id, owner id): the receiver has them all the same."""
    quote = connection.ops.quote_name
    table, subscriptions = quote(Delivery._meta.db_table), quote(Subscription._meta.db_table)
    values, params = rows_sql(answered, {"id": "BIGINT", "number": "INTEGER"})
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT d.item_id, s.owner_id FROM ({values}) v JOIN {table} d ON d.id = v.id "
                       f"JOIN {subscriptions} s ON s.id = d.subscription_id WHERE d.state = 'cancelled' "
                       f"AND d.attempts = v.number AND d.item_id IS NOT NULL", params)
        return cursor.fetchall()


def _none_unfinished(deliveries: str) -> tuple[str, list]:
    """The condition, with its parameters, that the derived table `v`'s
    subscription has no unfinished delivery (one item in flight)."""
    states = list(Delivery.UNFINISHED)
    return (f"NOT EXISTS (SELECT 1 FROM {deliveries} d WHERE d.subscription_id = v.subscription_id "
            f"AND d.state IN ({', '.join(['%s'] * len(states))}))", states)


def open_item_deliveries(subscription_ids: list[int], at, *, only_if_pending: bool) -> int:
    """An open delivery, due at `at`, for each of these `item` subscriptions
    that has none unfinished (one item in flight); with `only_if_pending`,
    only if its owner has a pending admitted item now. One statement;
    returns how many were opened (webhooks.mcp.offer)."""
    quote = connection.ops.quote_name
    deliveries, subscriptions, items = (quote(model._meta.db_table) for model in (Delivery, Subscription, InboxItem))
    values, params = rows_sql([(pk, new_delivery_id()) for pk in sorted(subscription_ids)],
                              {"subscription_id": "BIGINT", "public_id": "VARCHAR(40)"})
    none_unfinished, unfinished = _none_unfinished(deliveries)
    pending, pending_params = "", []
    if only_if_pending:
        pending = (f"AND EXISTS (SELECT 1 FROM {subscriptions} s JOIN {items} i ON i.member_id = s.owner_id "
                   f"WHERE s.id = v.subscription_id AND i.admission = %s AND i.state = %s) ")
        pending_params = [InboxItem.Admission.ADMITTED, InboxItem.State.PENDING]
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        # A concurrent offer's open delivery (one per subscription) wins: nothing to add.
        cursor.execute(f"INSERT INTO {deliveries} (public_id, subscription_id, after_position, through_position, "
                       f"state, due_at, attempts, created_at) "
                       f"SELECT v.public_id, v.subscription_id, 0, 0, %s, %s, 0, %s FROM ({values}) v "
                       f"WHERE {none_unfinished} {pending}"
                       f"ORDER BY v.subscription_id ON CONFLICT DO NOTHING",
                       [Delivery.State.OPEN, adapt(at), adapt(at), *params, *unfinished, *pending_params])
        return cursor.rowcount


def send_next_items(offers: list[tuple[int, int, str]], at, until) -> dict[int, tuple]:
    """A push's hand-off (webhooks.engine.record): for each (subscription
    id, item id, body), a delivery of that item already claimed by the
    recording worker (`sending`, its first attempt, leased until `until`,
    its body frozen), for the `item` subscriptions that may still send (an
    active owner and subscription, within its lease) and have nothing
    unfinished (one item in flight): what a claim would do with the open
    delivery an offer makes, in the transaction that acknowledged the item
    before. One statement, and one read of what signing needs; returns,
    by subscription id, (delivery id, public id, subscription public id,
    endpoint url, secret, previous secret, previous secret's end)."""
    if not offers:
        return {}
    quote = connection.ops.quote_name
    deliveries, subscriptions, endpoints = (quote(model._meta.db_table) for model in (Delivery, Subscription, Endpoint))
    values, params = rows_sql([(pk, new_delivery_id(), item, body) for pk, item, body in sorted(offers)],
                              {"subscription_id": "BIGINT", "public_id": "VARCHAR(40)", "item_id": "BIGINT",
                               "body": "TEXT"})
    none_unfinished, unfinished = _none_unfinished(deliveries)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {deliveries} (public_id, subscription_id, after_position, through_position, "
                       f"state, due_at, attempts, created_at, claimed_until, first_attempt_at, body, item_id) "
                       f"SELECT v.public_id, v.subscription_id, 0, 0, %s, %s, 1, %s, %s, %s, v.body, v.item_id "
                       f"FROM ({values}) v JOIN {subscriptions} s ON s.id = v.subscription_id "
                       f"WHERE s.kind = %s AND {sendable('%s')} "
                       f"AND {none_unfinished} "
                       f"ORDER BY v.subscription_id ON CONFLICT DO NOTHING RETURNING id, public_id, subscription_id",
                       [Delivery.State.SENDING, adapt(at), adapt(at), adapt(until), adapt(at), *params,
                        Subscription.Kind.ITEM, adapt(at), *unfinished])
        sent = {subscription: (pk, public_id) for pk, public_id, subscription in cursor.fetchall()}
        if not sent:
            return {}
        which, params = ids_in("s.id", sent)
        cursor.execute(f"SELECT s.id, s.public_id, e.url, e.secret, e.previous_secret, e.previous_secret_until "
                       f"FROM {subscriptions} s JOIN {endpoints} e ON e.id = s.endpoint_id WHERE {which}", params)
        return {pk: (*sent[pk], public_id, url, secret, previous, datetime_from_db(until))
                for pk, public_id, url, secret, previous, until in cursor.fetchall()}
