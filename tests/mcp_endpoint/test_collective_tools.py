"""Collective requests over MCP: `send_message` with `collective`, and the
`answer` tool, calling the services the REST routes call."""
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
