"""SPEC §2: Idempotency-Key on every write: its format, replays, conflicts,
and what a stored record keeps."""
import asyncio
import json

import pytest
from rest_framework.test import APIClient

from controlplane import bearer, services
from controlplane.asgi import application
from controlplane.models import Member, Space
from tests.conftest import at_once, error_code, meeting_point


@pytest.mark.parametrize("key", ["short", "x" * 129, "has space", "tab\tkey1", "caf\u00e9-key-1"])
def test_malformed_idempotency_key_is_400(as_alice, key):
    response = as_alice.post("/v0/spaces", {"slug": "ok", "name": "x"}, headers={"Idempotency-Key": key})
    assert response.status_code == 400
    assert error_code(response) == "INVALID_IDEMPOTENCY_KEY"
    assert not Space.objects.exists()


def test_idempotent_create_replays_and_conflicts(as_alice, as_bob):
    # given
    headers = {"Idempotency-Key": "create-lab-1"}
    first = as_alice.post("/v0/spaces", {"slug": "lab", "name": "Lab"}, headers=headers)
    # when
    again = as_alice.post("/v0/spaces", {"name": "Lab", "slug": "lab"}, headers=headers)
    different = as_alice.post("/v0/spaces", {"slug": "lab2", "name": "Lab"}, headers=headers)
    other_caller = as_bob.post("/v0/spaces", {"slug": "bobs", "name": "Bob's"}, headers=headers)
    # then
    assert first.status_code == 201
    assert again.status_code == 201 and again.content == first.content  # byte for byte: key order too
    assert different.status_code == 409 and error_code(different) == "IDEMPOTENCY_CONFLICT"
    assert other_caller.status_code == 201
    assert Space.objects.count() == 2


def test_failed_request_with_key_can_be_retried(as_alice):
    headers = {"Idempotency-Key": "retry-after-fix"}
    assert as_alice.post("/v0/spaces", {"slug": "BAD", "name": "x"}, headers=headers).status_code == 400
    assert as_alice.post("/v0/spaces", {"slug": "BAD", "name": "x"}, headers=headers).status_code == 400
    assert as_alice.post("/v0/spaces", {"slug": "good", "name": "x"}, headers=headers).status_code == 201


def test_replayed_credential_never_reveals_the_token_again(as_alice):
    # given
    headers = {"Idempotency-Key": "new-credential-1"}
    first = as_alice.post("/v0/me/credentials", headers=headers)
    # when
    replay = as_alice.post("/v0/me/credentials", headers=headers)
    # then
    assert first.json()["token"].startswith("sbt_")
    assert replay.status_code == 201
    assert replay.json() == {**first.json(), "token": None}
    from controlplane.models import IdempotencyRecord
    assert first.json()["token"] not in str(list(IdempotencyRecord.objects.values()))


def test_stored_fingerprints_are_keyed_hashes(as_alice):
    # given: a body holding a secret
    import hashlib

    from controlplane.models import IdempotencyRecord
    body = {"url": "https://hooks.example/x", "secret": "whsec_" + "A" * 44}
    as_alice.post("/v0/webhook-endpoints", body, headers={"Idempotency-Key": "endpoint-0001"})
    # then: the record's fingerprint is not the plain hash anyone could compute from a guess
    import json
    plain = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (record,) = IdempotencyRecord.objects.all()
    assert record.fingerprint != plain and len(record.fingerprint) == 64


def _write_routes() -> list[tuple[str, str]]:
    """(method, path) of every POST and PATCH route under /v0/, its
    placeholders filled with well-formed ids that name nothing."""
    import re

    from django.urls import get_resolver
    from django.urls.resolvers import URLResolver

    samples = {"space": "lab", "handle": "@bob", "pid": "abc_aaaaaaaaaaaaaaaa", "conversation": "%23general",
               "grant": "grt_none", "str": "none"}

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), getattr(pattern.callback, "cls", None)

    routes = []
    for path, view in walk(get_resolver().url_patterns, "/"):
        if path.startswith("/v0/") and view is not None:
            filled = re.sub(r"<(\w+):\w+>", lambda m: samples[m.group(1)], path)
            routes += [(method, filled) for method in ("post", "patch") if hasattr(view, method)]
    return routes


