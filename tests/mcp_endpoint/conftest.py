"""Fixtures of the push tests (test_push*.py)."""
import json

import pytest

from controlplane import services


@pytest.fixture
def no_kicks(monkeypatch):
    """Deliveries are sent by the test's own pump, never by a kick's task."""
    monkeypatch.setattr("webhooks.due.kick_on_commit", lambda: None)


def echo_challenges(received):
    """A push receiver: it echoes the verification challenge and answers every push 204."""
    body = received.json()
    if body.get("type") == "verification":
        return 200, {"Content-Type": "application/json"}, json.dumps({"challenge": body["challenge"]}).encode()
    return 204, {}, b""


@pytest.fixture
def world(receiver, make_member):
    """ada's inbox items pushed to the receiver (which echoes challenges and
    answers pushes 204); bo and ada share a direct conversation."""
    ada, bo = make_member("ada"), make_member("bo")
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=bo)
    services.join_space(space, actor=ada)
    direct, _ = services.get_or_create_direct(space, ada, actor=bo)

    receiver.respond = echo_challenges
    return {"ada": ada, "bo": bo, "direct": direct, "url": receiver.url("/items")}
