"""Run the ASGI server and the django-q2 cluster together until interrupted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from controlplane.schedules import ensure_schedules

STOP_GRACE_SECONDS = 10


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                with open(f"/proc/{stat}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(stat))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise CommandError(f"--bind must be HOST:PORT, not {bind!r}")
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = "Serve Switchboard: the ASGI server (Daphne) and the django-q2 worker cluster."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.SWITCHBOARD_BIND, help="HOST:PORT (default SWITCHBOARD_BIND)")
        parser.add_argument("--no-worker", action="store_true", help="do not start the django-q2 cluster")

    def handle(self, *args, bind, no_worker, **options):
        host, port = split_bind(bind)
        ensure_schedules()
        call_command("recover")  # persisted barriers finish before anything is served
        manage = [sys.executable, os.path.join(settings.BASE_DIR, "manage.py")]
        children = [subprocess.Popen([sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "-v", "0",
                                      "controlplane.asgi:application"])]
        if not no_worker:
            children.append(subprocess.Popen([*manage, "qcluster"]))
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        url_host = f"[{host}]" if ":" in host else host
        if self._wait_ready(f"http://{url_host}:{port}/healthz", children, lambda: stopping):
            self.stdout.write(f"Switchboard is serving at http://{url_host}:{port}/  (Ctrl-C stops)", )
            self.stdout.flush()
        while not stopping and all(child.poll() is None for child in children):
            time.sleep(0.2)
        self._stop(children)
        failed = [c.returncode for c in children if c.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)]
        if failed and not stopping:
            raise CommandError(f"a server process exited with status {failed[0]}")

    def _wait_ready(self, url: str, children, stopping) -> bool:
        while not stopping() and all(child.poll() is None for child in children):
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.1)
        return False

    def _stop(self, children) -> None:
        # Everything below us, the cluster's workers included: a child killed
        # after the grace period must not leave its own children running.
        below = descendants(os.getpid())
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for child in children:
            child.wait()
