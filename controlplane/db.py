"""Database helpers: calls from long-lived async code (sockets, streams, MCP
handlers), and derived tables for set-based updates."""
from __future__ import annotations

import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections

_pool: ThreadPoolExecutor | None = None
# Set by the ASGI application (controlplane.asgi) for everything it serves:
# elsewhere (the test client, management commands) sync work stays on
# asgiref's thread-sensitive thread, where a test's transaction is visible.
pooled = contextvars.ContextVar("switchboard_pooled", default=False)


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=settings.SYNC_THREADS, thread_name_prefix="switchboard-sync")
    return _pool


def in_pool(fn):
    """`fn` as a coroutine function. In a request of the ASGI server it runs
    on the process's pool of SYNC_THREADS long-lived threads (each keeps its
    Django connection object; the connection itself goes back to the
    database pool when the caller closes it): no thread is made per call,
    and calls overlap their database waits. Elsewhere, `sync_to_async(fn)`."""
    shared, on_pool = sync_to_async(fn), None

    @functools.wraps(fn)
    async def call(*args, **kwargs):
        nonlocal on_pool
        if not pooled.get():
            return await shared(*args, **kwargs)
        if on_pool is None:
            on_pool = sync_to_async(fn, thread_sensitive=False, executor=_executor())
        return await on_pool(*args, **kwargs)

    return call


def db_call(fn):
    """`fn` as a coroutine function for long-lived async code (sockets,
    streams, MCP handlers): it runs as `in_pool` says, and gives the
    connection back from inside the call, in the thread it ran in (Channels'
    own wrapper closes old connections from another context; for these
    long-lived tasks that was seen to leave a connection open after the
    socket had gone). Returning it is cheap: the pool keeps it."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return in_pool(call)


def rows_sql(rows: list[tuple], columns: dict[str, str]) -> tuple[str, list]:
    """`rows` as a derived table with `columns` (name: SQL type), for one
    `UPDATE … FROM (…) v` instead of a statement per row: a portable
    `SELECT … UNION ALL SELECT …` (PostgreSQL and SQLite alike). Every value
    is cast to its column's type: PostgreSQL types a UNION by its first
    row, and a NULL there would otherwise make a later number a mismatch."""
    casts = [f"CAST(%s AS {sql_type})" for sql_type in columns.values()]
    first = "SELECT " + ", ".join(f"{cast} AS {name}" for cast, name in zip(casts, columns))
    rest = " UNION ALL SELECT " + ", ".join(casts)
    return first + rest * (len(rows) - 1), [value for row in rows for value in row]


def datetime_from_db(value):
    """A datetime column read with plain SQL, as the ORM's converters give
    it: aware on SQLite too, where the cursor gives it naive (or as text)."""
    convert = getattr(connection.ops, "convert_datetimefield_value", None)
    return convert(value, None, connection) if convert else value


def model_columns(model, alias: str) -> str:
    """Every column of `model` in a plain-SQL select from `alias`, in the
    order `model_from_row` reads them."""
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(field.column)}" for field in model._meta.concrete_fields)


def model_from_row(model, row):
    """An instance of `model` from the first values of `row` (selected with
    `model_columns`), each converted as the ORM converts its field's column
    (SQLite's integers to booleans, its naive datetimes to aware ones)."""
    values = []
    for value, (col, converters) in zip(row, _converters(model)):
        for convert in converters:
            value = convert(value, col, connection)
        values.append(value)
    return model.from_db(connection.alias, [field.attname for field in model._meta.concrete_fields], values)


def _converters(model) -> list[tuple]:
    """The ORM's converters of each of `model`'s columns, kept on this
    thread's connection (they are its backend's methods)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    known = wrapper.__dict__.setdefault("_switchboard_converters", {})
    if model not in known:
        cols = [field.get_col(model._meta.db_table) for field in model._meta.concrete_fields]
        known[model] = [(col, wrapper.ops.get_db_converters(col) + col.field.get_db_converters(wrapper))
                        for col in cols]
    return known[model]
