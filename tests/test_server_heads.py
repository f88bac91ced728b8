"""A request's head (its request line and headers) through a real server:
bounded in size and in time, and its body and its answer in time
(controlplane.uvicorn_process.BoundedHead)."""
import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
import uvicorn

from controlplane import uvicorn_process
from controlplane.uvicorn_process import HEAD_MAX_BYTES, BoundedHead
from tests.servers import member_token, serving


def exchange(base: str, head: bytes) -> bytes:
    """Send `head` on a new connection; everything the server answers until it closes it."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=20) as connection:
        connection.sendall(head)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def get(host: str, **headers: str) -> bytes:
    lines = ["GET /healthz HTTP/1.1", f"Host: {host}", "Connection: close",
             *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.django_db(transaction=True)
def test_a_head_past_its_limit_is_431_in_the_contracts_shape_and_one_within_it_is_served():
    with serving("--no-worker", "--workers", "1") as (base, _):
        host = urlsplit(base).netloc
        # when one request carries 1 MiB of one header, and another as much as big cookies might be
        refused = exchange(base, get(host, **{"X-Filler": "x" * (1024 * 1024)}))
        served = exchange(base, get(host, Cookie="c=" + "x" * (HEAD_MAX_BYTES // 2)))
        # then the first is refused before it is held whole, the second answered; the server goes on
        status, _, body = refused.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 431 ")
        assert json.loads(body) == {"error": {"code": "INVALID_REQUEST", "message": "The request's headers are too "
                                              "large.", "details": {"max_bytes": HEAD_MAX_BYTES}}}
        assert served.startswith(b"HTTP/1.1 200 ")
        assert exchange(base, get(host)).startswith(b"HTTP/1.1 200 ")


@pytest.mark.django_db(transaction=True)
def test_a_body_sent_without_a_length_is_read_as_one_with_it():
    """Sent in chunks (`Transfer-Encoding: chunked`), a body was counted and
    passed on, and then read by no parser: a PATCH of optional fields answered
    200 having changed nothing, and malformed JSON made a credential."""
    import httpx

    token = member_token("ada")

    def chunked(data: bytes):
        yield data[:5]
        yield data[5:]

    with serving("--no-worker", "--workers", "1") as (base, _):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"}) as http:
            # when a credential is asked for with a name, and with a body that is not JSON, both in chunks
            named = http.post("/v0/me/credentials", content=chunked(b'{"name": "laptop"}'))
            malformed = http.post("/v0/me/credentials", content=chunked(b"{not json"))
            listed = http.get("/v0/me/credentials").json()
    # then the first is made with its name, the second refused
    assert named.request.headers["transfer-encoding"] == "chunked"
    assert (named.status_code, named.json()["name"]) == (201, "laptop")
    assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, "INVALID_REQUEST")
    assert sorted(row["name"] for row in listed["credentials"]) == ["", "laptop"]


@pytest.mark.parametrize("bad", [b"Idempotency-Key: abcdefg\x7f", b"Content-Length: abc",
                                 b"Content-Length: 2\r\nTransfer-Encoding: chunked"])
def test_what_is_not_http_is_400_in_the_contracts_shape(bad):
    with bounded_server() as base:
        refused = exchange(base, b"POST / HTTP/1.1\r\nHost: x\r\n" + bad + b"\r\n\r\n{}")
        status, _, body = refused.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in status
        assert json.loads(body)["error"] == {"code": "INVALID_REQUEST", "message": "The request is not valid HTTP/1.1.",
                                             "details": {}}


async def answer(scope, receive, send):
    """ok, once the whole body is in; a second later for /slow."""
    if scope["type"] == "http":
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/slow":
            await asyncio.sleep(1)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def server_in_a_thread(app):
    """uvicorn with `serve`'s protocol serving `app` on a loopback port, in a
    thread: its base URL and the server."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=BoundedHead, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield "http://127.0.0.1:%d" % listening.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()


@contextmanager
def bounded_server():
    with server_in_a_thread(answer) as (base, _):
        yield base


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a"])
def test_a_head_that_does_not_arrive_in_time_closes_its_connection(monkeypatch, sent):
    # given heads that must arrive within half a second
    monkeypatch.setattr(uvicorn_process, "HEAD_SECONDS", 0.5)
    with bounded_server() as base:
        # when a connection sends nothing, or a head that stops halfway
        started = time.monotonic()
        answered = exchange(base, sent)
        # then the server closes it, unanswered, soon after the deadline (not after the test's 20 s timeout)
        assert answered == b"" and time.monotonic() - started < 5
        # and a whole request on a new connection is served
        assert exchange(base, get("x")).startswith(b"HTTP/1.1 200 ")


