"""Bad input and unknown routes get the contract's clear 4xx and change
nothing (SPEC §2, §12, §14): lists past their length, related paths past
their bytes, writes to no route, bodies on deletes, any Accept; and the
schema's patterns say what the routes take."""
import re

import pytest
from rest_framework.test import APIClient

from controlplane import bearer
from tests.conftest import error_code


@pytest.mark.parametrize("method, path, field, rest", [
    ("post", "/v0/spaces/lab/conversations/%23general/messages", "related_paths", {"body": "hi"}),
    ("post", "/v0/spaces/lab/groups", "members", {}),
    ("put", "/v0/me/inbox/firewall", "rules", {}),
    ("post", "/v0/spaces/lab/webhook-subscriptions", "subjects", {"endpoint_id": "whe_nothere"}),
])
def test_a_list_past_its_length_is_refused_before_its_items_are_read(as_alice, general, method, path, field, rest):
    # when a list of 80,000 items, each of them wrong, fills most of a body
    response = getattr(as_alice, method)(path, {**rest, field: [1] * 80_000})
    # then the answer is its length, in a few bytes: not one error per item (megabytes, seconds of CPU)
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert len(response.content) < 1024 and "no more than" in response.content.decode()


def test_a_messages_related_paths_are_at_most_as_many_bytes_as_its_body(as_alice, general):
    path = "/v0/spaces/lab/conversations/%23general/messages"
    # given paths within their count and length, of four-byte characters: 12 KiB in every copy (64 of them: 256 KiB)
    heavy = as_alice.post(path, {"body": "hi", "related_paths": ["😀" * 1024] * 3})
    # then refused, while as many bytes as a body may hold are taken
    fits = as_alice.post(path, {"body": "hi", "related_paths": ["😀" * 1024] * 2})
    assert heavy.status_code == 400 and error_code(heavy) == "INVALID_REQUEST"
    assert heavy.json()["error"]["details"] == {"max_bytes": 8192}
    assert fits.status_code == 201


@pytest.mark.parametrize("method, path", [("post", "/v0/spaces/LAB/join"), ("post", "/v0/spaces/"),
                                          ("delete", "/v0/webhook-endpoints/whe_abc"), ("patch", "/v0/nope")])
def test_a_write_to_a_path_no_route_serves_is_404_as_a_read_is(alice, method, path):
    # given a bearer client with Django's CSRF check on, as the real server has it (the test client turns it off)
    _, token = bearer.issue_credential(alice, actor=None)
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    # when it writes to a path no route serves
    response = getattr(client, method)(path, b"{}", content_type="application/json")
    # then it is told so (it was 403 "CSRF verification failed.")
    assert response.status_code == 404 and error_code(response) == "NOT_FOUND"


@pytest.mark.parametrize("raw, content_type, status", [(b"{not json", "application/json", 400),
                                                       (b'{"purge": true}', "application/json", 400),
                                                       (b"hello", "text/plain", 415)])
def test_a_delete_with_a_body_it_would_ignore_is_refused_and_deletes_nothing(as_alice, raw, content_type, status):
    # given an endpoint of alice's
    endpoint = as_alice.post("/v0/webhook-endpoints", {"url": "https://example.com/hook"}).json()["endpoint"]["id"]
    # when she deletes it with a body no write takes
    response = as_alice.client.generic("DELETE", f"/v0/webhook-endpoints/{endpoint}", raw, content_type=content_type)
    # then, as for every other write (it was deleted, the body ignored)
    assert response.status_code == status and error_code(response) == "INVALID_REQUEST"
    assert as_alice.get(f"/v0/webhook-endpoints/{endpoint}").status_code == 200


@pytest.mark.parametrize("accept", ["text/html", "application/xml", "application/problem+json"])
def test_an_accept_header_without_json_gets_json_in_the_contracts_codes(anon, accept):
    # when a client that does not ask for JSON reads
    response = anon.client.get("/v0/me", HTTP_ACCEPT=accept)
    # then it gets the contract's answer, in its one format (it was 406, before even the credential was checked)
    assert response.status_code == 401 and error_code(response) == "UNAUTHENTICATED"


def test_the_published_conversation_pattern_is_anchored_as_a_whole(anon):
    schema = anon.client.get("/v0/schema/", HTTP_ACCEPT="application/json").json()
    parameters = schema["paths"]["/v0/spaces/{slug}/conversations/{conversation}/messages"]["post"]["parameters"]
    pattern = next(p["schema"]["pattern"] for p in parameters if p["name"] == "conversation")
    # (`^A|B$` anchors A at the start only and B at the end only)
    assert re.search(pattern, "cnv_aaaaaaaaaaaaaaaa") and re.search(pattern, "#general")
    assert not re.search(pattern, "cnv_aaaaaaaaaaaaaaaa/../x") and not re.search(pattern, "!!#general")


def test_a_format_the_api_does_not_have_is_answered_in_json(as_alice):
    # (DRF answered a `?format=` it has no renderer for with 404, on a route that exists)
    response = as_alice.get("/v0/me?format=xml")
    assert response.status_code == 200 and response.json()["member"]["handle"] == "@alice"


@pytest.mark.parametrize("path", ["/v0/schema/", "/v0/docs/"])
@pytest.mark.parametrize("method, headers, status, code", [
    ("post", {}, 405, "METHOD_NOT_ALLOWED"),
    ("get", {"HTTP_AUTHORIZATION": "Bearer sbt_wrong"}, 401, "UNAUTHENTICATED")])
def test_the_schema_and_its_docs_refuse_in_json_as_every_route_does(anon, path, method, headers, status, code):
    # (their errors came in the route's own format: the schema's YAML, the docs' HTML)
    response = getattr(anon.client, method)(path, **headers)
    assert response.status_code == status and response["Content-Type"] == "application/json"
    assert error_code(response) == code
