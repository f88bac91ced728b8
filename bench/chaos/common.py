"""What every part of the fault matrix shares: the scenario's constants, the
book of what happened, and the API client the load drives.
"""
from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent.parent

PY = sys.executable
PASSWORD = "chaos-watcher-password-0123456789"
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
SENDERS = 6
RECIPIENTS = 7        # r0–r2 read and acknowledge, r3–r4 take pushes, r5–r6 are never read
READERS = ("r0", "r1", "r2", "rg")
PUSHED = {"r3": "ok", "r4": "sometimes"}
UNREAD = ("r5", "r6")
SPACE_PATHS = ("ok", "slow", "flaky", "throttle", "timeout", "gone")
INBOX_PATHS = {"r0": "ok", "r1": "flaky", "r2": "throttle", "r5": "timeout", "r6": "ok"}
CONCURRENCY = 16
GRANT_SENDS = 5       # messages under each grant before it is revoked
LEASE_SECONDS = 20    # webhook claim leases (longer than any request); short, so a killed claim returns soon
CLOCK_JUMP_SECONDS = 25 * 3600  # past every lease: webhook claims (seconds), MCP subscriptions (24 h)
SETTLE_TIMEOUT = 420.0
FAULTS = ("node", "clock", "worker", "send.committed", "webhooks.answered", "webhooks.record", "webhooks.timer",
          "barrier.step", "postgres", "redis", "hang")
HEALTHCHECK_SECONDS = 3  # a node's server process that stops answering is replaced this soon




@dataclass
class Book:
    """What the clients saw; compared with the database at the end."""

    accepted: dict[str, str] = field(default_factory=dict)        # idempotency key -> message id
    targets: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (sender, conversation)
    refused: Counter = field(default_factory=Counter)  # 4xx that a correct send never gets
    retries: int = 0
    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # member -> tokens
    frames: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))  # socket -> frames
    reconnects: int = 0
    socket_errors: Counter = field(default_factory=Counter)  # connections lost with an error message, by kind
    began: float = field(default_factory=time.monotonic)  # the run's clock, for the log's times
    last_frame_at: dict[str, float] = field(default_factory=dict)  # socket -> seconds into the run
    faults: Counter = field(default_factory=Counter)
    faults_missed: Counter = field(default_factory=Counter)
    unreplaced: int = 0  # stopped server processes their `serve` did not replace
    grants: list[str] = field(default_factory=list)
    operations: Counter = field(default_factory=Counter)

    def elapsed(self) -> float:
        """Seconds since the run began."""
        return time.monotonic() - self.began


class Api:
    def __init__(self, session: aiohttp.ClientSession, base: str, book: Book):
        self.session, self.base, self.book = session, base, book

    async def call(self, token: str, method: str, path: str, body: dict | None = None, *, key: str | None = None,
                   retry: bool = True, ok: tuple[int, ...] = (200, 201)) -> tuple[int, dict]:
        """The call, retried after connection errors, 5xx and 429 (same key) until it is answered otherwise."""
        headers = {"Authorization": f"Bearer {token}"}
        if key:
            headers["Idempotency-Key"] = key
        while True:
            try:
                async with self.session.request(method, self.base + path, json=body, headers=headers) as response:
                    data = await response.json(content_type=None)
                    if response.status in ok or not retry or (response.status < 500 and response.status != 429):
                        return response.status, data or {}
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            self.book.retries += 1
            await asyncio.sleep(0.2)


