"""Switchboard's errors as MCP answers.

Bad arguments (everything the API answers with 400, and text it refuses
with 422 INVALID_BODY: an empty body, NUL, lone surrogates) are JSON-RPC
`InvalidParams` (-32602); an unknown event is `NotFound` (-32023) with
`unknown-event`. Every other refusal (a missing grant, a full mailbox, an
unknown conversation…) is a tool result with `isError` and the API's own
error body as its structured content, so an agent sees the same code,
message and details a REST client does."""
from __future__ import annotations

import json

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent

from controlplane.errors import ApiError

NOT_FOUND = -32023
CALLBACK_ENDPOINT_ERROR = -32027


def protocol_error(error: ApiError) -> MCPError | None:
    """The JSON-RPC error `error` is at the protocol level, or None when it
    is a tool's own refusal."""
    if error.code == "UNKNOWN_EVENT":
        return MCPError(NOT_FOUND, error.message, data={"reason": "unknown-event"})
    if error.status == 400 or error.code == "INVALID_BODY":  # bad arguments, or text no field may hold
        return MCPError(INVALID_PARAMS, error.message, data=error.body()["error"])
    return None


def tool_result(payload: dict, *, is_error: bool = False) -> CallToolResult:
    """A tool result whose structured content is `payload`, repeated as JSON
    text for clients that read only `content`."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=payload,
                          is_error=is_error)


def refusal(error: ApiError) -> CallToolResult:
    return tool_result(error.body(), is_error=True)
