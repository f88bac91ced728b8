"""Webhooks end to end: real `serve` processes (Daphne and a django-q2
cluster) deliver to a real HTTPS receiver on 127.0.0.1."""
import threading
import time

import httpx
import pytest
from switchboard_client import WakeVerifier, fetch_signing_keys

from controlplane.processes import in_session, kill_all
from tests.servers import member_token, serving
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def member(handle: str) -> dict:
    return {"Authorization": f"Bearer {member_token(handle, kind='human')}"}


def setup_inbox_subscription(base, receiver, alice, bob):
    """alice: a verified endpoint and an active inbox subscription (debounce 0);
    bob and alice share a direct conversation in `lab`."""
    httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
    httpx.post(f"{base}/v0/spaces/lab/join", headers=bob)
    direct = httpx.post(f"{base}/v0/spaces/lab/direct", json={"member": "@alice"}, headers=bob).json()
    endpoint = httpx.post(f"{base}/v0/webhook-endpoints", json={"url": receiver.url()}, headers=alice).json()
    endpoint_id = endpoint["endpoint"]["id"]
    verified = httpx.post(f"{base}/v0/webhook-endpoints/{endpoint_id}/verify", headers=alice, timeout=30)
    assert verified.status_code == 200, verified.text
    subscription = httpx.post(f"{base}/v0/me/inbox-subscriptions", json={"endpoint_id": endpoint_id,
                                                                        "debounce_ms": 0}, headers=alice).json()
    activated = httpx.post(f"{base}/v0/me/inbox-subscriptions/{subscription['subscription']['id']}/activate",
                           headers=alice)
    assert activated.status_code == 200, activated.text
    return direct["conversation"]["id"]


def receiver_env(receiver_ca) -> dict:
    return {"WEBHOOK_CA_BUNDLE": str(receiver_ca), "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1"}


def test_a_send_wakes_the_receiver_which_reads_the_feed(receiver, https_receiver):
    alice, bob = member("alice"), member("bob")
    with serving(**receiver_env(https_receiver[1])) as (base, _):
        direct = setup_inbox_subscription(base, receiver, alice, bob)
        receiver.requests.clear()
        # when
        sent = httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": "wake up"},
                          headers=bob).json()["message"]
        (wake,) = receiver.wait_for(lambda requests: len(requests) >= 1, timeout=30)
        # then: the wake verifies against the published keys
        verifier = WakeVerifier(lambda: fetch_signing_keys(base), issuer=base)  # where `serve --bind` serves
        body = verifier.verify(wake.headers, wake.body)
        assert body["type"] == "spaces.inbox_events.available"
        # and the feed from its range holds the message
        events = httpx.get(f"{base}/v0/me/inbox/events", params={"cursor": body["event_range"]["after"]},
                           headers=alice).json()["events"]
        assert [e["data"]["message"]["id"] for e in events] == [sent["id"]]


def test_a_worker_killed_mid_delivery_loses_nothing(receiver, https_receiver):
    alice, bob = member("alice"), member("bob")
    env = {**receiver_env(https_receiver[1]), "WEBHOOK_LEASE_SECONDS": "3"}
    release = threading.Event()
    with serving(**env) as (base, process):
        direct = setup_inbox_subscription(base, receiver, alice, bob)
        receiver.requests.clear()
        # the receiver holds the first wake until the worker is dead
        receiver.respond = lambda received: (release.wait(30), (202, {}, b"{}"))[1]
        httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": "in flight"},
                   headers=bob)
        (first,) = receiver.wait_for(lambda requests: len(requests) >= 1, timeout=30)
        # when: every process of that node is killed mid-request
        kill_all(lambda: in_session(process.pid))
        process.wait()
    release.set()
    receiver.respond = None
    with serving(**env) as (base, _):
        # then: a restarted worker sends the same wake again (same id), once
        # the lease and the dead timer's key ran out, not at the minute's sweep
        requests = receiver.wait_for(lambda requests: len(requests) >= 2, timeout=20)
        assert requests[1].headers["Webhook-Id"] == first.headers["Webhook-Id"]
        assert requests[1].body == first.body
        history = httpx.get(f"{base}/v0/me/inbox-subscriptions", headers=alice).json()["subscriptions"]
        deliveries = httpx.get(f"{base}/v0/webhook-subscriptions/{history[0]['id']}/deliveries",
                               headers=alice).json()["deliveries"]
        assert [d["state"] for d in deliveries] == ["delivered"]


KINDS, OUTCOMES = ("inbox", "space"), (202, 500, 410, 413)


