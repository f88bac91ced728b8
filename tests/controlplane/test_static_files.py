"""Static files' misses answer as unknown routes do (controlplane.asgi.StaticFiles)."""
import asyncio
import json

import pytest

from tests.controlplane.test_body_limit import answer


def nothing_sent():
    """A receive: no body, then a client that stays (until the handler stops listening)."""
    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
    return receive


@pytest.mark.parametrize("path", ["/static/nothing-here.css", "/static/../manage.py"])
def test_a_static_path_that_is_not_there_is_the_contracts_404(path):
    status, _, body = answer([], nothing_sent(), path, method="GET")
    assert (status, json.loads(body)["error"]["code"]) == (404, "NOT_FOUND")


def test_a_static_miss_while_redis_is_out_of_reach_is_503_as_every_route_answers(lost_redis):
    # it was a 500 with a traceback: counting the miss against its address needs Redis
    status, headers, body = answer([], nothing_sent(), "/static/nothing-here.css", method="GET")
    assert (status, json.loads(body)["error"]["code"]) == (503, "UNAVAILABLE") and b"retry-after" in headers
