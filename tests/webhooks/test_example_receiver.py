"""The example receiver `make receiver` runs (webhooks/example_receiver.py),
as a process of its own: the one docs/webhooks.md tells readers to start
their own from. Anyone can post to a receiver before any signature is
checked, so it reads a body only when its length is a number within a
wake's size."""
import os
import signal
import socket
import ssl
import subprocess
import sys

import pytest

from tests.servers import free_port, read_until


@pytest.fixture
def receiver(tmp_path):
    """(its port, its CA bundle, what it printed) while it runs; Ctrl-C
    (SIGINT) stops it after, as a script's background job, which starts with
    SIGINT ignored: Python then raises no KeyboardInterrupt of its own."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"SWITCHBOARD_PUBLIC_URL", "SWITCHBOARD_BIND"}}
    process = subprocess.Popen([sys.executable, "-m", "webhooks.example_receiver", "--port", str(port),
                                "--dir", str(tmp_path)], env={**env, "SWITCHBOARD_BIND": "127.0.0.1:8123"},
                               stdout=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        printed = read_until(process, "Ctrl-C stops")
        yield port, tmp_path / "ca.pem", printed
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(10)


def answer(port: int, ca, head: bytes, body: bytes = b"") -> str:
    """The status line the receiver answers a raw request with."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(head + b"\r\n" + body)
        return tls.recv(65536).split(b"\r\n", 1)[0].decode()


@pytest.mark.parametrize("length, status", [("abc", "400"), ("-1", "400"), ("5000000", "413")])
def test_a_body_is_read_only_when_its_length_is_a_number_within_a_wakes_size(receiver, length, status):
    """It read `Content-Length` as given: `abc` was a traceback and no answer,
    `-1` read until the client gave up, and 5 MB were read before a 401."""
    port, ca, _ = receiver
    head = f"POST /hook HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\n".encode()
    assert answer(port, ca, head).split(" ")[1] == status


def test_its_issuer_is_where_switchboard_serves(receiver):
    """It named http://127.0.0.1:8000 whatever SWITCHBOARD_BIND said: a
    server moved to another port had every wake refused as a wrong issuer."""
    _, _, printed = receiver
    assert "Wakes are verified against http://127.0.0.1:8123 " in "".join(printed)


def test_a_silent_connection_holds_up_no_other(receiver):
    """Its TLS handshake ran as the connection was accepted, on the one
    thread that accepts them, with no time limit: one connection that sent
    nothing stopped the receiver for as long as it stayed open."""
    port, ca, _ = receiver
    with socket.create_connection(("127.0.0.1", port)):
        head = b"POST /hook HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n"
        assert answer(port, ca, head).split(" ")[1] == "400"
