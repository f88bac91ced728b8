"""WakeReceiver against real wakes: the server signs and POSTs them over
HTTPS to the receiver served by a real WSGI server (wsgiref) or ASGI server
(uvicorn); the receiver answers the challenge, hands each wake to its
callback once, and refuses a tampered, stale or foreign one."""
import asyncio
import base64
import io
import json
import sqlite3
import ssl
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import httpx
import pytest
import uvicorn
from standardwebhooks.webhooks import Webhook
from switchboard_client import AsyncClient, Client, MemoryWakeStore, SQLiteWakeStore, Wake, WakeReceiver

from tests.client.conftest import member_token
from tests.servers import serving
from webhooks.example_receiver import make_ca_and_certificate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tls(tmp_path):
    """(CA bundle, certificate chain, key) for localhost and 127.0.0.1."""
    return make_ca_and_certificate(tmp_path)


def trusting(ca) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


class Recorder:
    """A WSGI middleware keeping each request's headers and body as they came."""

    def __init__(self, app):
        self.app, self.requests = app, []

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        self.requests.append((headers, body))
        environ["wsgi.input"] = io.BytesIO(body)
        return self.app(environ, start_response)


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def serve_wsgi_over_https(app, tls) -> tuple[str, callable]:
    ca, chain, key = tls
    server = WSGIServer(("127.0.0.1", 0), QuietHandler)
    server.set_app(app)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"https://localhost:{server.server_address[1]}/hook", lambda: (server.shutdown(), server.server_close())


def people(base):
    alice, bob = Client(base, member_token("alice")), Client(base, member_token("bob"))
    alice.create_space("lab", "Lab")
    bob.join_space("lab")
    return alice, bob


def test_the_wsgi_receiver_takes_a_real_wake_once_and_refuses_tampered_stale_and_foreign_ones(tls, tmp_path):
    ca = tls[0]
    wakes, arrived = [], threading.Condition()

    def on_inbox_wake(wake):
        with arrived:
            wakes.append(wake)
            arrived.notify_all()

    with serving(WEBHOOK_CA_BUNDLE=ca, WEBHOOK_ALLOW_PRIVATE_NETWORKS="1") as (base, _):
        store = SQLiteWakeStore(tmp_path / "var" / "wakes.sqlite3")  # (its folder made as it opens)
        receiver = WakeReceiver(base_url=base, store=store, on_inbox_wake=on_inbox_wake)
        recorder = Recorder(receiver.wsgi)
        url, stop = serve_wsgi_over_https(recorder, tls)
        alice, bob = people(base)
        direct = bob.open_direct("lab", "alice").id
        # given: the receiver answers the server's signed challenge
        endpoint = alice.create_endpoint(url)
        assert alice.verify_endpoint(endpoint.id)
        subscription = alice.create_inbox_subscription(endpoint.id, debounce_ms=0)
        receiver.inbox_subscription_id = subscription.id
        activation = alice.activate_subscription(subscription.id)
        # when: bob writes to alice
        sent = bob.send("lab", direct, "wake up")
        with arrived:
            assert arrived.wait_for(lambda: wakes, timeout=60)
        (wake,) = wakes
        # then: the wake names alice's inbox feed from the activation cursor, and it holds the message
        assert (wake.kind, wake.subscription_id, wake.source) == ("inbox", subscription.id, "webhook")
        assert wake.after == activation.activation_cursor and wake.chained
        events = alice.inbox_events(cursor=wake.after).items
        assert [e.data["message"]["id"] for e in events] == [sent.id]
        assert receiver.inbox_watermark == wake.through
        headers, body = next((h, b) for h, b in recorder.requests
                             if json.loads(b)["type"] != "spaces.webhook.challenge")
        assert headers["webhook-id"] == wake.id

        def post(content: bytes, **changed) -> httpx.Response:
            return httpx.post(url, content=content, headers={**headers, **changed}, verify=trusting(ca))

        # a replay of the same request: answered (so retries stop) but not handed on again
        replayed = post(body)
        assert replayed.status_code == 202 and replayed.json() == {"duplicate": True}
        # a tampered body: refused for its signature
        tampered = post(body.replace(b"inbox_events", b"inbox_evente"))
        assert tampered.status_code == 401
        # a Webhook-Id that is not the body's id (the Ed25519 signature does not cover the header): refused
        renamed = post(body, **{"webhook-id": "whd_someoneelse"})
        assert renamed.status_code == 400 and renamed.json() == {"error": "body id differs from Webhook-Id"}
        assert len(wakes) == 1
        # a receiver whose clock is past the 5-minute tolerance, or configured for another subscription
        stale = WakeReceiver(base_url=base, clock=lambda: time.time() + 301, on_inbox_wake=on_inbox_wake)
        assert (stale.handle(headers, body).status, stale.handle(headers, body).reason) == (
            400, "stale or future timestamp")
        foreign = WakeReceiver(base_url=base, inbox_subscription_id="whs_aaaaaaaaaaaaaaaa",
                               on_inbox_wake=on_inbox_wake)
        assert foreign.handle(headers, body).reason == "unknown subscription"
        # a receiver restarted on the same store remembers the delivery and the watermark
        restarted = WakeReceiver(base_url=base, store=SQLiteWakeStore(tmp_path / "var" / "wakes.sqlite3"),
                                 inbox_subscription_id=subscription.id, on_inbox_wake=on_inbox_wake)
        assert restarted.handle(headers, body).status == 202 and restarted.inbox_watermark == wake.through
        assert len(wakes) == 1
        stop()


