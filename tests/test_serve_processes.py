"""`serve`'s server processes: each accepts on a listening socket of its
own (one SO_REUSEPORT group), and `serve` starts one that dies again on its
socket once it has listened (docs/decisions.md, "Running it")."""
import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.management.base import CommandError

from controlplane.management.commands import serve
from controlplane.management.commands.serve import listening_sockets
from controlplane.processes import in_session, kill_all
from tests.servers import free_port, read_until, serving, start_serving
from tests.test_server import left_behind, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def listening_inodes(pid: int, port: int) -> set[str]:
    """The inodes of the listening sockets on `port` that process `pid` holds."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    listening.add(fields[9])
    held = set()
    with contextlib.suppress(OSError):  # the process is gone
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                held.add(os.readlink(fd).removeprefix("socket:[").removesuffix("]"))
    return listening & held


def server_processes(process) -> list[int]:
    """The uvicorn processes `serve` runs."""
    return serve.server_processes(process.pid)


def test_connections_made_together_spread_over_the_sockets_of_one_port():
    # given: the sockets serve makes for two server processes
    port = free_port()
    sockets = listening_sockets("127.0.0.1", port, 2)
    clients = []
    try:
        for listening in sockets:
            listening.setblocking(False)
        # when: a client makes its 64 connections at once
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
        # then: the kernel spread them over both sockets (all on one: 2 in 2^64)
        accepted = [0, 0]
        for n, listening in enumerate(sockets):
            with contextlib.suppress(BlockingIOError):
                while True:
                    listening.accept()[0].close()
                    accepted[n] += 1
        assert sum(accepted) == 64 and min(accepted) > 0, accepted
    finally:
        for s in clients + sockets:
            s.close()


def test_a_socket_that_joins_the_group_later_gets_no_connection():
    # given: serve's sockets for two processes, and then another socket of the same
    # user in their SO_REUSEPORT group (which the kernel allows)
    port = free_port()
    sockets = listening_sockets("127.0.0.1", port, 2)
    interloper = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    clients = []
    try:
        interloper.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        interloper.bind(("127.0.0.1", port))
        interloper.listen(128)
        # when
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(96)]
        # then: every connection went to serve's sockets, and to both of them
        accepted = []
        for listening in [*sockets, interloper]:
            listening.setblocking(False)
            accepted.append(0)
            with contextlib.suppress(BlockingIOError):
                while True:
                    listening.accept()[0].close()
                    accepted[-1] += 1
        assert accepted[2] == 0 and sum(accepted) == 96 and min(accepted[:2]) > 0, accepted
    finally:
        for s in clients + sockets + [interloper]:
            s.close()


def test_the_sockets_of_port_0_share_the_port_the_first_one_got():
    sockets = listening_sockets("127.0.0.1", 0, 2)
    try:
        assert sockets[0].getsockname()[1] == sockets[1].getsockname()[1] != 0
    finally:
        for s in sockets:
            s.close()


def test_a_port_another_server_listens_on_is_refused_before_anything_starts():
    # given: another server on the port, with SO_REUSEPORT as serve's own sockets
    port = free_port()
    held = listening_sockets("127.0.0.1", port, 1)
    try:
        # when / then: serve's sockets do not join its group
        with pytest.raises(CommandError, match="cannot listen on 127.0.0.1"):
            listening_sockets("127.0.0.1", port, 2)
    finally:
        held[0].close()


@pytest.mark.skipif(not settings.REDIS_URL, reason="several server processes share live updates through Redis")
def test_each_server_process_accepts_on_a_listening_socket_of_its_own():
    """uvicorn's own workers share one socket, and whichever woke first took
    every connection of a burst; serve's processes each have their own."""
    with serving("--no-worker", "--workers", "2") as (base, process):
        port = int(base.rsplit(":", 1)[1])
        servers = server_processes(process)
        assert len(servers) == 2
        inodes = [listening_inodes(pid, port) for pid in servers]
        assert all(len(held) == 1 for held in inodes) and inodes[0] != inodes[1]


def test_a_server_process_that_dies_is_started_again_on_its_socket(tmp_path):
    # given: its log in JSON, to a file
    log_file = open(tmp_path / "serve.log", "w")
    with log_file, serving("--no-worker", "--workers", "1", stderr=log_file, LOG_FORMAT="json") as (base, process):
        port = int(base.rsplit(":", 1)[1])
        (first,) = server_processes(process)
        socket_before = listening_inodes(first, port)
        assert len(socket_before) == 1
        # when
        os.kill(first, signal.SIGKILL)
        # then: another process serves from the same socket, and serve stays up
        wait_until(lambda: [pid for pid in server_processes(process) if pid != first], "no server process was "
                   "started again", seconds=30)
        (second,) = [pid for pid in server_processes(process) if pid != first]
        assert listening_inodes(second, port) == socket_before
        assert httpx.get(f"{base}/healthz", timeout=30).json() == {"status": "ok"}
        assert process.poll() is None
    # and serve said so in the log's format: its lines were plain text among JSON ones (jq stopped there)
    records = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines() if line.strip()]
    assert any(r["message"] == "a server process exited with status -9; starting another on its socket"
               for r in records)


def test_a_server_process_whose_loop_stops_answering_is_started_again_on_its_socket():
    # given: a server process that beats (its event loop runs), watched with a short health check
    with serving("--no-worker", "--workers", "1", SERVE_HEALTHCHECK_SECONDS=3) as (base, process):
        port = int(base.rsplit(":", 1)[1])
        (first,) = server_processes(process)
        socket_before = listening_inodes(first, port)
        time.sleep(7)  # more than twice the health check: a process that beats is left alone
        assert server_processes(process) == [first]
        # when: it stops answering (stopped, as a process whose loop never comes back)
        os.kill(first, signal.SIGSTOP)
        # then: it is killed, and another process serves from the same socket
        wait_until(lambda: first not in server_processes(process), "the stopped process was not killed", seconds=30)
        wait_until(lambda: server_processes(process), "no server process was started again", seconds=30)
        (second,) = server_processes(process)
        assert listening_inodes(second, port) == socket_before
        assert httpx.get(f"{base}/healthz", timeout=30).json() == {"status": "ok"}
        assert process.poll() is None


def test_a_server_process_that_dies_before_it_listens_stops_serve():
    # given: serve starting, its server process still importing the application
    process = start_serving("--no-worker", "--workers", "1")
    try:
        wait_until(lambda: server_processes(process), "no server process started", seconds=30)
        (first,) = server_processes(process)
        # when: it dies before it listens (as one whose code cannot start)
        os.kill(first, signal.SIGKILL)
        # then: serve does not start it again and again; it stops, failing, and leaves nothing
        assert process.wait(30) == 1
        assert "Switchboard is serving" not in process.stdout.read()
        assert left_behind(process) == []
    finally:
        kill_all(lambda: in_session(process.pid))


def test_a_bind_with_no_host_is_asked_and_named_by_its_loopback_address():
    """`--bind :PORT` served, but serve asked `http://:PORT/healthz` for ever:
    it never said where it served and never watched its processes."""
    port = free_port()
    with serving("--no-worker", "--workers", "1", "--bind", f":{port}", port=port) as (base, process):
        printed = []
        threading.Thread(target=lambda: printed.extend(read_until(process, "Switchboard is serving at")),
                         daemon=True).start()
        wait_until(lambda: printed, "serve never said where it serves", seconds=30)
        assert f"Switchboard is serving at http://127.0.0.1:{port}/" in "".join(printed)
