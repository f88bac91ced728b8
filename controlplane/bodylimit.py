"""Request bodies are limited before they are read (ASGI).

Django's ASGI handler reads a whole body (spooling it to disk) before any
view or parser can look at its size. This wrapper, outermost on HTTP, answers
`413 BODY_TOO_LARGE` at once when `Content-Length` is over
DATA_UPLOAD_MAX_MEMORY_SIZE, and counts a body sent without one (chunked),
answering 413 as soon as it passes the limit, without reading further; a
body within it is replayed with its length declared, since what reads it
(REST framework's parsers) reads nothing from a request that declares none.
A refusal counts against its sender's address as an anonymous request
does (429 past RATE_LIMIT_PER_MINUTE): it was a request no budget saw.
It is JSON in the contract's shape, or what `page` makes of it (the web
app's error page for a browser on its paths)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from django.conf import settings
from django.http import HttpResponse

from controlplane.errors import ApiError, BodyTooLarge, RateLimited
from controlplane.ratelimit import address_wait, scope_address

Page = Callable[[dict, ApiError], HttpResponse | None]


async def _refuse(scope, send, limit: int, page: Page | None) -> None:
    wait = await asyncio.to_thread(address_wait, scope_address(scope))
    error = RateLimited.after(wait) if wait is not None else BodyTooLarge(
        "The request is too large.", details={"max_bytes": limit})
    response = (page and page(scope, error)) or error.json_response()
    body = response.content
    headers = [(name.lower().encode(), value.encode()) for name, value in response.items()
               if name.lower() != "content-length"]
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": [*headers, (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, application, page: Page | None = None):
        self.application = application
        self.page = page

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await _refuse(scope, send, limit, self.page)
        if declared is not None:
            return await self.application(scope, receive, send)
        # No length given: read the body here, counting, then replay it.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            size += len(message.get("body", b""))
            if size > limit:
                return await _refuse(scope, send, limit, self.page)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return replayed.pop() if replayed else await receive()

        headers = [(name, value) for name, value in scope.get("headers") or [] if name != b"transfer-encoding"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        return await self.application(scope, replay, send)
