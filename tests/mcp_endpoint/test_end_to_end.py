"""/mcp end to end: a real `serve` process (uvicorn, which owns the
lifespan), the official SDK's client, both protocol eras."""
import asyncio
import time

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.mcp_endpoint.client import call, connect
from tests.servers import member_token, serving

pytestmark = pytest.mark.django_db(transaction=True)

ITEM = "org.switchboard/inbox.item"


def token_for(handle: str) -> str:
    return member_token(handle)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def direct_between(base: str, ada: str, bo: str) -> str:
    """bo's open space `lab`, ada in it, and their direct conversation."""
    assert httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=bearer(bo)).status_code == 201
    assert httpx.post(f"{base}/v0/spaces/lab/join", headers=bearer(ada)).status_code == 201
    return httpx.post(f"{base}/v0/spaces/lab/direct", json={"member": "@ada"},
                      headers=bearer(bo)).json()["conversation"]["id"]


def send(base: str, token: str, conversation: str, body: str) -> dict:
    sent = httpx.post(f"{base}/v0/spaces/lab/conversations/{conversation}/messages", json={"body": body},
                      headers=bearer(token))
    assert sent.status_code == 201, sent.text
    return sent.json()["message"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tools_read_send_acknowledge_and_errors_through_serve(mode):
    # given: ada (an agent on MCP) and bo (on the API) share a direct conversation
    ada, bo = token_for("ada"), token_for("bo")
    with serving("--no-worker") as (base, _):
        conversation = direct_between(base, ada, bo)
        send(base, bo, conversation, "hello ada")

        async def story():
            async with connect(base, ada, mode=mode) as (client, _):
                # when
                tools = {tool.name: tool for tool in (await client.list_tools()).tools}
                page = (await client.call_tool("read_inbox", {})).structured_content
                (entry,) = page["items"]
                event_id = "evt_" + entry["deliveryToken"][4:]
                event = (await client.call_tool("read_event", {"eventId": event_id})).structured_content
                reply = await client.call_tool("send_message", {"space": "lab", "conversation": conversation,
                                                                "body": "hi bo", "idempotency_key": "reply-0001"})
                again = await client.call_tool("send_message", {"space": "lab", "conversation": conversation,
                                                                "body": "hi bo", "idempotency_key": "reply-0001"})
                acked = (await client.call_tool("acknowledge_delivery",
                                                {"deliveryToken": entry["deliveryToken"]})).structured_content
                after = (await client.call_tool("read_inbox", {})).structured_content
                context = (await client.call_tool("get_coordination_context", {})).structured_content
                refused = await client.call_tool("send_message", {"space": "lab", "conversation": "cnv_nowhere",
                                                                  "body": "x"})
                errors = {}
                for name, arguments in [("read_event", {"eventId": "evt_" + "A" * 43}),
                                        ("read_event", {"eventId": "not-an-id"}),
                                        ("acknowledge_delivery", {"deliveryToken": entry["deliveryToken"],
                                                                  "extra": 1}),
                                        ("read_inbox", {"cursor": "forged"}),
                                        ("send_message", {"space": "lab\x00", "conversation": conversation,
                                                          "body": "x"})]:
                    with pytest.raises(MCPError) as raised:
                        await client.call_tool(name, arguments)
                    errors[name, str(arguments)[:30]] = (raised.value.code, raised.value.data)
                return tools, entry, event, reply, again, acked, after, context, refused, errors

        tools, entry, event, reply, again, acked, after, context, refused, errors = asyncio.run(story())
        api_inbox = httpx.get(f"{base}/v0/me/inbox", headers=bearer(bo)).json()["items"]
    # then: the same shapes as the API, and the API's rules
    assert set(tools) == {"read_inbox", "acknowledge_delivery", "read_event", "send_message", "answer",
                          "read_answers", "get_coordination_context"}
    assert all(tool.input_schema["type"] == "object" and tool.output_schema for tool in tools.values())
    # a retry of send_message without its idempotency_key sends again: not idempotent
    assert {name for name, tool in tools.items() if not tool.annotations.idempotent_hint} == {"send_message"}
    assert entry["item"]["content"] == "hello ada" and entry["item"]["sender"] == "@bo"
    assert event == {"item": entry["item"]}
    assert reply.structured_content["created"] is True and again.structured_content["created"] is False
    assert reply.structured_content["message"]["id"] == again.structured_content["message"]["id"]
    assert [i["item"]["content"] for i in api_inbox] == ["hi bo"]  # sent once
    assert acked == {} and after == {"items": [], "nextCursor": None}
    assert [m["message"]["body"] for m in context["unresolved"]] == ["hello ada"]
    assert refused.is_error and refused.structured_content["error"]["code"] == "NOT_FOUND"
    codes = [code for code, _ in errors.values()]
    assert codes == [-32023, -32602, -32602, -32602, -32602]
    assert list(errors.values())[0][1] == {"reason": "unknown-event"}


def test_poll_pages_and_a_stream_delivers_within_a_second_with_heartbeats():
    # given
    ada, bo = token_for("ada"), token_for("bo")
    with serving("--no-worker", MCP_HEARTBEAT_SECONDS=0.5, FEED_RECHECK_SECONDS=60) as (base, _):
        conversation = direct_between(base, ada, bo)

        async def story():
            async with connect(base, ada) as (client, events):
                listed = await call(client, "events/list")
                with pytest.raises(MCPError) as refused:  # one page: any cursor is not one of ours
                    await call(client, "events/list", cursor="forged")
                assert refused.value.error.code == -32602
                start = await call(client, "events/poll", name=ITEM)
                counted = await call(client, "events/poll", name="org.switchboard/inbox.pending")
                for n in range(3):
                    send(base, bo, conversation, f"polled {n}")
                first = await call(client, "events/poll", name=ITEM, cursor=start["cursor"], maxEvents=2)
                rest = await call(client, "events/poll", name=ITEM, cursor=first["cursor"], maxEvents=2)
                pending = [await call(client, "events/poll", name="org.switchboard/inbox.pending",
                                      cursor=counted["cursor"]) for _ in range(2)]  # a retry tells it again
                for bad in (0, True, "2"):  # out of range, or no JSON integer at all
                    with pytest.raises(MCPError) as refused:
                        await call(client, "events/poll", name=ITEM, cursor=start["cursor"], maxEvents=bad)
                    assert refused.value.error.code == -32602
                    assert refused.value.error.data == {"field": "maxEvents"}  # which field, and why
                    assert refused.value.error.message.startswith("maxEvents: ")
                # maxAgeMs: nothing older than it is replayed, and the answer says events were skipped
                bounded = await call(client, "events/poll", name=ITEM, cursor=start["cursor"], maxAgeMs=0)
                assert bounded["events"] == [] and bounded["truncated"] is True
                with pytest.raises(MCPError) as refused:
                    await call(client, "events/poll", name=ITEM, cursor=start["cursor"], maxAgeMs=-1)
                assert refused.value.error.code == -32602
                stream = asyncio.ensure_future(call(client, "events/stream", name=ITEM))
                active = await events.next()
                beats = [await events.next(), await events.next()]
                sent_at = time.monotonic()
                sent = send(base, bo, conversation, "streamed")
                while (frame := await events.next())[0] == "heartbeat":
                    pass
                latency = time.monotonic() - sent_at
                stream.cancel()
                return listed, start, counted, first, rest, pending, active, beats, frame, latency, sent

        listed, start, counted, first, rest, pending, active, beats, frame, latency, sent = asyncio.run(story())
    # then
    assert [e["name"] for e in listed["events"]] == [ITEM, "org.switchboard/inbox.pending", "spaces.work.available"]
    assert start["events"] == [] and start["truncated"] is False
    assert [e["data"]["item"]["content"] for e in first["events"]] == ["polled 0", "polled 1"]
    assert first["hasMore"] is True and first["nextPollMs"] == 0
    assert [e["data"]["item"]["content"] for e in rest["events"]] == ["polled 2"] and rest["hasMore"] is False
    assert all("cursor" not in e for e in first["events"])
    assert counted["events"] == [] and counted["cursor"]  # from now: nothing, and a cursor
    assert [[e["data"] for e in p["events"]] for p in pending] == [[{"pendingCount": 3}]] * 2
    assert pending[0]["events"][0]["eventId"] == pending[1]["events"][0]["eventId"]
    assert active[0] == "active" and active[1]["truncated"] is False
    assert [kind for kind, _ in beats] == ["heartbeat", "heartbeat"]
    kind, params = frame
    assert kind == "event" and params["data"]["item"]["postId"] == sent["id"] and latency < 1.0
    assert params["eventId"] == "evt_" + params["data"]["deliveryToken"][4:]
    assert params["_meta"]["io.modelcontextprotocol/subscriptionId"] == active[1]["_meta"][
        "io.modelcontextprotocol/subscriptionId"]


def test_a_work_stream_is_woken_by_a_send_in_its_space_within_a_second():
    # given: a recheck too slow to answer in time: only the send's nudge can
    ada, bo = token_for("ada"), token_for("bo")
    with serving("--no-worker", FEED_RECHECK_SECONDS=60) as (base, _):
        conversation = direct_between(base, ada, bo)

        async def story():
            async with connect(base, ada) as (client, events):
                stream = asyncio.ensure_future(call(client, "events/stream", name="spaces.work.available",
                                                    arguments={"space": "lab"}))
                active = await events.next()
                # when
                sent_at = time.monotonic()
                send(base, bo, conversation, "work to see")
                frame = await events.next()
                latency = time.monotonic() - sent_at
                stream.cancel()
                return active, frame, latency

        active, (kind, params), latency = asyncio.run(story())
    # then
    assert active[0] == "active"
    assert kind == "event" and params["name"] == "spaces.work.available" and params["data"]["space"] == "lab"
    assert latency < 1.0


def test_a_new_consumer_replaces_the_old_one_which_cannot_end_it():
    ada, bo = token_for("ada"), token_for("bo")
    with serving("--no-worker", MCP_HEARTBEAT_SECONDS=0.5) as (base, _):
        conversation = direct_between(base, ada, bo)

        async def story():
            async with connect(base, ada) as (old, old_events), connect(base, ada) as (new, new_events):
                first = asyncio.ensure_future(call(old, "events/stream", name=ITEM))
                assert (await old_events.next())[0] == "active"
                second = asyncio.ensure_future(call(new, "events/stream", name=ITEM))
                assert (await new_events.next())[0] == "active"
                while (frame := await old_events.next())[0] == "heartbeat":
                    pass
                await asyncio.wait_for(first, 10)  # the old stream has ended
                first.cancel()
                send(base, bo, conversation, "for the new one")
                while (delivered := await new_events.next())[0] == "heartbeat":
                    pass
                second.cancel()
                return frame, delivered

        terminated, delivered = asyncio.run(story())
    assert terminated[0] == "terminated" and terminated[1]["error"]["data"]["reason"] == "replaced"
    assert delivered[0] == "event" and delivered[1]["data"]["item"]["content"] == "for the new one"


SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ="


def mcp_receiver(receiver, answers=None):
    """Echo the verification challenge; answer pushed items with
    `answers(received)` (default 204)."""
    import json

    def respond(received):
        body = received.json()
        if body.get("type") == "verification":
            return 200, {"Content-Type": "application/json"}, json.dumps({"challenge": body["challenge"]}).encode()
        return answers(received) if answers else (204, {}, b"")

    receiver.respond = respond


def pushed(requests) -> list:
    return [r for r in requests if r.json().get("type") != "verification"]


def receiver_env(https_receiver) -> dict:
    return {"WEBHOOK_CA_BUNDLE": str(https_receiver[1]), "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1"}


def subscribe(base, token, receiver, path="/items", **extra) -> dict | MCPError:
    """events/subscribe for ada's inbox items: the result, or the MCPError."""
    async def go():
        async with connect(base, token) as (client, _):
            try:
                return await call(client, "events/subscribe", name=ITEM, arguments={},
                                  delivery={"mode": "webhook", "url": receiver.url(path), "secret": SECRET}, **extra)
            except MCPError as error:
                return error
    return asyncio.run(go())


def test_pushed_items_are_verified_signed_acknowledged_by_2xx_and_retried_on_5xx(receiver, https_receiver):
    # given: ada subscribes her inbox items to an HTTPS receiver that fails the first push once
    from standardwebhooks.webhooks import Webhook

    ada, bo = token_for("ada"), token_for("bo")
    failed = []

    def answers(received):
        if not failed:
            failed.append(received)
            return 500, {}, b""
        return 204, {}, b""

    mcp_receiver(receiver, answers)
    with serving(**receiver_env(https_receiver)) as (base, _):
        conversation = direct_between(base, ada, bo)
        created = subscribe(base, ada, receiver)
        refreshed = subscribe(base, ada, receiver, ttlMs=None)
        # when: three messages
        sent = [send(base, bo, conversation, f"push {n}")["id"] for n in range(3)]
        requests = receiver.wait_for(lambda rs: len(pushed(rs)) >= 4, timeout=60)
        # the last 2xx is recorded (and its item acknowledged) a moment after the receiver answered it
        deadline = time.monotonic() + 30
        while (inbox := httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
    # then: the challenge came first, signed; every push verifies with the secret
    challenge = requests[0]
    assert challenge.json()["type"] == "verification"
    assert created["id"].startswith("sub_") and refreshed["id"] == created["id"]
    assert created.get("cursor") is None and created["truncated"] is False and created["refreshBefore"]
    verifier = Webhook(SECRET)
    bodies = [verifier.verify(r.body, {k.lower(): v for k, v in r.headers.items()}) for r in pushed(requests)]
    assert all(r.headers["X-MCP-Subscription-Id"] == created["id"] for r in requests)
    # the 500 was retried with the same id and body; then the items in order, one at a time
    first, retry = pushed(requests)[:2]
    assert retry.headers["webhook-id"] == first.headers["webhook-id"] and retry.body == first.body
    assert [b["data"]["item"]["postId"] for b in bodies] == [sent[0], sent[0], sent[1], sent[2]]
    assert all(b["eventId"] == r.headers["webhook-id"] for b, r in zip(bodies, pushed(requests)))
    assert inbox == []  # each 2xx acknowledged its item


@pytest.mark.parametrize("status", [410, 413])
def test_a_terminal_answer_stops_the_subscription_for_good_and_keeps_the_item(receiver, https_receiver, status):
    # 410 (gone) and 413 (too large) are terminal for pushed items as for wakes (SPEC 8, 9)
    ada, bo = token_for("ada"), token_for("bo")
    mcp_receiver(receiver, lambda received: (status, {}, b""))
    with serving(**receiver_env(https_receiver)) as (base, _):
        conversation = direct_between(base, ada, bo)
        subscribe(base, ada, receiver)
        sent = send(base, bo, conversation, "gone?")
        receiver.wait_for(lambda rs: len(pushed(rs)) >= 1, timeout=60)
        deadline = time.monotonic() + 30
        while True:
            listed = httpx.get(f"{base}/v0/me/inbox-subscriptions", headers=bearer(ada)).json()["subscriptions"]
            if listed and listed[0]["status"] == "suspended" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        send(base, bo, conversation, "still there?")
        time.sleep(2)
        refresh = subscribe(base, ada, receiver)
        inbox = httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"]
    assert listed[0]["status"] == "suspended" and listed[0]["suspended"]["terminal"] is True
    assert len(pushed(receiver.requests)) == 1  # nothing more was sent
    assert isinstance(refresh, MCPError) and refresh.error.code == -32024
    kinds = [(i["item"]["kind"], i["item"].get("postId")) for i in inbox]
    assert ("direct", sent["id"]) in kinds  # the rejected item stays pending


def test_a_killed_server_loses_no_pushed_item_and_sends_each_once(receiver, https_receiver):
    from controlplane.processes import in_session, kill_all

    # given: items pending for a subscription on a server with no worker running, killed with SIGKILL
    ada, bo = token_for("ada"), token_for("bo")
    mcp_receiver(receiver)
    env = receiver_env(https_receiver)
    with serving("--no-worker", **env) as (base, process):
        conversation = direct_between(base, ada, bo)
        subscription = subscribe(base, ada, receiver)
        sent = [send(base, bo, conversation, f"survive {n}")["id"] for n in range(3)]
        kill_all(lambda: in_session(process.pid))
        process.wait()
    # when: a new server (with its worker) serves the same database
    with serving(**env) as (base, _):
        receiver.wait_for(lambda rs: len(pushed(rs)) >= 3, timeout=60)
        time.sleep(2)  # room for a duplicate to show up
        inbox = httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"]
    # then: every item once, in order, under the same subscription
    requests = pushed(receiver.requests)
    assert [r.json()["data"]["item"]["postId"] for r in requests] == sent
    assert {r.headers["X-MCP-Subscription-Id"] for r in requests} == {subscription["id"]}
    assert inbox == []


def test_subscribe_refuses_what_it_cannot_honour(receiver, https_receiver):
    ada = token_for("ada")
    receiver.respond = lambda received: (200, {"Content-Type": "application/json"}, b'{"challenge": "wrong"}')
    with serving("--no-worker", **receiver_env(https_receiver)) as (base, _):
        async def story():
            async with connect(base, ada) as (client, _):
                tries = {
                    "http": dict(name=ITEM, delivery={"mode": "webhook", "url": "http://localhost/x", "secret": SECRET}),
                    "secret": dict(name=ITEM, delivery={"mode": "webhook", "url": receiver.url(), "secret": "nope"}),
                    "mode": dict(name=ITEM, delivery={"mode": "push", "url": receiver.url(), "secret": SECRET}),
                    "challenge": dict(name=ITEM, delivery={"mode": "webhook", "url": receiver.url(), "secret": SECRET}),
                    "event": dict(name="no.such.event", delivery={"mode": "webhook", "url": receiver.url(),
                                                                 "secret": SECRET}),
                    "arguments": dict(name=ITEM, arguments={"space": "lab"},
                                      delivery={"mode": "webhook", "url": receiver.url(), "secret": SECRET}),
                }
                answers = {}
                for label, params in tries.items():
                    with pytest.raises(MCPError) as raised:
                        await call(client, "events/subscribe", **params)
                    answers[label] = (raised.value.error.code, raised.value.error.data)
                with pytest.raises(MCPError) as raised:
                    await call(client, "events/unsubscribe", name=ITEM, delivery={"url": receiver.url()})
                answers["unsubscribe"] = (raised.value.error.code, raised.value.error.data)
                return answers

        answers = asyncio.run(story())
    assert answers["http"][0] == -32602 and answers["secret"][0] == -32602 and answers["arguments"][0] == -32602
    assert answers["mode"] == (-32026, {"feature": "deliveryMode", "value": "push"})
    assert answers["challenge"] == (-32027, {"reason": "challenge_failed"})
    assert answers["event"] == (-32023, {"kind": "event"})
    assert answers["unsubscribe"] == (-32023, {"kind": "subscription"})


def test_the_example_client_drains_the_inbox_then_follows_the_stream():
    import json
    import subprocess
    import sys

    from tests.servers import ROOT, server_env

    ada, bo = token_for("ada"), token_for("bo")
    with serving("--no-worker") as (base, _):
        conversation = direct_between(base, ada, bo)
        send(base, bo, conversation, "waiting")
        agent = subprocess.Popen([sys.executable, "-m", "mcp_endpoint.example_client", "--url", f"{base}/mcp",
                                  "--seconds", "6"], cwd=ROOT, env=server_env(SWITCHBOARD_TOKEN=ada),
                                 stdout=subprocess.PIPE, text=True)
        assert json.loads(agent.stdout.readline()) == {"frame": "active"}
        assert json.loads(agent.stdout.readline())["item"]["content"] == "waiting"
        send(base, bo, conversation, "live")
        lines = [json.loads(line) for line in agent.stdout]
        assert agent.wait(30) == 0
        inbox = httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"]
    assert [line["item"]["content"] for line in lines if "item" in line] == ["live"]
    assert inbox == []  # both acknowledged


def test_revoking_the_credential_that_subscribed_stops_its_pushes(receiver, https_receiver):
    # given: ada subscribes with a second credential of hers
    ada, bo = token_for("ada"), token_for("bo")
    mcp_receiver(receiver)
    with serving(**receiver_env(https_receiver)) as (base, _):
        conversation = direct_between(base, ada, bo)
        second = httpx.post(f"{base}/v0/me/credentials", json={"name": "agent"}, headers=bearer(ada)).json()
        subscribe(base, second["token"], receiver)
        send(base, bo, conversation, "before")
        receiver.wait_for(lambda rs: len(pushed(rs)) >= 1, timeout=60)
        deadline = time.monotonic() + 30  # its 2xx recorded, the item acknowledged
        while httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"] and time.monotonic() < deadline:
            time.sleep(0.2)
        # when: she revokes it, and another message comes
        revoked = httpx.delete(f"{base}/v0/me/credentials/{second['id']}", headers=bearer(ada))
        after = send(base, bo, conversation, "after")
        time.sleep(3)  # room for a push to show up
        inbox = httpx.get(f"{base}/v0/me/inbox", headers=bearer(ada)).json()["items"]
        listed = httpx.get(f"{base}/v0/me/inbox-subscriptions", headers=bearer(ada)).json()["subscriptions"]
    # then: nothing more was pushed; the item waits in her inbox; the subscription is gone
    assert revoked.status_code == 204
    assert [r.json()["data"]["item"]["content"] for r in pushed(receiver.requests)] == ["before"]
    assert [i["item"].get("postId") for i in inbox] == [after["id"]]
    assert listed == []
