"""A request's head (its request line and headers) through a real server:
bounded in size and in time (controlplane.uvicorn_process.BoundedHead)."""
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
from tests.servers import serving


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


async def answer(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def bounded_server():
    """uvicorn with `serve`'s protocol on a loopback port, in a thread."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(answer, http=BoundedHead, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield "http://127.0.0.1:%d" % listening.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()


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
