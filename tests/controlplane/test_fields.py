"""Input shapes (controlplane.api.fields.StrictSerializer): fields bound
once per class, and still one answer per input, nested shapes and threads
included."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from controlplane.api.fields import StrictCharField, StrictSerializer, validated
from inbox.api.serializers import SendMessageIn


def answer(data) -> dict:
    try:
        return {"valid": validated(SendMessageIn, data)}
    except ValidationError as error:
        return {"errors": json.loads(json.dumps(error.detail))}


def test_fields_are_built_once_per_class_not_per_request():
    assert SendMessageIn(data={}).fields is SendMessageIn(data={"body": "x"}).fields


@pytest.mark.parametrize("mode", [{"partial": True}, {"context": {"request": None}}, {"instance": object()}])
def test_what_shared_fields_cannot_honour_is_refused(mode):
    with pytest.raises(TypeError, match="validates input only"):
        SendMessageIn(data={}, **mode)


def test_a_mutable_default_is_refused_not_shared():
    class Tagged(StrictSerializer):
        tags = serializers.ListField(child=StrictCharField(), default=[])

    with pytest.raises(TypeError, match="mutable default"):
        Tagged(data={}).is_valid()


@pytest.mark.parametrize("data, expected", [
    ({"body": "hello"}, {"valid": {"body": "hello", "request_approval": False}}),
    ({"body": 5}, {"errors": {"body": ["Not a valid string."]}}),
    ({"body": "x", "extra": 1}, {"errors": {"extra": ["Unknown field."]}}),
    ({"body": "x", "related_paths": ["a", 2]}, {"errors": {"related_paths": {"1": ["Not a valid string."]}}}),
    ({"body": "x", "collective": {"op": "all", "deadline_ms": 60000, "x": 1}},
     {"errors": {"collective": {"x": ["Unknown field."]}}}),
    ([], {"errors": {"non_field_errors": ["Expected a JSON object."]}}),
])
def test_each_input_gets_its_own_answer_from_shared_fields(data, expected):
    assert answer(data) == expected


def test_threads_validating_at_once_get_their_own_answers():
    def case(i: int) -> tuple[dict, dict]:  # valid, wrong type, a bad list item, a bad nested field
        if i % 4 == 0:
            return {"body": f"m{i}"}, {"valid": {"body": f"m{i}", "request_approval": False}}
        if i % 4 == 1:
            return {"body": i}, {"errors": {"body": ["Not a valid string."]}}
        if i % 4 == 2:
            return ({"body": "x", "related_paths": ["a"] * (i % 7) + [i]},
                    {"errors": {"related_paths": {str(i % 7): ["Not a valid string."]}}})
        return ({"body": "x", "collective": {"op": "all", "deadline_ms": 60000, f"x{i}": 1}},
                {"errors": {"collective": {f"x{i}": ["Unknown field."]}}})

    cases = [case(i) for i in range(800)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(answer, [data for data, _ in cases]))
    assert answers == [expected for _, expected in cases]


@pytest.mark.parametrize("path, named", [
    # given twice: the last one counted, and nothing said which
    ("/v0/spaces/lab/conversations?limit=1&limit=2", "limit"),
    ("/v0/spaces/lab/events?cursor=a&cursor=b", "cursor"),
    ("/v0/me/inbox?limit=5&limit=5", "limit"),
    # given empty: read as not given, an empty cursor started the feed again from its oldest event
    ("/v0/spaces/lab/events?cursor=", "cursor"),
    ("/v0/spaces/lab/conversations?limit=", "limit"),
    ("/v0/me/inbox?limit=5&wait_ms=", "wait_ms"),
    ("/v0/me/snapshot?page=", "page"),
    ("/v0/me/inbox/held?cursor=", "cursor"),
    ("/v0/spaces/lab/tasks?status=", "status"),
    # not the route's: ignored, `?state=denied` listed pending requests, `?limt=1` a page of 50
    ("/v0/spaces/lab/events?limt=1", "limt"),
    ("/v0/spaces/lab/tasks?state=done", "state"),
    ("/v0/approval-requests?state=denied", "state"),
    ("/v0/me/inbox?wait_ms=1000", "wait_ms"),
])
def test_a_query_parameter_given_twice_empty_or_not_the_routes_is_400_naming_it(space, as_root, path, named):
    response = as_root.get(path)
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"
    assert list(response.json()["error"]["details"]["fields"]) == [named]


@pytest.mark.parametrize("path", ["/v0/spaces/lab/tasks?status=open&limit=1", "/v0/spaces/lab/events?format=json",
                                  "/v0/approval-requests?status=denied&limit=5"])
def test_a_routes_own_parameters_and_the_format_are_taken(space, as_root, path):
    assert as_root.get(path).status_code == 200


@pytest.fixture
def as_root(api_for, make_member):
    return api_for(make_member("root", is_admin=True))


def test_a_snapshot_given_a_feeds_cursor_says_it_pages_with_page(as_alice):
    # it started again at its first page, silently
    response = as_alice.get("/v0/me/snapshot", cursor="anything")
    assert response.status_code == 400 and "page" in response.json()["error"]["details"]["fields"]["cursor"][0]
    assert as_alice.get("/v0/me/snapshot").status_code == 200
