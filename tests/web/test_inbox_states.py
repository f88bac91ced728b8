"""Every read path of a member's inbox × every state an item can be in.
The API's inbox, held list and feed, the web app's inbox page, its count
and its live socket, and the MCP tools and `inbox.item` / `inbox.pending`
polls each show the one truth the inbox's rules give (SPEC §5, §7, §9,
§11): an item is offered once it is admitted and until it is
acknowledged; a held one only in the held lists; one a revocation
barrier is withdrawing nowhere, and its rejection in its place."""
import re
from html import unescape

import pytest

from controlplane import services
from controlplane.db import db_call
from grants import barrier
from grants import services as grants
from grants.models import Grant
from inbox import firewall
from inbox.delivery import acknowledge_delivery
from inbox.models import InboxItem
from inbox.services import send_message
from mcp_endpoint import sources, tools
from webhooks import mcp
from tests.web.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("live_sockets")]


@pytest.fixture(autouse=True)
def steps_run_by_the_test(monkeypatch):
    """No task runs on a commit: the test classifies and settles itself."""
    monkeypatch.setattr("controlplane.live.kick", lambda task, *args: None)

PLAIN, SECRET, LATER = "a plain note", "the secret plan", "a later note"

# state of the first of two messages: (its body, what every pending path
# lists as (kind, content), what every held path lists, whether the inbox
# feed shows its body). The second comes after it in the same conversation,
# under another grant, and the firewall lets it through.
STATES = {
    "admitted": (PLAIN, [("direct", PLAIN), ("direct", LATER)], [], True),
    "unclassified": (PLAIN, [], [], False),  # and so is the later one
    "held": (SECRET, [("direct", LATER)], [SECRET], False),
    "released": (SECRET, [("direct", SECRET), ("direct", LATER)], [], True),
    "withheld by a barrier": (PLAIN, [], [], False),  # the later one waits behind it
    "rejected": (PLAIN, [("rejected", None), ("direct", LATER)], [], False),
    "held, then rejected": (SECRET, [("rejected", None), ("direct", LATER)], [], False),
    "acknowledged": (PLAIN, [("direct", LATER)], [], True),
}


def reach(state: str, make_member, browser_of, api_for) -> dict:
    """carol's inbox after bob's one message reached `state`, as every
    path but the socket reads it."""
    alice, bob, carol = (make_member(handle, kind="human", password="correct horse battery")
                         for handle in ("alice", "bob", "carol"))
    space = services.create_space(slug="vault", name="Vault", visibility="open", send_policy="explicit_only",
                                  actor=alice)
    services.join_space(space, actor=bob)
    services.join_space(space, actor=carol)
    direct, _ = services.get_or_create_direct(space, carol, actor=bob)
    once = grants.create_grant(space, grant_id="grt_once", kind="one_message", sender="@bob", recipient="@carol",
                               idempotency_key="key-00001", actor=alice)[0]
    grants.create_grant(space, grant_id="grt_pair", kind="pair", sender="@bob", recipient="@carol", actor=alice)
    firewall.set_rules(carol, [{"action": "hold", "content_pattern": "secret"}], actor=carol)
    items_from = sources.read(carol, sources.SOURCES[mcp.ITEM], {}, None, 50).cursor  # polls from before the send
    count_from = sources.read(carol, sources.SOURCES[mcp.PENDING], {}, None, 50).cursor  # it told 0

    body, order = STATES[state][0], STATES[state][1]
    first = send_message(direct, body=body, idempotency_key="key-00001", actor=bob).message
    send_message(direct, body=LATER, actor=bob)
    if state != "unclassified":
        firewall.classify_pending(carol.pk)
    token = InboxItem.objects.get(member=carol, message=first).token
    if state == "released":
        firewall.release_item(carol, token, actor=carol)
    if state == "acknowledged":
        acknowledge_delivery(carol, token, actor=carol)
    if state in ("withheld by a barrier", "rejected", "held, then rejected"):
        barrier.start_barrier(once.pk, ending=Grant.Status.REVOKED, actor=None)
    if state in ("rejected", "held, then rejected"):
        barrier.finish_barrier(once.pk)

    api, page = api_for(carol), browser_of(carol).get("/app/inbox/")
    assert page.status_code == 200
    html = page.content.decode()
    held_html = html[html.index('id="held"'):]
    items = [e["item"] for e in api.get("/v0/me/inbox").json()["items"]]
    tool_items = [e["item"] for e in tools.TOOLS["read_inbox"].run(carol, {})["items"]]
    polled = [e["data"]["item"] for e in sources.read(carol, sources.SOURCES[mcp.ITEM], {}, items_from, 50).events]
    told = sources.read(carol, sources.SOURCES[mcp.PENDING], {}, count_from, 50).events
    return {
        "carol": carol,
        "pending": {
            "GET /v0/me/inbox": [(i["kind"], i.get("content")) for i in items],
            "MCP read_inbox": [(i["kind"], i.get("content")) for i in tool_items],
            # a poll offers an item when it becomes available: a released one after those admitted meanwhile
            "MCP inbox.item poll": sorted(((i["kind"], i.get("content")) for i in polled), key=order.index),
            "web inbox page": web_items(html[:html.index('id="held"')], "card item"),
        },
        "held": {
            "GET /v0/me/inbox/held": [i["item"]["content"] for i in api.get("/v0/me/inbox/held").json()["items"]],
            "web inbox page": [content for _, content in web_items(held_html, "item held")],
        },
        "count": {
            "MCP inbox.pending poll": told[-1]["data"]["pendingCount"] if told else 0,
            "web inbox page": int(re.search(r'id="inbox-count"[^>]*>(\d+)<', html).group(1)),
        },
        "feed shows the body": body in api.get("/v0/me/inbox/events").content.decode(),
    }


def web_items(html: str, css_class: str) -> list[tuple[str, str | None]]:
    """(kind, body) of each item the page lists in `html`."""
    found = []
    for entry in re.findall(rf'<li class="{css_class}"[^>]*>(.*?)</li>', html, re.S):
        body = re.search(r'<div class="body">(.*?)</div>', entry, re.S)
        found.append((re.search(r"<strong>(.*?)</strong>", entry).group(1),
                      unescape(body.group(1)) if body else None))
    return found


@pytest.mark.parametrize("state", STATES)
async def test_every_inbox_read_path_shows_an_item_as_its_state_says(state, make_member, browser_of, api_for):
    # given / when
    seen = await db_call(reach)(state, make_member, browser_of, api_for)
    socket, connected = await open_socket("/ws/inbox/", seen["carol"])
    assert connected
    seen["count"]["/ws/inbox/"] = (await socket.receive_json_from(timeout=5))["pending"]
    # then
    _, pending, held, feed_shows_body = STATES[state]
    assert seen["pending"] == {path: pending for path in seen["pending"]}
    assert seen["held"] == {path: held for path in seen["held"]}
    assert seen["count"] == {path: len(pending) for path in seen["count"]}
    assert seen["feed shows the body"] is feed_shows_body
