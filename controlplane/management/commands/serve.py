"""Run the ASGI server and the django-q2 cluster together until interrupted."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from controlplane.binds import bound_url
from controlplane.processes import StopRequest, descendants, in_group, kill_all

log = logging.getLogger(__name__)
STOP_GRACE_SECONDS = 10
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when `serve` dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise CommandError(f"--bind must be HOST:PORT (a port of 0-65535), not {bind!r}")
    return host.strip("[]"), int(port)


APP = "controlplane.asgi:application"
BACKLOG = 2048  # uvicorn's default
# Linux's socket option for a reuseport group's classic BPF program (not
# named by Python's socket module), and the program's instructions as
# (code, jt, jf, k): A = a random number; A %= the group's size; return A.
SO_ATTACH_REUSEPORT_CBPF = 51
SKF_AD_RANDOM = 0xFFFFF000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM
BPF_LD_W_ABS, BPF_ALU_MOD_K, BPF_RET_A = 0x20, 0x94, 0x16
# Beats come every second (controlplane.uvicorn_process) and are read this
# often: a health check shorter than settings.MIN_HEALTHCHECK_SECONDS would
# restart healthy processes (refused where the setting is read).
RESTART_POLL_SECONDS = 0.2


def server_command(server: str, host: str, port: int, workers: int) -> list[str]:
    """granian's or Daphne's command line, each with its own processes
    (docs/benchmarks.md compares them); uvicorn's is `uvicorn_command`."""
    if server == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", host, "--port", str(port),
                "--workers", str(workers), "--loop", "uvloop", "--no-access-log", "--log-level", "warning", APP]
    if server != "daphne":
        raise ValueError(f"no command line for {server!r} here")
    if workers != 1:
        raise CommandError("Daphne serves from one process: use --workers 1, or --server uvicorn")
    return [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "-v", "0", APP]


def uvicorn_command(socket_fd: int, ready_fd: int) -> list[str]:
    """One uvicorn process on the listening socket `socket_fd`, which says
    on `ready_fd` when it listens (controlplane.uvicorn_process)."""
    return [sys.executable, "-m", "controlplane.uvicorn_process", str(socket_fd), str(ready_fd)]


def server_processes(serve_pid: int) -> list[int]:
    """The uvicorn processes (controlplane.uvicorn_process) that the `serve` process `serve_pid` runs now."""
    def command(pid: int) -> bytes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""  # gone
    return [pid for pid in descendants(serve_pid) if b"controlplane.uvicorn_process" in command(pid)]


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on host:port in one SO_REUSEPORT group, one
    per server process: the group's program hands each new connection to one
    of them (`_keep_the_group`). One address family, as uvicorn's `--workers` binds
    (IPv6 where the host has a colon). A plain bind first proves the port
    free: without it, a group another server of the same user holds would
    take these in, and the two servers would share its connections; and
    the group's program keeps out sockets added after these. Port 0: the
    others take the port the first one got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
        for _ in range(count):
            listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(listening)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listening.bind((host, port))
            port = listening.getsockname()[1]
            listening.listen(BACKLOG)
    except OSError as exc:
        for listening in sockets:
            listening.close()
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror} (choose another with --bind or "
                           "SWITCHBOARD_BIND)") from None
    try:
        _keep_the_group(sockets)
    except OSError as exc:  # a kernel without it: the group still spreads connections, by their addresses
        log.warning("serve's sockets take connections without the group's program (%s)", exc.strerror)
    return sockets


def _keep_the_group(sockets: list[socket.socket]) -> None:
    """Have the group hand each new connection to one of `sockets`, at
    random: a socket that another process of the same user adds to the
    group later (the kernel lets it) gets no connection. The program picks
    by a socket's place in the group (the order they listened in), which
    stays fixed while `serve` holds every socket open."""
    program = [(BPF_LD_W_ABS, 0, 0, SKF_AD_RANDOM), (BPF_ALU_MOD_K, 0, 0, len(sockets)), (BPF_RET_A, 0, 0, 0)]
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))
    sockets[0].setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF,
                          struct.pack("HP", len(program), ctypes.addressof(filters)))


@dataclass
class Child:
    """A process `serve` started, leading its own process group. A uvicorn
    process (one with a `listening` socket) says when it listens, and then
    beats every second (controlplane.uvicorn_process); it is started again
    on the same socket if it dies after that, or stops beating
    (`unresponsive`); the connections that came meanwhile wait in the
    socket's backlog."""

    command: list[str] | None = None
    listening: socket.socket | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)
    _ready_pipe: int | None = field(default=None, repr=False)
    _ready: bool = False
    _beat_at: float = 0.0

    def start(self) -> Child:
        self.close()
        if self.listening is None:
            self.process = subprocess.Popen(self.command, process_group=0, preexec_fn=_die_with_parent)
            self._ready = True
            return self
        self._ready_pipe, ready = os.pipe()
        try:
            self.process = subprocess.Popen(uvicorn_command(self.listening.fileno(), ready), process_group=0,
                                            preexec_fn=_die_with_parent, pass_fds=(self.listening.fileno(), ready))
        finally:
            os.close(ready)
        self._ready = False
        return self

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        """Whether it said it listens (any other child: once started); takes its beats."""
        while self._ready_pipe is not None and select.select([self._ready_pipe], [], [], 0)[0]:
            if not os.read(self._ready_pipe, 4096):  # it closed the pipe: it exits
                self.close()
            else:
                self._ready, self._beat_at = True, time.monotonic()
        return self._ready

    def unresponsive(self, seconds: float) -> bool:
        """Whether it listens and has not beaten for `seconds` (0: never): its event loop is stuck."""
        return (self.ready() and self._ready_pipe is not None and seconds > 0
                and time.monotonic() - self._beat_at > seconds)

    def close(self) -> None:
        if self._ready_pipe is not None:
            os.close(self._ready_pipe)
            self._ready_pipe = None