def test_the_asgi_receiver_under_uvicorn_takes_space_wakes_with_an_async_callback(tls):
    ca, chain, key = tls
    wakes, arrived = [], threading.Condition()

    async def on_space_wake(wake):
        with arrived:
            wakes.append(wake)
            arrived.notify_all()

    with serving(WEBHOOK_CA_BUNDLE=ca, WEBHOOK_ALLOW_PRIVATE_NETWORKS="1") as (base, _):
        alice, bob = people(base)
        general = alice.create_channel("lab", "general").id
        # an ASGI receiver's natural client is an AsyncClient (its keys were fetched through it: every wake a 503)
        receiver = WakeReceiver(client=AsyncClient(base, member_token("carol")), issuer=base,
                                on_space_wake=on_space_wake)
        config = uvicorn.Config(receiver.asgi, host="127.0.0.1", port=0, ssl_certfile=str(chain),
                                ssl_keyfile=str(key), lifespan="on", log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        # given: a verified endpoint and an active subscription to the space
        endpoint = alice.create_endpoint(f"https://localhost:{port}/asgi")
        alice.verify_endpoint(endpoint.id)
        subscription = alice.create_space_subscription("lab", endpoint.id, debounce_ms=0)
        receiver.space_subscription_ids = frozenset({subscription.id})
        alice.activate_subscription(subscription.id, space="lab")
        # when
        sent = bob.send("lab", general, "space news")
        with arrived:
            assert arrived.wait_for(lambda: wakes, timeout=60)
        # then
        (wake,) = wakes
        assert (wake.kind, wake.space, wake.subscription_id) == ("space", "lab", subscription.id)
        events = alice.space_events("lab", cursor=wake.after).items
        assert sent.id in [e.data.get("message", {}).get("id") for e in events]
        # a GET is not a wake
        assert httpx.get(f"https://localhost:{port}/asgi", verify=trusting(ca)).status_code == 405
        server.should_exit = True
        thread.join(10)


def test_standard_webhooks_pushes_are_checked_with_the_subscription_secret():
    # given: an MCP push signed the Standard Webhooks way (by that library, not by this package)
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body = json.dumps({"eventId": "whd_aaaaaaaaaaaaaaaa", "name": "spaces.work.available", "timestamp": "x",
                       "data": {"space": "lab", "event_range": {"after": "a", "through": "b"}}, "cursor": None})
    now = time.time()
    from datetime import datetime, timezone
    signature = Webhook(secret).sign("whd_aaaaaaaaaaaaaaaa", datetime.fromtimestamp(now, timezone.utc), body)
    headers = {"webhook-id": "whd_aaaaaaaaaaaaaaaa", "webhook-timestamp": str(int(now)),
               "webhook-signature": signature, "X-MCP-Subscription-Id": "sub_1"}
    wakes = []
    receiver = WakeReceiver(keys={}, mcp_secret=secret, mcp_subscription_ids={"sub_1"}, on_space_wake=wakes.append)
    # when / then
    assert receiver.handle(headers, body.encode()).status == 202
    assert [(w.kind, w.space, w.through, w.source) for w in wakes] == [("space", "lab", "b", "mcp")]
    assert WakeReceiver(keys={}, mcp_secret="whsec_" + base64.b64encode(b"x" * 32).decode()).handle(
        headers, body.encode()).status == 401
    assert WakeReceiver(keys={}, mcp_secret=secret, mcp_subscription_ids={"sub_2"}).handle(
        headers, body.encode()).reason == "unknown subscription"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_replay_of_an_old_range_does_not_move_the_watermark_back(kind, tmp_path):
    # given: three chained wakes, then a replay of the first (the same range, a new delivery id)
    store = MemoryWakeStore() if kind == "memory" else SQLiteWakeStore(tmp_path / "var" / "wakes.sqlite3")

    def wake(delivery, after, through):
        return Wake(delivery, "inbox", "whs_1", None, after, through, "webhook", "spaces.inbox_events.available", {})

    for delivery, after, through in [("whd_1", "c0", "c1"), ("whd_2", "c1", "c2"), ("whd_3", "c2", "c3")]:
        store.record(wake(delivery, after, through))
    # when
    store.record(wake("whd_4", "c0", "c1"))
    # then: the watermark stays at the latest range; a wake after a lost one still moves it
    assert store.watermark("whs_1") == "c3" and store.seen("whd_4")
    store.record(wake("whd_6", "c4", "c5"))
    assert store.watermark("whs_1") == "c5"
    # and the replay of the lost wake (c3 → c4), whose end a recorded wake began at, leaves it too
    store.record(wake("whd_7", "c3", "c4"))
    assert store.watermark("whs_1") == "c5"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_remembers_the_latest_wakes_only(kind, tmp_path):
    """The SQLite store kept every wake's id and cursors for as long as the receiver ran."""
    path = tmp_path / "wakes.sqlite3"
    store = MemoryWakeStore(remember=3) if kind == "memory" else SQLiteWakeStore(path, remember=3)
    # when: five chained wakes
    for n in range(1, 6):
        store.record(Wake(f"whd_{n}", "inbox", "whs_1", None, f"c{n - 1}", f"c{n}", "webhook",
                          "spaces.inbox_events.available", {}))
    # then: the latest three are known, the first two forgotten, the watermark the latest
    assert [store.seen(f"whd_{n}") for n in range(1, 6)] == [False, False, True, True, True]
    assert store.watermark("whs_1") == "c5"
    if kind == "sqlite":
        with sqlite3.connect(path) as db:
            counts = [db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                      for table in ("seen_wakes", "wake_cursors")]
        assert counts == [3, 6]


def test_a_store_that_fails_while_a_wake_is_checked_is_answered_503_for_a_retry():
    # given: a push the Standard Webhooks library signed, and a store that cannot be read
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body = json.dumps({"eventId": "whd_bbbbbbbbbbbbbbbb", "name": "spaces.work.available", "timestamp": "x",
                       "data": {"space": "lab", "event_range": {"after": "a", "through": "b"}}, "cursor": None})
    from datetime import datetime, timezone
    now = time.time()
    headers = {"webhook-id": "whd_bbbbbbbbbbbbbbbb", "webhook-timestamp": str(int(now)),
               "webhook-signature": Webhook(secret).sign("whd_bbbbbbbbbbbbbbbb",
                                                         datetime.fromtimestamp(now, timezone.utc), body),
               "X-MCP-Subscription-Id": "sub_1"}

    class Broken(MemoryWakeStore):
        def seen(self, delivery_id):
            raise OSError("disk I/O error")

    wakes = []
    receiver = WakeReceiver(keys={}, mcp_secret=secret, store=Broken(), on_space_wake=wakes.append)
    # when
    replies = [receiver.handle(headers, body.encode()), asyncio.run(receiver.handle_async(headers, body.encode()))]
    # then: a 5xx the server retries, with why, and no callback ran
    assert [(r.status, r.reason) for r in replies] == [(503, "OSError: disk I/O error")] * 2 and wakes == []


def signed_push(event_id: str) -> tuple[str, dict, bytes]:
    """(its secret, headers, body): an MCP push the Standard Webhooks library signed."""
    from datetime import datetime, timezone

    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body = json.dumps({"eventId": event_id, "name": "spaces.work.available", "timestamp": "x",
                       "data": {"space": "lab", "event_range": {"after": "a", "through": "b"}}, "cursor": None})
    now = time.time()
    headers = {"webhook-id": event_id, "webhook-timestamp": str(int(now)), "X-MCP-Subscription-Id": "sub_1",
               "webhook-signature": Webhook(secret).sign(event_id, datetime.fromtimestamp(now, timezone.utc), body)}
    return secret, headers, body.encode()


class AsyncCall:
    def __init__(self):
        self.wakes = []

    async def __call__(self, wake):
        self.wakes.append(wake)


def test_a_callback_whose_work_is_awaitable_is_awaited_or_refused_never_dropped():
    """A lambda returning a coroutine, or an object with an async __call__,
    was called and its coroutine dropped: the wake answered 202 and recorded
    (a pushed item acknowledged by it) with the callback never run."""
    queue = asyncio.Queue()
    for name, callback, got in [("lambda", lambda wake: queue.put(wake), lambda: queue.qsize()),
                                ("object", (call := AsyncCall()), lambda: len(call.wakes))]:
        secret, headers, body = signed_push(f"whd_{name:a<16}")
        store = MemoryWakeStore()
        receiver = WakeReceiver(keys={}, mcp_secret=secret, store=store, on_space_wake=callback)
        # under an event loop: awaited
        assert asyncio.run(receiver.handle_async(headers, body)).status == 202 and got() == 1
        # without one: refused (a 500, so the server retries), not recorded
        again = WakeReceiver(keys={}, mcp_secret=secret, store=MemoryWakeStore(), on_space_wake=callback)
        refused = again.handle(headers, body)
        assert refused.status == 500 and not again.store.seen(headers["webhook-id"]) and got() == 1


def native_wake(key, *, issuer="https://switchboard.example", at=None, secret=None):
    """(headers, body) of a native wake signed with `key` (Ed25519), and with the
    Standard Webhooks HMAC of `secret` too if given."""
    import hashlib
    import hmac

    at = str(int(time.time() if at is None else at))
    body = json.dumps({"id": "whd_nativenativenat", "type": "spaces.inbox_events.available", "issuer": issuer,
                       "subscription": "whs_1", "event_range": {"after": "a", "through": "b"}}).encode()
    signature = base64.urlsafe_b64encode(key.sign(f"k1.{at}.".encode() + body)).rstrip(b"=").decode()
    entries = [f"v1={signature}"]
    if secret is not None:
        mac = hmac.new(base64.b64decode(secret.removeprefix("whsec_")), f"whd_nativenativenat.{at}.".encode() + body,
                       hashlib.sha256).digest()
        entries.append("v1," + base64.b64encode(mac).decode())
    return {"webhook-id": "whd_nativenativenat", "webhook-timestamp": at, "webhook-key-id": "k1",
            "webhook-signature": " ".join(entries)}, body


def test_a_native_wake_is_checked_for_its_issuer_its_hmac_and_a_timestamp_either_side_of_now():
    """Mutants dropping the issuer check, the HMAC check or the future side of
    the tolerance passed every receiver test."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from switchboard_client import WakeVerifier
    from switchboard_client.verify import InvalidWake

    key = Ed25519PrivateKey.generate()
    keys = {"k1": key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)}
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()

    def refusal(verifier, headers_and_body):
        with pytest.raises(InvalidWake) as refused:
            verifier.verify(*headers_and_body)
        return str(refused.value)

    checking = WakeVerifier(keys, issuer="https://switchboard.example", secret=secret)
    assert checking.verify(*native_wake(key, secret=secret))["subscription"] == "whs_1"
    assert refusal(checking, native_wake(key, issuer="https://other.example", secret=secret)) == "wrong issuer"
    assert refusal(checking, native_wake(key)) == "bad Standard Webhooks signature"
    wrong_secret = "whsec_" + base64.b64encode(b"t" * 32).decode()
    assert refusal(checking, native_wake(key, secret=wrong_secret)) == "bad Standard Webhooks signature"
    for skew in (-301, 301):
        assert refusal(checking, native_wake(key, secret=secret, at=time.time() + skew)) == "stale or future timestamp"
    assert checking.verify(*native_wake(key, secret=secret, at=time.time() + 200))  # within the tolerance
