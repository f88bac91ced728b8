"""Through a real `manage.py serve` (its server and worker cluster): space
wakes, inbox wakes and MCP item pushes × 3xx, connection refused, an
untrusted certificate and a timeout. Each first attempt fails with its own
class; the receiver is then fixed and the retry (same id) is delivered."""
import json
import socket
import time

import httpx
import pytest

from tests.mcp_endpoint.test_end_to_end import subscribe as mcp_subscribe
from tests.servers import member_token, serving
from tests.webhooks.receiver import serve_receiver
from webhooks.models import Attempt, Delivery, Endpoint, Subscription

pytestmark = pytest.mark.django_db(transaction=True)
KINDS, OUTCOMES = ("space", "inbox", "item"), ("302", "refused", "tls", "timeout")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def polled(read, done, seconds=40.0):
    """`read()` again every 0.3 s until `done` with it, or `seconds` passed: its last answer."""
    deadline = time.monotonic() + seconds
    while not done(got := read()) and time.monotonic() < deadline:
        time.sleep(0.3)
    return got


def test_failures_of_every_kind_through_serve(receiver, https_receiver, tmp_path):
    untrusted, _, stop_untrusted = serve_receiver(tmp_path)  # a CA the server does not trust
    bob = {"Authorization": f"Bearer {member_token('bob')}"}
    owners = {(k, o): member_token(f"{k}{o}") for k in KINDS for o in OUTCOMES}
    seen: dict[str, int] = {}

    def answer(received):
        body = received.json()
        if body.get("type") in ("spaces.webhook.challenge", "verification"):
            return 200, {"Content-Type": "application/json"}, json.dumps({"challenge": body["challenge"]}).encode()
        seen[received.path] = seen.get(received.path, 0) + 1
        if seen[received.path] == 1 and received.path.endswith("302"):
            return 302, {"Location": receiver.url("/elsewhere")}, b""
        if seen[received.path] == 1 and received.path.endswith("timeout"):
            time.sleep(12)  # past the transport's 10 s read timeout
        return 202, {}, b"{}"

    receiver.respond = answer
    untrusted.respond = answer
    env = {"WEBHOOK_CA_BUNDLE": str(https_receiver[1]), "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1"}
    try:
        with serving(**env) as (base, _):
            httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=bob)
            direct = {}
            for token in owners.values():
                httpx.post(f"{base}/v0/spaces/lab/join", headers={"Authorization": f"Bearer {token}"})
            for (kind, outcome), token in owners.items():
                headers = {"Authorization": f"Bearer {token}"}
                handle = f"{kind}{outcome}"
                direct[kind, outcome] = httpx.post(f"{base}/v0/spaces/lab/direct", json={"member": f"@{handle}"},
                                                   headers=bob).json()["conversation"]["id"]
                path = f"/{handle}"
                if kind == "item":
                    created = mcp_subscribe(base, token, receiver, path=path)
                    assert "id" in created, created
                    continue
                endpoint = httpx.post(f"{base}/v0/webhook-endpoints", json={"url": receiver.url(path)},
                                      headers=headers).json()["endpoint"]["id"]
                assert httpx.post(f"{base}/v0/webhook-endpoints/{endpoint}/verify", headers=headers,
                                  timeout=30).status_code == 200
                collection = "me/inbox-subscriptions" if kind == "inbox" else "spaces/lab/webhook-subscriptions"
                made = httpx.post(f"{base}/v0/{collection}", json={"endpoint_id": endpoint, "debounce_ms": 0},
                                  headers=headers).json()["subscription"]["id"]
                assert httpx.post(f"{base}/v0/{collection}/{made}/activate", headers=headers).status_code == 200
            # break the receivers of the refused and tls cells (verified, then moved)
            for kind in KINDS:
                for outcome, url in (("refused", f"https://localhost:{closed_port()}/x"),
                                     ("tls", untrusted.url(f"/{kind}tls"))):
                    Endpoint.objects.filter(subscriptions__owner__handle=f"{kind}{outcome}").update(url=url)
            receiver.requests.clear()
            for (kind, outcome) in owners:
                sent = httpx.post(f"{base}/v0/spaces/lab/conversations/{direct[kind, outcome]}/messages",
                                  json={"body": f"to {kind}{outcome}"}, headers=bob)
                assert sent.status_code == 201, sent.text
            # every cell's first attempt fails with its own class
            expected = {"302": (302, None), "refused": (None, "connect_error"), "tls": (None, "tls_error"),
                        "timeout": (None, "timeout")}
            def first_attempts():
                return {(kind, outcome): Attempt.objects.filter(
                    number=1, delivery__subscription__owner__handle=f"{kind}{outcome}")
                    .exclude(delivery__state="cancelled").values_list("status_code", "error_class").first()
                    for kind, outcome in owners}

            firsts = polled(first_attempts, lambda got: all(got.values()))
            assert firsts == {cell: expected[cell[1]] for cell in owners}, firsts
            # fix the receivers: the retries are delivered, under the same ids
            for kind in KINDS:
                for outcome in ("refused", "tls"):
                    Endpoint.objects.filter(subscriptions__owner__handle=f"{kind}{outcome}").update(
                        url=receiver.url(f"/{kind}{outcome}"))
            def states():
                return {cell: list(Delivery.objects.filter(subscription__owner__handle=f"{cell[0]}{cell[1]}")
                                   .exclude(state="cancelled").values_list("state", flat=True)) for cell in owners}

            def all_delivered(got):
                return all(s and all(x == "delivered" for x in s) for s in got.values())

            delivered = polled(states, all_delivered)
            assert all_delivered(delivered), delivered
            for (kind, outcome) in owners:
                got = [r for r in receiver.requests if r.path == f"/{kind}{outcome}"
                       and r.json().get("type") not in ("spaces.webhook.challenge", "verification")]
                ids = {r.headers.get("Webhook-Id") or r.headers.get("webhook-id") for r in got}
                assert len(ids) == 1, (kind, outcome, ids)
            statuses = dict(Subscription.objects.values_list("owner__handle", "status"))
            assert all(statuses[f"{k}{o}"] == "active" for k, o in owners), statuses
    finally:
        stop_untrusted()
