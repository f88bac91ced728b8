"""Oversized bodies are refused before they are read (SPEC §13), whether
their length is declared or they are streamed without one."""
from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.asgi import application

CHUNK = 64 * 1024


def answer(headers: list[tuple[bytes, bytes]], receive, path: str = "/v0/spaces",
           method: str = "POST") -> tuple[int, dict, bytes]:
    """The status, headers and body `application` answers a request to `path` with."""
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {name.lower(): value for name, value in start["headers"]}, body


def _call(headers: list[tuple[bytes, bytes]], receive) -> tuple[int, dict]:
    status, _, body = answer(headers, receive)
    return status, json.loads(body)


def test_a_declared_length_over_the_limit_is_413_before_any_byte_is_read(settings):
    read = []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    status, body = _call([(b"content-length", str(10 ** 9).encode())], receive)
    assert (status, body["error"]["code"]) == (413, "BODY_TOO_LARGE")
    assert read == []


@pytest.mark.parametrize("length", [b"12abc", b"-1"])
def test_a_malformed_length_is_refused_unread(length):
    async def receive():
        raise AssertionError("nothing may be read")

    assert _call([(b"content-length", length)], receive)[0] == 413


def test_a_streamed_body_is_counted_and_refused_once_past_the_limit(settings):
    read = []

    async def receive():  # an endless chunked upload
        read.append(CHUNK)
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    status, body = _call([], receive)
    assert (status, body["error"]["code"]) == (413, "BODY_TOO_LARGE")
    assert sum(read) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE + CHUNK


def test_refusals_count_against_their_senders_address(settings):
    """No budget saw them: a sender could be refused without end."""
    from tests.conftest import clear_of_window_edge

    settings.RATE_LIMIT_PER_MINUTE = 2
    clear_of_window_edge()

    async def receive():
        raise AssertionError("nothing may be read")

    # when: three oversized bodies from one address
    answers = [_call([(b"content-length", str(10 ** 9).encode())], receive) for _ in range(3)]
    # then: the third is over the address's budget
    assert [(status, body["error"]["code"]) for status, body in answers] == [
        (413, "BODY_TOO_LARGE"), (413, "BODY_TOO_LARGE"), (429, "RATE_LIMITED")]
    assert answers[2][1]["error"]["details"]["retry_after"] >= 1


@pytest.mark.parametrize("accept, htmx", [(b"text/html,application/xhtml+xml", False), (b"*/*", True)])
def test_a_web_form_past_the_limit_is_answered_as_a_page_and_a_script_in_json(accept, htmx):
    async def receive():
        raise AssertionError("nothing may be read")

    form = "/app/spaces/room/cnv_x/send"
    too_large = [(b"content-length", str(10 ** 6).encode()), (b"accept", accept), *([(b"hx-request", b"true")] * htmx)]
    # a browser's form (or htmx) on the web app's paths gets the page (or the fragment for its error area)
    status, headers, body = answer(too_large, receive, form)
    assert status == 413 and headers[b"content-type"].startswith(b"text/html")
    assert "The request is too large." in body.decode() and "BODY_TOO_LARGE" in body.decode()
    assert (headers.get(b"hx-retarget") == b"#htmx-error") == htmx
    assert htmx or "<h1>That was too large to send</h1>" in body.decode()
    # with the headers every page of the web app's has (the middleware never saw this one)
    assert headers[b"content-security-policy"].startswith(b"default-src 'self'")
    assert (headers[b"x-frame-options"], headers[b"x-content-type-options"]) == (b"DENY", b"nosniff")
    # a script there, and anyone on the API, gets the contract's JSON
    for path, accepting in ((form, b"application/json"), ("/v0/spaces", accept)):
        status, headers, body = answer([(b"content-length", str(10 ** 6).encode()), (b"accept", accepting)],
                                        receive, path)
        assert (status, json.loads(body)["error"]["code"]) == (413, "BODY_TOO_LARGE")


def test_a_browser_past_its_addresss_rate_is_told_so_not_that_the_service_is_down(settings):
    from tests.conftest import clear_of_window_edge

    settings.RATE_LIMIT_PER_MINUTE = 1
    clear_of_window_edge()

    async def receive():
        raise AssertionError("nothing may be read")

    form = [(b"content-length", str(10 ** 6).encode()), (b"accept", b"text/html")]
    answers = [answer(form, receive, "/app/spaces/room/cnv_x/send") for _ in range(2)]
    status, headers, body = answers[1]
    # the page said "Switchboard is briefly unavailable"
    assert status == 429 and b"retry-after" in headers
    assert "<h1>Too many requests</h1>" in body.decode() and "unavailable" not in body.decode()
