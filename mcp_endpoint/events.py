"""The Events extension (`io.modelcontextprotocol/events`, SEP-3415, the
draft of 2026-10, pinned): `events/list`, `events/poll`, `events/stream`,
`events/subscribe` and `events/unsubscribe`.

Error codes are the draft's: NotFound -32023, Forbidden -32024,
ResourceExhausted -32025, Unsupported -32026, CallbackEndpointError -32027;
bad arguments are InvalidParams (-32602).
"""
from __future__ import annotations

import functools
import time
from typing import Any

import mcp_types as types
from django.conf import settings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controlplane.api.parsers import check_text
from controlplane.db import db_call
from controlplane.errors import ApiError, InvalidUrl, NotFound, VerificationFailed, as_unavailable
from mcp_endpoint import errors, sources
from mcp_endpoint.asgi import CREDENTIAL_KEY
from mcp_endpoint.server import caller
from mcp_endpoint.streams import MAX_PER_MEMBER as MAX_STREAMS
from mcp_endpoint.streams import StreamOwner, TooManyStreams, why_ended
from webhooks import mcp as pushed

EXTENSION = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
FORBIDDEN, RESOURCE_EXHAUSTED, UNSUPPORTED = -32024, -32025, -32026
POLL_INTERVAL_MS = 5000
MAX_RETRY_SECONDS = 15  # a stream's longest wait between reads while the database or Redis is lost
ENDINGS = {  # why a stream ends, as its `terminated` frame says
    "replaced": {"code": RESOURCE_EXHAUSTED, "message": "A newer consumer took over.",
                 "data": {"limit": "consumers", "max": 1, "reason": "replaced"}},
    "suspended": {"code": FORBIDDEN, "message": "The member was suspended.", "data": {"reason": "suspended"}},
    "revoked": {"code": FORBIDDEN, "message": "The credential was revoked.", "data": {"reason": "revoked"}},
    "shutdown": {"code": types.INTERNAL_ERROR, "message": "The server is shutting down: stream again from your cursor.",
                 "data": {"reason": "shutdown"}},
}


def extension_settings() -> dict:
    """What `server/discover` advertises under the extension's identifier."""
    return {"listChanged": False}


