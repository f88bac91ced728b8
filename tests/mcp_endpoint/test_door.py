"""What /mcp answers before the SDK, through a real `serve` process: the
credential, the rate limit (refusals counted by address), and the methods it takes."""
import asyncio

import httpx
import pytest

from tests.conftest import clear_of_window_edge
from tests.mcp_endpoint.client import connect
from tests.mcp_endpoint.test_end_to_end import bearer, token_for
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_credential_is_required_and_the_rate_limit_counts():
    ada = token_for("ada")
    with serving("--no-worker", RATE_LIMIT_PER_MINUTE=3) as (base, _):
        clear_of_window_edge(margin=5)
        missing = httpx.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        forged = httpx.post(f"{base}/mcp", json={}, headers=bearer("sbt_" + "x" * 43))
        statuses = [httpx.post(f"{base}/mcp", json={}, headers=bearer(ada)).status_code for _ in range(4)]
        limited = httpx.post(f"{base}/mcp", json={}, headers=bearer(ada))
        guesses = [httpx.post(f"{base}/mcp", json={}, headers=bearer(f"sbt_{n}" + "x" * 42)) for n in range(2)]
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "UNAUTHENTICATED"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert forged.status_code == 401
    # refusals count against the address: the third is the last 401, then guessing is 429
    assert [g.status_code for g in guesses] == [401, 429] and "retry-after" in guesses[1].headers
    assert statuses[3] == 429 and limited.status_code == 429 and "retry-after" in limited.headers


def test_only_post_is_served_so_no_idle_stream_is_held_open():
    # given: GET would open the transport's standalone stream, which nothing writes to and no cap counts
    ada = token_for("ada")
    with serving("--no-worker") as (base, _):
        # when
        streams = [httpx.get(f"{base}/mcp", headers={**bearer(ada), "Accept": "text/event-stream"}, timeout=10)
                   for _ in range(3)]
        ended = httpx.request("DELETE", f"{base}/mcp", headers=bearer(ada), timeout=10)

        async def tools():
            async with connect(base, ada) as (client, _):  # the SDK's client, which asks for the stream too
                return {tool.name for tool in (await client.list_tools()).tools}

        served = asyncio.run(tools())
    # then: answered at once, and POST still serves
    assert [r.status_code for r in streams + [ended]] == [405] * 4
    assert streams[0].headers["allow"] == "POST" and streams[0].json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "read_inbox" in served


def test_every_answer_says_it_is_not_to_be_stored():
    # (tool results carry delivery tokens and message bodies; /v0/ said no-store, /mcp nothing)
    from tests.mcp_endpoint.test_endpoint import DISCOVER, HEADERS

    ada = token_for("ada")
    with serving("--no-worker") as (base, _):
        served = httpx.post(f"{base}/mcp", json=DISCOVER, headers={**HEADERS, **bearer(ada)})
        refused = httpx.post(f"{base}/mcp", json=DISCOVER, headers=HEADERS)
    assert (served.status_code, refused.status_code) == (200, 401)
    assert served.headers["cache-control"] == refused.headers["cache-control"] == "no-store"


def test_what_an_answer_said_of_caching_is_kept_beside_no_store():
    from controlplane.middleware import answers_not_stored

    async def stream(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"cache-control", b"no-cache, no-transform"), (b"content-type", b"text/event-stream")]})

    sent = []

    async def collect(message):
        sent.append(message)

    asyncio.run(answers_not_stored(stream)({"type": "http"}, None, collect))
    assert dict(sent[0]["headers"]) == {b"cache-control": b"no-store, no-cache, no-transform",
                                        b"content-type": b"text/event-stream"}
