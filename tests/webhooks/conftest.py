"""The delivery engine's scene: a verified endpoint and an active
subscription to a real HTTPS receiver; the engine is run by the test."""
import pytest

from controlplane import services
from tests.webhooks.scene import SECRET


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