class _Params(types.RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ListParams(_Params):
    cursor: str | None = None


class SelectParams(_Params):
    name: str
    arguments: dict[str, Any] | None = None


class PollParams(SelectParams):
    cursor: str | None = None
    max_events: int = Field(default=sources.MAX_EVENTS, alias="maxEvents", ge=1, le=100, strict=True)
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs", ge=0, strict=True)


class StreamParams(SelectParams):
    cursor: str | None = None
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs", ge=0, strict=True)


class SubscribeParams(SelectParams):
    delivery: dict[str, Any]
    cursor: str | None = None
    ttl_ms: int | None = Field(default=None, alias="ttlMs", strict=True)  # JSON numbers: not true, not "60000"


class UnsubscribeParams(SelectParams):
    delivery: dict[str, Any]


class Frame(BaseModel):
    """A notification of this extension (the SDK's union has no such type)."""
    method: str
    params: dict[str, Any]


def _select(params: SelectParams) -> tuple[sources.Source, dict]:
    source = sources.SOURCES.get(params.name)
    if source is None:
        raise MCPError(errors.NOT_FOUND, f"No event named {params.name!r}.", data={"kind": "event"})
    arguments = params.arguments or {}
    try:
        check_text({"arguments": arguments, "delivery": getattr(params, "delivery", None)})  # as the API's parser
    except ApiError as error:
        raise _as_mcp(error) from None
    if (problem := source.problem(arguments)) is not None:
        raise MCPError(types.INVALID_PARAMS, f"{source.name}: {problem}")
    return source, arguments


def _as_mcp(error: ApiError) -> MCPError:
    if (protocol := errors.protocol_error(error)) is not None:
        return protocol
    if isinstance(error, NotFound) or error.status in (403, 409):
        return MCPError(FORBIDDEN, error.message, data={"reason": error.code})
    if error.code == "RATE_LIMITED":  # (the request limit is answered before any method: a receiver's verification)
        return MCPError(RESOURCE_EXHAUSTED, error.message,
                        data={"limit": "verifications", "retryAfterSeconds": int(error.headers["Retry-After"])})
    return MCPError(types.INTERNAL_ERROR, error.message, data=error.body()["error"])


async def _db(fn, *args):
    try:
        return await db_call(fn)(*args)
    except ApiError as error:
        raise _as_mcp(error) from None


async def _read(*args) -> sources.Batch:
    try:
        return await sources.read_on_loop(*args)
    except ApiError as error:
        raise _as_mcp(error) from None


async def list_events(ctx, params: ListParams) -> dict:
    if params.cursor is not None:  # one page, whose nextCursor is null: no cursor is one of ours
        raise MCPError(types.INVALID_PARAMS, "cursor: events/list has one page; there is no cursor to give.",
                       data={"field": "cursor"})
    return {"events": [{"name": s.name, "description": s.description, "delivery": list(s.delivery),
                        "inputSchema": s.input_schema, "payloadSchema": s.payload_schema}
                       for s in sources.SOURCES.values()], "nextCursor": None}


async def poll(ctx, params: PollParams) -> dict:
    member = caller(ctx)
    source, arguments = _select(params)
    batch = await _read(member, source, arguments, params.cursor, params.max_events, params.max_age_ms)
    return {"events": [{k: v for k, v in e.items() if k != "cursor"} for e in batch.events],
            "cursor": batch.cursor, "truncated": batch.truncated, "hasMore": batch.has_more,
            "nextPollMs": 0 if batch.has_more else POLL_INTERVAL_MS}


async def stream(ctx, params: StreamParams) -> dict:
    """One long-lived response: `active` first, then each event as it
    commits, a heartbeat at least every MCP_HEARTBEAT_SECONDS, and
    `terminated` when the server ends it (the consumer was replaced, or the
    caller lost access); a recoverable `error` while its reads fail (the
    database out of reach; Redis out of reach fails none), and the stream stays on. Re-reads after each nudge: for the inbox's events
    also every FEED_RECHECK_SECONDS in case one was lost; for a space's, the
    process's log watcher finds a lost one (mcp_endpoint.streams)."""
    member = caller(ctx)
    source, arguments = _select(params)
    meta = {SUBSCRIPTION_ID: ctx.request_id}

    async def send(method: str, **fields) -> None:
        await ctx.session.send_notification(Frame(method=f"notifications/events/{method}",
                                                  params={**fields, "_meta": meta}),
                                            related_request_id=ctx.request_id)

    credential_id = ctx.request.scope.get(CREDENTIAL_KEY)
    owner = StreamOwner(member, source, arguments, credential_id)
    try:
        await owner.start()
    except TooManyStreams:
        raise MCPError(RESOURCE_EXHAUSTED, f"At most {MAX_STREAMS} open streams per member.",
                       data={"limit": "streams", "max": MAX_STREAMS}) from None
    try:
        if (ending := await _db(why_ended, member.pk, credential_id)) is not None:
            ended = ENDINGS[ending]  # after the request was authenticated, before the stream joined their groups
            raise MCPError(ended["code"], ended["message"], data=ended["data"])
        owner.watch(**await _db(sources.interest, member, source, arguments))
        batch = await _read(member, source, arguments, params.cursor, sources.MAX_EVENTS, params.max_age_ms)
        await owner.take_over()  # only now: a refused request ends no other consumer
        await send("active", cursor=batch.start, truncated=batch.truncated)
        last_beat, retry_in = time.monotonic(), None
        while True:
            for event in batch.events:
                await send("event", **event)
            # Beats and endings are heeded while catching up too (a long feed
            # with few items): page after page could run past 30 s.
            beat_in = settings.MCP_HEARTBEAT_SECONDS - (time.monotonic() - last_beat)
            if beat_in <= 0:
                # Before each beat, the member and credential looked at again:
                # the message that ends a stream is sent once, after the
                # commit, and a process that dies first, or a Redis that drops
                # it, left the stream handing out items for ever.
                if (ending := await _ended_meanwhile(member.pk, credential_id)) is not None:
                    await send("terminated", error=ENDINGS[ending])
                    return {"_meta": meta}
                await send("heartbeat", cursor=batch.cursor)
                last_beat, beat_in = time.monotonic(), settings.MCP_HEARTBEAT_SECONDS
            if batch.has_more:
                ended = owner.ending()
            else:
                wait = min(beat_in, settings.FEED_RECHECK_SECONDS) if owner.inbox else beat_in
                ended = await owner.wait(wait if retry_in is None else min(wait, retry_in))
            if ended is not None:
                await send("terminated", error=ENDINGS[ended])
                return {"_meta": meta}
            batch, retry_in = await _read_again(send, member, source, arguments, batch, retry_in)
            if batch.truncated:  # behind the log's retention meanwhile: a gap, told as SEP-3415 says
                await send("active", cursor=batch.start, truncated=True)
    except Lost as lost:  # access lost meanwhile: the stream ends
        await send("terminated", error={"code": lost.error.code, "message": lost.error.message,
                                        "data": lost.error.data})
        return {"_meta": meta}
    finally:
        await owner.stop()


async def _ended_meanwhile(member_pk: int, credential_id: str | None) -> str | None:
    """`why_ended`, or None while the database is out of reach (the
    stream's reads tell the client so, and it stays on)."""
    try:
        return await db_call(why_ended)(member_pk, credential_id)
    except Exception as exc:
        if as_unavailable(exc) is None:
            raise
        return None


class Lost(Exception):
    """A stream's read was refused (its caller lost access meanwhile)."""

    def __init__(self, error: MCPError) -> None:
        super().__init__(error.error.message)
        self.error = error.error


async def _read_again(send, member, source, arguments, batch: sources.Batch,
                      retry_in: float | None) -> tuple[sources.Batch, float | None]:
    """A stream's next read, after `batch`, and when to try again after a
    lost database or Redis (None: not failing). Such a loss is a
    recoverable `error` frame, the stream stays on and reads again from
    the same cursor after 1 s, doubling to MAX_RETRY_SECONDS."""
    try:
        return await sources.read_on_loop(member, source, arguments, batch.cursor, sources.MAX_EVENTS), None
    except ApiError as error:
        raise Lost(_as_mcp(error)) from None
    except Exception as exc:
        if (unavailable := as_unavailable(exc)) is None:
            raise
        await send("error", error={"code": types.INTERNAL_ERROR, "message": unavailable.message,
                                   "data": unavailable.body()["error"]})
        return (sources.Batch(cursor=batch.cursor),
                1.0 if retry_in is None else min(retry_in * 2, MAX_RETRY_SECONDS))


def _delivery(params, *, needs_secret: bool) -> tuple[str, str | None]:
    delivery = params.delivery
    mode = delivery.get("mode", "webhook")
    if mode != "webhook":
        raise MCPError(UNSUPPORTED, "Only webhook delivery is offered through events/subscribe.",
                       data={"feature": "deliveryMode", "value": mode})
    url, secret = delivery.get("url"), delivery.get("secret")
    if not isinstance(url, str) or (needs_secret and not isinstance(secret, str)):
        raise MCPError(types.INVALID_PARAMS, "delivery needs url" + (" and secret (whsec_…)." if needs_secret else "."))
    return url, secret


def callback_reason(details: dict) -> str:
    """A failed verification's reason, in the extension's vocabulary."""
    reason = str(details.get("reason", ""))
    if reason.startswith(("http_4", "http_5")):
        return reason[:6] + "xx"
    if reason.startswith("http_"):  # any other status (a redirect, never followed): no echo in a 2xx
        return "challenge_failed"
    if "timeout" in reason:
        return "timeout"
    if "tls" in reason or "ssl" in reason or "certificate" in reason:
        return "tls_error"
    if reason in ("not_json", "challenge_mismatch"):
        return "challenge_failed"
    return "connection_refused"


def verification_error(failure: VerificationFailed) -> MCPError:
    """CallbackEndpointError, in the extension's words; or InvalidParams for
    a URL whose host resolved to an address that is never called (it was
    never contacted: the URL is at fault, as an IP literal there is)."""
    if failure.details.get("reason") == "forbidden_destination":
        refused = InvalidUrl("The URL's host resolves to an address that is never called (loopback, private, "
                             "link-local or metadata).", details={"reason": "forbidden_destination"})
        return MCPError(types.INVALID_PARAMS, refused.message, data=refused.body()["error"])
    return MCPError(errors.CALLBACK_ENDPOINT_ERROR, "The callback endpoint did not verify.",
                    data={"reason": callback_reason(failure.details)})


async def subscribe(ctx, params: SubscribeParams) -> dict:
    member = caller(ctx)
    source, arguments = _select(params)
    url, secret = _delivery(params, needs_secret=True)
    try:
        return await db_call(pushed.subscribe)(member, source.name, arguments, url, secret, ttl_ms=params.ttl_ms,
                                               credential_id=ctx.request.scope.get(CREDENTIAL_KEY))
    except VerificationFailed as failure:
        raise verification_error(failure) from None
    except ApiError as error:
        if error.code == "INVALID_URL":
            raise MCPError(types.INVALID_PARAMS, error.message, data=error.body()["error"]) from None
        if error.code == "LIMIT_EXCEEDED":
            raise MCPError(RESOURCE_EXHAUSTED, error.message, data={"limit": "subscriptions"}) from None
        raise _as_mcp(error) from None


async def unsubscribe(ctx, params: UnsubscribeParams) -> dict:
    member = caller(ctx)
    source, arguments = _select(params)
    url, _ = _delivery(params, needs_secret=False)
    found = await _db(pushed.unsubscribe, member, source.name, arguments, url)
    if not found:
        raise MCPError(errors.NOT_FOUND, "No such subscription.", data={"kind": "subscription"})
    return {}


def _unavailable_as_mcp(handler):
    """A lost database or Redis (controlplane.errors.as_unavailable) as the
    API's `UNAVAILABLE` body in the JSON-RPC error (`_as_mcp`), to retry,
    rather than the SDK's bare internal error."""
    @functools.wraps(handler)
    async def wrapped(ctx, params):
        try:
            return await handler(ctx, params)
        except Exception as exc:
            if (unavailable := as_unavailable(exc)) is None:
                raise
            raise _as_mcp(unavailable) from None
    return wrapped


def _checked(params_type: type[_Params], handler):
    """The SDK checks a method's params against the model it is registered
    with and answers a misfit with a bare "Invalid request parameters". So
    each is registered with any params (`_Params`) and checked here, by the
    same rule (aliases only), with an answer that says which field and why."""
    @functools.wraps(handler)
    async def wrapped(ctx, params):
        try:
            typed = params_type.model_validate(params.model_dump(by_alias=True, exclude_unset=True), by_name=False)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "params"
            raise MCPError(types.INVALID_PARAMS, f"{field}: {first['msg']}", data={"field": field}) from None
        return await handler(ctx, typed)
    return wrapped


METHODS = {method: (_Params, _checked(params, _unavailable_as_mcp(handler))) for method, (params, handler) in {
    "events/list": (ListParams, list_events),
    "events/poll": (PollParams, poll),
    "events/stream": (StreamParams, stream),
    "events/subscribe": (SubscribeParams, subscribe),
    "events/unsubscribe": (UnsubscribeParams, unsubscribe),
}.items()}
