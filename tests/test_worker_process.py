"""The worker command as a real process: how it stops, and the database
connections of the processes its cluster forks."""
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from controlplane.processes import descendants, in_session, kill_all
from tests.servers import left_behind, manage, serving

pytestmark = pytest.mark.django_db(transaction=True)


def database_sockets(pid: int, port: int) -> set[str]:
    """The inodes of `pid`'s TCP connections to `port` on the database host."""
    to_port = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                to_port.add(fields[9])
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and target[8:-1] in to_port:
                held.add(target[8:-1])
    return held


def test_a_worker_stops_when_its_whole_process_group_is_told_to():
    """A service manager (systemd's control-group kill mode, `kill -TERM --
    -pgid`) signals every process of the worker at once: the cluster's own
    processes end at once, and the command had hung for ever setting an
    event one of them held."""
    import subprocess
    import sys

    from tests.servers import ROOT, server_env

    process = subprocess.Popen([sys.executable, "manage.py", "worker"], cwd=ROOT, env=server_env(),
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(descendants(process.pid)) < 4:  # the sentinel, its workers, monitor and pusher
            assert time.monotonic() < deadline, "the cluster never started"
            time.sleep(0.2)
        time.sleep(1)
        # when
        os.killpg(process.pid, signal.SIGTERM)
        # then
        assert process.wait(20) is not None
        assert left_behind(process) == []
    finally:
        kill_all(lambda: in_session(process.pid))


@pytest.mark.postgres
def test_the_worker_forks_with_no_database_connection_open(settings):
    # given: the worker opens the database (its schedules) before its cluster forks
    port = int(settings.DATABASES["default"].get("PORT") or 5432)
    with serving() as (base, process):
        deadline = time.monotonic() + 30
        while len(worker := [pid for pid in descendants(process.pid)
                             if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]) < 4:
            assert time.monotonic() < deadline, "the cluster never started its workers"
            time.sleep(0.2)
        time.sleep(2)  # the cluster's processes connect as they start
        # then: no connection is held by two processes at once
        held = [database_sockets(pid, port) for pid in worker]
    assert all(not (a & b) for i, a in enumerate(held) for b in held[i + 1:])


FORK_SCRIPT = """
import os, sys
from django.db import connection
from controlplane.management.commands import worker
os.register_at_fork(after_in_child=worker.forget_inherited_connections)
with connection.cursor() as cursor:   # the parent uses the database (and its pool)
    cursor.execute("SELECT 1")
connection.close()
pid = os.fork()
if pid == 0:
    try:   # more connections than the pool keeps idle: the pool must open new ones
        connection.pool.open()  # as Django does at a connection's start
        held = [connection.pool.getconn(timeout=3) for _ in range(4)]
        os._exit(0 if all(c.execute("SELECT 2").fetchone() == (2,) for c in held) else 3)
    except Exception:
        os._exit(4)
_, status = os.waitpid(pid, 0)
with connection.cursor() as cursor:   # and the parent's own connection still works
    cursor.execute("SELECT 3")
    assert cursor.fetchone() == (3,)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.postgres
def test_a_worker_forked_after_the_parent_used_the_database_gets_connections():
    # given: a parent process that used its pool, then forks (as the cluster reincarnates a worker)
    out = manage("shell", "-c", FORK_SCRIPT)
    # then: the child queried on connections of its own (an inherited pool has no threads and times out)
    assert out.strip().splitlines()[-1] == "0"
