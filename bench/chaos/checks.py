"""The counts at the end, from the database, the receiver's log and the feeds
read through the API.
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path

from bench.chaos.common import PUSHED, READERS, UNREAD, Api, Book


def settled(people: dict) -> tuple[bool, str]:
    """Nothing left to send: every delivery of an active subscription finished
    and covering its head, pushed inboxes drained, no barrier unfinished."""
    from django.db import connections

    from grants.models import Grant
    from inbox.models import InboxItem
    from webhooks.models import Delivery, Subscription

    connections.close_all()
    open_ = Delivery.objects.filter(state__in=["open", "pending", "sending"],
                                    subscription__status=Subscription.Status.ACTIVE).count()
    if open_:
        return False, f"{open_} deliveries unfinished"
    pushed = InboxItem.objects.filter(member__in=[people[w][0] for w in PUSHED], state="pending").count()
    if pushed:
        return False, f"{pushed} pushed items pending"
    if Grant.objects.filter(status=Grant.Status.REVOKING).exists():
        return False, "a barrier unfinished"
    return True, ""


def behind(heads: dict[str, int]) -> list[str]:
    """Active subscriptions whose last wake ends before the last event their
    owner's feed shows (`heads`: subscription id -> that position)."""
    from django.db import connections
    from django.db.models import Max

    from webhooks.models import Subscription

    connections.close_all()
    late = []
    for subscription in Subscription.objects.filter(status="active", public_id__in=list(heads)).annotate(
            through=Max("deliveries__through_position")):
        if heads[subscription.public_id] > max(subscription.through or 0, subscription.activation_position or 0):
            late.append(subscription.public_id)
    return late


async def feed_heads(api: Api, people: dict) -> dict[str, int]:
    """The last position each wake subscription's owner reads in the feed it
    wakes for: the independent oracle of what its wakes must cover."""
    from webhooks.models import Subscription

    rows = await asyncio.to_thread(lambda: list(Subscription.objects.exclude(kind="item").values_list(
        "public_id", "kind", "owner__handle")))
    tokens = {member.handle: token for member, token in people.values()}
    heads = {}
    for public_id, kind, handle in rows:
        path = "/v0/spaces/chaos/events" if kind == "space" else "/v0/me/inbox/events"
        cursor, head = None, 0
        while True:
            status, page = await api.call(tokens[handle], "GET", f"{path}?limit=100"
                                          + (f"&cursor={cursor}" if cursor else ""))
            head = max([head, *(e["position"] for e in page.get("events", []))])
            cursor = page.get("cursor")
            if not page.get("has_more"):
                break
        heads[public_id] = head
    return heads


