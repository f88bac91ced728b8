"""An `events/stream` response in-process, frame by frame: what a refused
request leaves alone, and what a lost database says without ending it."""
import asyncio
import json

import httpx
import pytest

from controlplane import bearer, services
from mcp_endpoint import sources
from mcp_endpoint.asgi import McpEndpoint
from mcp_endpoint.endpoint import build

pytestmark = pytest.mark.django_db(transaction=True)
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
ITEM = "org.switchboard/inbox.item"


def stream_request(token: str, request_id: int, cursor: str | None, name: str = ITEM) -> dict:
    return {"url": "/mcp",
            "json": {"jsonrpc": "2.0", "id": request_id, "method": "events/stream",
                     "params": {"name": name, "arguments": {}, "cursor": cursor, "_meta": META}},
            "headers": {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                        "Mcp-Method": "events/stream", "Authorization": f"Bearer {token}"}}


def frames(text: str) -> list[dict]:
    """The JSON-RPC messages of a response: its SSE data frames, or its one JSON body."""
    if text.lstrip().startswith("{"):
        return [json.loads(text)]
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def methods(text: str) -> list[str]:
    return [frame.get("method", "result" if "result" in frame else "error") for frame in frames(text)]


async def with_endpoint(story):
    endpoint = McpEndpoint(build)
    try:
        transport = httpx.ASGITransport(app=endpoint)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
            return await story(http)
    finally:
        await endpoint.stop()


def test_a_refused_stream_request_leaves_the_members_stream_to_its_consumer(make_member, settings):
    # given: a consumer streaming ada's inbox items
    settings.MCP_HEARTBEAT_SECONDS = 0.5
    _, token = bearer.issue_credential(make_member("ada"), actor=None)

    async def story(http):
        first = asyncio.create_task(http.post(**stream_request(token, 1, None)))
        await asyncio.sleep(1.0)
        # when: another stream request with a forged cursor is refused
        refused = await http.post(**stream_request(token, 2, "forged-cursor"))
        await asyncio.sleep(1.0)
        kept = not first.done()
        first.cancel()
        return refused, kept

    refused, kept = asyncio.run(with_endpoint(story))
    # then: the refusal is InvalidParams, and the first stream is still on
    assert frames(refused.text)[-1]["error"]["code"] == -32602
    assert kept


def patched_reads(monkeypatch, change) -> list:
    """`sources.read_on_loop` through `change(n, read)`, n counting reads
    from 1 and `read()` the real one: the cursors they read from."""
    real, reads = sources.read_on_loop, []

    async def patched(*args):
        reads.append(args[3])
        return await change(len(reads), lambda: real(*args))

    monkeypatch.setattr(sources, "read_on_loop", patched)
    return reads


def streamed_until_suspended(token: str, seconds: float) -> str:
    """ada's inbox items streamed for `seconds`; the response, whole once her
    suspension ends it."""
    async def story(http):
        from asgiref.sync import sync_to_async

        from controlplane.models import Member
        response = asyncio.create_task(http.post(**stream_request(token, 1, None)))
        await asyncio.sleep(seconds)
        await sync_to_async(services.update_member)(await Member.objects.aget(handle="ada"), status="suspended",
                                                    actor=None)
        return await asyncio.wait_for(response, 5)

    return asyncio.run(with_endpoint(story)).text


