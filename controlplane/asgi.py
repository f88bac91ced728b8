"""ASGI entry point: HTTP (Django, with static files) and WebSockets (Channels)."""
import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from controlplane.bodylimit import BodyLimit  # noqa: E402
from controlplane.live import publisher  # noqa: E402
from web.routing import websocket_urlpatterns  # noqa: E402
from web.sockets import SameOriginOnly  # noqa: E402

router = ProtocolTypeRouter({
    "http": BodyLimit(ASGIStaticFilesHandler(django_application)),
    "websocket": SameOriginOnly(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})


async def application(scope, receive, send):
    # After-commit group messages for the in-memory layer run on this loop.
    publisher.bind_server_loop(asyncio.get_running_loop())
    await router(scope, receive, send)
