"""`/mcp` as an ASGI application: the member's bearer credential, the
API's rate limit, then the SDK's Streamable HTTP transport (stateless: any
server process answers any request, as for the REST API).

The SDK's session manager must be running before it serves a request.
Uvicorn and other servers that speak the ASGI lifespan protocol start it
at startup (controlplane.asgi owns lifespan; Django's handler refuses it);
Daphne sends no lifespan events, so the first request starts it instead, on
the server's event loop, where it runs until the process ends.
"""
from __future__ import annotations

import asyncio
import json
import logging

from django.conf import settings
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from controlplane.api.authentication import credential_for_bearer
from controlplane.db import db_call
from controlplane.errors import ApiError, RateLimited
from controlplane.ratelimit import member_request_wait
from mcp_endpoint.server import MEMBER_KEY

log = logging.getLogger(__name__)


def transport_security() -> TransportSecuritySettings:
    """The SDK's Host and Origin checks, from the hosts Django allows."""
    hosts = [h for h in settings.ALLOWED_HOSTS if h]
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    allowed = [pattern for host in hosts for pattern in (host.lstrip("."), f"{host.lstrip('.')}:*")]
    origins = [f"{scheme}://{pattern}" for scheme in ("http", "https") for pattern in allowed]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=allowed,
                                     allowed_origins=origins)


def _authenticate(header: str):
    """The member the bearer credential names, counted against the API's
    rate limit (one budget for the member, over every surface)."""
    member = credential_for_bearer(header).member
    if (wait := member_request_wait(member)) is not None:
        raise RateLimited.after(wait)
    return member


async def _refuse(send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="switchboard"'))
    headers += [(name.lower().encode(), str(value).encode()) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    def __init__(self, server):
        self.server = server
        self.manager: StreamableHTTPSessionManager | None = None
        self._running: asyncio.Task | None = None
        self._started = asyncio.Event()
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Start the session manager on this loop (once); returns when it runs."""
        if self._running is None:
            self.manager = StreamableHTTPSessionManager(app=self.server, stateless=True,
                                                        security_settings=transport_security(),
                                                        max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
            self._running = asyncio.get_running_loop().create_task(self._run(), name="mcp-session-manager")
        await self._started.wait()

    async def _run(self) -> None:
        async with self.manager.run():
            self._started.set()
            await self._stop.wait()

    async def stop(self) -> None:
        if self._running is not None:
            self._stop.set()
            await self._running

    async def __call__(self, scope, receive, send):
        await self.start()
        headers = dict(scope.get("headers") or [])
        try:
            member = await db_call(_authenticate)(headers.get(b"authorization", b"").decode("latin-1"))
        except ApiError as error:
            return await _refuse(send, error)
        await self.manager.handle_request({**scope, MEMBER_KEY: member}, receive, send)
