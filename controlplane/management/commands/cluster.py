"""Start the scale-out topology on this machine: N `serve` nodes and M
worker processes on PostgreSQL + Redis, behind a round-robin proxy on
--bind, each restarted if it dies, until interrupted (docs/deploy.md)."""
from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from controlplane.binds import bound_url
from controlplane.cluster import Child, Proxy, Supervisor, free_port, node_command, worker_command
from controlplane.management.commands.serve import split_bind
from controlplane.processes import StopRequest
from controlplane.schedules import ensure_schedules

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 60


class Command(BaseCommand):
    help = "Run N serve nodes and M workers behind a local proxy (PostgreSQL + Redis), until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.SWITCHBOARD_BIND, help="the proxy's HOST:PORT")
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--workers", type=int, default=1, help="worker processes (each a django-q2 cluster)")

    def handle(self, *args, bind, nodes, workers, **options):
        if connection.vendor != "postgresql" or not settings.REDIS_URL:
            raise CommandError("a cluster shares PostgreSQL and Redis: set DATABASE_URL=postgres://… and REDIS_URL")
        if nodes < 1 or workers < 0:
            raise CommandError("--nodes must be at least 1 and --workers at least 0")
        host, port = split_bind(bind)
        os.environ.setdefault("SWITCHBOARD_PUBLIC_URL", bound_url(bind))  # the proxy's, for every node and worker
        call_command("recover")
        ensure_schedules()
        connection.close()
        stop = StopRequest()
        ports = [free_port() for _ in range(nodes)]
        supervisor = Supervisor()
        try:
            for n, node_port in enumerate(ports):
                supervisor.add(Child(f"node{n}", node_command(node_port), dict(os.environ)))
            for n in range(workers):
                supervisor.add(Child(f"worker{n}", worker_command(), dict(os.environ)))
            asyncio.run(self._run(supervisor, ports, host, port, stop))
        finally:
            supervisor.stop()

    async def _run(self, supervisor: Supervisor, ports: list[int], host: str, port: int, stop: StopRequest) -> None:
        proxy = Proxy([("127.0.0.1", p) for p in ports])
        try:
            await proxy.start(host, port)
        except OSError as exc:  # as serve says it
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + READY_TIMEOUT_SECONDS
            while not stop.requested and not await asyncio.to_thread(_all_ready, ports):
                if time.monotonic() > deadline:
                    raise CommandError("the nodes did not become ready")
                await asyncio.sleep(0.2)
            self.stdout.write(f"Switchboard cluster: {len(ports)} nodes (ports {', '.join(map(str, ports))}), "
                              f"{sum(c.name.startswith('worker') for c in supervisor.children)} workers, "
                              f"serving at {bound_url(f'{host}:{port}')}/  (Ctrl-C stops)")
            self.stdout.flush()
            while not stop.requested:
                for child in supervisor.tick():
                    log.warning("%s died and was restarted", child.name)
                await asyncio.sleep(0.2)
        finally:
            await proxy.close()


def _all_ready(ports: list[int]) -> bool:
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                if response.status != 200:
                    return False
        except OSError:
            return False
    return True
