"""The delivery engine's scene: a verified endpoint and an active
subscription to a real HTTPS receiver; the engine is run by the test."""
import base64
import json

import pytest

from controlplane import services
from inbox.services import send_message
from tests.webhooks.scene import SECRET
from webhooks import mcp
from webhooks.models import Subscription

MCP_SECRET = "whsec_" + base64.b64encode(b"m" * 32).decode()
MCP_NAMES = {"item": mcp.ITEM, "pending": mcp.PENDING, "work": mcp.WORK}


@pytest.fixture
def no_kicks(monkeypatch):
    """The tests run the engine themselves (kicks would run it synchronously)."""
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)


@pytest.fixture
def world(receiver, api_for, make_member):
    """alice subscribed to the open space `lab` (debounce 0) through a
    verified endpoint with a secret; bob sends."""
    alice, bob = make_member("alice"), make_member("bob")
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    services.join_space(space, actor=bob)
    general = services.create_channel(space, "general", actor=alice)
    as_alice = api_for(alice)
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url(), "secret": SECRET}).json()["endpoint"]
    as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    subscription = as_alice.post("/v0/spaces/lab/webhook-subscriptions",
                                 {"endpoint_id": endpoint["id"], "debounce_ms": 0}).json()["subscription"]
    as_alice.post(f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}/activate")
    receiver.requests.clear()
    return {"alice": alice, "bob": bob, "as_alice": as_alice, "general": general, "subscription": subscription,
            "path": f"/v0/spaces/lab/webhook-subscriptions/{subscription['id']}"}


def challenge_or(answer):
    """Echo both challenge shapes; anything else gets `answer(received)`."""
    def respond(received):
        body = received.json()
        if body.get("type") in ("spaces.webhook.challenge", "verification"):
            return 200, {"Content-Type": "application/json"}, json.dumps({"challenge": body["challenge"]}).encode()
        return answer(received)
    return respond


def pushes(receiver):
    return [r for r in receiver.requests if r.json().get("type") not in ("spaces.webhook.challenge", "verification")]


@pytest.fixture
def cell(receiver, api_for, make_member):
    """alice with one active subscription of `kind` (debounce 0) on the
    receiver; bob writes to her in a direct conversation of the open space."""
    def make(kind):
        alice, bob = make_member("alice"), make_member("bob")
        space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
        services.join_space(space, actor=bob)
        direct, _ = services.get_or_create_direct(space, alice, actor=bob)
        receiver.respond = challenge_or(lambda r: (202, {}, b"{}"))
        as_alice = api_for(alice)
        if kind in MCP_NAMES:
            created = mcp.subscribe(alice, MCP_NAMES[kind], {"space": "lab"} if kind == "work" else {},
                                    receiver.url(f"/{kind}"), MCP_SECRET, ttl_ms=None)
            subscription = Subscription.objects.get(public_id=created["id"])
        else:
            endpoint = as_alice.post("/v0/webhook-endpoints", {"url": receiver.url(f"/{kind}"),
                                                               "secret": SECRET}).json()["endpoint"]
            assert as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify").status_code == 200
            collection = "/v0/spaces/lab/webhook-subscriptions" if kind == "space" else "/v0/me/inbox-subscriptions"
            made = as_alice.post(collection, {"endpoint_id": endpoint["id"], "debounce_ms": 0}).json()["subscription"]
            assert as_alice.post(f"{collection}/{made['id']}/activate").status_code == 200
            subscription = Subscription.objects.get(public_id=made["id"])
        receiver.requests.clear()
        return {"alice": alice, "bob": bob, "space": space, "direct": direct, "as_alice": as_alice,
                "subscription": subscription, "send": lambda body: send_message(direct, body=body, actor=bob)}
    return make
