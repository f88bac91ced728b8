"""Input shapes (controlplane.api.fields.StrictSerializer): fields bound
once per class, and still one answer per input, nested shapes and threads
included."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from rest_framework.exceptions import ValidationError

from controlplane.api.fields import validated
from inbox.api.serializers import SendMessageIn


def answer(data) -> dict:
    try:
        return {"valid": validated(SendMessageIn, data)}
    except ValidationError as error:
        return {"errors": json.loads(json.dumps(error.detail))}


def test_fields_are_built_once_per_class_not_per_request():
    assert SendMessageIn(data={}).fields is SendMessageIn(data={"body": "x"}).fields


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
    inputs = [{"body": f"m{i}"} if i % 3 else {"body": i} for i in range(600)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(answer, inputs))
    for data, got in zip(inputs, answers):
        assert got == ({"valid": {"body": data["body"], "request_approval": False}} if isinstance(data["body"], str)
                       else {"errors": {"body": ["Not a valid string."]}})
