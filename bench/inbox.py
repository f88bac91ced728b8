"""The durable inbox: read_inbox page time with 10, 10,000 and 1,000,000
pending items, and acknowledge_delivery throughput.

Items are inserted with SQL (INSERT … SELECT generate_series), each stage for
a member of its own (`inbox10`, `inbox10k`, `inbox1m`), at positions after
the log head, which is then moved past them; the table is vacuumed and
analyzed, and each member gets an `inbox_mailbox` row counting its pending
bytes. Every stage is measured right after its load, so the 10-item stage
runs on a small table. Per stage, `--feed-requests` sequential requests
after 20 warm-up requests, read as the stage's member:

- first page: `GET /v0/me/inbox` (no cursor; at most 50 items and 2 MiB);
- next page: the first page's `nextCursor`;
- middle page: a cursor built here at the middle item (a reader that has
  paged through half its inbox without acknowledging);
- event lookup: `GET /v0/inbox-events/evt_…` of the middle item;
- held page: `GET /v0/me/inbox/held` (nothing is held: what finding the
  held items costs beside a big inbox).

Then `--clients` concurrent aiohttp clients, each its own member (`ack00`, …)
with ACK_ITEMS pending items, acknowledge distinct tokens taken from the
table (`POST /v0/me/inbox/acknowledge`, no Idempotency-Key) for
`--ack-seconds` after a warm-up; afterwards the acknowledged rows and the
mailbox counters are checked against the 200s.
"""
from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter

import aiohttp
import psycopg

from bench.fixture import Member
from bench.load import latency_summary

STAGES = (("10", 10), ("10k", 10_000), ("1M", 1_000_000))
PAGE_ITEMS = 50
WARMUP_REQUESTS = 20
ACK_ITEMS = 5_000  # per acknowledging member: far more than ~6 s of acks
PAYLOAD = {"kind": "direct", "postId": "msg_bench", "conversation": "cnv_bench", "sender": "@bench00",
           "content": "bench inbox item: status nominal, queue drained, nothing to report, all systems go, ok ok"}
PAYLOAD_TEXT = json.dumps(PAYLOAD, ensure_ascii=False, separators=(",", ":"))
CONTENT_BYTES = len(PAYLOAD_TEXT.encode())  # as inbox.items.content_bytes counts it
TOKEN_PATTERN = "^dlv_[A-Za-z0-9_-]{43}$"

# sha256 of a per-member seed and the row number: 32 bytes, canonical
# unpadded base64url, unique (the token index would refuse a duplicate).
_ITEM_SQL = """
INSERT INTO inbox_inboxitem (member_id, token, kind, payload, content_bytes, position, state, created_at{item_cols})
SELECT %(member)s::bigint,
       'dlv_' || translate(rtrim(encode(sha256(convert_to(%(seed)s::text || ':' || g, 'UTF8')), 'base64'), '='),
                           '+/', '-_'),
       'direct', %(payload)s::jsonb, %(bytes)s::int, %(base)s::bigint + g, 'pending', now(){item_values}
FROM generate_series(1, %(count)s::bigint) AS g
"""

_MAILBOX_SQL = """
INSERT INTO inbox_mailbox (member_id, pending_bytes{mailbox_cols})
VALUES (%(member)s, %(count)s::bigint * %(bytes)s::int{mailbox_values})
ON CONFLICT (member_id) DO UPDATE SET pending_bytes = inbox_mailbox.pending_bytes + EXCLUDED.pending_bytes
"""


# NOT NULL columns without a database default that a newer schema may have,
# with the value a plain item (or mailbox) takes there.
OPTIONAL_COLUMNS = {"item": ("inbox_inboxitem", {"admission": "'admitted'"}),
                    "mailbox": ("inbox_mailbox", {"firewall": "false"})}


def _sql(conn, template: str) -> str:
    """`template` with the OPTIONAL_COLUMNS this database has."""
    fill = {}
    for key, (table, columns) in OPTIONAL_COLUMNS.items():
        present = {row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))}
        names = [name for name in columns if name in present]
        fill[f"{key}_cols"] = "".join(f", {name}" for name in names)
        fill[f"{key}_values"] = "".join(f", {columns[name]}" for name in names)
    return template.format(**fill)


def create_member(handle: str) -> Member:
    """A member with a credential, through the management commands (call outside an event loop)."""
    from django.core.management import call_command

    from controlplane.models import Member as MemberModel

    out = io.StringIO()
    call_command("createmember", handle, kind="agent", stdout=out)
    public_id = out.getvalue().strip()
    out = io.StringIO()
    call_command("issuecredential", handle, stdout=out)
    return Member(handle, public_id, out.getvalue().strip(), MemberModel.objects.get(public_id=public_id).pk)


