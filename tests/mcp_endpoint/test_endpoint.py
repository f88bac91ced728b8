"""The /mcp endpoint in-process: its Host and Origin checks are Django's (ALLOWED_HOSTS)."""
import asyncio

import httpx
import pytest

from controlplane.errors import VerificationFailed
from mcp_endpoint import events
from mcp_endpoint.asgi import McpEndpoint
from mcp_endpoint.endpoint import build

pytestmark = pytest.mark.django_db(transaction=True)
DISCOVER = {"jsonrpc": "2.0", "id": 1, "method": "server/discover",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {}}}}
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
           "Mcp-Method": "server/discover"}


def discover(host: str, token: str, origin: str | None = None) -> httpx.Response:
    async def go():
        endpoint = McpEndpoint(build)
        try:
            transport = httpx.ASGITransport(app=endpoint)
            async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
                headers = {**HEADERS, "Authorization": f"Bearer {token}", **({"Origin": origin} if origin else {})}
                return await http.post("/mcp", json=DISCOVER, headers=headers)
        finally:
            await endpoint.stop()
    return asyncio.run(go())


def test_hosts_and_origins_are_checked_as_django_checks_them(settings, make_member):
    # given: a production-like host list, with a domain and its subdomains
    from controlplane import bearer
    _, token = bearer.issue_credential(make_member("ada"), actor=None)
    settings.ALLOWED_HOSTS = ["switchboard.example", ".agents.example"]
    # when
    allowed = discover("switchboard.example", token)
    subdomain = discover("eu.agents.example:8443", token)
    other = discover("evil.example", token)
    foreign = discover("switchboard.example", token, origin="https://evil.example")
    # then
    assert allowed.status_code == 200 and subdomain.status_code == 200
    assert allowed.json()["result"]["capabilities"]["extensions"] == {events.EXTENSION: {"listChanged": False}}
    assert other.status_code == 400 and other.json()["error"]["details"] == {"reason": "host"}
    assert foreign.status_code == 403 and foreign.json()["error"]["details"] == {"reason": "origin"}


def test_the_sdk_starts_at_the_first_accepted_request_not_at_a_refused_one(make_member):
    # given: an endpoint that has served nothing yet
    from controlplane import bearer
    _, token = bearer.issue_credential(make_member("ada"), actor=None)
    endpoint = McpEndpoint(build)

    async def go():
        transport = httpx.ASGITransport(app=endpoint)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            # when: a refused request, then an accepted one
            refused = await http.post("/mcp", json=DISCOVER, headers={**HEADERS, "Authorization": "Bearer sbt_nope"})
            started_by_refusal = endpoint.manager is not None
            accepted = await http.post("/mcp", json=DISCOVER, headers={**HEADERS, "Authorization": f"Bearer {token}"})
            started = endpoint.manager is not None
        await endpoint.stop()
        return refused, started_by_refusal, accepted, started

    refused, started_by_refusal, accepted, started = asyncio.run(go())
    # then
    assert refused.status_code == 401 and started_by_refusal is False
    assert accepted.status_code == 200 and started is True
    # and its instructions name every tool (they named five of seven)
    from mcp_endpoint.tools import TOOLS
    instructions = accepted.json()["result"]["instructions"]
    assert all(name in instructions for name in TOOLS) and {"answer", "read_answers"} <= TOOLS.keys()


def test_a_lost_redis_is_the_apis_503_at_the_door(make_member, lost_redis):
    """The endpoint counts every request against the API's rate limit, in
    Redis: while Redis restarts, `/mcp` answers as the API does (503
    UNAVAILABLE, Retry-After), not with a failure of the ASGI application."""
    # given: a valid credential, and the cache on a Redis that refuses connections (lost_redis)
    from controlplane import bearer
    _, token = bearer.issue_credential(make_member("ada"), actor=None)
    # when
    response = discover("testserver", token)
    # then
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "UNAVAILABLE"


def test_a_tool_that_loses_the_database_is_a_refusal_to_retry(make_member, monkeypatch):
    # given: the inbox's read fails as it does when the database restarts under it
    from django.db import OperationalError

    from inbox import reads
    from mcp_endpoint.server import run_tool

    def lost(*args):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(reads, "inbox_page", lost)
    # when
    result = run_tool(make_member("ada"), "read_inbox", {})
    # then: the API's error body, as a tool's refusal (not the SDK's internal error)
    assert result.is_error and result.structured_content["error"]["code"] == "UNAVAILABLE"
    assert result.structured_content["error"]["details"] == {"retry_after": 1}


def test_every_event_method_answers_a_lost_service_with_the_apis_unavailable_body():
    # given: the Events extension's methods, and handlers that lose the database or fail otherwise
    from django.db import OperationalError
    from mcp.shared.exceptions import MCPError

    async def lost(ctx, params):
        raise OperationalError("server closed the connection unexpectedly")

    async def broken(ctx, params):
        raise ValueError("a bug")

    # when / then: every method goes through the one mapping (inside the check of its params)
    assert all(handler.__wrapped__.__wrapped__ is getattr(events, handler.__name__)
               for _, handler in events.METHODS.values())
    with pytest.raises(MCPError) as unavailable:
        asyncio.run(events._unavailable_as_mcp(lost)(None, None))
    assert unavailable.value.error.data["code"] == "UNAVAILABLE"
    assert unavailable.value.error.data["details"] == {"retry_after": 1}
    with pytest.raises(ValueError):  # anything else stays the SDK's internal error
        asyncio.run(events._unavailable_as_mcp(broken)(None, None))


@pytest.mark.parametrize(("reason", "answer"), [("http_404", "http_4xx"), ("http_503", "http_5xx"),
                                                ("http_302", "challenge_failed"), ("challenge_mismatch",
                                                                                   "challenge_failed"),
                                                ("not_json", "challenge_failed"), ("timeout", "timeout"),
                                                ("tls_error", "tls_error"), ("connect_error", "connection_refused")])
def test_a_failed_verification_is_named_in_the_extensions_words(reason, answer):
    assert events.callback_reason({"reason": reason}) == answer
    refused = events.verification_error(VerificationFailed(details={"reason": reason})).error
    assert (refused.code, refused.data) == (-32027, {"reason": answer})


def test_too_many_verifications_is_named_so_with_when_to_try_again():
    # (it said `limit: "requests"`, which is HTTP's 429, and left out the wait)
    from controlplane.errors import RateLimited

    refused = events._as_mcp(RateLimited.after(42.5, "Too many verifications; try again later.")).error
    assert (refused.code, refused.data) == (-32025, {"limit": "verifications", "retryAfterSeconds": 43})


def test_a_name_that_resolves_where_no_call_goes_is_the_urls_fault_not_the_receivers():
    """It was `connection_refused`: an operator would look for a receiver
    that is down, and none was ever contacted."""
    refused = events.verification_error(VerificationFailed(details={"reason": "forbidden_destination"})).error
    assert refused.code == -32602
    assert (refused.data["code"], refused.data["details"]) == ("INVALID_URL", {"reason": "forbidden_destination"})


def test_an_events_argument_with_nul_is_invalid_params():
    from mcp.shared.exceptions import MCPError

    params = events.PollParams(name="spaces.work.available", arguments={"space": "lab\x00"})
    with pytest.raises(MCPError) as refused:
        events._select(params)
    assert refused.value.code == -32602 and refused.value.error.data["code"] == "INVALID_BODY"
