"""The one `/mcp` endpoint of this process: the server with its tools and
the Events extension, behind the credential check. The server (and the
SDK under it) is built when the endpoint first serves a request."""
from __future__ import annotations

from mcp_endpoint.asgi import McpEndpoint


def build():
    from mcp_endpoint import events
    from mcp_endpoint.server import build_server

    return build_server(events.METHODS, {events.EXTENSION: events.extension_settings()})


mcp_endpoint = McpEndpoint(build)
