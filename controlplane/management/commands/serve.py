"""Run the ASGI server and the django-q2 cluster together until interrupted."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from controlplane.processes import StopRequest, in_group, kill_all

STOP_GRACE_SECONDS = 10
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when `serve` dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise CommandError(f"--bind must be HOST:PORT, not {bind!r}")
    return host.strip("[]"), int(port)


APP = "controlplane.asgi:application"
SERVERS = ("uvicorn", "granian", "daphne")


def server_command(server: str, host: str, port: int, workers: int) -> list[str]:
    """The ASGI server's command line (docs/benchmarks.md compares them)."""
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", APP, "--host", host, "--port", str(port), "--workers", str(workers),
                "--loop", "uvloop", "--http", "httptools", "--ws", "websockets-sansio", "--lifespan", "on",
                "--timeout-graceful-shutdown", "5", "--no-access-log", "--log-level", "warning"]
    if server == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", host, "--port", str(port),
                "--workers", str(workers), "--loop", "uvloop", "--no-access-log", "--log-level", "warning", APP]
    if workers != 1:
        raise CommandError("Daphne serves from one process: use --workers 1, or --server uvicorn")
    return [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "-v", "0", APP]


def default_workers() -> int:
    """One server process per core where processes can share the channel
    layer (Redis); one otherwise, as the in-memory layer lives in a process."""
    return (os.cpu_count() or 1) if settings.REDIS_URL else 1


class Command(BaseCommand):
    help = "Serve Switchboard: the ASGI server (uvicorn by default) and the django-q2 worker cluster."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.SWITCHBOARD_BIND, help="HOST:PORT (default SWITCHBOARD_BIND)")
        parser.add_argument("--server", choices=SERVERS, default=settings.SERVE_SERVER,
                            help="the ASGI server (default SERVE_SERVER, else uvicorn)")
        parser.add_argument("--workers", type=int, default=settings.SERVE_WORKERS or None,
                            help="server processes (default SERVE_WORKERS, else one per core with REDIS_URL, else 1)")
        parser.add_argument("--no-worker", action="store_true", help="do not start the django-q2 cluster")

    def handle(self, *args, bind, server, workers, no_worker, **options):
        host, port = split_bind(bind)
        if server not in SERVERS:
            raise CommandError(f"--server (SERVE_SERVER) must be one of {', '.join(SERVERS)}, not {server!r}")
        workers = workers or default_workers()
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if workers > 1 and not settings.REDIS_URL:
            raise CommandError("several server processes share live updates through Redis: set REDIS_URL, "
                               "or use --workers 1")
        call_command("recover")  # persisted barriers finish before anything is served
        # Listen first: a signal between two spawns must not leave a child
        # behind. Each child leads its own process group, so Ctrl-C reaches
        # only this process, which stops them in order, and what a child
        # spawned (the cluster's sentinel and workers) can be found and
        # killed even after the child is gone.
        stop = StopRequest()
        commands = [server_command(server, host, port, workers)]
        if not no_worker:
            commands.append([sys.executable, os.path.join(settings.BASE_DIR, "manage.py"), "worker"])
        children = []
        try:
            for command in commands:
                if not stop.requested:
                    children.append(subprocess.Popen(command, process_group=0, preexec_fn=_die_with_parent))
            url_host = f"[{host}]" if ":" in host else host
            if self._wait_ready(f"http://{url_host}:{port}/healthz", children, stop):
                self.stdout.write(f"Switchboard is serving at http://{url_host}:{port}/  (Ctrl-C stops)")
                self.stdout.flush()
            while not stop.requested and all(child.poll() is None for child in children):
                time.sleep(0.2)
        finally:
            self._stop(children)
        failed = [c.returncode for c in children if c.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)]
        if failed and not stop.requested:
            raise CommandError(f"a server process exited with status {failed[0]}")

    def _wait_ready(self, url: str, children, stop: StopRequest) -> bool:
        while not stop.requested and all(child.poll() is None for child in children):
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.1)
        return False

    def _stop(self, children) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(max(0.1, deadline - time.monotonic()))
        for child in children:
            kill_all(lambda: in_group(child.pid))
            child.wait()
