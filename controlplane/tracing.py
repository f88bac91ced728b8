"""Request ids, and the JSON log format that prints them.

Every HTTP request gets an id (the client's `X-Request-Id` when it is a
safe one, else a fresh `req_…`), held in a context variable for the work
the request does: the ASGI application (`with_request_id`), or Django's
middleware under WSGI (controlplane.middleware.RequestId), sets it; every log record made under it
carries it (`stamp_log_records`); an event records the id of the request that appended it
(controlplane.log.NewEvent), and so does the wake the event causes
(webhooks.outbox), so a send can be followed to its webhook attempts.
(Not to be confused with controlplane.log, the event log.)
"""
from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re

from django.http import HttpRequest

from controlplane.clock import rfc3339
from controlplane.tokens import public_id

HEADER = "X-Request-Id"
# What a client's id may be: short, and nothing that could split a log
# line, a header or the space-separated list a wake keeps.
INBOUND_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,64}")

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("switchboard_request_id", default=None)


def current_request_id() -> str | None:
    return _request_id.get()


def accept_request_id(inbound: str | None) -> str:
    """The client's id if it is a safe one, else a new one."""
    if inbound is not None and INBOUND_ID.fullmatch(inbound):
        return inbound
    return public_id("req")


def begin_request(inbound: str | None) -> tuple[str, contextvars.Token]:
    """Set this context's request id from the client's header; returns it
    and the token that `end_request` takes."""
    request_id = accept_request_id(inbound)
    return request_id, _request_id.set(request_id)


def end_request(token: contextvars.Token) -> None:
    _request_id.reset(token)


def with_request_id(application):
    """An ASGI application whose HTTP requests each get a request id, named
    in their response: outermost on every HTTP request the ASGI application
    serves (Django's middleware, `RequestId`, names it for WSGI and tests)."""
    wire_name = HEADER.lower().encode()

    async def call(scope, receive, send):
        if scope["type"] != "http":
            return await application(scope, receive, send)
        inbound = dict(scope.get("headers") or []).get(wire_name)
        request_id, token = begin_request(inbound.decode("latin-1") if inbound is not None else None)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (wire_name, request_id.encode())]}
            await send(message)

        try:
            return await application(scope, receive, send_with_id)
        finally:
            end_request(token)

    return call


def stamp_log_records() -> None:
    """Every log record carries the request id of the context that made it
    (`record.request_id`), whichever thread formats it later and however.
    Installed once, at startup (controlplane.apps)."""
    make = logging.getLogRecordFactory()
    if getattr(make, "stamps_request_id", False):
        return

    def stamped(*args, **kwargs):
        record = make(*args, **kwargs)
        record.request_id = _request_id.get()
        return record

    stamped.stamps_request_id = True
    logging.setLogRecordFactory(stamped)


# The attributes every LogRecord has; anything else came in `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName",
                                                                           "request_id"}


def _plain(value):
    if isinstance(value, HttpRequest):  # Django's request logs: no query string, no headers
        return f"{value.method} {value.path}"
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id,
    and the record's `extra` fields (LOG_FORMAT=json)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": rfc3339(dt.datetime.fromtimestamp(record.created, dt.timezone.utc)),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                 "request_id": getattr(record, "request_id", None)}
        entry.update((key, value) for key, value in vars(record).items() if key not in _STANDARD)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=_plain, ensure_ascii=False)