def load_items(dsn: str, counts: dict[int, int]) -> dict:
    """`counts[member_pk]` pending items for each member, in one transaction."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '300s'")
        with conn.transaction():
            base = conn.execute("SELECT position FROM controlplane_loghead WHERE id = 1 FOR UPDATE").fetchone()[0]
            item_sql, mailbox_sql = _sql(conn, _ITEM_SQL), _sql(conn, _MAILBOX_SQL)
            for member, count in counts.items():
                params = {"member": member, "seed": f"bench-inbox-{member}", "payload": PAYLOAD_TEXT,
                          "bytes": CONTENT_BYTES, "base": base, "count": count}
                conn.execute(item_sql, params)
                conn.execute(mailbox_sql, params)
            conn.execute("UPDATE controlplane_loghead SET position = %s WHERE id = 1", (base + max(counts.values()),))
        conn.execute("VACUUM (ANALYZE) inbox_inboxitem")
        conn.execute("CHECKPOINT")
        malformed = conn.execute("SELECT count(*) FROM inbox_inboxitem WHERE member_id = ANY(%s) AND token !~ %s",
                                 (list(counts), TOKEN_PATTERN)).fetchone()[0]
        rows, size = conn.execute("SELECT count(*), pg_total_relation_size('inbox_inboxitem') "
                                  "FROM inbox_inboxitem").fetchone()
    if malformed:
        raise RuntimeError(f"{malformed} bulk-loaded tokens do not match {TOKEN_PATTERN}")
    return {"items_in_table": rows, "table_mib": round(size / 2**20, 1),
            "load_seconds": round(time.monotonic() - started, 1)}


def middle_paths(dsn: str, member: Member, count: int) -> dict[str, str]:
    """The event id of the middle item and, past two pages, a continuation
    cursor at it (as if the first half had been paged through)."""
    from controlplane.cursors import pack_cursor

    with psycopg.connect(dsn) as conn:
        bound = conn.execute("SELECT position FROM controlplane_loghead WHERE id = 1").fetchone()[0]
        position, item_id, token = conn.execute(
            "SELECT position, id, token FROM inbox_inboxitem WHERE member_id = %s AND state = 'pending' "
            "ORDER BY position, id OFFSET %s LIMIT 1", (member.pk, count // 2)).fetchone()
    paths = {"event": f"/v0/inbox-events/evt_{token[4:]}"}
    if count > 2 * PAGE_ITEMS:
        cursor = pack_cursor((bound, position, item_id), caller=member.public_id, stream="read_inbox")
        paths["middle"] = f"/v0/me/inbox?cursor={cursor}"
    return paths


async def time_requests(session: aiohttp.ClientSession, path: str, requests: int, items: int | None) -> dict:
    """The same GET, WARMUP_REQUESTS unmeasured then `requests` measured;
    `items`: how many items a page must hold (None: not a page)."""
    latencies, errors, wrong, samples = [], 0, 0, []
    loop = asyncio.get_running_loop()
    for n in range(WARMUP_REQUESTS + requests):
        began = loop.time()
        async with session.get(path) as response:
            body = await response.json(content_type=None)
            status = response.status
        elapsed = loop.time() - began
        if n < WARMUP_REQUESTS:
            continue
        if status != 200:
            errors += 1
            samples.append(f"{status} {str(body)[:300]}")
        else:
            latencies.append(elapsed)
            wrong += items is not None and len(body.get("items", [])) != items
    return {"requests": requests, "errors": errors, "wrong_pages": wrong,
            "error_samples": samples[:3], **latency_summary(latencies)}


async def read_stage(base_url: str, member: Member, items: int, extra: dict[str, str], requests: int) -> dict:
    headers = {"Authorization": f"Bearer {member.token}"}
    async with aiohttp.ClientSession(base_url, headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.get("/v0/me/inbox") as response:
            first = await response.json(content_type=None)
            if response.status != 200:
                raise RuntimeError(f"GET /v0/me/inbox as @{member.handle}: {response.status} {first}")
        result = {"first": await time_requests(session, "/v0/me/inbox", requests, min(items, PAGE_ITEMS))}
        if (items > PAGE_ITEMS) != bool(first.get("nextCursor")):
            result["first"]["wrong_pages"] += 1  # a cursor iff there is more
        if first.get("nextCursor"):
            result["next"] = await time_requests(session, f"/v0/me/inbox?cursor={first['nextCursor']}", requests,
                                                 min(items - PAGE_ITEMS, PAGE_ITEMS))
        if "middle" in extra:
            result["middle"] = await time_requests(session, extra["middle"], requests,
                                                   min(items - items // 2 - 1, PAGE_ITEMS))
        result["event"] = await time_requests(session, extra["event"], requests, None)
        result["held"] = await time_requests(session, "/v0/me/inbox/held", requests, 0)
    return result


async def ack_load(base_url: str, clients: list[tuple[Member, list[str]]], *, warmup: float, seconds: float) -> dict:
    """Each client acknowledges its own tokens in order, one request at a
    time, until the window ends or its tokens run out."""
    url = f"{base_url}/v0/me/inbox/acknowledge"
    connector = aiohttp.TCPConnector(limit=len(clients), limit_per_host=len(clients))
    latencies: list[float] = []
    statuses: Counter = Counter()
    error_samples: dict[str, str] = {}
    sent, acked, exhausted = [0], [0], [0]

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup
        measure_to = measure_from + seconds

        async def client(member: Member, tokens: list[str]) -> None:
            headers = {"Authorization": f"Bearer {member.token}", "Content-Type": "application/json"}
            for token in tokens:
                if loop.time() >= measure_to:
                    return
                began = loop.time()
                try:
                    async with session.post(url, data=json.dumps({"deliveryToken": token}), headers=headers) as r:
                        text, status = await r.text(), str(r.status)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    text, status = repr(exc), type(exc).__name__
                ended = loop.time()
                sent[0] += 1
                acked[0] += status == "200"
                if measure_from <= ended <= measure_to:
                    statuses[status] += 1
                    if status == "200":
                        latencies.append(ended - began)
                    else:
                        error_samples.setdefault(status, text[:500])
            exhausted[0] += 1

        await asyncio.gather(*(client(m, t) for m, t in clients))

    ok = statuses.get("200", 0)
    return {"clients": len(clients), "seconds": seconds, "warmup_seconds": warmup,
            "requests": sum(statuses.values()), "acks": ok, "acks_per_s": round(ok / seconds, 1),
            "errors": sum(statuses.values()) - ok, "statuses": dict(statuses), "error_samples": error_samples,
            "requests_total": sent[0], "acks_total": acked[0], "clients_out_of_tokens": exhausted[0],
            **latency_summary(latencies)}


def check_acks(dsn: str, members: list[Member]) -> dict:
    """Acknowledged rows and mailbox counters after the ack load."""
    with psycopg.connect(dsn) as conn:
        acknowledged, pending_bytes = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'acknowledged'), "
            "coalesce(sum(content_bytes) FILTER (WHERE state = 'pending'), 0) "
            "FROM inbox_inboxitem WHERE member_id = ANY(%s)", ([m.pk for m in members],)).fetchone()
        counted = conn.execute("SELECT coalesce(sum(pending_bytes), 0) FROM inbox_mailbox WHERE member_id = ANY(%s)",
                               ([m.pk for m in members],)).fetchone()[0]
    return {"acknowledged_rows": acknowledged, "pending_bytes_in_items": int(pending_bytes),
            "pending_bytes_in_mailboxes": int(counted)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run(base_url: str, dsn: str, *, requests: int, largest: int, clients: int, warmup: float,
        seconds: float) -> dict:
    """Synchronous (members are created through the ORM); each measurement
    runs its own event loop."""
    result = {"page_items": PAGE_ITEMS, "content_bytes": CONTENT_BYTES, "stages": {}}
    stages = result["stages"]
    for (name, count), handle in zip(STAGES, ("inbox10", "inbox10k", "inbox1m")):
        count = min(count, largest)
        member = create_member(handle)
        stages[name] = {"items": count, **load_items(dsn, {member.pk: count})}
        stages[name].update(asyncio.run(read_stage(base_url, member, count, middle_paths(dsn, member, count),
                                                   requests)))

    # Every page against the 10-item first page (event lookups and held pages
    # against the 10-item stage's own), and 1M against 10k for the same page.
    result["ratios"] = {
        f"{page}_{label}_{key}": _ratio(stages[num].get(page, {}).get(key), ref.get(key))
        for page in ("first", "next", "middle", "event", "held")
        for label, num, ref in (("10k/10", "10k", stages["10"][page if page in ("event", "held") else "first"]),
                                ("1M/10", "1M", stages["10"][page if page in ("event", "held") else "first"]),
                                ("1M/10k", "1M", stages["10k"].get(page, {})))
        for key in ("p50_ms", "p99_ms")
    }

    members = [create_member(f"ack{i:02d}") for i in range(clients)]
    result["ack_load"] = load_items(dsn, {m.pk: ACK_ITEMS for m in members})
    with psycopg.connect(dsn) as conn:
        tokens = [[row[0] for row in conn.execute(
            "SELECT token FROM inbox_inboxitem WHERE member_id = %s AND state = 'pending' ORDER BY position, id",
            (m.pk,))] for m in members]
    ack = result["ack"] = asyncio.run(ack_load(base_url, list(zip(members, tokens)), warmup=warmup, seconds=seconds))
    check = ack["check"] = check_acks(dsn, members)
    check["ok"] = (check["acknowledged_rows"] == ack["acks_total"]
                   and check["pending_bytes_in_items"] == check["pending_bytes_in_mailboxes"])
    return result
