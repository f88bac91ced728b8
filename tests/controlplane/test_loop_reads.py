"""Reads on the event loop's own connection (controlplane.loop_reads,
under the server on PostgreSQL) read what Django's own connection reads;
a lost connection costs a reconnect, not a failed read; one left
unanswered is dropped; any other error is the caller's, as Django's.
(A live pass that reads there: tests/web/test_live_pass.py.)"""
import psycopg
import pytest
from django.db import ProgrammingError

from controlplane.db import db_call, plain_rows
from controlplane.loop_reads import LoopReads, loop_reads
from controlplane.models import Member
from tests.conftest import under_the_server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.mark.asyncio
async def test_a_loop_read_reads_what_djangos_connection_reads(alice):
    sql = (f"SELECT m.created_at, m.handle, current_setting('TimeZone'), current_setting('application_name') "
           f"FROM {Member._meta.db_table} m WHERE m.id = %s")
    by_django = await db_call(plain_rows)(sql, [alice.pk])
    async with under_the_server():
        on_loop = await loop_reads.rows(sql, [alice.pk])
    assert on_loop[0][:3] == by_django[0][:3]
    assert on_loop[0][0].utcoffset() == by_django[0][0].utcoffset()
    assert on_loop[0][3] == loop_reads.APPLICATION_NAME  # so an operator can tell it apart


async def backend_pid() -> int:
    """The server process behind the loop's connection."""
    return (await loop_reads.rows("SELECT pg_backend_pid()", []))[0][0]


def terminate(pid: int) -> bool:
    return plain_rows("SELECT pg_terminate_backend(%s, 5000)", [pid])[0][0]


@pytest.mark.asyncio
async def test_a_lost_loop_connection_costs_a_reconnect_not_a_failed_read():
    async with under_the_server():
        # given: the loop's connection, ended by the server (a restart, an administrator)
        first = await backend_pid()
        assert await db_call(terminate)(first)
        # when: the next read
        second = await backend_pid()
    # then: it ran on a new connection
    assert second != first


@pytest.mark.asyncio
async def test_a_failing_loop_read_raises_djangos_error_and_keeps_its_connection():
    async with under_the_server():
        first = await backend_pid()
        with pytest.raises(ProgrammingError) as raised:  # as on a thread: callers map Django's errors
            await loop_reads.rows("SELECT * FROM no_such_table", [])
        second = await backend_pid()
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
    assert second == first


@pytest.mark.asyncio
async def test_a_database_out_of_reach_is_djangos_operational_error(monkeypatch):
    # given: no loop connection yet, and the database's port refusing connections (loopback)
    from django.db import OperationalError, connection

    from tests.servers import free_port

    monkeypatch.setitem(connection.settings_dict, "PORT", str(free_port()))
    async with under_the_server():
        # when / then: what callers answer 503 (MCP: UNAVAILABLE), as for a thread's read
        with pytest.raises(OperationalError):
            await loop_reads.rows("SELECT 1", [])


@pytest.mark.asyncio
async def test_a_loop_read_left_unanswered_drops_its_connection(monkeypatch):
    # given: a read that outlasts the loop's patience (a dead socket, a lock held elsewhere)
    monkeypatch.setattr(LoopReads, "READ_TIMEOUT", 0.2)
    async with under_the_server():
        first = await backend_pid()
        with pytest.raises(TimeoutError):
            await loop_reads.rows("SELECT pg_sleep(5)", [])
        # then: the reads after it go on, on a new connection
        second = await backend_pid()
    assert second != first


@pytest.mark.asyncio
async def test_a_caller_cancelled_mid_read_leaves_the_connection_to_the_others():
    # given: a read in flight on the loop's connection
    import asyncio

    async with under_the_server():
        first = await backend_pid()
        caller = asyncio.ensure_future(loop_reads.rows("SELECT pg_sleep(0.3)", []))
        await asyncio.sleep(0.05)
        # when: its caller is cancelled, again and again, as anyio cancels a scope (an MCP client gone)
        for _ in range(20):
            caller.cancel()
            await asyncio.sleep(0.001)
        with pytest.raises(asyncio.CancelledError):
            await caller
        # then: the next read runs on the same connection
        second = await backend_pid()
    assert second == first
