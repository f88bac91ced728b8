"""`Client` and `AsyncClient`: the operations of `operations.Operations`
run by a sync or an async transport, plus the helpers a consumer needs:
`pages` (follow cursors), `iter_feed` (long-poll a feed forever) and
`drain_inbox` (handle, then acknowledge, every pending item)."""
from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from switchboard_client.config import DEFAULT_HOST, variable_token
from switchboard_client.errors import ResyncRequired, done_synchronously
from switchboard_client.feeds import AsyncFeed, DrainError, DrainReport, Feed, Resync
from switchboard_client.models import InboxEntry
from switchboard_client.operations import Operations
from switchboard_client.transport import AsyncTransport, Call, RetryPolicy, SyncTransport

DEFAULT_URL = DEFAULT_HOST


def _settings(base_url: str | None, token: str | None) -> tuple[str, str | None]:
    base_url = base_url or os.environ.get("SWITCHBOARD_URL") or DEFAULT_URL
    return base_url, token or variable_token(base_url)


class Client(Operations):
    """The API over one `httpx.Client`.

        client = Client("https://switchboard.example", token="sbt_…")
        client.send("lab", "#general", "hello")

    `base_url` and `token` default to `$SWITCHBOARD_URL` and
    `$SWITCHBOARD_TOKEN` (the variable's token only for its own host, as the
    command line has it: config.variable_token); `Client.from_config()` uses what `switchboard
    login` stored. Failed calls raise a `SwitchboardError` subclass after the
    retries `retry` allows (see transport.py for which calls are retried);
    `sleep` is how the client waits between them."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        base_url, token = _settings(base_url, token)
        self.transport = SyncTransport(base_url, token, timeout=timeout, retry=retry or RetryPolicy(), http=http,
                                       sleep=sleep)

    @classmethod
    def from_config(cls, host: str | None = None, **kwargs) -> Client:
        from switchboard_client.config import resolve

        base_url, token = resolve(host)
        return cls(base_url, token, **kwargs)

    @property
    def base_url(self) -> str:
        return self.transport.base_url

    def _run(self, call: Call) -> Any:
        return self.transport.execute(call)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pages(self, list_method: Callable, *args, **kwargs):
        """Every item of a paged list, following its cursors:
        `for space in client.pages(client.my_spaces): …`."""
        cursor = kwargs.pop("cursor", None)
        while True:
            page = list_method(*args, cursor=cursor, **kwargs)
            yield from page.items
            if not page.has_more or page.cursor is None:
                return
            cursor = page.cursor

    def iter_feed(self, *, space: str | None = None, inbox: bool = False, after: str | None = None,
                  wait_ms: int = 30_000, limit: int | None = None, on_resync: Resync | None = None) -> Feed:
        """Every event of a space's feed (`space=`) or of the caller's inbox
        feed (`inbox=True`) after the cursor `after`, forever: an empty page
        long-polls `wait_ms`, and a server that went away is waited for
        (with backoff) and resumed from the last cursor, so nothing is lost or
        repeated. `feed.cursor` is the checkpoint to keep (see feeds.Feed).

        On 410 RESYNC_REQUIRED it raises `ResyncRequired`, unless `on_resync`
        is given: it is called with the error, re-snapshots, and returns the
        cursor to go on from (None: the oldest retained event)."""
        return Feed(self, space=space, inbox=inbox, after=after, wait_ms=wait_ms, limit=limit, on_resync=on_resync)

    def drain_inbox(self, handler: Callable[[InboxEntry], Any], *, raise_errors: bool = True) -> DrainReport:
        """Call `handler` on every pending inbox item, oldest first, and
        acknowledge each one only after its handler returned.

        An item whose handler raises is never acknowledged: it stays pending
        (the next drain offers it again) and the drain goes on with the
        others. Pages are read again until a pass finds nothing new, so
        items arriving meanwhile are handled too. At the end, if a handler
        failed, `DrainError` is raised (its `.report` lists what was
        acknowledged and what failed, its `__cause__` is the first failure);
        with `raise_errors=False` the report is returned instead. API errors
        (reading or acknowledging) propagate at once; so do exceptions that
        are not `Exception`s (KeyboardInterrupt)."""
        report, failed = DrainReport(), set()
        while True:
            handled = 0
            cursor = None
            while True:
                page = self.read_inbox(cursor=cursor)
                for entry in page.items:
                    if entry.token in failed:
                        continue
                    handled += 1
                    try:
                        done_synchronously(handler(entry), "The handler")
                    except Exception as exc:  # noqa: BLE001 - kept in the report, raised at the end
                        failed.add(entry.token)
                        report.failed.append((entry, exc))
                        continue
                    self.acknowledge(entry.token)
                    report.acknowledged.append(entry)
                if page.cursor is None:
                    break
                cursor = page.cursor
            if handled == 0:
                return report.finish(raise_errors)


class AsyncClient(Operations):
    """The same API, every operation awaitable: `await client.send(…)`.
    `iter_feed` is an async iterator; `drain_inbox` accepts sync or async
    handlers."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.AsyncClient | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        base_url, token = _settings(base_url, token)
        self.transport = AsyncTransport(base_url, token, timeout=timeout, retry=retry or RetryPolicy(), http=http,
                                        sleep=sleep)

    @classmethod
    def from_config(cls, host: str | None = None, **kwargs) -> AsyncClient:
        from switchboard_client.config import resolve

        base_url, token = resolve(host)
        return cls(base_url, token, **kwargs)

    @property
    def base_url(self) -> str:
        return self.transport.base_url

    def _run(self, call: Call) -> Any:
        return self.transport.execute(call)  # a coroutine

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def pages(self, list_method: Callable, *args, **kwargs):
        cursor = kwargs.pop("cursor", None)
        while True:
            page = await list_method(*args, cursor=cursor, **kwargs)
            for item in page.items:
                yield item
            if not page.has_more or page.cursor is None:
                return
            cursor = page.cursor

    def iter_feed(self, *, space: str | None = None, inbox: bool = False, after: str | None = None,
                  wait_ms: int = 30_000, limit: int | None = None, on_resync: Resync | None = None) -> AsyncFeed:
        """As `Client.iter_feed`; `on_resync` may be async."""
        return AsyncFeed(self, space=space, inbox=inbox, after=after, wait_ms=wait_ms, limit=limit,
                         on_resync=on_resync)

    async def drain_inbox(self, handler: Callable[[InboxEntry], Any], *, raise_errors: bool = True) -> DrainReport:
        """As `Client.drain_inbox`; `handler` may be a coroutine function."""
        report, failed = DrainReport(), set()
        while True:
            handled = 0
            cursor = None
            while True:
                page = await self.read_inbox(cursor=cursor)
                for entry in page.items:
                    if entry.token in failed:
                        continue
                    handled += 1
                    try:
                        result = handler(entry)
                        if inspect.isawaitable(result):
                            await result
                    except Exception as exc:  # noqa: BLE001 - kept in the report, raised at the end
                        failed.add(entry.token)
                        report.failed.append((entry, exc))
                        continue
                    await self.acknowledge(entry.token)
                    report.acknowledged.append(entry)
                if page.cursor is None:
                    break
                cursor = page.cursor
            if handled == 0:
                return report.finish(raise_errors)


__all__ = ["AsyncClient", "Client", "DrainError", "DrainReport", "ResyncRequired"]
