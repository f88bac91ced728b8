"""The MCP server behind `/mcp`: the SDK's low-level `Server` with
Switchboard's tools and the Events extension (mcp_endpoint.events).

Every handler finds its caller in the ASGI scope, where the endpoint
(mcp_endpoint.asgi) put the member its bearer credential names; database
work runs in a worker thread and gives its connection back."""
from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from rest_framework.exceptions import ValidationError

from controlplane.db import db_call
from controlplane.errors import ApiError, as_unavailable
from controlplane.models import Member
from mcp_endpoint import errors
from mcp_endpoint.asgi import MEMBER_KEY
from mcp_endpoint.tools import TOOLS, check_arguments


def caller(ctx) -> Member:
    """The member the request's credential names (set by the endpoint)."""
    request = ctx.request
    member = request.scope.get(MEMBER_KEY) if request is not None else None
    if member is None:  # only reachable if the endpoint was bypassed
        raise MCPError(types.INVALID_REQUEST, "No credential: use Authorization: Bearer sbt_….")
    return member


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name=tool.name, description=tool.description, input_schema=tool.input_schema,
                   output_schema=tool.output_schema,
                   annotations=types.ToolAnnotations(read_only_hint=tool.read_only, destructive_hint=False,
                                                     idempotent_hint=tool.idempotent, open_world_hint=False))
        for tool in TOOLS.values()])


def run_tool(member: Member, name: str, arguments: dict | None) -> types.CallToolResult:
    tool = TOOLS.get(name)
    if tool is None:
        raise MCPError(types.INVALID_PARAMS, f"No tool named {name!r}.", data={"tools": sorted(TOOLS)})
    try:
        return errors.tool_result(tool.run(member, check_arguments(tool, arguments)))
    except ValidationError as exc:
        raise MCPError(types.INVALID_PARAMS, f"{name}: invalid arguments.", data=exc.detail) from None
    except ApiError as exc:
        if (protocol := errors.protocol_error(exc)) is not None:
            raise protocol from None
        return errors.refusal(exc)
    except Exception as exc:  # a lost database or Redis: the API's 503, to retry
        if (unavailable := as_unavailable(exc)) is None:
            raise
        return errors.refusal(unavailable)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    return await db_call(run_tool)(caller(ctx), params.name, params.arguments)


def build_server(extension_methods: dict[str, tuple[type, Any]], extensions: dict[str, dict]) -> Server:
    server = Server("switchboard", version="0.1.0", title="Switchboard",
                    instructions=f"Your Switchboard inbox and spaces, through the tools {', '.join(TOOLS)}; "
                                 "inbox events through the io.modelcontextprotocol/events extension.",
                    on_list_tools=list_tools, on_call_tool=call_tool)
    for method, (params_type, handler) in extension_methods.items():
        server.add_request_handler(method, params_type, handler)
    server.extensions.update(extensions)
    return server
