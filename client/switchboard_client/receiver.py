"""`WakeReceiver`: a whole webhook receiver for Switchboard's wakes, with an
ASGI and a WSGI adapter.

For each request it:
1. verifies it (verify.py): Ed25519 for native wakes and challenges (and the
   HMAC when the endpoint has a secret), or the Standard Webhooks HMAC alone
   for MCP pushes; a stale timestamp, a body id other than the Webhook-Id,
   a wrong issuer: 400 (401 for a signature); 503 when the signing keys
   could not be fetched, so the server retries;
2. answers a challenge (`spaces.webhook.challenge`, MCP `verification`)
   with 200 `{"challenge"}`;
3. refuses a wake of a subscription it was not configured for (400);
4. answers a delivery id it has already recorded with 202 and does nothing
   else: the server's retries stop, the callbacks are not called twice;
5. calls `on_inbox_wake(wake)` or `on_space_wake(wake)`, then records the
   delivery id and the subscription's watermark (the wake's `through`) in
   the store, then answers 202. A callback or store that raises gets 500,
   so the server retries; the callback is thus called at least once per
   delivery (keep it short: enqueue work, then read the feed from your own
   processed cursor elsewhere).
"""
from __future__ import annotations

import asyncio
import inspect
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from switchboard_client.errors import done_synchronously
from switchboard_client.verify import (CHALLENGE, KEY_FETCH_SECONDS, MCP_VERIFICATION, TOLERANCE_SECONDS, InvalidWake,
                                       SigningKeysUnavailable, WakeVerifier, keys_from_listing)

INBOX_TYPE, SPACE_TYPE = "spaces.inbox_events.available", "spaces.events.available"
MCP_HEADER = "x-mcp-subscription-id"


@dataclass(frozen=True)
class Wake:
    """A verified wake. `kind` is "inbox" or "space"; `after`/`through` the
    feed range it names (None for an MCP `inbox.item` push, which carries
    its item in `body["data"]`); `chained` is False when `after` is not the
    previous wake's `through` (a wake was lost, or this one is a replay):
    read from your own processed cursor in any case."""
    id: str
    kind: str
    subscription_id: str | None
    space: str | None
    after: str | None
    through: str | None
    source: str  # "webhook" (native) or "mcp"
    name: str  # the envelope type, or the MCP event name
    body: dict = field(repr=False)
    chained: bool = True


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict
    reason: str | None = None  # why a request was refused, for your logs

    def content(self) -> bytes:
        return json.dumps(self.body).encode()


# A wake's body is small, and a pushed MCP item's at most 256 KiB (SPEC §13):
# the adapters read no more of an unsigned request than this, and answer
# 413 past it (which only a forged request can reach).
MAX_BODY_BYTES = 256 * 1024 + 4096
TOO_LARGE = Reply(413, {"error": "body too large"}, "body too large")


class WakeStore(Protocol):
    """Where delivery ids and watermarks persist. `record` must store both
    together (or neither). A wake moves its subscription's watermark to its
    `through` unless a wake recorded before began or ended there: a replay
    resends an old range (SPEC §8), of a wake recorded or lost, and must not
    move the watermark back. (A replay older than every wake a store
    remembers still does: cursors are opaque, so nothing else orders them.)"""

    def seen(self, delivery_id: str) -> bool: ...

    def record(self, wake: Wake) -> None: ...

    def watermark(self, subscription_id: str) -> str | None: ...


class MemoryWakeStore:
    """In memory, bounded to the latest `remember` ids: lost on restart."""

    def __init__(self, remember: int = 100_000):
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()  # (subscription, after or through)
        self._watermarks: dict[str, str] = {}
        self._remember = remember
        self._lock = threading.Lock()

    def seen(self, delivery_id: str) -> bool:
        with self._lock:
            return delivery_id in self._ids

    def record(self, wake: Wake) -> None:
        with self._lock:
            self._ids[wake.id] = None
            if len(self._ids) > self._remember:
                self._ids.popitem(last=False)
            if wake.subscription_id and wake.through:
                if (wake.subscription_id, wake.through) not in self._known:
                    self._watermarks[wake.subscription_id] = wake.through
                for cursor in (wake.after, wake.through):
                    self._known[wake.subscription_id, cursor] = None
                while len(self._known) > 2 * self._remember:
                    self._known.popitem(last=False)

    def watermark(self, subscription_id: str) -> str | None:
        with self._lock:
            return self._watermarks.get(subscription_id)