def test_a_lost_database_is_a_recoverable_error_frame_and_the_stream_goes_on(make_member, settings, monkeypatch):
    # given: a stream whose reads lose the database twice after the first
    from django.db import OperationalError

    settings.MCP_HEARTBEAT_SECONDS = 5
    settings.FEED_RECHECK_SECONDS = 0.1
    _, token = bearer.issue_credential(make_member("ada"), actor=None)

    async def flaky(n, read):
        if n in (2, 3):
            raise OperationalError("server closed the connection unexpectedly")
        return await read()

    reads = patched_reads(monkeypatch, flaky)
    # two failures: the next read 1 s later, the one after 2 s
    text = streamed_until_suspended(token, 4.5)
    seen = methods(text)
    # then: active, two recoverable errors with the API's unavailable body, and the stream read on
    assert seen[0] == "notifications/events/active"
    assert seen.count("notifications/events/error") == 2
    error = next(f for f in frames(text) if f.get("method") == "notifications/events/error")
    assert error["params"]["error"]["data"]["code"] == "UNAVAILABLE"
    assert error["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 1}
    assert len(reads) > 3 and len(set(reads[1:4])) == 1  # again from the same cursor
    assert seen[-2] == "notifications/events/terminated"


def test_revoking_the_credential_that_opened_a_stream_ends_it(make_member, settings):
    # given: ada streams her inbox's items with one credential, and its pending count with another
    settings.MCP_HEARTBEAT_SECONDS = 5
    ada = make_member("ada")
    credential, token = bearer.issue_credential(ada, actor=None)
    _, other = bearer.issue_credential(ada, actor=None)

    async def story(http):
        from asgiref.sync import sync_to_async

        revoked = asyncio.create_task(http.post(**stream_request(token, 1, None)))
        kept = asyncio.create_task(http.post(**stream_request(other, 2, None, "org.switchboard/inbox.pending")))
        await asyncio.sleep(1.0)
        # when
        await sync_to_async(bearer.revoke_credential)(credential, actor=None)
        response = await asyncio.wait_for(revoked, 5)
        await asyncio.sleep(0.5)
        still = not kept.done()
        kept.cancel()
        return response, still

    response, still = asyncio.run(with_endpoint(story))
    # then: that stream ends with Forbidden, the other credential's goes on
    ended = [f for f in frames(response.text) if f.get("method") == "notifications/events/terminated"]
    assert ended[0]["params"]["error"]["code"] == -32024
    assert ended[0]["params"]["error"]["data"] == {"reason": "revoked"}
    assert still


@pytest.mark.parametrize("ending", ["revoked", "suspended"])
def test_a_stream_whose_ending_was_never_told_ends_at_its_next_heartbeat(make_member, settings, ending):
    """The message that ends a stream is sent once, after the commit: a
    process that died before sending it, or a Redis that dropped it, left
    the stream handing a suspended member's items out for ever."""
    from controlplane.models import Credential, Member

    # given: ada streams her inbox's items
    settings.MCP_HEARTBEAT_SECONDS = 0.5
    ada = make_member("ada")
    credential, token = bearer.issue_credential(ada, actor=None)

    async def story(http):
        from asgiref.sync import sync_to_async

        response = asyncio.create_task(http.post(**stream_request(token, 1, None)))
        await asyncio.sleep(1.0)
        # when: she is suspended, or her credential deleted, and no message says so (no signal either)
        if ending == "suspended":
            await sync_to_async(Member.objects.filter(pk=ada.pk).update)(status=Member.Status.SUSPENDED)
        else:
            await sync_to_async(Credential.objects.filter(pk=credential.pk)._raw_delete)("default")
        return await asyncio.wait_for(response, 5)

    # then: the stream ends at its next beat, and says why
    sent = frames(asyncio.run(with_endpoint(story)).text)
    ended = [f for f in sent if f.get("method") == "notifications/events/terminated"]
    assert ended[0]["params"]["error"]["code"] == -32024
    assert ended[0]["params"]["error"]["data"] == {"reason": ending}


@pytest.mark.parametrize("ending", ["revoked", "suspended"])
def test_a_stream_whose_credential_or_member_ends_while_it_starts_ends_before_anything_is_sent(
        make_member, monkeypatch, ending):
    # given: the credential is revoked, or its member suspended, after the
    # request was authenticated, before the stream listens for either
    from asgiref.sync import sync_to_async

    from mcp_endpoint.streams import StreamOwner

    ada = make_member("ada")
    credential, token = bearer.issue_credential(ada, actor=None)
    start = StreamOwner.start

    def end():
        if ending == "revoked":
            bearer.revoke_credential(credential, actor=None)
        else:
            services.update_member(ada, status="suspended", actor=None)

    async def start_late(self):
        await sync_to_async(end)()
        await start(self)

    monkeypatch.setattr(StreamOwner, "start", start_late)

    async def story(http):
        return await asyncio.wait_for(http.post(**stream_request(token, 1, None)), 5)

    # when
    response = asyncio.run(with_endpoint(story))
    # then
    (answer,) = frames(response.text)
    assert answer["error"]["code"] == -32024 and answer["error"]["data"] == {"reason": ending}


def test_a_stream_catching_up_a_long_feed_still_beats_and_still_ends(make_member, settings, monkeypatch):
    """Page after page with no item to send (an old cursor, a feed of acknowledged items): the stream read on
    without a heartbeat, and without heeding a suspension, until it caught up."""
    # given: a stream whose every read after the first finds more to read, slowly
    settings.MCP_HEARTBEAT_SECONDS = 0.5
    _, token = bearer.issue_credential(make_member("ada"), actor=None)
    real, reads = sources.read_on_loop, []

    async def catching_up(*args):
        reads.append(args[3])
        if len(reads) == 1:
            return await real(*args)
        await asyncio.sleep(0.1)
        return sources.Batch(cursor=args[3], has_more=True)

    monkeypatch.setattr(sources, "read_on_loop", catching_up)

    async def story(http):
        response = asyncio.create_task(http.post(**stream_request(token, 1, None)))
        await asyncio.sleep(2.0)
        # when: ada is suspended while it still catches up
        from asgiref.sync import sync_to_async
        from controlplane.models import Member
        ada = await Member.objects.aget(handle="ada")
        await sync_to_async(services.update_member)(ada, status="suspended", actor=None)
        return await asyncio.wait_for(response, 5)

    seen = methods(asyncio.run(with_endpoint(story)).text)
    # then: heartbeats while it read, and the end
    assert seen[0] == "notifications/events/active" and seen.count("notifications/events/heartbeat") >= 2
    assert seen[-2] == "notifications/events/terminated" and len(reads) > 10


def test_a_pending_count_stream_tells_changes_only_from_its_cursor(make_member, settings):
    # given: ada's pending count streamed from now, with one item already pending
    settings.MCP_HEARTBEAT_SECONDS = 5
    settings.FEED_RECHECK_SECONDS = 0.1
    from inbox.services import send_message

    ada, bo = make_member("ada"), make_member("bo")
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=bo)
    services.join_space(space, actor=ada)
    direct, _ = services.get_or_create_direct(space, ada, actor=bo)
    send_message(direct, body="already here", actor=bo)
    _, token = bearer.issue_credential(ada, actor=None)

    async def story(http):
        from asgiref.sync import sync_to_async

        response = asyncio.create_task(http.post(**stream_request(token, 1, None, "org.switchboard/inbox.pending")))
        await asyncio.sleep(1.0)  # several reads with nothing changed
        # when
        await sync_to_async(send_message)(direct, body="one more", actor=bo)
        await asyncio.sleep(1.0)
        await sync_to_async(services.update_member)(ada, status="suspended", actor=None)  # ends the stream
        return await asyncio.wait_for(response, 5)

    sent = frames(asyncio.run(with_endpoint(story)).text)
    # then: active with a cursor, one event for the change, nothing for the count it started at
    active = next(f["params"] for f in sent if f.get("method") == "notifications/events/active")
    events = [f["params"] for f in sent if f.get("method") == "notifications/events/event"]
    assert active["cursor"] and active["truncated"] is False
    assert [e["data"] for e in events] == [{"pendingCount": 2}] and events[0]["cursor"] != active["cursor"]


def test_a_gap_mid_stream_is_a_fresh_active_frame_and_the_stream_goes_on(make_member, settings, monkeypatch):
    # given: a stream whose second read finds its cursor behind the log's retention
    settings.MCP_HEARTBEAT_SECONDS = 5
    settings.FEED_RECHECK_SECONDS = 0.1
    _, token = bearer.issue_credential(make_member("ada"), actor=None)

    async def pruned_meanwhile(n, read):
        batch = await read()
        if n == 2:
            batch.truncated, batch.start = True, "the-floor"
        return batch

    reads = patched_reads(monkeypatch, pruned_meanwhile)
    sent = frames(streamed_until_suspended(token, 1.0))
    # then: a second active says truncated, with the fresh cursor; the stream read on after it
    actives = [f["params"] for f in sent if f.get("method") == "notifications/events/active"]
    assert [(a["truncated"], a["cursor"] == "the-floor") for a in actives] == [(False, False), (True, True)]
    assert len(reads) > 2
