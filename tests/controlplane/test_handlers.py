"""The ASGI handler (controlplane.handlers): a sync view runs with the sync
middleware chain on the pool of request threads, an async view on the event
loop, and both get every middleware's effect."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from controlplane.asgi import application


def asgi_call(method: str, path: str, headers: tuple = (), body: bytes = b"",
              host: bytes = b"testserver") -> tuple[dict, bytes]:
    """One request through the ASGI application: its response start and body."""
    sent, requests = [], [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays connected

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", host), *headers], "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def asgi_get(path: str, host: bytes = b"testserver", headers: tuple = ()) -> tuple[int, dict, dict]:
    """GET `path` through the ASGI application: (status, headers, JSON body or bytes)."""
    start, body = asgi_call("GET", path, headers, host=host)
    answered = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], answered, json.loads(body) if "json" in answered.get("content-type", "") else body


@pytest.fixture
def thread_urls(settings):
    settings.ROOT_URLCONF = "tests.controlplane.handler_urls"


def test_a_sync_view_runs_on_a_request_thread_with_the_sync_middleware(thread_urls):
    status, headers, body = asgi_get("/sync")
    assert status == 200 and body["thread"].startswith("switchboard-sync")
    assert headers["x-frame-options"] == "DENY"  # the middleware chain ran around it


def test_an_async_view_runs_on_the_event_loop_with_the_async_middleware(thread_urls):
    status, headers, body = asgi_get("/async")
    assert status == 200 and body["thread"] == threading.current_thread().name  # asyncio.run's loop thread
    assert headers["x-frame-options"] == "DENY"


def test_the_sync_chain_refuses_a_host_not_allowed_and_answers_unknown_paths(thread_urls, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    assert asgi_get("/sync", host=b"elsewhere.example")[0] == 400
    assert asgi_get("/nowhere")[0] == 404


def test_a_sync_view_s_request_signals_run_on_its_request_thread(thread_urls):
    # given: receivers of the request signals that note their thread
    from django.core.signals import request_finished, request_started

    seen = []

    def note(sender, signal, **kwargs):
        seen.append(("started" if signal is request_started else "finished", threading.current_thread().name))

    request_started.connect(note)
    request_finished.connect(note)
    try:
        # when
        status, _, body = asgi_get("/sync")
        streamed = asgi_get("/streaming")
    finally:
        request_started.disconnect(note)
        request_finished.disconnect(note)
    # then: one hop for the request, its signals included (not two more to
    # the thread every request of the process shares); a streamed response
    # is closed, and so finished, once its content is sent
    assert status == 200
    assert seen[:2] == [("started", body["thread"]), ("finished", body["thread"])]
    assert streamed[0] == 200 and streamed[2] == b"one two"
    assert [kind for kind, _ in seen[2:]] == ["started", "finished"]
