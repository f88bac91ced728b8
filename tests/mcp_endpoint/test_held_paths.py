"""Held and unclassified items × the MCP paths (inbox.pending by poll and
push, an item push before classification, the tools), and a message
retained for approval × every read path of its recipient: none shows what
the firewall holds or an admin has not approved (SPEC §5, §7)."""
import asyncio
import base64

import pytest

from controlplane import services
from inbox import firewall
from inbox.models import InboxItem
from inbox.services import send_message
from mcp_endpoint import sources, tools
from tests.mcp_endpoint.conftest import echo_challenges
from webhooks import mcp
from webhooks import pump as timer_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_kicks")]
SECRET = "whsec_" + base64.b64encode(b"h" * 32).decode()


def pump():
    return asyncio.run(timer_loop.run(seconds=10.0, wait=False))


def pushes(receiver, path=None):
    return [r for r in receiver.requests if r.json().get("type") != "verification" and (path is None or r.path == path)]


def test_pending_count_and_tools_never_count_or_show_held_items(world, receiver):
    ada, bo = world["ada"], world["bo"]
    firewall.set_rules(ada, [{"action": "hold", "content_pattern": "secret"}], actor=ada)
    mcp.subscribe(ada, mcp.PENDING, {}, receiver.url("/pending"), SECRET, ttl_ms=None)
    mcp.subscribe(ada, mcp.ITEM, {}, receiver.url("/items"), SECRET, ttl_ms=None)
    watermark = sources.read(ada, sources.SOURCES[mcp.PENDING], {}, None, 50).cursor  # a poll from now
    sent = send_message(world["direct"], body="the secret", actor=bo).message
    # before classification: nothing pushed, nothing counted
    while pump():
        pass
    assert pushes(receiver, "/items") == []
    assert sources.read(ada, sources.SOURCES[mcp.PENDING], {}, watermark, 50).events == []  # still 0: no change
    firewall.classify_pending(ada.pk)
    while pump():
        pass
    held = InboxItem.objects.get(member=ada, message=sent)
    assert held.admission == "held"
    assert pushes(receiver, "/items") == []
    assert all(r.json()["data"]["pendingCount"] == 0 for r in pushes(receiver, "/pending"))
    assert sources.read(ada, sources.SOURCES[mcp.PENDING], {}, watermark, 50).events == []  # still 0: no change
    # the MCP tools answer as their REST routes do
    assert tools.TOOLS["read_inbox"].run(ada, {})["items"] == []
    assert "the secret" not in str(tools.TOOLS["get_coordination_context"].run(ada, {}))
    from controlplane.errors import UnknownEvent
    with pytest.raises(UnknownEvent):
        tools.TOOLS["read_event"].run(ada, {"eventId": "evt_" + held.token[4:]})
    # released: pushed and counted
    firewall.release_item(ada, held.token, actor=ada)
    while pump():
        pass
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver, "/items")] == ["the secret"]


def test_a_retained_message_reaches_no_path_of_its_recipient(make_member, api_for, receiver):
    from tests.webhooks.scene import pump as wake_pump

    root = make_member("root", kind="human", is_admin=True, password="root-pass-123")
    alice, bob, carol = make_member("alice"), make_member("bob"), make_member("carol")
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    as_bob, as_carol = api_for(bob), api_for(carol)

    receiver.respond = echo_challenges
    mcp.subscribe(carol, mcp.ITEM, {}, receiver.url("/carol-items"), SECRET, ttl_ms=None)
    mcp.subscribe(carol, mcp.PENDING, {}, receiver.url("/carol-pending"), SECRET, ttl_ms=None)
    mcp.subscribe(carol, mcp.WORK, {"space": "vault"}, receiver.url("/carol-work"), SECRET, ttl_ms=None)
    start = sources.read(carol, sources.SOURCES[mcp.ITEM], {}, None, 50)
    refused = as_bob.post(f"/v0/spaces/vault/conversations/{direct.public_id}/messages",
                          {"body": "RETAINED BODY", "request_approval": True},
                          headers={"Idempotency-Key": "retained-0001"})
    assert refused.status_code == 403
    while wake_pump():
        pass
    text = " ".join(r.body.decode() for r in receiver.requests)
    paths = [
        as_carol.get("/v0/me/inbox").content, as_carol.get("/v0/me/inbox/events").content,
        as_carol.get("/v0/spaces/vault/events").content, as_carol.get("/v0/me/snapshot").content,
        api_for(alice).get("/v0/spaces/vault/events").content,
        str(sources.read(carol, sources.SOURCES[mcp.ITEM], {}, start.cursor, 50)).encode(),
    ]
    assert "RETAINED BODY" not in text
    assert all(b"RETAINED BODY" not in p for p in paths)
    # approved: it arrives once, exactly
    as_root = api_for(root)
    request_id = refused.json()["error"]["details"]["approval_request"]["id"]
    assert as_root.post(f"/v0/approval-requests/{request_id}/approve").status_code == 200
    while wake_pump():
        pass
    assert [r.json()["data"]["item"]["content"] for r in pushes(receiver, "/carol-items")] == ["RETAINED BODY"]
