"""`/mcp` as an ASGI application: the member's bearer credential, the
API's rate limit, then the SDK's Streamable HTTP transport (stateless: any
server process answers any request, as for the REST API).

The SDK's session manager must be running before it serves a request.
The first request that passes the Host check and the credential check
loads the SDK's server modules (about 27 MiB, mcp_endpoint.sdk) and starts
the manager on the server's event loop, where it runs until the process
ends: a process that never serves `/mcp` (or only refuses it) never pays
for it. Servers that speak the ASGI lifespan protocol (uvicorn, which
`serve` runs) stop it at shutdown (controlplane.asgi owns lifespan;
Django's handler refuses it).
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Callable

from django.conf import settings

from controlplane.api.authentication import authenticate_bearer
from controlplane.db import db_call
from controlplane.errors import ApiError, RateLimited, Unauthenticated, as_unavailable
from controlplane.middleware import host_check
from controlplane.ratelimit import address_wait, scope_address

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

# Where the endpoint puts the caller for the server's handlers (mcp_endpoint.server.caller).
MEMBER_KEY = "switchboard.member"
CREDENTIAL_KEY = "switchboard.credential"  # the credential's public id


def _authenticate(header: str):
    """The bearer credential (with its member), counted against the API's
    rate limit (one budget for the member, over every surface)."""
    credential, wait = authenticate_bearer(header)
    if wait is not None:
        raise RateLimited.after(wait)
    return credential


async def _refuse(send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), str(value).encode()) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    def __init__(self, build_server: Callable[[], Server]):
        self.build_server = build_server
        self.manager: StreamableHTTPSessionManager | None = None
        self._running: asyncio.Task | None = None
        self._starting = asyncio.Lock()
        self._started = asyncio.Event()
        self._stop = asyncio.Event()

    def _new_manager(self) -> StreamableHTTPSessionManager:
        from mcp_endpoint.sdk import load_lean

        load_lean()
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        # Host and Origin are checked by `host_check`, the way Django checks them.
        return StreamableHTTPSessionManager(app=self.build_server(), stateless=True,
                                            security_settings=TransportSecuritySettings(
                                                enable_dns_rebinding_protection=False),
                                            max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)

    async def start(self) -> None:
        """Start the session manager on this loop (once); returns when it runs.
        The SDK is imported in a worker thread: the loop keeps serving."""
        if self._started.is_set():
            return
        async with self._starting:
            if self._running is None:
                self.manager = await asyncio.to_thread(self._new_manager)
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
        if scope.get("method") != "POST":
            # Stateless: no session to end (DELETE), and no standalone stream
            # (GET), which the SDK would hold open, written to by nothing and
            # counted by no cap, past a revocation; the transport allows 405.
            return await _refuse(send, ApiError("The MCP endpoint takes POST only.", status=405,
                                                code="METHOD_NOT_ALLOWED", headers={"Allow": "POST"}))
        headers = dict(scope.get("headers") or [])
        if (refused := host_check(headers)) is not None:
            return await _refuse(send, refused)
        try:
            credential = await db_call(_authenticate)(headers.get(b"authorization", b"").decode("latin-1"))
        except Unauthenticated as error:  # counted against the address, as the API counts it
            wait = await db_call(address_wait)(scope_address(scope))
            return await _refuse(send, RateLimited.after(wait) if wait is not None else error)
        except ApiError as error:
            return await _refuse(send, error)
        except Exception as exc:
            if (unavailable := as_unavailable(exc)) is None:
                raise
            return await _refuse(send, unavailable)
        await self.start()
        await self.manager.handle_request({**scope, MEMBER_KEY: credential.member,
                                           CREDENTIAL_KEY: credential.public_id}, receive, send)
