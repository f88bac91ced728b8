"""SPEC §2 and §12: request bodies the API refuses before any field is
read (malformed JSON, a key given twice, text no field may hold, nesting,
size), each in the contract's shape, and nothing changed."""
import json

import pytest

from controlplane.api.parsers import parse_json_object
from controlplane.errors import InvalidRequest
from controlplane.models import Space
from tests.conftest import error_code
from tests.shapes import check_response


@pytest.mark.parametrize("raw,content_type,code,status", [
    (b"{not json", "application/json", "INVALID_REQUEST", 400),
    (b"[1, 2]", "application/json", "INVALID_REQUEST", 400),
    (b'{"slug": NaN}', "application/json", "INVALID_REQUEST", 400),
    (b'{"slug": "Not A Slug", "name": "x", "slug": "ok"}', "application/json", "INVALID_REQUEST", 400),
    (b'{"slug": "a\xff", "name": "x"}', "application/json", "INVALID_BODY", 422),
    (b'{"slug": "ok", "name": "a\\u0000b"}', "application/json", "INVALID_BODY", 422),
    (b'{"slug": "ok", "name": "\\ud800"}', "application/json", "INVALID_BODY", 422),
    (b"slug=x", "application/x-www-form-urlencoded", "INVALID_REQUEST", 415),
])
def test_malformed_bodies_get_contract_errors(as_alice, raw, content_type, code, status):
    response = as_alice.client.generic("POST", "/v0/spaces", raw, content_type=content_type)
    assert response.status_code == status
    assert error_code(response) == code
    assert not Space.objects.exists()
    check_response("post", "/v0/spaces", response)  # the schema lists what it answered


def test_a_key_given_twice_is_refused_at_any_depth():
    with pytest.raises(InvalidRequest, match="'a' appears twice"):
        parse_json_object(b'{"items": [{"a": 1, "b": 2, "a": 3}]}')
    nested = {"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}  # one key in many objects is no repeat
    assert parse_json_object(json.dumps(nested).encode()) == nested


def test_deeply_nested_json_is_400(as_alice):
    raw = b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = as_alice.client.generic("POST", "/v0/spaces", raw, content_type="application/json")
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert response.json()["error"]["message"] == "JSON nested deeper than 32 levels."


@pytest.mark.parametrize("raw,message", [
    (b'{"slug": ' + b"9" * 5000 + b"}", "Malformed JSON: a number has too many digits."),
    (b'{"slug": NaN}', "Malformed JSON: NaN is not JSON."),
    (b'{"slug" 1}', "Malformed JSON: Expecting ':' delimiter: line 1 column 9 (char 8)"),
])
def test_malformed_json_is_told_in_the_apis_words_not_the_interpreters(as_alice, raw, message):
    response = as_alice.client.generic("POST", "/v0/spaces", raw, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["message"] == message


def test_oversized_request_is_refused_before_parsing(as_alice):
    response = as_alice.post("/v0/spaces", {"slug": "lab", "name": "x", "pad": "x" * 300_000})
    assert response.status_code == 413 and error_code(response) == "BODY_TOO_LARGE"
    assert not Space.objects.exists()