def default_workers() -> int:
    """One server process per core where processes can share the channel
    layer (Redis); one otherwise, as the in-memory layer lives in a process."""
    return (os.cpu_count() or 1) if settings.REDIS_URL else 1


class Command(BaseCommand):
    help = "Serve Switchboard: the ASGI server (uvicorn by default) and the django-q2 worker cluster."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.SWITCHBOARD_BIND, help="HOST:PORT (default SWITCHBOARD_BIND)")
        parser.add_argument("--server", choices=settings.SERVE_SERVERS, default=settings.SERVE_SERVER,
                            help="the ASGI server (default SERVE_SERVER, else uvicorn)")
        parser.add_argument("--workers", type=int, default=settings.SERVE_WORKERS or None,
                            help="server processes (default SERVE_WORKERS, else one per core with REDIS_URL, else 1)")
        parser.add_argument("--no-worker", action="store_true", help="do not start the django-q2 cluster")

    def handle(self, *args, bind, server, workers, no_worker, **options):
        host, port = split_bind(bind)
        workers = workers or default_workers()
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if workers > 1 and not settings.REDIS_URL:
            raise CommandError("several server processes share live updates through Redis: set REDIS_URL, "
                               "or use --workers 1")
        call_command("recover")  # persisted barriers finish before anything is served
        sockets = listening_sockets(host, port, workers) if server == "uvicorn" else []
        port = sockets[0].getsockname()[1] if sockets else port
        # Its processes name where they serve (the issuer of every wake, links
        # in payloads) after --bind, not after SWITCHBOARD_BIND's default.
        os.environ.setdefault("SWITCHBOARD_PUBLIC_URL", bound_url(f"{host}:{port}"))
        # Listen first: a signal between two spawns must not leave a child
        # behind. Each child leads its own process group, so Ctrl-C reaches
        # only this process, which stops them in order, and what a child
        # spawned (the cluster's sentinel and workers) can be found and
        # killed even after the child is gone.
        stop = StopRequest()
        if sockets:
            planned = [Child(listening=listening) for listening in sockets]
        else:
            planned = [Child(server_command(server, host, port, workers))]
        if not no_worker:
            planned.append(Child([sys.executable, os.path.join(settings.BASE_DIR, "manage.py"), "worker"]))
        children = []
        try:
            for child in planned:
                if not stop.requested:
                    children.append(child.start())
            # A wildcard or empty host is asked and named by its loopback address: `http://:8000/` is no URL.
            url = bound_url(f"{host}:{port}")
            if self._wait_ready(f"{url}/healthz", children, stop):
                self.stdout.write(f"Switchboard is serving at {url}/  (Ctrl-C stops)")
                self.stdout.flush()
                self._supervise(children, stop)
        finally:
            for listening in sockets:  # once the processes close theirs, new connections are refused
                listening.close()
            self._stop(children)
        failed = [c.process.returncode for c in children
                  if c.process.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)]
        if failed and not stop.requested:
            raise CommandError(f"a server process exited with status {failed[0]}")

    def _supervise(self, children: list[Child], stop: StopRequest) -> None:
        """Until a stop is asked for, or a child exits that is not started
        again: one that is not a uvicorn process, or one that exited before
        it listened (it cannot start: its code or its settings are broken)."""
        while not stop.requested:
            for child in children:
                if child.alive() and not child.unresponsive(settings.SERVE_HEALTHCHECK_SECONDS):
                    continue
                if child.alive():
                    log.warning("a server process (%d) has not answered for %s s; starting another on its socket",
                                child.process.pid, settings.SERVE_HEALTHCHECK_SECONDS)
                elif child.listening is None or not child.ready():
                    return
                else:
                    log.warning("a server process exited with status %d; starting another on its socket",
                                child.process.returncode)
                kill_all(lambda: in_group(child.process.pid))
                try:
                    child.process.wait(STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    log.error("the server process %d outlived SIGKILL; starting another beside it",
                              child.process.pid)
                if stop.requested:
                    return
                child.start()
            time.sleep(RESTART_POLL_SECONDS)

    def _wait_ready(self, url: str, children: list[Child], stop: StopRequest) -> bool:
        """Whether every server process listens and the server answers."""
        while not stop.requested and all(child.alive() for child in children):
            if not all(child.ready() for child in children):
                time.sleep(0.1)
                continue
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.1)
        return False

    def _stop(self, children: list[Child]) -> None:
        for child in children:
            if child.alive():
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.1, deadline - time.monotonic()))
        for child in children:
            kill_all(lambda: in_group(child.process.pid))
            child.process.wait()
            child.close()
