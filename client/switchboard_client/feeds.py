"""Following a feed forever, and the report of an inbox drain.

A feed page is `{events, cursor, has_more}`; its cursor is exclusive and
covers the whole page (SPEC §6). `Feed.cursor` therefore moves to a page's
cursor when the page's last event is handed out: saved after handling an
event, it never skips an event, and resuming from it repeats at most the
events of the page being handled when the process stopped.
"""
from __future__ import annotations

import inspect
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from switchboard_client.errors import ConnectionFailed, RateLimitError, ResyncRequired, ServerError
from switchboard_client.models import Event, InboxEntry
from switchboard_client.transport import doubled

Resync = Callable[[ResyncRequired], "str | None | Awaitable[str | None]"]
RECONNECT_MAX = 30.0  # seconds between tries while the server is away
EMPTY_POLL_PAUSE = 1.0  # seconds between polls that do not wait (wait_ms=0) and find nothing


class _FeedState:
    """What both feeds share: which page to ask for next, the events not yet
    handed out, and how long to wait after a failure."""

    def __init__(self, *, space: str | None, inbox: bool, after: str | None, wait_ms: int, limit: int | None,
                 on_resync):
        if (space is None) == (not inbox):
            raise ValueError("iter_feed takes space=… or inbox=True")
        self.space, self.inbox = space, inbox
        self.cursor = after
        self.wait_ms, self.limit, self.on_resync = wait_ms, limit, on_resync
        self._buffer: deque[Event] = deque()
        self._page_cursor: str | None = None
        self._failures = 0
        self._immediate = False  # the last page had more: ask again without waiting

    def request(self) -> tuple[str, tuple, dict]:
        params = {"cursor": self.cursor, "limit": self.limit, "wait_ms": 0 if self._immediate else self.wait_ms}
        if self.space is not None:
            return "space_events", (self.space,), params
        return "inbox_events", (), params

    def took(self, page) -> float:
        """Take a page; the seconds to pause before the next (a poll that
        does not wait asked again at once, as fast as the server answered)."""
        self._failures = 0
        self._immediate = page.has_more
        if page.items:
            self._buffer.extend(page.items)
            self._page_cursor = page.cursor
        elif page.cursor:
            self.cursor = page.cursor  # the position given, or past events a space feed may not show
        return EMPTY_POLL_PAUSE if not page.items and not page.has_more and self.wait_ms == 0 else 0.0

    def pop(self) -> Event | None:
        if not self._buffer:
            return None
        event = self._buffer.popleft()
        if not self._buffer:
            self.cursor = self._page_cursor
        return event

    def backoff(self, error) -> float:
        """Seconds to wait after a failure the feed rides out, or raise it."""
        if not isinstance(error, (ServerError, RateLimitError, ConnectionFailed)):
            raise error
        self._failures += 1
        if error.retry_after is not None:
            return min(error.retry_after, RECONNECT_MAX)
        return doubled(0.25, self._failures, RECONNECT_MAX) * random.uniform(0.8, 1.2)

    def resynced(self, cursor: str | None) -> None:
        self._buffer.clear()
        self.cursor = cursor


class _Feed:
    """What a sync and an async feed share: their state, cursor and page size."""

    def __init__(self, client, sleep, options: dict):
        self._client, self._sleep = client, sleep
        self._state = _FeedState(**options)

    @property
    def cursor(self) -> str | None:
        return self._state.cursor

    @property
    def limit(self) -> int | None:
        """The most events the next page asked for may hold (None: the server's default)."""
        return self._state.limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._state.limit = value


class Feed(_Feed):
    """An endless iterator of `Event`s (see `Client.iter_feed`)."""

    def __init__(self, client, *, sleep: Callable[[float], None] = time.sleep, **options):
        super().__init__(client, sleep, options)

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Event:
        state = self._state
        while (event := state.pop()) is None:
            name, args, params = state.request()
            try:
                if pause := state.took(getattr(self._client, name)(*args, **params)):
                    self._sleep(pause)
            except ResyncRequired as gone:
                if state.on_resync is None:
                    raise
                state.resynced(state.on_resync(gone))
            except (ServerError, RateLimitError) as error:
                self._sleep(state.backoff(error))
        return event


class AsyncFeed(_Feed):
    """An endless async iterator of `Event`s (see `AsyncClient.iter_feed`)."""

    def __init__(self, client, *, sleep: Callable[[float], Awaitable[None]] | None = None, **options):
        import asyncio

        super().__init__(client, sleep or asyncio.sleep, options)

    def __aiter__(self) -> AsyncFeed:
        return self

    async def __anext__(self) -> Event:
        state = self._state
        while (event := state.pop()) is None:
            name, args, params = state.request()
            try:
                if pause := state.took(await getattr(self._client, name)(*args, **params)):
                    await self._sleep(pause)
            except ResyncRequired as gone:
                if state.on_resync is None:
                    raise
                cursor = state.on_resync(gone)
                state.resynced(await cursor if inspect.isawaitable(cursor) else cursor)
            except (ServerError, RateLimitError) as error:
                await self._sleep(state.backoff(error))
        return event


@dataclass
class DrainReport:
    """What a drain did: the items acknowledged, and those whose handler
    raised (still pending), with the exception."""
    acknowledged: list[InboxEntry] = field(default_factory=list)
    failed: list[tuple[InboxEntry, Exception]] = field(default_factory=list)

    def finish(self, raise_errors: bool) -> DrainReport:
        if self.failed and raise_errors:
            raise DrainError(self) from self.failed[0][1]
        return self


class DrainError(Exception):
    """At least one handler raised; its items were left pending."""

    def __init__(self, report: DrainReport):
        self.report = report
        super().__init__(f"{len(report.failed)} inbox item(s) left pending: their handler raised "
                         f"({', '.join(sorted({type(e).__name__ for _, e in report.failed}))}); "
                         f"{len(report.acknowledged)} acknowledged")
