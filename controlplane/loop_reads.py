"""Reads on the event loop's own database connection: `loop_reads`, one per
process, for async code's short reads (live passes, MCP inbox reads)."""
from __future__ import annotations

import asyncio

from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections

from controlplane.db import db_call, plain_rows, pooled, run_steps


class LoopReads:
    """One plain-SQL read from async code, without a thread hop where it
    can: on PostgreSQL, under the ASGI server (`pooled`), on a connection of
    the event loop's own (psycopg's AsyncConnection, one per process, made
    on first use, configured as Django configures its own: time zone, role,
    server-side binding, prepared statements). Elsewhere (SQLite; tests and
    management commands, whose transaction must stay visible) on a request
    thread, as `db_call`.

    Why: a live pass runs after every commit, and its one query took a
    fraction of its time. The rest was handing it to a request thread and
    its result back, each hop waiting for the interpreter lock while the
    sending request wrote its response (docs/benchmarks.md, round
    twenty-one). Calls from one loop share the connection and take turns on
    it: fit for short reads, not for a transaction or a long scan."""

    APPLICATION_NAME = "switchboard-loop"
    READ_TIMEOUT = 10.0  # seconds
    # Unless the settings say otherwise: a connection attempt gives up after
    # 10 s, and TCP keepalives find a connection a firewall dropped while
    # idle in about a minute, not after the kernel's retransmissions.
    CONNECTION_DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30,
                           "keepalives_interval": 10, "keepalives_count": 3}

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection = None
        self._opening: asyncio.Lock | None = None

    @staticmethod
    def on_loop() -> bool:
        return pooled.get() and connection.vendor == "postgresql"

    async def rows(self, sql: str, params: list) -> list[tuple]:
        """The rows of one read. Its errors are Django's, as on a thread
        (an outage is an OperationalError, which callers answer 503). A
        read may run again: once, on a new connection, if this one was lost
        (the server restarted, a proxy dropped it). One not answered within
        READ_TIMEOUT drops the connection, so the reads queued behind it
        go on with a new one instead of waiting on a dead socket."""
        if not self.on_loop():
            return await db_call(plain_rows)(sql, params)
        wrapper = connections[DEFAULT_DB_ALIAS]
        for retry in (False, True):
            conn = None
            try:
                with wrapper.wrap_database_errors:
                    conn = await self._connected()
                    return await self._shielded(self._read(conn, sql, params))
            except TimeoutError:
                self._drop(conn)
                raise
            except OperationalError:
                if retry or conn is None or not conn.broken:
                    raise

    async def _read(self, conn, sql: str, params: list) -> list[tuple]:
        async with asyncio.timeout(self.READ_TIMEOUT):
            async with conn.cursor() as cursor:
                await cursor.execute(sql, params)
                return await cursor.fetchall()

    @staticmethod
    async def _shielded(read):
        """`read`, finished on its own if its caller is cancelled meanwhile
        (a page or an MCP client gone): the shared connection stays in step.
        Cancelled itself, psycopg cancels the query in the server and waits
        for it, but a caller cancelled again and again (as anyio cancels a
        scope) interrupts that wait, and psycopg then closes the connection
        under every other read."""
        task = asyncio.ensure_future(read)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved if left behind
        return await asyncio.shield(task)

    async def run(self, steps):
        """`run_steps` from async code: each statement through `rows`, or,
        where there is no loop connection, the whole read in one call on a
        request thread. The steps' own work runs on the loop: they must
        not use Django's connection (a sync call there raises)."""
        if not self.on_loop():
            return await db_call(run_steps)(steps)
        try:
            query = next(steps)
            while True:
                query = steps.send(await self.rows(*query))
        except StopIteration as done:
            return done.value

    async def _connected(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new server loop (tests make several): its own connection
            self.forget()
            self._loop, self._opening = loop, asyncio.Lock()
        if self._connection is None or self._connection.closed:
            async with self._opening:
                if self._connection is None or self._connection.closed:
                    self._connection = await self._connect()
        return self._connection

    @classmethod
    async def _connect(cls):
        import psycopg

        wrapper = connections[DEFAULT_DB_ALIAS]
        params = wrapper.get_connection_params()
        params.pop("cursor_factory")  # Django's, for sync connections
        binding = wrapper.settings_dict["OPTIONS"].get("server_side_binding") is True
        params.setdefault("application_name", cls.APPLICATION_NAME)
        params = {**cls.CONNECTION_DEFAULTS, **params}
        conn = await psycopg.AsyncConnection.connect(
            **params, autocommit=True, cursor_factory=psycopg.AsyncCursor if binding else psycopg.AsyncClientCursor)
        if (zone := wrapper.timezone_name) and conn.info.parameter_status("TimeZone") != zone:
            await conn.execute(wrapper.ops.set_time_zone_sql(), [zone])
        if role := wrapper.settings_dict["OPTIONS"].get("assume_role"):
            await conn.execute(psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(role)))
        return conn

    def forget(self) -> None:
        """Close the connection of a loop that has ended (a test's), from
        outside it: its socket is closed, with no round trip."""
        if self._connection is not None:
            self._connection.pgconn.finish()
        self._loop = self._connection = self._opening = None

    def _drop(self, conn) -> None:
        """Close `conn` (its socket, no round trip); the next read makes a new one."""
        conn.pgconn.finish()
        if self._connection is conn:
            self._connection = None

    async def close(self) -> None:
        """Close this loop's connection, at the server's shutdown (the lifespan's)."""
        conn, self._connection = self._connection, None
        if conn is not None and self._loop is asyncio.get_running_loop():
            await conn.close()
        elif conn is not None:
            conn.pgconn.finish()


loop_reads = LoopReads()
