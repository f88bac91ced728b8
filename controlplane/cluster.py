"""A local scale-out deployment in one command (`manage.py cluster`), and
the parts the fault matrix (`make chaos`) drives: `serve` nodes and worker
processes under a supervisor that restarts what dies, behind a round-robin
TCP proxy standing in for the load balancer (docs/deploy.md).

Production runs the same processes under its own supervisor (systemd,
Kubernetes) behind its own proxy; nothing here is needed there.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.processes import in_session, kill_all

ROOT = Path(__file__).resolve().parent.parent
RESTART_DELAY_SECONDS = 0.5
STOP_GRACE_SECONDS = 10


def node_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """One `serve` node: one server process, no worker cluster of its own."""
    return [sys.executable, str(ROOT / "manage.py"), "serve", "--bind", f"{host}:{port}", "--workers", "1",
            "--no-worker"]


def worker_command() -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), "worker"]


@dataclass
class Child:
    """A supervised process in a session of its own (so that everything it
    started can be found and killed with it)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path | None = None
    process: subprocess.Popen | None = None
    starts: int = 0
    restart: bool = True
    died_at: float | None = None

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        if self.log:
            out.close()
        self.starts += 1
        self.died_at = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and everything in its session, at once."""
        if self.process is not None:
            kill_all(lambda: in_session(self.process.pid))
            self.process.wait()

    def stop(self) -> None:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_GRACE_SECONDS)
        self.kill()


@dataclass
class Supervisor:
    """Restarts a dead child after RESTART_DELAY_SECONDS, as a process
    supervisor would. `tick()` is called from the caller's loop."""

    children: list[Child] = field(default_factory=list)

    def add(self, child: Child) -> Child:
        self.children.append(child)
        child.start()
        return child

    def tick(self) -> list[Child]:
        """Restart what has been dead long enough; the children restarted."""
        restarted = []
        for child in self.children:
            if child.alive or not child.restart:
                continue
            if child.died_at is None:
                child.kill()  # whatever it left in its session goes with it
                child.died_at = time.monotonic()
            elif time.monotonic() - child.died_at >= RESTART_DELAY_SECONDS:
                child.start()
                restarted.append(child)
        return restarted

    def stop(self) -> None:
        for child in self.children:
            child.restart = False
            if child.alive:
                child.process.send_signal(signal.SIGTERM)
        for child in self.children:
            child.stop()


class Proxy:
    """Round-robin TCP proxy: each connection goes to the next backend that
    accepts it (a dead node is skipped), bytes copied both ways. HTTP and
    WebSockets alike; enough for a local cluster, not a production balancer."""

    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self._next = itertools.cycle(range(len(backends)))
        self.server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port, backlog=1024)

    async def close(self) -> None:
        if self.server:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for _ in range(len(self.backends)):
            host, port = self.backends[next(self._next)]
            try:
                upstream = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
                break
            except (OSError, asyncio.TimeoutError):
                continue
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
