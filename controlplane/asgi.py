"""ASGI entry point: HTTP (Django, with static files), WebSockets (Channels),
and the MCP endpoint at /mcp; this callable owns the lifespan protocol
(Django's handler refuses it), which stops the MCP transport that the first
`/mcp` request starts (mcp_endpoint.asgi), the log watcher and the loop's
own database connection (controlplane.loop_reads)."""
import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup(set_prefix=False)

from controlplane.handlers import PooledASGIHandler  # noqa: E402

django_application = PooledASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import SuspiciousOperation  # noqa: E402
from django.http import Http404  # noqa: E402

from controlplane.bodylimit import BodyLimit  # noqa: E402
from controlplane.db import pooled  # noqa: E402
from controlplane.errors import as_unavailable  # noqa: E402
from controlplane.loop_reads import loop_reads  # noqa: E402
from controlplane.live import log_watcher  # noqa: E402
from controlplane.middleware import answers_not_stored  # noqa: E402
from controlplane.publishing import publisher  # noqa: E402
from controlplane.tracing import with_request_id  # noqa: E402
from mcp_endpoint.endpoint import mcp_endpoint  # noqa: E402
from web.routing import websocket_urlpatterns  # noqa: E402
from web.errors import refusal_page, unknown_route  # noqa: E402
from web.sockets import SameOriginOnly  # noqa: E402


class StaticFiles(ASGIStaticFilesHandler):
    """Django's static files, where a path it cannot find, or refuses (`..`
    out of its folders: SuspiciousFileOperation, which Django's handler lets
    through as a 500 with a traceback in the log), answers as an unknown
    route does: the contract's 404, counted against the caller's address."""

    def serve(self, request):
        try:
            return super().serve(request)
        except (Http404, SuspiciousOperation):
            pass
        try:
            return unknown_route(request)
        except Exception as exc:  # Redis out of reach for the count: 503, as every route answers then
            if (unavailable := as_unavailable(exc)) is None:
                raise
            return unavailable.json_response()


router = ProtocolTypeRouter({
    # The request id first, so that every answer names it: a refused body's and a static file's too.
    "http": with_request_id(BodyLimit(StaticFiles(django_application), page=refusal_page)),
    "websocket": SameOriginOnly(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})


mcp = with_request_id(answers_not_stored(BodyLimit(mcp_endpoint)))
MCP_PATHS = ("/mcp", "/mcp/")


async def lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            publisher.bind_server_loop(asyncio.get_running_loop())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await mcp_endpoint.stop()
            await log_watcher.stop()
            await loop_reads.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    pooled.set(True)  # sync work of this connection runs on the thread pool (controlplane.db.in_pool)
    # After-commit group messages for the in-memory layer run on this loop.
    publisher.bind_server_loop(asyncio.get_running_loop())
    if scope["type"] == "http" and scope["path"] in MCP_PATHS:
        return await mcp(scope, receive, send)
    await router(scope, receive, send)