def check(book: Book, people: dict, conversations: dict, receiver_log: Path,
          heads: dict[str, int]) -> dict[str, Counter]:
    from django.db import connections
    from django.db.models import Sum

    from grants.models import Grant
    from inbox.models import InboxItem, Mailbox, Message
    from webhooks.models import Delivery, Subscription

    connections.close_all()
    lost, duplicated, stuck, disorder = Counter(), Counter(), Counter(), Counter()

    # Sends: each key stored once, as the message its client was given.
    stored = defaultdict(list)
    for key, public_id in Message.objects.filter(idempotency_key__startswith="chaos-").values_list(
            "idempotency_key", "public_id"):
        stored[key].append(public_id)
    for key, public_id in book.accepted.items():
        if not stored.get(key):
            lost["sends"] += 1
        elif stored[key] != [public_id]:
            duplicated["sends"] += 1
    duplicated["sends"] += sum(len(ids) - 1 for key, ids in stored.items() if len(ids) > 1 and key in book.accepted)
    lost["sends (never accepted)"] += len(set(book.targets) - set(book.accepted))

    # Inboxes: each accepted direct message is exactly one item of its
    # recipient, in conversation order; acknowledged what was acknowledged.
    messages = {m.public_id: m for chunk in _chunks(book.accepted.values())
                for m in Message.objects.filter(public_id__in=chunk)}
    items = defaultdict(list)
    for chunk in _chunks(messages):  # a statement takes at most 65,535 parameters
        for item in InboxItem.objects.filter(message__public_id__in=chunk).select_related("message"):
            items[item.message.public_id].append(item)
    for key, public_id in book.accepted.items():
        label = book.targets[key][1]
        if label == "#general":
            continue
        found = items.get(public_id, [])
        if not found:
            lost["inbox items"] += 1
        elif len(found) > 1:
            duplicated["inbox items"] += len(found) - 1
    by_member = defaultdict(list)
    for found in items.values():
        for item in found:
            by_member[item.member_id].append(item)
    for member_items in by_member.values():
        last = {}
        for item in sorted(member_items, key=lambda i: i.pk):
            if item.message.position < last.get(item.conversation_id, -1):
                disorder["inbox items"] += 1
            last[item.conversation_id] = item.message.position
    tokens = {t: s for t, s in InboxItem.objects.filter(member__in=[p[0] for p in people.values()])
              .values_list("token", "state")}
    for who, acked in book.acked.items():
        # An item a barrier withdrew after its read answers {} too, and stays rejected: only rg's grant is revoked.
        settled = ("acknowledged", "rejected") if who == "rg" else ("acknowledged",)
        lost["acknowledgements"] += sum(tokens.get(t) not in settled for t in acked)
    read = {people[w][0].pk for w in (*READERS, *PUSHED)}
    for who in UNREAD:
        member = people[who][0]
        lost["pending items"] += InboxItem.objects.filter(member=member).exclude(state="pending").count()
    pending_read = InboxItem.objects.filter(member_id__in=read, state="pending", admission="admitted").count()
    stuck["unacknowledged items"] += pending_read

    # Pushed items: acknowledged exactly when the receiver answered 2xx for them.
    answered = defaultdict(set)
    received_ids = defaultdict(set)
    for line in receiver_log.read_text().splitlines():
        entry = json.loads(line)
        received_ids[entry["path"]].add(entry["id"])
        if entry["mcp"] and 200 <= entry["status"] < 300 and not entry["late"]:
            answered[entry["path"]].add(entry["event"])
    for who, path in PUSHED.items():
        member = people[who][0]
        acked = {"evt_" + t[4:] for t in InboxItem.objects.filter(member=member, state="acknowledged")
                 .values_list("token", flat=True)}
        got = answered[f"/hook/{path}/mcp-{who}"]
        lost["pushed items"] += len(acked - got)
        stuck["pushed items"] += len(got - acked)

    # Wakes: per subscription, ranges chained from its activation with no gap
    # or overlap, each delivered one received, the head covered. (A wake that
    # failed as its subscription was suspended handed its range back to the
    # next: webhooks.outbox.hand_back.)
    for subscription in Subscription.objects.exclude(kind="item").select_related("endpoint"):
        path = "/" + subscription.endpoint.url.split("/", 3)[3]
        position = subscription.activation_position
        for delivery in Delivery.objects.filter(subscription=subscription, replay_of=None).exclude(
                state="failed", subscription__terminal=False).order_by("after_position", "pk"):
            if delivery.after_position > position:
                lost["wake ranges"] += 1
            elif delivery.after_position < position:
                duplicated["wake ranges"] += 1
            position = delivery.through_position
            if delivery.state == "delivered" and delivery.public_id not in received_ids[path]:
                lost["wakes received"] += 1
            if delivery.state == "sending":
                stuck["deliveries sending"] += 1
    lost["events covered"] += len(behind(heads))
    gone = Subscription.objects.filter(endpoint__url__contains="/hook/gone/").first()
    if gone is not None and not (gone.status == "suspended" and gone.terminal):
        stuck["410 not suspended"] += 1

    # Barriers: every grant terminal; nothing it authorized left pending.
    stuck["server processes not replaced"] += book.unreplaced
    stuck["barriers"] += Grant.objects.filter(public_id__in=book.grants, status=Grant.Status.REVOKING).count()
    stuck["revoked items pending"] += InboxItem.objects.filter(grant__public_id__in=book.grants,
                                                               grant__status="revoked", state="pending").count()

    # Live sockets: every frame of #general, once each, in order.
    general = dict(Message.objects.filter(conversation__public_id=conversations["#general"])
                   .values_list("public_id", "position"))
    for name, frames in book.frames.items():
        ids = [public_id for _, public_id in frames]
        positions = [p for p, _ in frames]
        duplicated["socket frames"] += len(ids) - len(set(ids))
        missing = sorted(general[public_id] for public_id in set(general) - set(ids))
        lost["socket frames"] += len(missing)
        disorder["socket frames"] += sum(b <= a for a, b in zip(positions, positions[1:]))
        if missing:  # when it went quiet, against the faults' times in the log
            print(f"  {name}: {len(missing)} frames missing, positions {missing[0]}..{missing[-1]}; its last "
                  f"frame (position {positions[-1] if positions else None}) came "
                  f"{book.last_frame_at.get(name, 0):.1f} s into the run", flush=True)

    # Mailbox counters: the pending bytes they count.
    for mailbox in Mailbox.objects.all():
        actual = (InboxItem.objects.filter(member_id=mailbox.member_id, state="pending").exclude(admission="held")
                  .aggregate(total=Sum("content_bytes"))["total"] or 0)
        if actual != mailbox.pending_bytes:
            lost["mailbox counters"] += 1

    book.operations["sends"] = len(book.accepted)
    book.operations["wakes delivered"] = Delivery.objects.filter(state="delivered", subscription__kind__in=[
        "space", "inbox"]).count()
    book.operations["items pushed"] = Delivery.objects.filter(state="delivered", subscription__kind="item").count()
    book.operations["socket frames"] = sum(len(f) for f in book.frames.values())
    book.operations["items"] = InboxItem.objects.count()
    book.operations["attempts"] = Delivery.objects.aggregate(n=Sum("attempts"))["n"] or 0
    return {"lost": lost, "duplicated": duplicated, "stuck": stuck, "out of order": disorder}


def _chunks(values, size: int = 10_000):
    values = list(values)
    return [values[i:i + size] for i in range(0, len(values), size)]
