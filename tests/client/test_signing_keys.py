"""Where a receiver gets its signing keys: an unknown key id costs at most
one fetch of the published keys per KEY_REFRESH_SECONDS (anyone can send
one), a rotated key is still picked up, and a failed fetch is a 503 the
server retries rather than an exception."""
import asyncio
import base64
import json
import time

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from switchboard_client import WakeReceiver
from switchboard_client.verify import KEY_REFRESH_SECONDS

ISSUER = "https://switchboard.example"


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class PublishedKeys:
    """The server's `/v0/webhook-signing-keys`, counting its fetches; `failure` makes them fail."""

    def __init__(self, **keys: Ed25519PrivateKey):
        self.keys, self.fetches, self.failure = keys, 0, None

    def __call__(self) -> dict[str, bytes]:
        self.fetches += 1
        if self.failure is not None:
            raise self.failure
        return {key_id: key.public_key().public_bytes_raw() for key_id, key in self.keys.items()}


def signed_wake(key_id: str, key: Ed25519PrivateKey, now: float, delivery_id: str) -> tuple[dict, bytes]:
    body = json.dumps({"id": delivery_id, "type": "spaces.inbox_events.available", "issuer": ISSUER,
                       "subscription": {"id": "whs_1"}, "event_range": {"after": "a", "through": "b"}}).encode()
    timestamp = str(int(now))
    signature = base64.urlsafe_b64encode(key.sign(f"{key_id}.{timestamp}.".encode() + body)).rstrip(b"=")
    return {"Webhook-Id": delivery_id, "Webhook-Timestamp": timestamp, "Webhook-Key-Id": key_id,
            "Webhook-Signature": f"v1={signature.decode()}"}, body


