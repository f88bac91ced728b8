"""Collective requests over MCP: `send_message` with `collective`, and the
`answer` tool, calling the services the REST routes call; and the tools'
arguments, refused as the API refuses them."""
import pytest

from controlplane import services
from controlplane.errors import ApiError
from inbox.models import InboxItem
from mcp_endpoint.tools import TOOLS, check_arguments


def call(name, member, arguments):
    tool = TOOLS[name]
    return tool.run(member, check_arguments(tool, arguments))


def test_an_agent_asks_and_the_others_answer_through_tools(space, alice, bob, carol):
    # given
    group, _ = services.get_or_create_group(space, [alice, bob, carol], actor=alice)
    sent = call("send_message", alice, {"space": "lab", "conversation": group.public_id, "body": "Ready?",
                                        "collective": {"op": "all_gather", "deadline_ms": 30_000}})
    message = sent["message"]["id"]
    # when
    first = call("answer", bob, {"messageId": message, "body": "ready"})
    again = call("answer", bob, {"messageId": message, "body": "ready"})
    call("answer", carol, {"messageId": message, "body": "not yet"})
    # then
    assert first["created"] is True and again["created"] is False and first["answer"] == again["answer"]
    for member in (alice, bob, carol):
        (result,) = InboxItem.objects.filter(member=member, kind="collective.result")
        assert [a["answer"] for a in result.payload["answers"]] == ["ready", "not yet"]


@pytest.mark.parametrize("collective", [{"op": "scatter", "deadline_ms": 5000}, {"op": "gather", "deadline_ms": 10},
                                        {"op": "gather"}])
def test_bad_collective_arguments_are_invalid_params(space, alice, collective):
    # when
    with pytest.raises(ApiError) as refused:
        call("send_message", alice, {"space": "lab", "conversation": "#general", "body": "q",
                                     "collective": collective})
    # then: 400 INVALID_REQUEST, which the endpoint answers as -32602
    assert refused.value.status == 400 and refused.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("acknowledge_delivery", {}, "acknowledge_delivery: arguments must contain ['deliveryToken'] properties"),
    ("acknowledge_delivery", {"deliveryToken": "dlv_short"},
     "acknowledge_delivery: arguments.deliveryToken must match pattern ^dlv_[A-Za-z0-9_-]{43}$"),
    ("read_inbox", {"cursor": "c", "limit": 5}, "read_inbox: arguments must not contain {'limit'} properties"),
    ("read_inbox", {"cursor": 5}, "read_inbox: arguments.cursor must be string or null"),
    ("send_message", {"space": "lab", "conversation": "#general", "body": "q",
                      "collective": {"op": "gather", "deadline_ms": 10}},
     "send_message: arguments.collective.deadline_ms must be bigger than or equal to 1000"),
])
def test_arguments_that_misfit_a_tools_schema_say_where_and_why(name, arguments, message):
    # when: no database is touched: the schema refuses first
    with pytest.raises(ApiError) as refused:
        check_arguments(TOOLS[name], arguments)
    # then
    assert (refused.value.code, refused.value.message) == ("INVALID_REQUEST", message)


@pytest.mark.parametrize("arguments", [{"space": "lab\x00", "conversation": "#general", "body": "q"},
                                       {"space": "lab", "conversation": "#general", "body": "q\ud800"},
                                       {"space": "lab", "conversation": "#general", "body": "q",
                                        "related_paths": ["a\x00"]}])
def test_text_the_api_would_refuse_is_refused_before_the_schema(arguments):
    # when: no database is touched
    with pytest.raises(ApiError) as refused:
        check_arguments(TOOLS["send_message"], arguments)
    # then: the API's parser's rule (-32602 at the endpoint)
    assert refused.value.code == "INVALID_BODY"


def test_a_reply_to_of_null_is_no_reply_as_in_the_api(space, alice, bob):
    group, _ = services.get_or_create_group(space, [alice, bob], actor=alice)
    sent = call("send_message", alice, {"space": "lab", "conversation": group.public_id, "body": "q",
                                        "reply_to": None})
    assert sent["created"] is True


@pytest.mark.parametrize("name, argument", [("read_inbox", "cursor"), ("get_coordination_context", "page")])
def test_a_cursor_of_any_length_is_invalid_cursor_as_on_the_api(space, alice, name, argument):
    with pytest.raises(ApiError) as refused:
        call(name, alice, {argument: "A" * 401})
    assert refused.value.code == "INVALID_CURSOR"


def test_a_tool_answers_with_the_apis_own_code_for_a_malformed_key_or_event_id(space, alice):
    # the schema names no shape of its own for them: the API's rule answers
    with pytest.raises(ApiError) as short_key:
        call("send_message", alice, {"space": "lab", "conversation": "#general", "body": "q",
                                     "idempotency_key": "short"})
    with pytest.raises(ApiError) as bad_id:
        call("read_event", alice, {"eventId": "evt_short"})
    assert (short_key.value.code, bad_id.value.code) == ("INVALID_IDEMPOTENCY_KEY", "INVALID_EVENT_ID")


def test_a_null_cursor_is_the_first_page_as_the_tools_own_answers_give_it(space, alice):
    first = call("read_inbox", alice, {"cursor": None})
    assert first == call("read_inbox", alice, {}) and first["nextCursor"] is None
    assert call("get_coordination_context", alice, {"page": None})["cursor"]


def test_a_channel_of_the_longest_name_is_reached_by_its_name(space, alice):
    # a channel name is 1–80 characters; "#" and 80 of them were past the schema's 80
    services.create_channel(space, "c" * 80, actor=alice)
    sent = call("send_message", alice, {"space": "lab", "conversation": "#" + "c" * 80, "body": "q"})
    assert sent["created"] is True
