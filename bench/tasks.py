"""The claim sweep's cost per scan over 1,000 and over 100,000 claimed tasks
(SPEC §10: at most 100 check-ins per scan, from a bounded index read).

In-process, on the bench database (PostgreSQL). The tasks are bulk-loaded
in plain SQL (each with its discussion channel), all claimed by one member,
none due. Each measured scan finds SCAN_LIMIT of them due for a check-in
(their update time moved back 19 hours, a fresh check-in key each round,
spread across the table) and emits a check-in for each: the median scan
time is the figure, and the ratio of the two sizes is the target (≤ 1.3).
"""
from __future__ import annotations

import datetime as dt
import statistics
import time

import psycopg

SIZES = (1_000, 100_000)
ROUNDS = 7

_CONVERSATIONS = """
INSERT INTO controlplane_conversation (public_id, space_id, kind, name, address, created_by_id, created_at)
SELECT 'cnv_bench' || lpad(g::text, 12, '0'), %(space)s, 'channel', 'task:bench' || g, '#task:bench' || g,
       %(member)s, now()
FROM generate_series(%(first)s::int, %(last)s::int) g
"""
_TASKS = """
INSERT INTO coordination_task (public_id, space_id, conversation_id, title, description, status, claimant_id,
                               claimed_at, created_by_id, created_at, updated_at, sweep_at)
SELECT 'tsk_bench' || lpad(g::text, 12, '0'), %(space)s, c.id, 'task ' || g, '', 'claimed', %(member)s,
       now(), %(member)s, now(), now(), now() + interval '18 hours'
FROM generate_series(%(first)s::int, %(last)s::int) g
JOIN controlplane_conversation c ON c.address = '#task:bench' || g AND c.space_id = %(space)s
"""


def _load(dsn: str, space: int, member: int, first: int, last: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            params = {"space": space, "member": member, "first": first, "last": last}
            conn.execute(_CONVERSATIONS, params)
            conn.execute(_TASKS, params)
        conn.execute("VACUUM (ANALYZE) coordination_task")
        conn.execute("VACUUM (ANALYZE) controlplane_conversation")


def _scan_ms(space, count: int) -> dict:
    from controlplane.clock import freeze, now
    from coordination import claims
    from coordination.models import Task

    ids = list(Task.objects.filter(space=space).order_by("id").values_list("pk", flat=True))
    step = max(1, len(ids) // claims.SCAN_LIMIT)
    due = ids[::step][:claims.SCAN_LIMIT]
    times, emitted = [], []
    for n in range(ROUNDS):
        at = now()
        Task.objects.filter(pk__in=due).update(updated_at=at - dt.timedelta(hours=19, seconds=n),
                                               sweep_at=at - dt.timedelta(hours=1))
        with freeze(at):
            started = time.perf_counter()
            outcome = claims.scan()
            times.append((time.perf_counter() - started) * 1000)
        emitted.append(outcome["checkins"])
    return {"claimed_tasks": count, "due_per_scan": len(due), "checkins_per_scan": emitted,
            "scan_ms_median": round(statistics.median(times), 1), "scan_ms_min": round(min(times), 1),
            "scan_ms_max": round(max(times), 1)}


def run(dsn: str) -> dict:
    from controlplane import services
    from controlplane.models import Member

    member = Member.objects.filter(handle="bench00").first() or services.create_member("bench00", actor=None)
    space = services.create_space(slug=f"tasks-{time.strftime('%H%M%S')}", name="Tasks", visibility="open",
                                  send_policy="open", actor=member)
    loaded, rows = 0, {}
    for size in SIZES:
        started = time.monotonic()
        _load(dsn, space.pk, member.pk, loaded + 1, size)
        load_seconds = round(time.monotonic() - started, 1)
        loaded = size
        rows[str(size)] = {**_scan_ms(space, size), "load_seconds": load_seconds}
    small, big = (rows[str(s)]["scan_ms_median"] for s in SIZES)
    return {"sizes": rows, "ratio_100k_to_1k": round(big / small, 2), "target": 1.3}
