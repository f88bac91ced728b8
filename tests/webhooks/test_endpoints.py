"""Webhook endpoints and their verification challenge (SPEC §8)."""
import base64
import datetime as dt
import logging

import nacl.signing
import pytest
from standardwebhooks.webhooks import Webhook

from controlplane.clock import freeze, now
from tests.conftest import clear_of_window_edge, error_code
from webhooks.models import Endpoint

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def unpadded_b64url(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def create(api, url, **extra):
    return api.post("/v0/webhook-endpoints", {"url": url, **extra})


def test_create_read_list_delete(receiver, as_alice, as_bob):
    # when
    created = create(as_alice, receiver.url(), secret=SECRET)
    endpoint = created.json()["endpoint"]
    # then: the secret is never returned
    assert created.status_code == 201
    assert endpoint | {"id": None, "created_at": None} == {
        "id": None, "url": receiver.url(), "has_secret": True, "verified": False, "verified_at": None,
        "created_at": None}
    assert SECRET not in created.content.decode()
    assert as_alice.get(f"/v0/webhook-endpoints/{endpoint['id']}").json()["endpoint"] == endpoint
    assert [e["id"] for e in as_alice.get("/v0/webhook-endpoints").json()["endpoints"]] == [endpoint["id"]]
    # ownership: others see nothing
    assert as_bob.get(f"/v0/webhook-endpoints/{endpoint['id']}").status_code == 404
    assert as_bob.delete(f"/v0/webhook-endpoints/{endpoint['id']}").status_code == 404
    assert as_alice.delete(f"/v0/webhook-endpoints/{endpoint['id']}").status_code == 204
    assert not Endpoint.objects.owned_by(as_alice.member).exists()


def test_the_secret_is_stored_encrypted(receiver, as_alice):
    create(as_alice, receiver.url(), secret=SECRET)
    stored = Endpoint.objects.get().secret
    assert SECRET not in stored and SECRET.removeprefix("whsec_") not in stored


@pytest.mark.parametrize("url", [
    "http://receiver.example/hook",          # plain http
    "https://user:pass@receiver.example/",   # credentials in the URL
    "https://10.0.0.7/hook",                  # private literal
    "https://[::ffff:192.168.0.1]/hook",     # mapped private literal
    "https://169.254.169.254/latest/",      # cloud metadata
    "https://127.0.0.1:8443/hook",            # loopback, without the development flag
    "https://１２７.０.０.１:8443/hook",      # loopback in full-width digits, which IDNA maps to ASCII
    "ftp://receiver.example/",
    "",                                      # was 400 INVALID_REQUEST, where every other one is 422
    "https:///nohost",
    "https://receiver.example/a b",
    "https://receiver.example/a\x7fb",      # DEL
    "https://receiver.example/hook#",        # an empty fragment
    "https://receiver.example/" + "a" * 2024,  # 2,049 characters
    # IPv4 in the other forms resolvers and URL parsers read, which were taken as names: a lookup sent them to
    # the network's resolver, and the client's own check refused them only at send time
    "https://2130706433/hook",
    "https://0x7f000001/hook",
    "https://0177.0.0.1/hook",
    "https://127.1/hook",
    "https://127.0.0.1./hook",
    "https://%31%30.0.0.1/hook",
])
def test_unacceptable_urls_are_422(as_alice, url, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    response = create(as_alice, url)
    assert response.status_code == 422 and error_code(response) == "INVALID_URL"
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("url", ["https://127.0.0.1:8443/hook", "https://[::ffff:10.0.0.1]/hook",
                                 "https://169.254.169.254/latest/"])
def test_an_address_never_called_is_refused_for_that_reason(as_alice, url, settings):
    # as a name that resolves only to such addresses is (MCP's callback URLs, verification): it gave no reason
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    response = create(as_alice, url)
    assert response.json()["error"]["details"] == {"reason": "forbidden_destination"}


@pytest.mark.parametrize("secret", ["whsec_short", "whsec_" + base64.b64encode(b"x" * 100).decode(), "s3cret",
                                    "whsec_!!!!"])
def test_malformed_secrets_are_400(as_alice, secret):
    response = create(as_alice, "https://receiver.example/hook", secret=secret)
    assert response.status_code == 400 and not Endpoint.objects.exists()


def test_at_most_20_endpoints_per_owner(as_alice):
    for n in range(20):
        assert create(as_alice, f"https://receiver.example/{n}").status_code == 201
    over = create(as_alice, "https://receiver.example/21")
    assert over.status_code == 409 and error_code(over) == "LIMIT_EXCEEDED"


def test_verification_sends_a_signed_challenge(receiver, as_alice, anon):
    # given
    endpoint = create(as_alice, receiver.url(), secret=SECRET).json()["endpoint"]
    # when
    verified = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    # then
    assert verified.status_code == 200 and set(verified.json()) == {"verified_at"}
    (challenge,) = receiver.requests
    body = challenge.json()
    assert set(body) == {"type", "id", "challenge", "created_at"} and body["type"] == "spaces.webhook.challenge"
    # the Ed25519 signature verifies with PyNaCl against the published key
    keys = {k["key_id"]: k for k in anon.get("/v0/webhook-signing-keys").json()["keys"]}
    key = keys[challenge.headers["Webhook-Key-Id"]]
    assert key["algorithm"] == "ed25519" and key["status"] == "active"
    public = nacl.signing.VerifyKey(unpadded_b64url(key["public_key"]))
    (signature,) = [s[3:] for s in challenge.headers["Webhook-Signature"].split() if s.startswith("v1=")]
    signed = f"{key['key_id']}.{challenge.headers['Webhook-Timestamp']}.".encode() + challenge.body
    public.verify(signed, unpadded_b64url(signature))
    # and the Standard Webhooks signature with the standardwebhooks package
    assert Webhook(SECRET).verify(challenge.body, challenge.headers) == body
    assert challenge.headers["Webhook-Id"] == body["id"]
    assert as_alice.get(f"/v0/webhook-endpoints/{endpoint['id']}").json()["endpoint"]["verified"] is True


@pytest.mark.parametrize("answer, reason", [
    ((200, {}, b'{"challenge": "wrong"}'), "challenge_mismatch"),
    ((200, {}, b"not json"), "not_json"),
    ((500, {}, b"{}"), "http_500"),
    ((302, {"Location": "https://localhost/elsewhere"}, b""), "http_302"),
])
def test_a_wrong_answer_fails_verification(receiver, as_alice, answer, reason):
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    receiver.respond = lambda received: answer
    response = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    assert response.status_code == 422 and error_code(response) == "VERIFICATION_FAILED"
    assert response.json()["error"]["details"] == {"reason": reason}
    assert len(receiver.requests) == 1  # a redirect is not followed
    assert Endpoint.objects.get().verified_at is None


def test_an_answer_holding_a_lone_surrogate_fails_verification(receiver, as_alice):
    # given: valid JSON that is no string of characters
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    receiver.respond = lambda received: (200, {"Content-Type": "application/json"}, b'{"challenge": "\\ud800"}')
    # when
    response = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    # then
    assert response.status_code == 422 and response.json()["error"]["details"]["reason"] == "challenge_mismatch"


@pytest.mark.parametrize("answer", [b"[" * 60_000, b'{"challenge": ' * 30_000, b"not json"])
def test_an_answer_no_json_parser_takes_fails_verification(receiver, as_alice, answer):
    # given: the receiver answers with bytes nested past the parser's depth, or no JSON at all
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    receiver.respond = lambda received: (200, {"Content-Type": "application/json"}, answer)
    # when
    response = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    # then
    assert response.status_code == 422 and response.json()["error"]["details"]["reason"] == "not_json"


def test_an_unreachable_receiver_fails_verification(receiver, as_alice):
    endpoint = create(as_alice, "https://localhost:9/hook").json()["endpoint"]
    response = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    assert response.status_code == 422 and response.json()["error"]["details"]["reason"] == "connect_error"


def test_verification_is_cached_10_minutes_per_owner_url_and_secret(receiver, as_alice, as_bob):
    # given
    first = create(as_alice, receiver.url(), secret=SECRET).json()["endpoint"]
    as_alice.post(f"/v0/webhook-endpoints/{first['id']}/verify")
    same = create(as_alice, receiver.url(), secret=SECRET).json()["endpoint"]
    other_secret = create(as_alice, receiver.url()).json()["endpoint"]
    bobs = create(as_bob, receiver.url(), secret=SECRET).json()["endpoint"]
    # when
    as_alice.post(f"/v0/webhook-endpoints/{same['id']}/verify")
    cached = len(receiver.requests)
    as_alice.post(f"/v0/webhook-endpoints/{other_secret['id']}/verify")
    as_bob.post(f"/v0/webhook-endpoints/{bobs['id']}/verify")
    with freeze(now() + dt.timedelta(minutes=11)):
        as_alice.post(f"/v0/webhook-endpoints/{same['id']}/verify")
    # then: only the same owner, URL and secret within 10 minutes skip the challenge
    assert cached == 1
    assert len(receiver.requests) == 4


def test_secrets_never_reach_the_logs(receiver, as_alice, caplog):
    caplog.set_level(logging.DEBUG)
    endpoint = create(as_alice, receiver.url(), secret=SECRET).json()["endpoint"]
    receiver.respond = lambda received: (500, {}, b"{}")
    as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    assert SECRET not in caplog.text and SECRET.removeprefix("whsec_") not in caplog.text


def test_a_failed_verification_is_answered_again_from_memory_for_a_minute(receiver, as_alice):
    # given
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    receiver.respond = lambda received: (500, {}, b"{}")
    first = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    # when: at once again, and after a minute
    again = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    with freeze(now() + dt.timedelta(seconds=61)):
        later = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    # then: the repeat sent nothing; a minute later the receiver is asked again
    assert [r.status_code for r in (first, again, later)] == [422, 422, 422]
    assert again.json()["error"]["details"] == {"reason": "http_500", "cached": True}
    assert len(receiver.requests) == 2


def test_a_keyed_verification_answers_its_retry_as_it_first_did(receiver, as_alice):
    # given
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    path = f"/v0/webhook-endpoints/{endpoint['id']}/verify"
    # when
    malformed = as_alice.post(path, headers={"Idempotency-Key": "short"})
    unverified = Endpoint.objects.get().verified_at
    first = as_alice.post(path, headers={"Idempotency-Key": "verify-0001"})
    with freeze(now() + dt.timedelta(minutes=11)):
        retry = as_alice.post(path, headers={"Idempotency-Key": "verify-0001"})
        unkeyed = as_alice.post(path)
    # then: the retry sends no challenge and answers the first time; without a key it is asked again
    assert malformed.status_code == 400 and error_code(malformed) == "INVALID_IDEMPOTENCY_KEY"
    assert unverified is None
    assert first.status_code == retry.status_code == 200 and retry.json() == first.json()
    assert unkeyed.json() != first.json()
    assert len(receiver.requests) == 2


def test_verifications_are_limited_per_member(receiver, as_alice, as_bob, settings):
    settings.VERIFY_PER_HOUR = 2
    endpoints = [create(as_alice, receiver.url(f"/hook{i}")).json()["endpoint"] for i in range(3)]
    clear_of_window_edge(3600)
    statuses = [as_alice.post(f"/v0/webhook-endpoints/{e['id']}/verify").status_code for e in endpoints]
    assert statuses == [200, 200, 429]
    assert len(receiver.requests) == 2
    bobs = create(as_bob, receiver.url("/bob")).json()["endpoint"]
    assert as_bob.post(f"/v0/webhook-endpoints/{bobs['id']}/verify").status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("headers", [{}, {"Idempotency-Key": "verify-0001"}], ids=["unkeyed", "keyed"])
def test_one_verification_per_member_in_flight_and_no_connection_held(receiver, api_for, make_member,
                                                                      monkeypatch, headers):
    # given: a receiver that holds the first challenge until told
    import threading

    from django.db import connections

    from webhooks import verification
    as_alice = api_for(make_member("alice"))
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    arrived, release, held = threading.Event(), threading.Event(), []
    default = receiver.answer

    def slow(received):
        arrived.set()
        release.wait(20)
        receiver.respond = None
        return default(received)

    receiver.respond = slow
    original_challenge, original_post, verifying = verification._challenge, verification._post_once, []

    def challenge(*args):
        verifying.append(connections["default"])  # the verifying thread's connection (the loop has its own)
        return original_challenge(*args)

    async def post_once(*args):
        held.append(verifying[0].connection is not None)
        return await original_post(*args)

    monkeypatch.setattr(verification, "_challenge", challenge)
    monkeypatch.setattr(verification, "_post_once", post_once)
    results = []
    def verify_in_a_thread():
        try:
            results.append(as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify",
                                         headers=headers).status_code)
        finally:
            connections.close_all()

    first = threading.Thread(target=verify_in_a_thread)
    first.start()
    assert arrived.wait(20)
    # when: a second verification while the first is in flight
    second = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    release.set()
    first.join(20)
    # then
    assert second.status_code == 429 and error_code(second) == "RATE_LIMITED"
    assert results == [200]
    assert held == [False]  # the request went out with no database connection held


def test_a_process_verifies_only_so_many_receivers_at_once(receiver, as_alice, monkeypatch, settings):
    """Each verification holds a request thread while its receiver takes its
    time: members whose receivers answered a byte every few seconds held
    every thread of a process."""
    import threading

    from webhooks import verification

    # given: the process's one place taken by a verification in flight, and one verification an hour
    monkeypatch.setattr(verification, "_PLACES", threading.BoundedSemaphore(1))
    settings.VERIFY_PER_HOUR = 1
    clear_of_window_edge(3600)
    endpoint = create(as_alice, receiver.url()).json()["endpoint"]
    verification._PLACES.acquire()
    # when / then: refused for now, not counted against the member's hour, and verified once the place is free
    refused = as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5" and not receiver.requests
    verification._PLACES.release()
    assert as_alice.post(f"/v0/webhook-endpoints/{endpoint['id']}/verify").status_code == 200