def answers(base: str, *reads: bytes, pause: float = 0.2) -> bytes:
    """Send `reads` on one connection, `pause` apart (each arrives as a read of its own); what comes back."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=20) as connection:
        for data in reads:
            connection.sendall(data)
            time.sleep(pause)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def test_a_pipelined_head_is_counted_apart_from_the_body_before_it():
    # given a 400 KiB body whose last read also starts the next request's head
    body = b"x" * (400 * 1024)
    with bounded_server() as base:
        answered = answers(base, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body),
                           body + b"GET /healthz HT", b"TP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    # then both are answered (the read's whole length was counted as the second head: a 431 mid-answer)
    assert answered.count(b"HTTP/1.1 200 ") == 2 and b"431" not in answered


def test_a_pipelined_head_waits_while_the_request_before_it_is_answered(monkeypatch):
    # given heads that must arrive within half a second, and a request answered a second later
    monkeypatch.setattr(uvicorn_process, "HEAD_SECONDS", 0.5)
    with bounded_server() as base:
        # when the next request's head starts in the same read and ends after that second
        answered = answers(base, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /a HT",
                           b"TP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", pause=1.2)
    # then both are answered: its time ran from the first answer, not while uvicorn stopped reading
    assert answered.count(b"HTTP/1.1 200 ") == 2


def test_a_pipelined_head_past_its_limit_is_refused_after_the_answer_before_it():
    # given a slow request, then a pipelined head that grows past its limit while it is answered
    with bounded_server() as base:
        answered = answers(base, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nX-Filler: ",
                           b"y" * (HEAD_MAX_BYTES + 1), b"y" * 1024)
    # then the first answer comes whole, and the 431 after it
    assert answered.startswith(b"HTTP/1.1 200 ") and answered.index(b"HTTP/1.1 431 ") > answered.index(b"ok")


def test_what_is_not_http_after_a_pipelined_request_is_refused_after_its_answer_and_the_rest_read():
    # given a slow request, then a malformed one with a body still coming
    with bounded_server() as base:
        answered = answers(base, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                                 b"POST /a HTTP/1.1\r\nContent-Length: abc\r\n\r\n", b"z" * 65536, b"z" * 65536)
    # then the first answer comes whole, the 400 after it, and the client read both (no reset)
    assert answered.startswith(b"HTTP/1.1 200 ") and answered.index(b"HTTP/1.1 400 ") > answered.index(b"ok")


def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closes(monkeypatch):
    """The body is read before any credential or rate limit is looked at: one
    dripped a byte at a time held its connection for ever, for anyone."""
    monkeypatch.setattr(uvicorn_process, "BODY_SECONDS", 0.5)
    with bounded_server() as base:
        started = time.monotonic()
        # when a body of 100 bytes stops after 10, and a whole one comes in time
        dripped = answers(base, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789", pause=0)
        whole = answers(base, b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 4\r\n\r\n",
                        b"{}{}", pause=0.2)
    # then the first is refused soon after its deadline, in the contract's shape; the second is served
    status, _, body = dripped.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 5
    assert json.loads(body)["error"] == {"code": "INVALID_REQUEST", "message": "The request's body did not arrive "
                                         "in time.", "details": {"seconds": 0.5}}
    assert whole.startswith(b"HTTP/1.1 200 ")


def test_a_pipelined_requests_body_has_its_time_too(monkeypatch):
    """Its time starts once the answer before it has gone and uvicorn reads
    it: it had none, so a pipelined head with a body never sent held its
    connection for ever."""
    monkeypatch.setattr(uvicorn_process, "BODY_SECONDS", 0.5)
    with bounded_server() as base:
        started = time.monotonic()
        answered = answers(base, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                                 b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789", pause=0)
    assert answered.startswith(b"HTTP/1.1 200 ") and answered.index(b"HTTP/1.1 408 ") > answered.index(b"ok")
    assert time.monotonic() - started < 5


LARGE = 32 * 1024 * 1024  # more than the kernel's buffers on both sides hold


async def large(scope, receive, send):
    """LARGE bytes of answer."""
    if scope["type"] == "http":
        await receive()
        body = b"x" * LARGE
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


def test_an_answer_its_client_does_not_read_is_dropped_in_time(monkeypatch):
    monkeypatch.setattr(uvicorn_process, "WRITE_SECONDS", 0.5)
    with server_in_a_thread(large) as (base, server):
        # when a client asks, reads a little, then stops reading
        address = urlsplit(base)
        with socket.create_connection((address.hostname, address.port), timeout=20) as connection:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            first = connection.recv(1024)
            deadline = time.monotonic() + 5
            while server.server_state.connections and time.monotonic() < deadline:
                time.sleep(0.1)
            # then the server dropped the connection, and the answer it held, soon after the deadline
            assert first.startswith(b"HTTP/1.1 200 ") and not server.server_state.connections


@pytest.mark.django_db(transaction=True)
def test_a_static_path_that_is_not_there_or_climbs_out_is_404_in_the_contracts_shape():
    with serving("--no-worker", "--workers", "1") as (base, _):
        host = urlsplit(base).netloc
        for path in ("/static/nothing-here.css", "/static/%2e%2e/%2e%2e/manage.py", "/static/admin/../../manage.py",
                     "/static/..%2f..%2fmanage.py"):
            answer = exchange(base, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            status, _, body = answer.partition(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 404 "), (path, status)
            assert b'{"error": {"code": "NOT_FOUND"' in body, path  # (chunked)
        assert exchange(base, f"GET /static/web/app.js HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                        .encode()).startswith(b"HTTP/1.1 200 ")