class SQLiteWakeStore:
    """In an SQLite file: survives restarts; one transaction per wake.
    Bounded as `MemoryWakeStore` is, to the latest `remember` ids (and twice
    as many cursors): a wake's redelivery comes within hours, and the file
    no longer grows with every wake for as long as the receiver runs."""

    def __init__(self, path: str | Path, remember: int = 1_000_000):
        self.path = str(path)
        self._remember = remember
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS seen_wakes (id TEXT PRIMARY KEY, subscription TEXT, "
                       "received_at REAL NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS watermarks (subscription TEXT PRIMARY KEY, through TEXT NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS wake_cursors (subscription TEXT NOT NULL, cursor TEXT NOT NULL, "
                       "PRIMARY KEY (subscription, cursor))")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def seen(self, delivery_id: str) -> bool:
        with self._connect() as db:
            return db.execute("SELECT 1 FROM seen_wakes WHERE id = ?", (delivery_id,)).fetchone() is not None

    def record(self, wake: Wake) -> None:
        with self._connect() as db:  # one transaction: committed on leaving the block
            db.execute("INSERT OR IGNORE INTO seen_wakes VALUES (?, ?, ?)", (wake.id, wake.subscription_id,
                                                                            time.time()))
            if wake.subscription_id and wake.through:
                if not db.execute("SELECT 1 FROM wake_cursors WHERE subscription = ? AND cursor = ?",
                                  (wake.subscription_id, wake.through)).fetchone():
                    db.execute("INSERT INTO watermarks VALUES (?, ?) ON CONFLICT (subscription) "
                               "DO UPDATE SET through = excluded.through", (wake.subscription_id, wake.through))
                db.executemany("INSERT OR IGNORE INTO wake_cursors VALUES (?, ?)",
                               [(wake.subscription_id, c) for c in (wake.after, wake.through) if c])
            # The oldest rows past the bound (rowids grow with each insert): a seek, not a scan.
            for table, keep in (("seen_wakes", self._remember), ("wake_cursors", 2 * self._remember)):
                db.execute(f"DELETE FROM {table} WHERE rowid <= (SELECT max(rowid) FROM {table}) - ?", (keep,))

    def watermark(self, subscription_id: str) -> str | None:
        with self._connect() as db:
            row = db.execute("SELECT through FROM watermarks WHERE subscription = ?", (subscription_id,)).fetchone()
        return row[0] if row else None


Callback = Callable[[Wake], Any]


def _fetcher_once(client) -> Callable[[], dict[str, bytes]]:
    """The published keys through `client`'s connection, tried once within
    KEY_FETCH_SECONDS: an unknown key id (anyone can send one) must not
    hold a receiver's worker through the client's retries and their
    Retry-After waits, as `fetch_signing_keys` does not either."""
    from switchboard_client.routes import ROUTES
    import httpx

    from switchboard_client.transport import NO_RETRIES, Call, SyncTransport

    # Keys are fetched synchronously: an AsyncClient's connection cannot be
    # used for that (every wake was a 503), so it gets one of its own.
    http = client.transport.http if isinstance(client.transport.http, httpx.Client) else None
    transport = SyncTransport(client.transport.base_url, None, timeout=KEY_FETCH_SECONDS, retry=NO_RETRIES,
                              http=http)
    route = ROUTES["list_webhook_signing_keys"]
    return lambda: keys_from_listing(transport.execute(Call(route, route.url(), lambda data: data)))


