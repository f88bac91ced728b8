"""The one `/mcp` endpoint of this process: the server with its tools and
the Events extension, behind the credential check."""
from __future__ import annotations

from mcp_endpoint import events
from mcp_endpoint.asgi import McpEndpoint
from mcp_endpoint.server import build_server

mcp_endpoint = McpEndpoint(build_server(events.METHODS, {events.EXTENSION: events.extension_settings()}))
