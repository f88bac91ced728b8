"""Database helpers: calls from long-lived async code (sockets, streams, MCP
handlers), and derived tables for set-based updates."""
from __future__ import annotations

import functools

from channels.db import database_sync_to_async
from django.db import close_old_connections


def db_call(fn):
    """`database_sync_to_async(fn)` that also gives the connection back from
    inside the call, in the context the call ran in. Channels closes old
    connections around the call from the worker thread's own context; for
    the long-lived tasks here that was seen to leave a connection open
    after the socket had gone (on PostgreSQL, a test database that could
    not be dropped). Returning it here is cheap: the pool keeps it."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return database_sync_to_async(call)


def rows_sql(rows: list[tuple], columns: list[str]) -> tuple[str, list]:
    """`rows` as a derived table with `columns` (SQL, params), for one
    `UPDATE … FROM (…) v` instead of a statement per row: a portable
    `SELECT … UNION ALL SELECT …` (PostgreSQL and SQLite alike)."""
    first = "SELECT " + ", ".join(f"%s AS {column}" for column in columns)
    rest = " UNION ALL SELECT " + ", ".join(["%s"] * len(columns))
    return first + rest * (len(rows) - 1), [value for row in rows for value in row]