class WakeReceiver:
    """See the module docstring. Keys come from `keys` (a mapping or a
    callable returning one), else from `client.signing_keys()`, else from
    `base_url`'s `/v0/webhook-signing-keys`; they are fetched again when a
    wake names a key id not yet known, at most once per
    `KEY_REFRESH_SECONDS` (verify.py).

    Configure the subscriptions you created: `inbox_subscription_id`,
    `space_subscription_ids`, `mcp_subscription_ids`. A kind left
    unconfigured accepts any subscription id (handy while trying things; not
    in production)."""

    def __init__(self, *, keys=None, client=None, base_url: str | None = None, issuer: str | None = None,
                 secret: str | None = None, mcp_secret: str | list[str] | None = None,
                 inbox_subscription_id: str | None = None, space_subscription_ids=(), mcp_subscription_ids=(),
                 on_inbox_wake: Callback | None = None, on_space_wake: Callback | None = None,
                 store: WakeStore | None = None, tolerance: int = TOLERANCE_SECONDS,
                 clock: Callable[[], float] = time.time):
        if keys is None and client is not None:
            keys = _fetcher_once(client)
        elif keys is None and base_url is not None:
            from switchboard_client.verify import fetch_signing_keys

            keys = lambda: fetch_signing_keys(base_url)  # noqa: E731
        self.verifier = WakeVerifier(keys, issuer=issuer, secret=secret, mcp_secret=mcp_secret,
                                     tolerance=tolerance, clock=clock)
        self.inbox_subscription_id = inbox_subscription_id
        self.space_subscription_ids = frozenset(space_subscription_ids)
        self.mcp_subscription_ids = frozenset(mcp_subscription_ids)
        self.on_inbox_wake, self.on_space_wake = on_inbox_wake, on_space_wake
        self.store = store if store is not None else MemoryWakeStore()

        async def asgi(scope, receive, send) -> None:
            """An ASGI 3 application answering POSTs on any path (`uvicorn module:receiver.asgi`).
            A plain function, not a bound method, so that servers detect it as ASGI 3."""
            await self._asgi(scope, receive, send)

        self.asgi = asgi

    # --- the watermark: the latest `through` recorded per subscription
    @property
    def inbox_watermark(self) -> str | None:
        """The `through` of the latest inbox wake recorded: after a restart,
        read the inbox feed from your processed cursor at least this far."""
        return self.store.watermark(self.inbox_subscription_id) if self.inbox_subscription_id else None

    def watermark(self, subscription_id: str) -> str | None:
        return self.store.watermark(subscription_id)

    # --- the steps
    def prepare(self, headers: Mapping[str, str], body: bytes) -> Reply | Wake:
        """Verify and classify: a `Reply` to send at once, or a new `Wake`."""
        lowered = {k.lower(): v for k, v in headers.items()}
        try:
            if "webhook-key-id" not in lowered and MCP_HEADER in lowered:
                wake = self._mcp_wake(lowered, self.verifier.verify_standard(lowered, body))
            else:
                wake = self._native_wake(self.verifier.verify(lowered, body))
        except InvalidWake as invalid:
            return Reply(401 if invalid.signature else 400, {"error": invalid.reason}, invalid.reason)
        except SigningKeysUnavailable as unavailable:
            return Reply(503, {"error": "signing keys unavailable"}, str(unavailable))
        if isinstance(wake, Reply):
            return wake
        try:
            if self.store.seen(wake.id):
                return Reply(202, {"duplicate": True}, "already received")
            previous = self.store.watermark(wake.subscription_id) if wake.subscription_id else None
        except Exception as failure:  # noqa: BLE001 - the server retries a 5xx
            return Reply(503, {"error": "store unavailable"}, f"{type(failure).__name__}: {failure}")
        if previous is not None and wake.after != previous:
            wake = Wake(**{**wake.__dict__, "chained": False})
        return wake

    def _native_wake(self, body: dict) -> Wake | Reply:
        if body["type"] == CHALLENGE:
            return Reply(200, {"challenge": body.get("challenge")})
        subscription = (body.get("subscription") or {}).get("id")
        kind = "inbox" if body["type"] == INBOX_TYPE else "space"
        allowed = ({self.inbox_subscription_id} if self.inbox_subscription_id else None) if kind == "inbox" \
            else (self.space_subscription_ids or None)
        if allowed is not None and subscription not in allowed:
            return Reply(400, {"error": "unknown subscription"}, "unknown subscription")
        event_range = body.get("event_range") or {}
        return Wake(body["id"], kind, subscription, body.get("space"), event_range.get("after"),
                    event_range.get("through"), "webhook", body["type"], body)

    def _mcp_wake(self, headers: dict, body: dict) -> Wake | Reply:
        if body.get("type") == MCP_VERIFICATION:
            return Reply(200, {"challenge": body.get("challenge")})
        subscription = headers.get(MCP_HEADER)
        if self.mcp_subscription_ids and subscription not in self.mcp_subscription_ids:
            return Reply(400, {"error": "unknown subscription"}, "unknown subscription")
        name = str(body.get("name", ""))
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        event_range = data.get("event_range") or {}
        kind = "space" if name.startswith("spaces.") else "inbox"
        return Wake(body["eventId"], kind, subscription, data.get("space"), event_range.get("after"),
                    event_range.get("through"), "mcp", name, body)

    def _callback(self, wake: Wake) -> Callback | None:
        return self.on_inbox_wake if wake.kind == "inbox" else self.on_space_wake

    def handle(self, headers: Mapping[str, str], body: bytes) -> Reply:
        """The whole exchange, synchronously (callbacks must be plain functions)."""
        prepared = self.prepare(headers, body)
        if isinstance(prepared, Reply):
            return prepared
        try:
            callback = self._callback(prepared)
            if callback is not None:
                done_synchronously(callback(prepared), "The wake's callback")
            self.store.record(prepared)
        except Exception as failure:  # noqa: BLE001 - the server retries a 5xx
            return Reply(500, {"error": "not recorded"}, f"{type(failure).__name__}: {failure}")
        return Reply(202, {})

    async def handle_async(self, headers: Mapping[str, str], body: bytes) -> Reply:
        """The same, for an event loop: verification and the store run in a
        thread; a coroutine callback is awaited, a plain one runs in a thread."""
        prepared = await asyncio.to_thread(self.prepare, headers, body)
        if isinstance(prepared, Reply):
            return prepared
        try:
            callback = self._callback(prepared)
            if callback is not None:
                # A plain function runs in a thread; whatever it returns that is awaitable
                # (a lambda's coroutine, an async __call__) is awaited here.
                result = callback(prepared) if inspect.iscoroutinefunction(callback) \
                    else await asyncio.to_thread(callback, prepared)
                if inspect.isawaitable(result):
                    await result
            await asyncio.to_thread(self.store.record, prepared)
        except Exception as failure:  # noqa: BLE001 - the server retries a 5xx
            return Reply(500, {"error": "not recorded"}, f"{type(failure).__name__}: {failure}")
        return Reply(202, {})

    # --- adapters
    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks, size, more = [], 0, True
        while more and size <= MAX_BODY_BYTES:  # an unsigned body is read no further than a wake can be
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        if scope["method"] != "POST":
            reply = Reply(405, {"error": "POST only"})
        elif size > MAX_BODY_BYTES:
            reply = TOO_LARGE
        else:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            reply = await self.handle_async(headers, b"".join(chunks))
        content = reply.content()
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})

    def wsgi(self, environ, start_response):
        """A WSGI application answering POSTs on any path."""
        length = environ.get("CONTENT_LENGTH") or "0"
        if environ.get("REQUEST_METHOD") != "POST":
            reply = Reply(405, {"error": "POST only"})
        elif not length.isascii() or not length.isdigit():
            reply = Reply(400, {"error": "bad Content-Length"}, "bad Content-Length")
        elif int(length) > MAX_BODY_BYTES:
            reply = TOO_LARGE
        else:
            body = environ["wsgi.input"].read(int(length)) if int(length) else b""
            headers = {key[5:].replace("_", "-").lower(): value for key, value in environ.items()
                       if key.startswith("HTTP_")}
            if environ.get("CONTENT_TYPE"):
                headers["content-type"] = environ["CONTENT_TYPE"]
            reply = self.handle(headers, body)
        content = reply.content()
        start_response(f"{reply.status} {_REASONS.get(reply.status, 'Status')}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(content)))])
        return [content]


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
            413: "Content Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