def test_every_outcome_for_inbox_and_space_subscriptions_alike(receiver, https_receiver):
    """Each subscription kind against each answer a receiver can give: 2xx
    is delivered; a 500 is retried with the same id and body and then
    delivered; 410 and 413 suspend the subscription for good, fail its
    delivery and tell its owner, and the engine goes on delivering."""
    # given: one owner per cell, each with one subscription on its own receiver path
    bob = member("bob")
    owners = {(kind, status): member(f"{kind}{status}") for kind in KINDS for status in OUTCOMES}
    wakes: dict[str, int] = {}

    def answer(received):
        status = int(received.path[-3:])
        if received.json().get("type") != "spaces.webhook.challenge":
            wakes[received.path] = wakes.get(received.path, 0) + 1
            if status in (410, 413) or (status == 500 and wakes[received.path] == 1):
                return status, {}, b""
        return Receiver(port=0).answer(received)  # the default: challenges echoed, wakes 202

    receiver.respond = answer
    with serving(**receiver_env(https_receiver[1])) as (base, _):
        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=bob)
        channel = httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"},
                             headers=bob).json()["conversation"]["id"]
        for headers in owners.values():  # every join first: a join would wake the space subscriptions
            httpx.post(f"{base}/v0/spaces/lab/join", headers=headers)
        subscriptions = {}
        for (kind, status), headers in owners.items():
            endpoint = httpx.post(f"{base}/v0/webhook-endpoints", json={"url": receiver.url(f"/{kind}{status}")},
                                  headers=headers).json()["endpoint"]["id"]
            assert httpx.post(f"{base}/v0/webhook-endpoints/{endpoint}/verify", headers=headers,
                              timeout=30).status_code == 200
            collection = "me/inbox-subscriptions" if kind == "inbox" else "spaces/lab/webhook-subscriptions"
            created = httpx.post(f"{base}/v0/{collection}", json={"endpoint_id": endpoint, "debounce_ms": 0},
                                 headers=headers).json()
            route = f"{base}/v0/{collection}/{created['subscription']['id']}"
            assert httpx.post(f"{route}/activate", headers=headers).status_code == 200
            subscriptions[kind, status] = route
        receiver.requests.clear()
        # when: one message mentions everyone
        handles = " ".join(f"@{kind}{status}" for kind, status in owners)
        sent = httpx.post(f"{base}/v0/spaces/lab/conversations/{channel}/messages",
                          json={"body": f"hello {handles}"}, headers=bob)
        assert sent.status_code == 201, sent.text
        retried = {f"/{kind}500" for kind in KINDS}
        requests = receiver.wait_for(lambda requests: {r.path for r in requests} >= {
            f"/{kind}{status}" for kind, status in owners} and all(
            sum(r.path == path for r in requests) >= 2 for path in retried), timeout=60)
        # then: a retry is the same wake (id and body)
        for path in retried:
            first, again = [r for r in requests if r.path == path][:2]
            assert again.headers["Webhook-Id"] == first.headers["Webhook-Id"] and again.body == first.body
        for (kind, status), route in subscriptions.items():
            headers = owners[kind, status]
            expected = "suspended" if status in (410, 413) else "active"
            deadline = time.monotonic() + 30
            while True:
                subscription = httpx.get(route, headers=headers).json()["subscription"]
                deliveries = httpx.get(f"{base}/v0/webhook-subscriptions/{subscription['id']}/deliveries",
                                       headers=headers).json()["deliveries"]
                states = [d["state"] for d in deliveries]
                settled = states == (["failed"] if expected == "suspended" else ["delivered"])
                if (subscription["status"] == expected and settled) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert subscription["status"] == expected and settled, (kind, status, subscription["status"], states)
            kinds = [i["item"]["kind"] for i in httpx.get(f"{base}/v0/me/inbox", headers=headers).json()["items"]]
            if expected == "suspended":
                assert subscription["suspended"]["terminal"] is True
                assert subscription["suspended"]["last_error"] == f"http_{status}"
                assert "subscription.suspended" in kinds
            else:
                assert "subscription.suspended" not in kinds
        # and suspensions are their owners' business: in no space feed
        feed = httpx.get(f"{base}/v0/spaces/lab/events", params={"limit": 100}, headers=bob).json()["events"]
        assert [e["kind"] for e in feed if e["kind"].startswith("subscription.")] == []
        # and the engine lives on: the next message still reaches a healthy receiver
        receiver.requests.clear()
        httpx.post(f"{base}/v0/spaces/lab/conversations/{channel}/messages", json={"body": "again @inbox202"},
                   headers=bob)
        receiver.wait_for(lambda requests: any(r.path == "/inbox202" for r in requests), timeout=30)


@pytest.mark.postgres
def test_wakes_go_on_at_once_after_the_database_cut_every_connection(receiver, https_receiver):
    # given: wakes flowing, then every database connection of the server and its workers cut
    from django.db import connection

    from tests.servers import cut_every_database_connection

    alice, bob = member("alice"), member("bob")
    with serving(**receiver_env(https_receiver[1])) as (base, _):
        direct = setup_inbox_subscription(base, receiver, alice, bob)
        for n in range(3):
            httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": f"before {n}"},
                       headers=bob)
            receiver.wait_for(lambda requests, n=n: len(requests) >= n + 2, timeout=30)
        cut_every_database_connection()
        connection.close()
        connection.close_pool()
        # when: the next sends (retried, with their keys, while the server's pool drops what broke)
        for n in range(3):
            key = {"Idempotency-Key": f"after-cut-{n}"}
            while httpx.post(f"{base}/v0/spaces/lab/conversations/{direct}/messages", json={"body": f"after {n}"},
                             headers={**bob, **key}).status_code == 503:
                time.sleep(0.2)
        # then: their wakes come within seconds, not after a lease or at the minute sweep
        # (the workers' tasks take live connections, and an attempt that could not be
        # recorded is recorded again on a fresh one)
        seen = receiver.wait_for(lambda requests: len(requests) >= 5, timeout=10)
    assert len(seen) >= 5