def test_a_wake_verifies_by_whichever_ed25519_entry_is_the_keys():
    # given: a genuine wake whose signature header carries another v1= entry first
    clock, genuine, other = Clock(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    receiver = WakeReceiver(keys=PublishedKeys(wsk_genuine=genuine), issuer=ISSUER, clock=clock)
    headers, body = signed_wake("wsk_genuine", genuine, clock.now, "whd_1")
    foreign = base64.urlsafe_b64encode(other.sign(b"anything")).rstrip(b"=").decode()
    headers["Webhook-Signature"] = f"v1={foreign} {headers['Webhook-Signature']}"
    # then: taken; with the foreign entry alone, refused
    assert receiver.handle(headers, body).status == 202
    headers["Webhook-Signature"] = f"v1={foreign}"
    assert (receiver.handle(headers, body).status, receiver.handle(headers, body).reason) == (401, "bad signature")


def test_forged_key_ids_cost_one_fetch_of_the_keys_per_window():
    # given: a receiver that has not fetched the keys yet
    clock, genuine, forger = Clock(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    published = PublishedKeys(wsk_genuine=genuine)
    receiver = WakeReceiver(keys=published, issuer=ISSUER, clock=clock)
    # when: five requests name key ids nobody published
    replies = []
    for n in range(5):
        clock.now += 1
        replies.append(receiver.handle(*signed_wake(f"wsk_forged{n}", forger, clock.now, f"whd_forged{n}")))
    # then: all are refused for their signature, after a single fetch
    assert [(r.status, r.reason) for r in replies] == [(401, "unknown signing key")] * 5
    assert published.fetches == 1
    # and a genuine wake still verifies with the keys already fetched
    assert receiver.handle(*signed_wake("wsk_genuine", genuine, clock.now, "whd_genuine")).status == 202
    assert published.fetches == 1


def test_a_rotated_key_is_picked_up_once_the_window_has_passed():
    # given: a receiver that fetched the keys for a wake signed with the first key
    clock, first, second = Clock(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    published = PublishedKeys(wsk_first=first)
    receiver = WakeReceiver(keys=published, issuer=ISSUER, clock=clock)
    assert receiver.handle(*signed_wake("wsk_first", first, clock.now, "whd_1")).status == 202
    # when: the server rotates and signs with the second key within the window
    published.keys["wsk_second"] = second
    clock.now += KEY_REFRESH_SECONDS - 1
    early = receiver.handle(*signed_wake("wsk_second", second, clock.now, "whd_2"))
    # then: it is refused without a fetch (the server retries any non-2xx) ...
    assert (early.status, published.fetches) == (401, 1)
    # ... and its retry after the window fetches the keys again and is taken
    clock.now += 1
    retried = receiver.handle(*signed_wake("wsk_second", second, clock.now, "whd_2"))
    assert (retried.status, published.fetches) == (202, 2)


def test_a_failed_fetch_of_the_keys_is_a_503_to_retry_not_an_exception():
    # given: a key listing that cannot be fetched
    clock, key = Clock(), Ed25519PrivateKey.generate()
    published = PublishedKeys(wsk_1=key)
    published.failure = httpx.ConnectError("connection refused")
    receiver = WakeReceiver(keys=published, issuer=ISSUER, clock=clock, on_inbox_wake=lambda wake: None)
    # when
    reply = receiver.handle(*signed_wake("wsk_1", key, clock.now, "whd_1"))
    clock.now += 1
    again = asyncio.run(receiver.handle_async(*signed_wake("wsk_1", key, clock.now, "whd_1")))
    # then: both answer 503, so the server retries, and the second did not fetch again
    assert (reply.status, reply.body, reply.reason) == (
        503, {"error": "signing keys unavailable"}, "ConnectError: connection refused")
    assert (again.status, published.fetches) == (503, 1)
    # and once the window has passed and the listing answers, the retry is taken
    published.failure = None
    clock.now += KEY_REFRESH_SECONDS
    assert receiver.handle(*signed_wake("wsk_1", key, clock.now, "whd_1")).status == 202
    assert published.fetches == 2


def test_a_receiver_whose_server_does_not_answer_replies_503():
    # given: keys from a base URL where nothing listens
    key = Ed25519PrivateKey.generate()
    receiver = WakeReceiver(base_url="http://127.0.0.1:1", issuer=ISSUER)
    # when / then
    assert receiver.handle(*signed_wake("wsk_1", key, time.time(), "whd_1")).status == 503


class Answering:
    """A plain HTTP server on 127.0.0.1 answering every request (GET, POST, DELETE) with `answer` (status,
    headers, a JSON body or raw bytes), counting them."""

    def __init__(self, status: int, headers: dict, body: dict | bytes):
        import http.server
        import threading

        outer = self
        self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests += 1
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers,
                                    "Content-Length": str(len(raw))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_keys_fetched_through_a_client_are_tried_once_whatever_its_retries():
    # given: a client with its usual retries, whose server rate-limits the key listing for ten minutes
    from switchboard_client import Client

    server = Answering(429, {"Retry-After": "600"}, {"error": {"code": "RATE_LIMITED", "message": "slow down",
                                                                  "details": {"retry_after": 600}}})
    client = Client(server.base_url, "sbt_" + "x" * 43)
    receiver = WakeReceiver(client=client, issuer=ISSUER)
    # when: a request names a key id nobody published
    reply = receiver.handle(*signed_wake("wsk_forged", Ed25519PrivateKey.generate(), time.time(), "whd_1"))
    server.close()
    # then: one request (its retries would have waited out each Retry-After): the receiver's worker is not held
    assert (reply.status, server.requests) == (503, 1)


def test_the_window_counts_from_the_end_of_a_slow_fetch():
    # given: a key listing that takes longer than the window to answer
    clock, genuine = Clock(), Ed25519PrivateKey.generate()
    published = PublishedKeys(wsk_genuine=genuine)

    def slow():
        clock.now += KEY_REFRESH_SECONDS + 10
        return published()

    receiver = WakeReceiver(keys=slow, issuer=ISSUER, clock=clock)
    # when: forged key ids come one after another, as requests queued behind the fetch would
    for n in range(3):
        clock.now += 1
        receiver.handle(*signed_wake(f"wsk_forged{n}", genuine, clock.now, f"whd_{n}"))
    # then: the queued ones did not fetch again
    assert published.fetches == 1
