"""The fault schedule: what is killed, restarted or skewed, and when."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

from bench.chaos.common import CLOCK_JUMP_SECONDS, FAULTS, HEALTHCHECK_SECONDS, Book
from bench.chaos.services import Postgres
from controlplane.cluster import Child, Supervisor
from controlplane.management.commands.serve import server_processes


class Faults:
    def __init__(self, nodes: list[Child], workers: list[Child], pg: Postgres, redis: Child, book: Book):
        self.nodes, self.workers = nodes, workers
        self.pg, self.redis, self.book = pg, redis, book

    @staticmethod
    def directory(child: Child) -> Path:
        return Path(child.env["SWITCHBOARD_FAULTS"])

    async def arm(self, point: str, candidates: list[Child], wait: float = 15.0) -> bool:
        """Arm `point` in every candidate; the first to reach it dies, the others are disarmed."""
        files = [self.directory(c) / point for c in candidates]
        for f in files:
            f.touch()
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                if any(not f.exists() for f in files):
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            for f in files:
                f.unlink(missing_ok=True)

    async def inject(self, kind: str) -> bool:
        if kind == "node":
            random.choice(self.nodes).kill()
        elif kind == "worker":
            random.choice(self.workers).kill()
        elif kind in ("send.committed", "barrier.step"):
            return await self.arm(kind, self.nodes)
        elif kind in ("webhooks.answered", "webhooks.record", "webhooks.timer"):
            return await self.arm(kind, self.workers)
        elif kind == "postgres":
            await asyncio.to_thread(self.pg.crash_restart)
        elif kind == "redis":
            self.redis.kill()  # the supervisor starts it again, empty
        elif kind == "hang":
            # A node's server process stops mid-load, as one whose event loop
            # never comes back (holding its requests, sockets, transactions
            # and row locks); its `serve` kills it and starts another.
            node = random.choice([n for n in self.nodes if n.alive] or self.nodes)
            running = server_processes(node.process.pid) if node.alive else []
            if not running:
                return False  # the node is starting again: tried later
            os.kill(running[0], signal.SIGSTOP)
            await self._replaced(node, running[0])
        elif kind == "clock":
            # A worker's clock jumps a day ahead, it claims and leases by it,
            # and dies holding claims; restarted, its clock is right. Only a
            # worker that sends reaches the point (the timer's, most of the
            # time): each is tried in turn, so the fault lands while the load
            # runs instead of being put off to the end of the schedule.
            for worker in random.sample(self.workers, len(self.workers)):
                skew = self.directory(worker) / "clock-skew"
                skew.write_text(str(CLOCK_JUMP_SECONDS))
                try:
                    if await self.arm("webhooks.answered", [worker]):
                        return True
                finally:
                    skew.unlink()
            return False
        return True

    async def _replaced(self, node: Child, stopped: int) -> None:
        """Until `serve` has killed the stopped server process (or the node
        died with it); one still there well after the health check counts as
        stuck, and is killed so that the run goes on."""
        deadline = time.monotonic() + HEALTHCHECK_SECONDS + 15
        while node.alive and stopped in server_processes(node.process.pid):
            if time.monotonic() > deadline:
                self.book.unreplaced += 1
                os.kill(stopped, signal.SIGKILL)
                return
            await asyncio.sleep(0.1)

    async def run(self, count: int, interval: float, stop: asyncio.Event) -> None:
        """Inject `count` faults, cycling through the kinds; one armed and not
        reached is not counted and is tried again later in the cycle."""
        schedule = [FAULTS[i % len(FAULTS)] for i in range(count)]
        tries = 0
        while schedule and not stop.is_set() and tries < 2 * count:
            kind = schedule.pop(0)
            tries += 1
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))
            hit = await self.inject(kind)
            (self.book.faults if hit else self.book.faults_missed)[kind] += 1
            if not hit:
                schedule.append(kind)
            print(f"  {self.book.elapsed():6.1f} s fault: {kind}"
                  f"{'' if hit else ' (armed, not reached: tried again later)'}", flush=True)


async def supervise(supervisor: Supervisor, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for child in supervisor.tick():
            print(f"  restarted {child.name}", flush=True)
        await asyncio.sleep(0.1)


