"""WebSocket handshake guard."""
from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier


class SameOriginOnly:
    """Refuse a socket opened by another site's page.

    Browsers send `Origin` on every WebSocket handshake, with the site's
    cookies, so a foreign page could otherwise read a member's live streams.
    The origin's host must be the host the socket was opened on (whatever
    ALLOWED_HOSTS says). Clients that send no Origin (scripts, not
    browsers) pass; they need a session cookie of their own."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        if origin is not None and urlsplit(origin.decode("latin-1")).netloc != headers.get(b"host", b"").decode(
                "latin-1"):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
