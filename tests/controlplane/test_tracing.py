"""Request ids (controlplane.tracing): every answer names one, the client's
own when it is a safe one; the request's work (sync views on the pool of
request threads, async views on the loop, /mcp) runs under it; the JSON log
format prints it with the record's structured fields."""
from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys

import pytest
from django.test import Client, RequestFactory

from controlplane.tracing import JsonFormatter, begin_request, end_request
from tests.controlplane.test_handlers import asgi_call, asgi_get
from tests.servers import ROOT, server_env

GENERATED = re.compile(r"req_[a-z2-7]{16}")


@pytest.mark.parametrize("inbound", ["abc-123", "3f2c7a9e-1b4d-4c8e-9a55-0d6b2f1e7c40",
                                     "Root=1-5759e988-bd862e3fe1be46a994272793", "a" * 64])
def test_a_safe_inbound_request_id_is_kept(inbound):
    response = Client().get("/healthz", HTTP_X_REQUEST_ID=inbound)
    assert response["X-Request-Id"] == inbound


@pytest.mark.parametrize("inbound", ["", "a" * 65, "has space", "semi;colon", 'quo"te', "tab\there", "ünïcode",
                                     "<script>"])
def test_an_unsafe_inbound_request_id_is_replaced(inbound):
    response = Client().get("/healthz", HTTP_X_REQUEST_ID=inbound)
    assert GENERATED.fullmatch(response["X-Request-Id"])


def test_a_request_without_one_gets_a_fresh_one_every_time():
    first, second = Client().get("/healthz")["X-Request-Id"], Client().get("/healthz")["X-Request-Id"]
    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second) and first != second


@pytest.fixture
def thread_urls(settings):
    settings.ROOT_URLCONF = "tests.controlplane.handler_urls"


@pytest.mark.parametrize("path", ["/sync", "/async"])
def test_the_view_runs_under_the_request_id_on_either_chain(thread_urls, path):
    # given: the ASGI application, where sync views run on the pool of request threads
    # when
    status, headers, body = asgi_get(path, headers=((b"x-request-id", b"trace-me-1"),))
    # then: the view saw it, in whichever thread ran it, and the answer names it
    assert status == 200 and body["request_id"] == "trace-me-1" and headers["x-request-id"] == "trace-me-1"
    if path == "/sync":
        assert body["thread"].startswith("switchboard-sync")


def test_a_refused_host_still_names_its_request_id(thread_urls, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    status, headers, _ = asgi_get("/sync", host=b"elsewhere.example", headers=((b"x-request-id", b"bad-host"),))
    assert status == 400 and headers["x-request-id"] == "bad-host"


def test_the_request_id_ends_with_its_request(thread_urls):
    asgi_get("/sync", headers=((b"x-request-id", b"over-now"),))
    _, _, body = asgi_get("/sync")
    assert GENERATED.fullmatch(body["request_id"])


@pytest.mark.django_db
def test_the_mcp_endpoint_names_a_request_id_too():
    # when: a call without a credential to /mcp, which is outside Django's middleware
    start, _ = asgi_call("POST", "/mcp", ((b"x-request-id", b"mcp-call-7"),), b"{}")
    # then
    assert start["status"] == 401 and (b"x-request-id", b"mcp-call-7") in start["headers"]


@pytest.mark.parametrize("path", ["/v0/spaces", "/mcp", "/app/credentials/new"])
def test_a_body_refused_before_any_view_still_names_its_request_id(path):
    # when a body past the limit is refused before Django or the MCP SDK sees it
    start, _ = asgi_call("POST", path, ((b"x-request-id", b"too-big-1"), (b"content-length", b"1000000000")))
    # then the answer names the request's id, once
    assert start["status"] == 413
    assert [value for name, value in start["headers"] if name.lower() == b"x-request-id"] == [b"too-big-1"]


@pytest.mark.parametrize("path", ["/healthz", "/static/admin/css/base.css"])
def test_django_and_the_static_files_name_the_request_id_once(path):
    # (the static files handler answers without Django's middleware)
    start, _ = asgi_call("GET", path, ((b"x-request-id", b"named-once"),))
    assert start["status"] == 200
    assert [value for name, value in start["headers"] if name.lower() == b"x-request-id"] == [b"named-once"]


@pytest.fixture
def json_lines():
    """What a logger prints through a handler with the JSON format."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("switchboard.test_tracing")
    logger.addHandler(handler)
    yield logger, lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)


def test_the_json_format_prints_time_level_logger_message_request_id_and_extra_fields(json_lines):
    logger, lines = json_lines
    # given: a record made under a request, formatted after it ended
    _, token = begin_request("trace-9")
    try:
        logger.warning("sent %s", "msg_1", extra={"message_id": "msg_1", "event_position": 42})
    finally:
        end_request(token)
    logger.warning("outside")
    # then
    inside, outside = lines()
    assert inside.pop("time").endswith("Z")
    assert inside == {"level": "WARNING", "logger": "switchboard.test_tracing", "message": "sent msg_1",
                      "request_id": "trace-9", "message_id": "msg_1", "event_position": 42}
    assert outside["request_id"] is None and outside["message"] == "outside"


def test_the_json_format_keeps_exceptions_and_no_query_string_of_a_request():
    # given: a record as django.request logs a 500
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    record.request, record.status_code = RequestFactory().get("/v0/spaces", {"cursor": "secret-ish"}), 500
    # when
    entry = json.loads(JsonFormatter().format(record))
    # then
    assert entry["request"] == "GET /v0/spaces" and entry["status_code"] == 500 and entry["request_id"] is None
    assert "ValueError: boom" in entry["exception"] and "secret-ish" not in json.dumps(entry)


def test_log_format_json_selects_the_json_format_and_anything_unknown_refuses_to_start():
    script = "import logging; logging.getLogger('switchboard.check').warning('hello', extra={'answer': 42})"
    shell = [sys.executable, "manage.py", "shell", "-c", script]
    printed = subprocess.run(shell, cwd=ROOT, env=server_env(LOG_FORMAT="json"), capture_output=True, text=True,
                             timeout=60)
    assert printed.returncode == 0, printed.stderr
    entry = json.loads(printed.stderr.strip().splitlines()[-1])
    assert (entry["logger"], entry["message"], entry["answer"]) == ("switchboard.check", "hello", 42)
    plain = subprocess.run(shell, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60)
    assert plain.stderr.strip().splitlines()[-1].endswith("WARNING switchboard.check hello")
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=server_env(LOG_FORMAT="xml"),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "LOG_FORMAT is plain or json" in refused.stderr


def test_a_lost_redis_is_one_line_in_the_log_and_anything_else_has_its_traceback(caplog):
    import logging

    import redis

    from controlplane.errors import warn_of

    log = logging.getLogger("switchboard.live")
    for error in (redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused."),
                  ValueError("a bug")):
        try:
            raise error
        except Exception:
            warn_of(log, "lost Redis while listening to %s; subscribing again", "switchboard.log")
    outage, bug = caplog.records
    assert outage.getMessage() == ("lost Redis while listening to switchboard.log; subscribing again: Error 111 "
                                   "connecting to 127.0.0.1:6390. Connection refused.") and outage.exc_info is None
    assert bug.getMessage() == "lost Redis while listening to switchboard.log; subscribing again" and bug.exc_info
