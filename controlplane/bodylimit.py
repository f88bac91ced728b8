"""Request bodies are limited before they are read (ASGI).

Django's ASGI handler reads a whole body (spooling it to disk) before any
view or parser can look at its size. This wrapper, outermost on HTTP, answers
`413 BODY_TOO_LARGE` at once when `Content-Length` is over
DATA_UPLOAD_MAX_MEMORY_SIZE, and counts a body sent without one (chunked),
answering 413 as soon as it passes the limit, without reading further."""
from __future__ import annotations

import json

from django.conf import settings

from controlplane.errors import BodyTooLarge


async def _refuse(send, limit: int) -> None:
    body = json.dumps(BodyTooLarge("The request is too large.", details={"max_bytes": limit}).body()).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await _refuse(send, limit)
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
                return await _refuse(send, limit)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return replayed.pop() if replayed else await receive()

        return await self.application(scope, replay, send)
