"""Database helpers: calls from long-lived async code (sockets, streams, MCP
handlers), reads written once as steps, and derived tables for set-based
updates. Reads on the event loop itself: controlplane.loop_reads."""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import re
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections

from controlplane import turns

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
        if (caller := turns.caller.get()) is None:
            return await on_pool(*args, **kwargs)
        async with turns.request_turns().turn(caller):  # a request's: in its client address's turn
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


def plain_rows(sql: str, params: list) -> list[tuple]:
    """The rows of one plain-SQL read, on this thread's Django connection."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def advisory_lock(name: str) -> None:
    """Hold PostgreSQL's advisory lock for `name` until the transaction ends
    (SQLite's writers take turns anyway, at BEGIN IMMEDIATE)."""
    if connection.vendor == "postgresql":
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def run_steps(steps):
    """The answer of `steps`, run on this thread's connection. `steps` is a
    read written once as a generator: it yields each statement as (sql,
    params), is sent its rows, and returns the answer. Written so, a read
    runs here or on the event loop (controlplane.loop_reads), with no second copy."""
    try:
        query = next(steps)
        while True:
            query = steps.send(plain_rows(*query))
    except StopIteration as done:
        return done.value


def rows_sql(rows: list[tuple], columns: dict[str, str]) -> tuple[str, list]:
    """`rows` (at least one) as a derived table with `columns` (name: SQL
    type), for one `UPDATE … FROM (…) v` or `INSERT … SELECT` instead of a
    statement per row.

    On PostgreSQL with server-side binding (DB_PREPARE_THRESHOLD), one
    array per column, sent in binary and unnested: the statement's text is
    the same however many rows, so psycopg converts it once and PostgreSQL
    prepares it once, where a row of placeholders per row made a new
    statement for every batch size, parsed and planned on every run. (In
    text, an array of pushed items' bodies took milliseconds to escape.)
    Otherwise a `SELECT … UNION ALL SELECT …`, every value cast to its
    column's type on PostgreSQL, which types a UNION by its first row (a
    NULL there made a later number a mismatch); SQLite's values keep their
    own types."""
    if connection.vendor == "postgresql" and connection.settings_dict["OPTIONS"].get("server_side_binding"):
        arrays = ", ".join(f"%b::{sql_type}[]" for sql_type in columns.values())
        return (f"SELECT * FROM unnest({arrays}) AS v({', '.join(columns)})",
                [[row[n] for row in rows] for n in range(len(columns))])
    cast = "CAST(%s AS {})" if connection.vendor == "postgresql" else "%s"
    casts = [cast.format(sql_type) for sql_type in columns.values()]
    first = "SELECT " + ", ".join(f"{value} AS {name}" for value, name in zip(casts, columns))
    rest = " UNION ALL SELECT " + ", ".join(casts)
    return first + rest * (len(rows) - 1), [value for row in rows for value in row]


def unprepared_rows(query) -> list[tuple]:
    """The rows of `query` (a queryset, or SQL and its parameters), which PostgreSQL plans with its parameters on
    every run, never as a prepared statement (DB_PREPARE_THRESHOLD): for a
    read whose best plan depends on them. After five runs a prepared
    statement may keep one generic plan for every value; for a space feed
    that plan walked the whole log by position, filtering on the space (a
    page of a small space in a million-event log read 100,000 rows). On
    PostgreSQL it goes to psycopg's cursor directly, past Django's query
    log (DEBUG)."""
    sql, params = query if isinstance(query, tuple) else query.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with connection.wrap_database_errors:
                cursor.cursor.execute(sql, params, prepare=False)
        else:
            cursor.execute(sql, params)
        return cursor.fetchall()


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
    return models_from_row([model], row)[0]


def models_from_row(models, row) -> list:
    """One instance of each of `models` from consecutive values of `row`
    (selected with each one's `model_columns`, in that order); None where an
    outer join found no row (its primary key is NULL)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    plans = wrapper.__dict__.setdefault("_switchboard_row_plans", {})
    instances, start = [], 0
    for model in models:
        plan = plans.get(model) or plans.setdefault(model, _RowPlan.of(model, wrapper))
        values = list(row[start:start + len(plan.attnames)])
        start += len(plan.attnames)
        if values[plan.pk_index] is None:
            instances.append(None)
            continue
        for index, col, converters in plan.converting:
            value = values[index]
            for convert in converters:
                value = convert(value, col, wrapper)
            values[index] = value
        instances.append(model.from_db(wrapper.alias, plan.attnames, values))
    return instances


@dataclasses.dataclass(frozen=True)
class _RowPlan:
    """How to read `model` from plain-SQL values on one connection (kept on
    it: the converters are its backend's methods): the attribute names, the
    primary key's place, and only the columns the ORM converts (none of
    most on PostgreSQL)."""
    attnames: list[str]
    pk_index: int
    converting: list[tuple]

    @classmethod
    def of(cls, model, wrapper) -> "_RowPlan":
        fields = model._meta.concrete_fields
        converting = []
        for index, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            converters = wrapper.ops.get_db_converters(col) + field.get_db_converters(wrapper)
            if converters:
                converting.append((index, col, converters))
        return cls([field.attname for field in fields], fields.index(model._meta.pk), converting)


class Compiled:
    """A query written once with the ORM, compiled to SQL once per database
    and shape instead of on every run: for the hot reads whose compiling
    cost several times their running (an inbox page, a push's next items).

    `build(*args)` returns the queryset. Each argument is an int, a list of
    ints (an `IN`) or None (a shape of its own, for builds that leave a
    filter out); the ints become the compiled SQL's parameters. A list is
    padded to the next power of two by repeating its last value, which
    changes no `IN`'s answer: a few shapes serve every length, and each
    shape's statement is run often enough to be prepared. The first run of
    a shape builds it with stand-in values and finds where each one went,
    so an argument the build reads in Python, instead of passing it on as a
    parameter, is refused there."""

    SHAPES = 256  # compiled shapes kept per query

    def __init__(self, build) -> None:
        self._build = build
        self._plans: dict[tuple, tuple[str, list, list[tuple[int, int]]]] = {}

    def sql(self, *args) -> tuple[str, list]:
        """The SQL and parameters of `build(*args)`."""
        args = [padded(a) if isinstance(a, list) else a for a in args]
        shape = (connection.vendor, *(None if a is None else len(a) if isinstance(a, list) else -1 for a in args))
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= self.SHAPES:
                self._plans.clear()
            plan = self._plans[shape] = self._compile(shape[1:])
        sql, template, slots = plan
        values = [v for a in args if a is not None for v in (a if isinstance(a, list) else [a])]
        params = list(template)
        for index, value in slots:
            params[index] = values[value]
        return sql, params

    def _compile(self, shape: tuple) -> tuple[str, list, list[tuple[int, int]]]:
        stand_ins = iter(range(_STAND_IN, _STAND_IN - 10**6, -1))
        args = [None if n is None else [next(stand_ins) for _ in range(n)] if n >= 0 else next(stand_ins)
                for n in shape]
        order = {v: i for i, v in enumerate(v for a in args if a is not None
                                            for v in (a if isinstance(a, list) else [a]))}
        sql, params = self._build(*args).query.sql_with_params()
        slots = [(index, order[p]) for index, p in enumerate(params) if isinstance(p, int) and p in order]
        if {value for _, value in slots} != set(order.values()):
            raise ValueError("every argument of a compiled query must become one of its parameters")
        if connection.vendor == "postgresql":
            return _inline_constants(sql, list(params), slots)
        return sql, list(params), slots


def _inline_constants(sql: str, params: list, slots: list[tuple[int, int]]) -> tuple[str, list, list[tuple[int, int]]]:
    """PostgreSQL: the build's own values (a state, an admission, a zero)
    written into the SQL as literals, the arguments left as parameters.
    Once prepared (DB_PREPARE_THRESHOLD), a statement may run one generic
    plan for any parameters, and a generic plan cannot use a partial index
    whose condition a parameter would have to meet: the next pending item
    of an inbox (`admission = 'admitted'`, `inboxitem_pending`) was found by
    walking every item its member ever had (17 ms a push's next item for a
    member with a few thousand acknowledged ones)."""
    from psycopg import sql as pg

    arguments = {index for index, _ in slots}
    moved, kept, parts, index = {}, [], [], 0
    for part in re.split(r"(%%|%s)", sql):
        if part != "%s":
            parts.append(part)
            continue
        value = params[index]
        if index not in arguments and isinstance(value, (str, int)):  # choices and psycopg's Int8 too
            plain = value if isinstance(value, bool) else str.__str__(value) if isinstance(value, str) else int(value)
            parts.append(pg.Literal(plain).as_string().replace("%", "%%"))
        else:
            moved[index] = len(kept)
            kept.append(value)
            parts.append(part)
        index += 1
    return "".join(parts), kept, [(moved[index], value) for index, value in slots]


def padded(values: list) -> list:
    """`values` (the members of an `IN`) padded to the next power of two by
    repeating the last one: the same answer, from one of a few statements."""
    if len(values) < 2:
        return values
    return values + values[-1:] * ((1 << (len(values) - 1).bit_length()) - len(values))


def ids_in(column: str, ids) -> tuple[str, list]:
    """A plain-SQL condition that `column` (an integer column) is one of
    `ids`, and its parameters. On PostgreSQL `= ANY` of one bigint array:
    one statement text whatever the number (prepared once per array type
    psycopg picks for the largest id), where psycopg parses again on every
    run a statement of more than 50 parameters (a push worker's record ran
    two such, with up to 64 ids).
    Elsewhere an `IN (…)` of placeholders, padded (`padded`)."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s::bigint[])", [list(ids)]
    values = padded(list(ids))
    return f"{column} IN ({', '.join(['%s'] * len(values))})", values


_STAND_IN = -(2**62)  # no real id or position comes near
