"""Prepared statements (DB_PREPARE_THRESHOLD) against client-side binding:
the CPU a send, a live stream's pass and an acknowledgement cost, in this
process and in its PostgreSQL backend. In-process, on one connection that
switches between the two ways every 100 operations, in alternating order:
the machine's drift falls on both alike, where separate runs of the
end-to-end benchmarks differ by more than the change.

PostgreSQL's share is its backend's CPU time (/proc/<pid>/stat, clock
ticks), so the database must run on this machine (it does here)."""
from __future__ import annotations

import os
import time
import uuid

OPERATIONS = 100  # per block
WARMUP = 20


def _backend_seconds(connection) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _use(connection, prepared: bool, threshold: int) -> None:
    """Switch the open connection between the two ways (what the setting
    chooses when a connection is made)."""
    from django.db.backends.postgresql.base import Cursor, ServerBindingCursor

    connection.ensure_connection()
    connection.connection.cursor_factory = ServerBindingCursor if prepared else Cursor
    connection.connection.prepare_threshold = threshold if prepared else None


def _operations() -> dict:
    from controlplane import services
    from controlplane.access import get_conversation_to_write
    from inbox import delivery
    from inbox import services as inbox_services
    from web.streams import read_pass

    tag = uuid.uuid4().hex[:8]
    ann = services.create_member(f"stmt{tag}a", actor=None)
    bob = services.create_member(f"stmt{tag}b", actor=None)
    space = services.create_space(slug=f"stmt{tag}", name="Statements", visibility="open", send_policy="open",
                                  actor=ann)
    services.join_space(space, actor=bob)
    direct, _ = services.get_or_create_direct(space, bob, actor=ann)
    channel = services.create_channel(space, "general", actor=ann)
    sent = iter(range(10**9))

    def send():  # the API's path below the view: the write check, then the send
        target = get_conversation_to_write(space.slug, direct.public_id, ann)
        inbox_services.send_message(target, body=f"statement {next(sent)}", actor=ann)

    def live_pass():
        read_pass(channel.pk, {ann.pk, bob.pk}, 0)

    def acknowledge():  # bob's oldest pending item (each send leaves one), found as a push finds it
        item = delivery.oldest_pending([bob.pk]).get(bob.pk)
        if item is not None:
            delivery.acknowledge_delivery(bob, item.token, actor=bob)

    return {"send": send, "live pass": live_pass, "acknowledgement": acknowledge}


def run(blocks: int = 12) -> dict:
    import logging

    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        return {"error": "needs PostgreSQL"}
    threshold = settings.DATABASES["default"]["OPTIONS"].get("prepare_threshold") or 5
    logging.getLogger("switchboard").setLevel(logging.WARNING)  # a log line per send is not what is measured
    operations = _operations()
    totals = {(name, prepared): [0.0, 0.0, 0] for name in operations for prepared in (False, True)}
    for name, operation in operations.items():
        for prepared in (False, True):
            _use(connection, prepared, threshold)
            for _ in range(WARMUP):
                operation()
    for block in range(blocks):
        for name, operation in operations.items():
            for prepared in ((False, True) if block % 2 == 0 else (True, False)):
                _use(connection, prepared, threshold)
                own, backend = time.process_time(), _backend_seconds(connection)
                for _ in range(OPERATIONS):
                    operation()
                total = totals[(name, prepared)]
                total[0] += time.process_time() - own
                total[1] += _backend_seconds(connection) - backend
                total[2] += OPERATIONS
    _use(connection, threshold > 0, threshold)
    rows = {}
    for name in operations:
        cells = {}
        for prepared in (False, True):
            own, backend, count = totals[(name, prepared)]
            cells["prepared" if prepared else "client_binding"] = {
                "python_us": round(own / count * 1e6), "postgres_us": round(backend / count * 1e6),
                "total_us": round((own + backend) / count * 1e6), "operations": count}
        before, after = cells["client_binding"]["total_us"], cells["prepared"]["total_us"]
        rows[name] = {**cells, "ratio": round(after / before, 2) if before else None}
    return {"threshold": threshold, "operations": rows}