def test_every_write_route_refuses_a_malformed_idempotency_key_first(make_member, api_for):
    # given: an admin, whom every route's permissions admit
    admin = api_for(make_member("root", kind="human", is_admin=True))
    routes = _write_routes()
    # when
    answers = {(method, path): admin._call(method, path, {}, headers={"Idempotency-Key": "short"})
               for method, path in routes}
    # then: SPEC §2, "POST and PATCH that create or change state accept Idempotency-Key"
    assert len(routes) >= 30  # the walk found them
    refused = {route for route, response in answers.items()
               if response.status_code == 400 and error_code(response) == "INVALID_IDEMPOTENCY_KEY"}
    assert set(routes) - refused == set()
    assert not Space.objects.exists()


def test_every_write_operation_of_the_schema_declares_the_idempotency_key(anon):
    schema = anon.client.get("/v0/schema/", HTTP_ACCEPT="application/json").json()
    undeclared = [(method, path) for path, operations in schema["paths"].items() for method, operation
                  in operations.items() if method in ("post", "patch")
                  and "Idempotency-Key" not in {p["name"] for p in operation.get("parameters", [])}]
    assert undeclared == []
    assert all("INVALID_IDEMPOTENCY_KEY" in operations[m]["responses"]["400"]["description"]
               for operations in schema["paths"].values() for m in operations if m in ("post", "patch"))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_requests_with_one_key_at_once_do_the_work_once_and_answer_alike(monkeypatch):
    # given two requests with one key that meet once both are past the record lookup
    # (unless one waits for the other, which breaks the meeting)
    alice = services.create_member("alice", actor=None)
    _, token = bearer.issue_credential(alice, actor=None)
    both_in, take_turns = meeting_point(), Member.take_turns

    def meeting_then_take_turns(member_id):
        both_in()
        return take_turns(member_id)

    monkeypatch.setattr(Member, "take_turns", staticmethod(meeting_then_take_turns))

    def create():
        response = APIClient().post("/v0/spaces", {"slug": "lab", "name": "Lab"}, format="json",
                                    HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_IDEMPOTENCY_KEY="create-lab-1")
        return response.status_code, response.json()

    answers = at_once(create, create)
    # then one space, and the second answer is the first's (it was 409: that slug is taken)
    assert Space.objects.count() == 1
    assert [status for status, _ in answers] == [201, 201] and answers[0][1] == answers[1][1]


@pytest.mark.django_db(transaction=True)
def test_a_key_given_twice_is_400_not_the_two_joined(settings):
    # given: two Idempotency-Key headers, which Django joins into "first-key-1,other-key-2"
    alice = services.create_member("alice", actor=None)
    _, token = bearer.issue_credential(alice, actor=None)
    body = json.dumps({"slug": "lab", "name": "Lab"}).encode()
    keys = [(b"idempotency-key", b"first-key-1"), (b"idempotency-key", b"other-key-2")]
    # when
    status, answer = _post(body, [(b"authorization", f"Bearer {token}".encode()), *keys])
    # then
    assert (status, answer["error"]["code"]) == (400, "INVALID_IDEMPOTENCY_KEY")
    assert not Space.objects.exists()
    # and one of them alone is a key like any other
    assert _post(body, [(b"authorization", f"Bearer {token}".encode()), keys[0]])[0] == 201


def _post(body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """POST /v0/spaces through the ASGI application `serve` runs, with
    exactly these headers (a test client cannot repeat one)."""
    sent, received = [], [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return received.pop(0) if received else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v0/spaces", "raw_path": b"/v0/spaces", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), *headers]}
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
